#pragma once

#include <cstddef>
#include <string>

namespace inferd {

// The CUDA runtime, found at run time with dlopen: the core builds and runs without a CUDA toolkit,
// and uses pinned host memory, device memory, streams and events when libcudart and a device are
// there. Handles (streams, events) are the runtime's opaque pointers, passed as void*.
// Invariant: once get() has returned, the library stays loaded for the life of the process, so the
// function pointers never dangle (buffers freed at exit still find cudaFreeHost).
// Every method is thread-safe; the ones taking a device make it current on the calling thread.
class CudaRuntime {
 public:
  // The process-wide instance; the first call loads the library.
  static const CudaRuntime& get();

  // True when libcudart loaded, has every function below and reports at least one device.
  bool available() const { return host_alloc_ != nullptr; }
  // CUDA devices visible to this process (CUDA_VISIBLE_DEVICES applies); 0 when unavailable.
  int device_count() const { return device_count_; }
  // Which library was used, or why none could be.
  const std::string& description() const { return description_; }
  // The runtime's text for an error code.
  std::string error_string(int code) const;

  // Page-locked host memory from cudaHostAlloc; nullptr when unavailable or on failure.
  // May block while the driver maps the memory.
  void* host_alloc(size_t size) const;
  void host_free(void* ptr) const;

  // Device memory on `device`; nullptr when unavailable or on failure.
  void* device_alloc(int device, size_t size) const;
  void device_free(int device, void* ptr) const;

  // The calls below return the runtime's error code (0 = success; -1 when unavailable).
  int stream_create(int device, void** stream) const;  // a non-blocking stream
  int stream_destroy(void* stream) const;
  int stream_synchronize(void* stream) const;
  int stream_wait_event(void* stream, void* event) const;
  enum class CopyKind : int { kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3 };
  int memcpy_async(void* dst, const void* src, size_t size, CopyKind kind, void* stream) const;
  int event_create(int device, void** event) const;
  int event_destroy(void* event) const;
  int event_record(void* event, void* stream) const;
  int event_synchronize(void* event) const;
  int event_elapsed_ms(float* ms, void* start, void* end) const;
  // A synchronous cudaMemcpy with `device` current: returns once the bytes are there.
  int memcpy_sync(int device, void* dst, const void* src, size_t size, CopyKind kind) const;

  // CUDA IPC, for memory another process exported (cudaIpcGetMemHandle). `handle` is a
  // cudaIpcMemHandle_t: kIpcHandleSize opaque bytes. ipc_open maps it on `device`
  // (cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess); ipc_close unmaps it.
  static constexpr size_t kIpcHandleSize = 64;
  int ipc_open(int device, const void* handle, void** ptr) const;
  int ipc_close(int device, void* ptr) const;
  // The allocation that holds `ptr` on `device`, as the driver knows it (cuMemGetAddressRange_v2
  // from libcuda.so.1, which the runtime does not export): its first byte and its size. The one
  // source of truth for a client's allocation size. Returns the driver's CUresult (0 = success;
  // not the runtime's codes: error_string does not apply), -1 when the driver library is not there.
  int allocation_range(int device, const void* ptr, const void** base, size_t* size) const;
  // Whether ipc_open/ipc_close and allocation_range can work, or why not (empty when they can).
  const std::string& ipc_unavailable() const { return ipc_unavailable_; }

 private:
  CudaRuntime();
  int set_device(int device) const;
  void find_ipc(void* runtime, const char* runtime_name);

  using HostAllocFn = int (*)(void**, size_t, unsigned int);
  using PtrFn = int (*)(void*);
  using MallocFn = int (*)(void**, size_t);
  using SetDeviceFn = int (*)(int);
  using CreateWithFlagsFn = int (*)(void**, unsigned int);
  using TwoHandlesFn = int (*)(void*, void*);
  using WaitEventFn = int (*)(void*, void*, unsigned int);
  using MemcpyAsyncFn = int (*)(void*, const void*, size_t, int, void*);
  using ElapsedFn = int (*)(float*, void*, void*);
  using ErrorStringFn = const char* (*)(int);

  HostAllocFn host_alloc_ = nullptr;
  PtrFn free_host_ = nullptr;
  MallocFn malloc_ = nullptr;
  PtrFn free_ = nullptr;
  SetDeviceFn set_device_ = nullptr;
  CreateWithFlagsFn stream_create_ = nullptr;
  PtrFn stream_destroy_ = nullptr;
  PtrFn stream_synchronize_ = nullptr;
  WaitEventFn stream_wait_event_ = nullptr;
  MemcpyAsyncFn memcpy_async_ = nullptr;
  CreateWithFlagsFn event_create_ = nullptr;
  PtrFn event_destroy_ = nullptr;
  TwoHandlesFn event_record_ = nullptr;
  PtrFn event_synchronize_ = nullptr;
  ElapsedFn event_elapsed_ = nullptr;
  ErrorStringFn error_string_ = nullptr;
  struct IpcHandle {  // cudaIpcMemHandle_t's layout: passed by value
    char reserved[kIpcHandleSize];
  };
  using IpcOpenFn = int (*)(void**, IpcHandle, unsigned int);
  using MemcpyFn = int (*)(void*, const void*, size_t, int);
  using AddressRangeFn = int (*)(unsigned long long*, size_t*, unsigned long long);  // CUdeviceptr
  MemcpyFn memcpy_ = nullptr;
  IpcOpenFn ipc_open_ = nullptr;
  PtrFn ipc_close_ = nullptr;
  AddressRangeFn address_range_ = nullptr;
  std::string ipc_unavailable_;
  int device_count_ = 0;
  std::string description_;
};

}  // namespace inferd
