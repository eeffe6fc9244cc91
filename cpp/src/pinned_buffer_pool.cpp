#include "inferd/pinned_buffer_pool.h"

#include <cstdlib>

#include "inferd/cuda_runtime.h"

namespace inferd {
namespace {

constexpr size_t kPage = 4096;

}  // namespace

PinnedHostMemory::PinnedHostMemory(bool use_cuda) : pinned_(use_cuda && CudaRuntime::get().available()) {}

PinnedHostMemory::Block PinnedHostMemory::allocate(size_t size) const {
  if (pinned_) {
    if (void* p = CudaRuntime::get().host_alloc(size)) return {static_cast<std::byte*>(p), true};
  }
  return allocate_fallback(size);  // the driver could not page-lock it: ordinary memory still serves
}

PinnedHostMemory::Block PinnedHostMemory::allocate_fallback(size_t size) const {
  return {static_cast<std::byte*>(std::aligned_alloc(kPage, size)), false};
}

void PinnedHostMemory::free(const Block& block) const {
  if (block.pinned) {
    CudaRuntime::get().host_free(block.data);
  } else {
    std::free(block.data);
  }
}

template class BufferPool<PinnedHostMemory>;

}  // namespace inferd
