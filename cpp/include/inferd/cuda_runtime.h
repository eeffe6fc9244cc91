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

 private:
  CudaRuntime();
  int set_device(int device) const;

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
  int device_count_ = 0;
  std::string description_;
};

}  // namespace inferd
