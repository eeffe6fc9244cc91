#include "inferd/cuda_stream.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#include "inferd/cuda_runtime.h"

namespace inferd {
namespace {

const CudaRuntime& cuda() { return CudaRuntime::get(); }

bool use_device(int device) { return device >= 0 && cuda().available() && device < cuda().device_count(); }

Status checked(int code, const char* what) {
  if (code == 0) return Status::Ok();
  return Status::Error(StatusCode::kInternal, std::string(what) + ": " + cuda().error_string(code));
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

CudaStream::CudaStream(int device) : device_(device) {
  if (!use_device(device)) {
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

CudaEvent::CudaEvent(int device) {
  if (use_device(device) && cuda().event_create(device, &handle_) != 0) handle_ = nullptr;
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

namespace {

std::byte* allocate_memory(int device, size_t size) {
  void* p = device >= 0 ? cuda().device_alloc(device, size) : std::aligned_alloc(4096, size);
  return static_cast<std::byte*>(p);
}

void free_memory(int device, std::byte* p) {
  if (device >= 0) {
    cuda().device_free(device, p);
  } else {
    std::free(p);
  }
}

}  // namespace

struct DeviceBufferPool::State {
  std::mutex mutex;
  Stats stats;                                              // guarded by mutex
  std::map<size_t, std::vector<std::byte*>> free_by_class;  // guarded by mutex
  bool closed = false;  // guarded by mutex: the pool is gone, returning buffers are freed
};

DeviceBufferPool::DeviceBufferPool(int device, size_t capacity_bytes)
    : device_(use_device(device) ? device : -1), state_(std::make_shared<State>()) {
  state_->stats.capacity_bytes = capacity_bytes;
  state_->stats.on_device = device_ >= 0;
}

DeviceBufferPool::~DeviceBufferPool() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (auto& [size, list] : state_->free_by_class) {
    for (std::byte* p : list) free_memory(device_, p);
  }
  state_->free_by_class.clear();
  state_->closed = true;
}

std::shared_ptr<DeviceBufferPool::Buffer> DeviceBufferPool::lease(size_t size) {
  size_t cls = 4096;
  while (cls < size) cls <<= 1;
  Buffer buffer{nullptr, cls};
  bool pooled = true;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    Stats& s = state_->stats;
    auto& list = state_->free_by_class[cls];
    if (!list.empty()) {
      buffer.data = list.back();
      list.pop_back();
      ++s.reuses;
    } else if (s.pooled_bytes + cls <= s.capacity_bytes) {
      buffer.data = allocate_memory(device_, cls);
      if (buffer.data == nullptr) throw std::bad_alloc();
      s.pooled_bytes += cls;
      ++s.allocations;
    } else {
      pooled = false;
      ++s.fallbacks;
    }
    if (pooled) s.leased_bytes += cls;
  }
  if (!pooled) {
    buffer.data = allocate_memory(device_, cls);
    if (buffer.data == nullptr) throw std::bad_alloc();
  }
  // The deleter returns the buffer to its free list, or frees it (a fallback, or the pool is gone).
  std::weak_ptr<State> pool = state_;
  const int device = device_;
  return std::shared_ptr<Buffer>(std::make_unique<Buffer>(buffer).release(), [pool, device, pooled](Buffer* b) {
    std::unique_ptr<Buffer> owned(b);
    auto state = pooled ? pool.lock() : nullptr;
    if (state != nullptr) {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (!state->closed) {
        state->stats.leased_bytes -= owned->size;
        state->free_by_class[owned->size].push_back(owned->data);
        return;
      }
    }
    free_memory(device, owned->data);
  });
}

DeviceBufferPool::Stats DeviceBufferPool::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

}  // namespace inferd
