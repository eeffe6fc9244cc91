#include "inferd/cuda_event.h"

#include <chrono>

#include "cuda_device.h"

namespace inferd {
namespace {

using cuda_device::checked;
using cuda_device::cuda;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

CudaEvent::CudaEvent(int device) {
  if (cuda_device::usable(device) && cuda().event_create(device, &handle_) != 0) handle_ = nullptr;
}

CudaEvent::~CudaEvent() {
  if (handle_ != nullptr) cuda().event_destroy(handle_);
}

Status CudaEvent::record(const CudaStream& stream) {
  if (handle_ == nullptr || !stream.on_device()) {
    host_ns_ = now_ns();
    return Status::Ok();
  }
  return checked(cuda().event_record(handle_, stream.handle()), "event record");
}

Status CudaEvent::synchronize() {
  return handle_ != nullptr ? checked(cuda().event_synchronize(handle_), "event synchronize") : Status::Ok();
}

Status CudaEvent::make_wait(const CudaStream& stream) const {
  if (handle_ == nullptr || !stream.on_device()) return Status::Ok();  // host work is already done
  return checked(cuda().stream_wait_event(stream.handle(), handle_), "stream wait");
}

Status CudaEvent::elapsed_ms(const CudaEvent& start, const CudaEvent& end, float* ms) {
  if (start.handle_ != nullptr && end.handle_ != nullptr) {
    return checked(cuda().event_elapsed_ms(ms, start.handle_, end.handle_), "event elapsed time");
  }
  *ms = static_cast<float>(end.host_ns_ - start.host_ns_) / 1e6f;
  return Status::Ok();
}

}  // namespace inferd
