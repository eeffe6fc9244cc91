#pragma once

#include <cstddef>
#include <string>

namespace inferd {

// The CUDA runtime, found at run time with dlopen: the core builds and runs without a CUDA toolkit,
// and uses pinned host memory when libcudart and a device are there.
// Invariant: once get() has returned, the library stays loaded for the life of the process, so the
// function pointers never dangle (buffers freed at exit still find cudaFreeHost).
class CudaRuntime {
 public:
  // The process-wide instance; the first call loads the library. Thread-safe.
  static const CudaRuntime& get();

  // True when libcudart loaded and reports at least one device.
  bool available() const { return host_alloc_ != nullptr; }
  // CUDA devices visible to this process (CUDA_VISIBLE_DEVICES applies); 0 when unavailable.
  int device_count() const { return device_count_; }
  // Which library was used, or why none could be.
  const std::string& description() const { return description_; }

  // Page-locked host memory from cudaHostAlloc; nullptr when unavailable or on failure.
  // Thread-safe; may block while the driver maps the memory.
  void* host_alloc(size_t size) const;
  // Frees memory from host_alloc. Thread-safe.
  void host_free(void* ptr) const;

 private:
  CudaRuntime();
  using HostAllocFn = int (*)(void**, size_t, unsigned int);
  using FreeHostFn = int (*)(void*);
  HostAllocFn host_alloc_ = nullptr;
  FreeHostFn free_host_ = nullptr;
  int device_count_ = 0;
  std::string description_;
};

}  // namespace inferd
