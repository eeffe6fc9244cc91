#include "inferd/cuda_runtime.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstring>

namespace inferd {
namespace {

constexpr int kUnavailable = -1;

template <typename Fn>
bool find(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

const CudaRuntime& CudaRuntime::get() {
  static const CudaRuntime instance;  // initialised once, thread-safe (C++11 statics)
  return instance;
}

CudaRuntime::CudaRuntime() {
  using DeviceCountFn = int (*)(int*);
  for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}) {
    // Never dlclose'd: see the invariant in the header.
    void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) continue;
    DeviceCountFn get_device_count = nullptr;
    HostAllocFn host_alloc_fn = nullptr;
    const bool complete =
        find(lib, "cudaGetDeviceCount", &get_device_count) && find(lib, "cudaHostAlloc", &host_alloc_fn) &&
        find(lib, "cudaFreeHost", &free_host_) && find(lib, "cudaMalloc", &malloc_) && find(lib, "cudaFree", &free_) &&
        find(lib, "cudaSetDevice", &set_device_) && find(lib, "cudaStreamCreateWithFlags", &stream_create_) &&
        find(lib, "cudaStreamDestroy", &stream_destroy_) && find(lib, "cudaStreamSynchronize", &stream_synchronize_) &&
        find(lib, "cudaStreamWaitEvent", &stream_wait_event_) && find(lib, "cudaMemcpyAsync", &memcpy_async_) &&
        find(lib, "cudaEventCreateWithFlags", &event_create_) && find(lib, "cudaEventDestroy", &event_destroy_) &&
        find(lib, "cudaEventRecord", &event_record_) && find(lib, "cudaEventSynchronize", &event_synchronize_) &&
        find(lib, "cudaEventElapsedTime", &event_elapsed_) && find(lib, "cudaGetErrorString", &error_string_);
    if (!complete) {
      description_ = std::string(name) + " lacks the functions inferd needs";
      continue;
    }
    int devices = 0;
    if (get_device_count(&devices) != 0 || devices == 0) {
      description_ = std::string(name) + " found, but no CUDA device";
      continue;
    }
    host_alloc_ = host_alloc_fn;  // last: available() reads it
    device_count_ = devices;
    description_ = std::string(name) + " with " + std::to_string(devices) + " device(s)";
    find_ipc(lib, name);
    return;
  }
  if (description_.empty()) description_ = "no CUDA runtime library (libcudart) found";
  ipc_unavailable_ = description_;
}

// Optional: what CUDA shared memory needs beyond the rest. Its absence switches that off alone.
void CudaRuntime::find_ipc(void* runtime, const char* runtime_name) {
  if (!find(runtime, "cudaMemcpy", &memcpy_) || !find(runtime, "cudaIpcOpenMemHandle", &ipc_open_) ||
      !find(runtime, "cudaIpcCloseMemHandle", &ipc_close_)) {
    ipc_open_ = nullptr;
    ipc_unavailable_ = std::string(runtime_name) + " lacks cudaMemcpy or cudaIpc{Open,Close}MemHandle";
    return;
  }
  // The driver library the runtime itself loaded (never dlclose'd either).
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr || !find(driver, "cuMemGetAddressRange_v2", &address_range_)) {
    ipc_open_ = nullptr;
    ipc_unavailable_ =
        "libcuda.so.1 with cuMemGetAddressRange_v2 not found: a client's allocation size cannot be checked";
  }
}

std::string CudaRuntime::error_string(int code) const {
  if (code == kUnavailable || error_string_ == nullptr) return "CUDA unavailable: " + description_;
  return std::string("CUDA error ") + std::to_string(code) + ": " + error_string_(code);
}

int CudaRuntime::set_device(int device) const {
  if (!available()) return kUnavailable;
  return set_device_(device);
}

void* CudaRuntime::host_alloc(size_t size) const {
  if (!available()) return nullptr;
  void* ptr = nullptr;
  constexpr unsigned int kPortable = 0x01;  // cudaHostAllocPortable: usable from every context
  return host_alloc_(&ptr, size, kPortable) == 0 ? ptr : nullptr;
}

void CudaRuntime::host_free(void* ptr) const {
  if (available() && ptr != nullptr) free_host_(ptr);
}

void* CudaRuntime::device_alloc(int device, size_t size) const {
  void* ptr = nullptr;
  if (set_device(device) != 0 || malloc_(&ptr, size) != 0) return nullptr;
  return ptr;
}

void CudaRuntime::device_free(int device, void* ptr) const {
  if (ptr != nullptr && set_device(device) == 0) free_(ptr);
}

int CudaRuntime::stream_create(int device, void** stream) const {
  constexpr unsigned int kNonBlocking = 0x01;  // no implicit sync with the legacy default stream
  const int status = set_device(device);
  return status != 0 ? status : stream_create_(stream, kNonBlocking);
}

int CudaRuntime::stream_destroy(void* stream) const { return available() ? stream_destroy_(stream) : kUnavailable; }

int CudaRuntime::stream_synchronize(void* stream) const {
  return available() ? stream_synchronize_(stream) : kUnavailable;
}

int CudaRuntime::stream_wait_event(void* stream, void* event) const {
  return available() ? stream_wait_event_(stream, event, 0) : kUnavailable;
}

int CudaRuntime::memcpy_async(void* dst, const void* src, size_t size, CopyKind kind, void* stream) const {
  return available() ? memcpy_async_(dst, src, size, static_cast<int>(kind), stream) : kUnavailable;
}

int CudaRuntime::event_create(int device, void** event) const {
  constexpr unsigned int kDefault = 0x00;  // with timing
  const int status = set_device(device);
  return status != 0 ? status : event_create_(event, kDefault);
}

int CudaRuntime::event_destroy(void* event) const { return available() ? event_destroy_(event) : kUnavailable; }

int CudaRuntime::event_record(void* event, void* stream) const {
  return available() ? event_record_(event, stream) : kUnavailable;
}

int CudaRuntime::event_synchronize(void* event) const { return available() ? event_synchronize_(event) : kUnavailable; }

int CudaRuntime::event_elapsed_ms(float* ms, void* start, void* end) const {
  return available() ? event_elapsed_(ms, start, end) : kUnavailable;
}

int CudaRuntime::memcpy_sync(int device, void* dst, const void* src, size_t size, CopyKind kind) const {
  if (memcpy_ == nullptr) return kUnavailable;
  const int status = set_device(device);
  return status != 0 ? status : memcpy_(dst, src, size, static_cast<int>(kind));
}

int CudaRuntime::ipc_open(int device, const void* handle, void** ptr) const {
  if (ipc_open_ == nullptr) return kUnavailable;
  const int status = set_device(device);
  if (status != 0) return status;
  IpcHandle value;
  std::memcpy(value.reserved, handle, kIpcHandleSize);
  constexpr unsigned int kLazyEnablePeerAccess = 0x01;  // cudaIpcMemLazyEnablePeerAccess
  return ipc_open_(ptr, value, kLazyEnablePeerAccess);
}

int CudaRuntime::ipc_close(int device, void* ptr) const {
  if (ipc_close_ == nullptr) return kUnavailable;
  const int status = set_device(device);
  return status != 0 ? status : ipc_close_(ptr);
}

int CudaRuntime::allocation_range(int device, const void* ptr, const void** base, size_t* size) const {
  if (address_range_ == nullptr) return kUnavailable;
  // The driver API works on the current context: the device's primary one, made current here.
  const int status = set_device(device);
  if (status != 0) return status;
  unsigned long long first = 0;
  const int result = address_range_(&first, size, reinterpret_cast<uintptr_t>(ptr));
  *base = reinterpret_cast<const void*>(static_cast<uintptr_t>(first));
  return result;
}

}  // namespace inferd
