#include "inferd/pinned_buffer_pool.h"

#include <cstdlib>
#include <new>

#include "inferd/cuda_runtime.h"

namespace inferd {
namespace {

constexpr size_t kPage = 4096;

size_t size_class(size_t size) {
  size_t c = kPage;
  while (c < size) c <<= 1;
  return c;
}

std::byte* allocate(size_t size, bool pinned) {
  void* p = pinned ? CudaRuntime::get().host_alloc(size) : std::aligned_alloc(kPage, size);
  return static_cast<std::byte*>(p);
}

void deallocate(const PooledBuffer& b) {
  if (b.pinned) {
    CudaRuntime::get().host_free(b.data);
  } else {
    std::free(b.data);
  }
}

}  // namespace

struct PinnedBufferPool::State {
  std::mutex mutex;
  Stats stats;                                               // guarded by mutex
  std::map<size_t, std::vector<PooledBuffer>> free_buffers;  // by size class; guarded by mutex

  // Requires mutex held. Frees cached buffers (largest first) until `needed` more bytes fit.
  void make_room(size_t needed) {
    for (auto it = free_buffers.rbegin(); it != free_buffers.rend(); ++it) {
      auto& list = it->second;
      while (!list.empty() && stats.pooled_bytes + needed > stats.capacity_bytes) {
        deallocate(list.back());
        stats.pooled_bytes -= list.back().size;
        list.pop_back();
      }
    }
  }
};

PinnedBufferPool::PinnedBufferPool(size_t capacity_bytes, bool use_cuda) : state_(std::make_shared<State>()) {
  state_->stats.capacity_bytes = capacity_bytes;
  state_->stats.pinned = use_cuda && CudaRuntime::get().available();
}

PinnedBufferPool::~PinnedBufferPool() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (auto& [size, list] : state_->free_buffers) {
    for (auto& b : list) deallocate(b);
  }
  state_->free_buffers.clear();
}

std::shared_ptr<PooledBuffer> PinnedBufferPool::lease(size_t size) {
  const size_t cls = size_class(size);
  PooledBuffer buffer;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    Stats& s = state_->stats;
    auto& list = state_->free_buffers[cls];
    if (!list.empty()) {
      buffer = list.back();
      list.pop_back();
      ++s.reuses;
    } else {
      if (s.pooled_bytes + cls > s.capacity_bytes) state_->make_room(cls);
      if (s.pooled_bytes + cls <= s.capacity_bytes) {
        buffer = {allocate(cls, s.pinned), cls, s.pinned, true};
        if (buffer.data == nullptr && s.pinned) buffer = {allocate(cls, false), cls, false, true};
        if (buffer.data == nullptr) throw std::bad_alloc();
        s.pooled_bytes += cls;
        ++s.allocations;
      } else {
        ++s.fallbacks;
      }
    }
    if (buffer.data != nullptr) s.leased_bytes += buffer.size;
  }
  if (buffer.data == nullptr) {  // over the bound: an ordinary allocation, freed on release
    buffer = {allocate(cls, false), cls, false, false};
    if (buffer.data == nullptr) throw std::bad_alloc();
  }
  // The deleter returns the buffer to the pool, or frees it when it is a fallback or the pool is gone.
  std::weak_ptr<State> pool = state_;
  return std::shared_ptr<PooledBuffer>(std::make_unique<PooledBuffer>(buffer).release(), [pool](PooledBuffer* b) {
    std::unique_ptr<PooledBuffer> owned(b);
    auto state = pool.lock();
    if (!owned->pooled || state == nullptr) {
      deallocate(*owned);
      return;
    }
    std::lock_guard<std::mutex> lock(state->mutex);
    state->stats.leased_bytes -= owned->size;
    state->free_buffers[owned->size].push_back(*owned);
  });
}

PinnedBufferPool::Stats PinnedBufferPool::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

}  // namespace inferd
