#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace inferd {

// A buffer leased from a BufferPool<Memory>: the memory kind's block (`data` and whatever the kind
// needs to free it, e.g. PinnedHostMemory's `pinned`) plus the pool's bookkeeping. Returned to the
// pool when the last shared_ptr to it goes, from whichever thread; freed instead when it is a
// fallback or the pool is gone by then.
template <typename Memory>
struct PoolBuffer : Memory::Block {
  size_t size = 0;     // usable bytes: the size class, at least what was asked for
  bool pooled = true;  // false: a fallback allocation outside the pool's bound
};

// Reusable buffers of one memory kind, bounded in total bytes: the one pool algorithm behind
// PinnedBufferPool (page-locked host memory) and DeviceBufferPool (one device's memory).
// Buffers come in power-of-two size classes (at least one page) and go back to a free list on
// release, so a steady stream of batches of the same sizes allocates nothing after warm-up
// (Stats::allocations). When a new buffer would pass the bound, free buffers of other sizes are
// released first (largest first); if that is not enough, the lease is served by an allocation
// outside the pool, freed on release and counted in Stats::fallbacks.
//
// `Memory`, the memory kind, is a copyable value providing:
//   struct Block { std::byte* data; ... };      one allocation, and what freeing it needs
//   struct Facts { ... };                       what Stats reports about the kind (its fields)
//   Block allocate(size_t size) const;          for the pool; data == nullptr on failure
//   Block allocate_fallback(size_t size) const; for a lease outside the bound; nullptr on failure
//   void free(const Block& block) const;
//   Facts facts() const;
//
// Invariants, under State::mutex:
//  - pooled_bytes is the sum of the sizes of pooled buffers on lease and on free lists, and never
//    exceeds capacity_bytes; leased_bytes is the part on lease.
//  - Every block is freed exactly once, by the kind that allocated it: a fallback when released; a
//    pooled one when evicted, when the pool is destroyed (free lists), or when released after that.
//  - Once `closed` (set by the destructor) nothing goes onto a free list: buffers hold the shared
//    State, so one released after (or while) the pool is destroyed must be freed, not cached where
//    no one would free it.
// Every method is thread-safe and blocks only on the internal lock and the kind's allocator. Pooled
// allocations and evictions run under the lock, so the bound holds for memory actually held.
template <typename Memory>
class BufferPool {
 public:
  using Block = typename Memory::Block;
  using Buffer = PoolBuffer<Memory>;
  struct Stats : Memory::Facts {
    uint64_t capacity_bytes = 0;
    uint64_t pooled_bytes = 0;  // held by the pool: leased plus free
    uint64_t leased_bytes = 0;
    uint64_t allocations = 0;  // buffers allocated for the pool
    uint64_t reuses = 0;       // leases served from a free list
    uint64_t fallbacks = 0;    // leases served outside the pool because it was full
  };

  BufferPool(size_t capacity_bytes, Memory memory);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of at least `size` bytes. Throws std::bad_alloc when the memory cannot be allocated.
  std::shared_ptr<Buffer> lease(size_t size);
  Stats stats() const;
  const Memory& memory() const { return state_->memory; }

 private:
  struct State {
    explicit State(Memory m) : memory(std::move(m)) {}

    // Requires mutex held. Takes free buffers (largest class first) off their lists until `needed`
    // more bytes fit under the bound, freeing them.
    void evict(size_t needed) {
      for (auto it = free_lists.rbegin(); it != free_lists.rend(); ++it) {
        auto& list = it->second;
        while (!list.empty() && stats.pooled_bytes + needed > stats.capacity_bytes) {
          memory.free(list.back());
          stats.pooled_bytes -= it->first;
          list.pop_back();
        }
      }
    }

    const Memory memory;
    std::mutex mutex;
    Stats stats;                                      // guarded by mutex
    std::map<size_t, std::vector<Block>> free_lists;  // by size class; guarded by mutex
    bool closed = false;                              // guarded by mutex: the pool is gone
  };

  // Gives a released buffer back to its pool's free list, or frees it (see the invariants).
  struct Release {
    std::shared_ptr<State> state;
    void operator()(Buffer* buffer) const noexcept {
      std::unique_ptr<Buffer> owned(buffer);
      give_back(*owned);
    }
    void give_back(const Buffer& buffer) const noexcept;
  };

  // The smallest power of two, at least a page, that holds `size`.
  static size_t size_class(size_t size) {
    size_t c = 4096;
    if (size > std::numeric_limits<size_t>::max() / 2 + 1) throw std::bad_alloc();  // no class holds it
    while (c < size) c <<= 1;
    return c;
  }

  std::shared_ptr<State> state_;
};

template <typename Memory>
BufferPool<Memory>::BufferPool(size_t capacity_bytes, Memory memory)
    : state_(std::make_shared<State>(std::move(memory))) {
  static_cast<typename Memory::Facts&>(state_->stats) = state_->memory.facts();
  state_->stats.capacity_bytes = capacity_bytes;
}

template <typename Memory>
BufferPool<Memory>::~BufferPool() {
  std::map<size_t, std::vector<Block>> free_lists;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->closed = true;
    free_lists.swap(state_->free_lists);
  }
  for (auto& [size, list] : free_lists) {
    for (const Block& block : list) state_->memory.free(block);
  }
}

template <typename Memory>
std::shared_ptr<typename BufferPool<Memory>::Buffer> BufferPool<Memory>::lease(size_t size) {
  Buffer buffer;
  buffer.size = size_class(size);
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    Stats& s = state_->stats;
    auto& list = state_->free_lists[buffer.size];
    if (!list.empty()) {
      static_cast<Block&>(buffer) = list.back();
      list.pop_back();
      ++s.reuses;
    } else {
      if (s.pooled_bytes + buffer.size > s.capacity_bytes) state_->evict(buffer.size);
      buffer.pooled = s.pooled_bytes + buffer.size <= s.capacity_bytes;
      if (buffer.pooled) {
        static_cast<Block&>(buffer) = state_->memory.allocate(buffer.size);
        if (buffer.data == nullptr) throw std::bad_alloc();
        s.pooled_bytes += buffer.size;
        ++s.allocations;
      } else {
        ++s.fallbacks;
      }
    }
    if (buffer.pooled) s.leased_bytes += buffer.size;
  }
  if (!buffer.pooled) {  // over the bound: allocated (outside the lock) and freed on release
    static_cast<Block&>(buffer) = state_->memory.allocate_fallback(buffer.size);
    if (buffer.data == nullptr) throw std::bad_alloc();
  }
  Release release{state_};
  std::unique_ptr<Buffer> owned;
  try {
    owned = std::make_unique<Buffer>(buffer);
  } catch (...) {
    release.give_back(buffer);
    throw;
  }
  // If the shared_ptr cannot allocate its control block, it calls `release` on the buffer itself.
  return std::shared_ptr<Buffer>(owned.release(), std::move(release));
}

template <typename Memory>
void BufferPool<Memory>::Release::give_back(const Buffer& buffer) const noexcept {
  if (buffer.pooled) {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->stats.leased_bytes -= buffer.size;
    if (!state->closed) {
      try {
        state->free_lists[buffer.size].push_back(static_cast<const Block&>(buffer));
        return;
      } catch (const std::bad_alloc&) {  // no memory to cache it: free it instead
      }
    }
    state->stats.pooled_bytes -= buffer.size;
  }
  state->memory.free(buffer);
}

template <typename Memory>
typename BufferPool<Memory>::Stats BufferPool<Memory>::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

}  // namespace inferd
