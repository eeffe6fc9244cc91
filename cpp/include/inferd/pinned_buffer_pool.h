#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace inferd {

// A buffer leased from a PinnedBufferPool. Returned to the pool when the last shared_ptr to it
// goes, from whichever thread; freed instead if the pool is gone by then.
struct PooledBuffer {
  std::byte* data = nullptr;
  size_t size = 0;      // usable bytes: at least what was asked for
  bool pinned = false;  // page-locked by the CUDA runtime (else page-aligned host memory)
  bool pooled = true;   // false: a fallback allocation outside the pool's bound
};

// Reusable host buffers for batch assembly, bounded in total bytes (Triton's
// --pinned-memory-pool-byte-size, default 256 MiB). Buffers come in power-of-two size classes
// (at least one page) and go back to a free list on release, so a steady stream of batches of
// the same sizes allocates nothing after warm-up (see Stats::allocations).
// Memory is page-locked with the CUDA runtime when one and a device are present, else page-aligned.
// When the bound is reached, free buffers of other sizes are released first; if that is not
// enough, the lease falls back to an ordinary allocation outside the pool (counted).
// Every method is thread-safe and blocks only on the internal lock and the allocator.
class PinnedBufferPool {
 public:
  struct Stats {
    uint64_t capacity_bytes = 0;
    uint64_t pooled_bytes = 0;  // held by the pool: leased plus free
    uint64_t leased_bytes = 0;
    uint64_t allocations = 0;  // buffers allocated for the pool
    uint64_t reuses = 0;       // leases served from a free list
    uint64_t fallbacks = 0;    // leases served outside the pool because it was full
    bool pinned = false;
  };

  // `use_cuda`: page-lock with the CUDA runtime if it is available.
  explicit PinnedBufferPool(size_t capacity_bytes, bool use_cuda = true);
  ~PinnedBufferPool();
  PinnedBufferPool(const PinnedBufferPool&) = delete;
  PinnedBufferPool& operator=(const PinnedBufferPool&) = delete;

  // A buffer of at least `size` bytes. Throws std::bad_alloc only if even the fallback fails.
  std::shared_ptr<PooledBuffer> lease(size_t size);
  Stats stats() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace inferd
