#include "inferd/cuda_runtime.h"

#include <dlfcn.h>

namespace inferd {

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
    auto device_count = reinterpret_cast<DeviceCountFn>(dlsym(lib, "cudaGetDeviceCount"));
    auto host_alloc = reinterpret_cast<HostAllocFn>(dlsym(lib, "cudaHostAlloc"));
    auto free_host = reinterpret_cast<FreeHostFn>(dlsym(lib, "cudaFreeHost"));
    int devices = 0;
    if (device_count == nullptr || host_alloc == nullptr || free_host == nullptr) {
      description_ = std::string(name) + " lacks the functions inferd needs";
      continue;
    }
    if (device_count(&devices) != 0 || devices == 0) {
      description_ = std::string(name) + " found, but no CUDA device";
      continue;
    }
    host_alloc_ = host_alloc;
    free_host_ = free_host;
    device_count_ = devices;
    description_ = std::string(name) + " with " + std::to_string(devices) + " device(s)";
    return;
  }
  if (description_.empty()) description_ = "no CUDA runtime library (libcudart) found";
}

void* CudaRuntime::host_alloc(size_t size) const {
  if (host_alloc_ == nullptr) return nullptr;
  void* ptr = nullptr;
  constexpr unsigned int kPortable = 0x01;  // cudaHostAllocPortable: usable from every context
  return host_alloc_(&ptr, size, kPortable) == 0 ? ptr : nullptr;
}

void CudaRuntime::host_free(void* ptr) const {
  if (free_host_ != nullptr && ptr != nullptr) free_host_(ptr);
}

}  // namespace inferd
