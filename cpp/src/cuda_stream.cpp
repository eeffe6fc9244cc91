#include "inferd/cuda_stream.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "cuda_device.h"

namespace inferd {

using cuda_device::checked;
using cuda_device::cuda;

CudaStream::CudaStream(int device) : device_(device) {
  if (!cuda_device::usable(device)) {
    device_ = -1;
    return;
  }
  const int code = cuda().stream_create(device, &handle_);
  if (code != 0) {
    handle_ = nullptr;
    throw std::runtime_error("cannot create a CUDA stream on device " + std::to_string(device) + ": " +
                             cuda().error_string(code));
  }
}

CudaStream::~CudaStream() {
  if (handle_ != nullptr) {
    cuda().stream_synchronize(handle_);  // nothing queued may outlive the stream's owner
    cuda().stream_destroy(handle_);
  }
}

Status CudaStream::copy_to_device(void* dst, const void* src, size_t size) {
  if (!on_device()) {
    std::memcpy(dst, src, size);
    return Status::Ok();
  }
  return checked(cuda().memcpy_async(dst, src, size, CudaRuntime::CopyKind::kHostToDevice, handle_),
                 "host-to-device copy");
}

Status CudaStream::copy_to_host(void* dst, const void* src, size_t size) {
  if (!on_device()) {
    std::memcpy(dst, src, size);
    return Status::Ok();
  }
  return checked(cuda().memcpy_async(dst, src, size, CudaRuntime::CopyKind::kDeviceToHost, handle_),
                 "device-to-host copy");
}

Status CudaStream::synchronize() {
  return on_device() ? checked(cuda().stream_synchronize(handle_), "stream synchronize") : Status::Ok();
}

}  // namespace inferd
