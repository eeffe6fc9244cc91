#pragma once

#include <cstddef>

#include "inferd/buffer_pool.h"

namespace inferd {

// Host memory for batch assembly that the GPU's copy engines can read directly: page-locked by the
// CUDA runtime when one and a device are present (and wanted), else page-aligned ordinary memory,
// so the same code runs without a GPU. A memory kind for BufferPool (see its requirements).
class PinnedHostMemory {
 public:
  struct Block {
    std::byte* data = nullptr;
    bool pinned = false;  // page-locked by the CUDA runtime (else page-aligned host memory)
  };
  struct Facts {
    bool pinned = false;  // the pool page-locks its buffers
  };

  // `use_cuda`: page-lock with the CUDA runtime if it is available.
  explicit PinnedHostMemory(bool use_cuda);

  // Page-locked when the runtime is used and can, else page-aligned.
  Block allocate(size_t size) const;
  // Page-aligned, never page-locked: page-locked memory is the scarce thing the pool's bound limits.
  Block allocate_fallback(size_t size) const;
  void free(const Block& block) const;
  Facts facts() const { return {pinned_}; }

 private:
  bool pinned_;
};

// Reusable host buffers for batch assembly, bounded in total bytes (Triton's
// --pinned-memory-pool-byte-size, default 256 MiB): BufferPool over PinnedHostMemory, which holds
// the algorithm and its invariants. This class only names the kind and keeps the constructor its
// users (the scheduler, the bindings) call.
class PinnedBufferPool final : public BufferPool<PinnedHostMemory> {
 public:
  explicit PinnedBufferPool(size_t capacity_bytes, bool use_cuda = true)
      : BufferPool(capacity_bytes, PinnedHostMemory(use_cuda)) {}
};

// A buffer leased from a PinnedBufferPool: data, size, pinned, pooled.
using PooledBuffer = PinnedBufferPool::Buffer;

extern template class BufferPool<PinnedHostMemory>;  // instantiated once, in pinned_buffer_pool.cpp

}  // namespace inferd
