// The pool algorithm (BufferPool) over both memory kinds, each wrapped in a kind that counts
// allocations and frees: every block must be freed exactly once, whatever outlives what.
// On a GPU (make gpu-check) the kinds are real page-locked and device memory; else the stand-ins.
#include "inferd/buffer_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "inferd/cuda_runtime.h"
#include "inferd/device_buffer_pool.h"
#include "inferd/pinned_buffer_pool.h"

namespace inferd {
namespace {

struct Counts {
  std::atomic<int> allocated{0};
  std::atomic<int> freed{0};
  std::function<void()> on_free;  // run once, from the next free(), then cleared
};

// A memory kind that forwards to `Kind` and counts what it allocates and frees.
template <typename Kind>
class Counted {
 public:
  using Block = typename Kind::Block;
  using Facts = typename Kind::Facts;

  Counted(Kind kind, std::shared_ptr<Counts> counts) : kind_(std::move(kind)), counts_(std::move(counts)) {}

  Block allocate(size_t size) const { return counted(kind_.allocate(size)); }
  Block allocate_fallback(size_t size) const { return counted(kind_.allocate_fallback(size)); }
  void free(const Block& block) const {
    kind_.free(block);
    ++counts_->freed;
    if (auto hook = std::exchange(counts_->on_free, nullptr)) hook();
  }
  Facts facts() const { return kind_.facts(); }

 private:
  Block counted(Block block) const {
    if (block.data != nullptr) ++counts_->allocated;
    return block;
  }

  Kind kind_;
  std::shared_ptr<Counts> counts_;
};

int test_device() { return CudaRuntime::get().available() ? 0 : -1; }

template <typename Kind>
Kind make_kind();
template <>
PinnedHostMemory make_kind() {
  return PinnedHostMemory(/*use_cuda=*/true);
}
template <>
DeviceMemory make_kind() {
  return DeviceMemory(test_device());
}

template <typename Kind>
class BufferPoolTest : public ::testing::Test {
 protected:
  using Pool = BufferPool<Counted<Kind>>;

  std::unique_ptr<Pool> make_pool(size_t capacity_bytes) {
    return std::make_unique<Pool>(capacity_bytes, Counted<Kind>(make_kind<Kind>(), counts));
  }

  std::shared_ptr<Counts> counts = std::make_shared<Counts>();
};

struct KindName {
  template <typename Kind>
  static std::string GetName(int) {
    return std::is_same_v<Kind, PinnedHostMemory> ? "PinnedHostMemory" : "DeviceMemory";
  }
};
using Kinds = ::testing::Types<PinnedHostMemory, DeviceMemory>;
TYPED_TEST_SUITE(BufferPoolTest, Kinds, KindName);

TYPED_TEST(BufferPoolTest, ReusesAReleasedBufferOfTheSameSizeClass) {
  auto pool = this->make_pool(1 << 20);
  for (int i = 0; i < 10; ++i) {
    auto a = pool->lease(10'000);
    auto b = pool->lease(3'000);
    EXPECT_EQ(a->size, 16u << 10);
    EXPECT_EQ(b->size, 4u << 10);
    EXPECT_TRUE(a->pooled);
  }
  const auto s = pool->stats();
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.reuses, 18u);
  EXPECT_EQ(s.leased_bytes, 0u);
  EXPECT_EQ(s.pooled_bytes, 20u << 10);
  EXPECT_EQ(this->counts->allocated.load(), 2);
  EXPECT_EQ(this->counts->freed.load(), 0);
  pool.reset();  // the free lists are freed with the pool
  EXPECT_EQ(this->counts->freed.load(), 2);
}

// Before the one template, the device pool did not evict: this lease fell back outside the pool.
TYPED_TEST(BufferPoolTest, OverTheBoundEvictsOtherSizesBeforeFallingBack) {
  auto pool = this->make_pool(64 << 10);
  pool->lease(4096);                 // released at once: 4 KiB cached
  pool->lease(16384);                // 16 KiB cached: 20 KiB pooled
  auto big = pool->lease(48 << 10);  // a 64 KiB class: both cached buffers must go first
  EXPECT_TRUE(big->pooled);
  EXPECT_EQ(this->counts->freed.load(), 2);
  auto s = pool->stats();
  EXPECT_EQ(s.pooled_bytes, 64u << 10);
  EXPECT_EQ(s.fallbacks, 0u);
  auto extra = pool->lease(4096);  // nothing left to evict: outside the pool
  EXPECT_FALSE(extra->pooled);
  s = pool->stats();
  EXPECT_EQ(s.fallbacks, 1u);
  EXPECT_EQ(s.pooled_bytes, 64u << 10);
  EXPECT_EQ(s.leased_bytes, 64u << 10);  // fallbacks are not the pool's bytes
}

TYPED_TEST(BufferPoolTest, FallbacksAreFreedOnReleaseNotCached) {
  auto pool = this->make_pool(8 << 10);
  auto held = pool->lease(8 << 10);
  for (int i = 0; i < 3; ++i) {
    auto extra = pool->lease(100);
    EXPECT_FALSE(extra->pooled);
  }
  EXPECT_EQ(pool->stats().fallbacks, 3u);
  EXPECT_EQ(pool->stats().reuses, 0u);
  EXPECT_EQ(this->counts->allocated.load(), 4);
  EXPECT_EQ(this->counts->freed.load(), 3);
}

// The closed flag: a buffer released after its pool is destroyed is freed (it holds the pool's
// state, so it would otherwise go onto a free list no one frees).
TYPED_TEST(BufferPoolTest, ABufferOutlivingItsPoolIsFreedWhenReleased) {
  auto pool = this->make_pool(1 << 20);
  auto kept = pool->lease(100);
  pool->lease(100'000);  // cached: freed with the pool
  pool.reset();
  EXPECT_EQ(this->counts->freed.load(), 1);
  kept.reset();
  EXPECT_EQ(this->counts->freed.load(), 2);
  EXPECT_EQ(this->counts->allocated.load(), 2);
}

// Before the one template, the pinned pool had no closed flag: a buffer released while its
// destructor ran (after it had emptied the free lists) went onto a free list no one freed. Here
// the release happens from inside the destructor's first free, deterministically.
TYPED_TEST(BufferPoolTest, ABufferReleasedWhileThePoolIsBeingDestroyedIsFreed) {
  auto pool = this->make_pool(1 << 20);
  auto kept = pool->lease(100);
  pool->lease(100);  // cached: the destructor frees it, and the hook runs then
  pool->lease(100'000);
  this->counts->on_free = [&kept] { kept.reset(); };
  pool.reset();
  EXPECT_EQ(kept, nullptr);
  EXPECT_EQ(this->counts->allocated.load(), 3);
  EXPECT_EQ(this->counts->freed.load(), 3);
}

TYPED_TEST(BufferPoolTest, BuffersReleasedConcurrentlyAfterThePoolAreEachFreedOnce) {
  constexpr int kThreads = 4, kBuffers = 50;
  auto pool = this->make_pool(1 << 20);
  std::vector<std::vector<std::shared_ptr<typename TestFixture::Pool::Buffer>>> held(kThreads);
  for (auto& list : held) {
    for (int i = 0; i < kBuffers; ++i) list.push_back(pool->lease(4096 << (i % 4)));  // some fall back
  }
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (auto& list : held) {
    threads.emplace_back([&go, &list] {
      while (!go) std::this_thread::yield();
      list.clear();
    });
  }
  go = true;
  pool.reset();  // races the releases
  for (auto& t : threads) t.join();
  EXPECT_EQ(this->counts->allocated.load(), kThreads * kBuffers);
  EXPECT_EQ(this->counts->freed.load(), kThreads * kBuffers);
}

TYPED_TEST(BufferPoolTest, ASizeNoClassHoldsIsRefused) {
  auto pool = this->make_pool(1 << 20);
  EXPECT_THROW(pool->lease(~size_t{0}), std::bad_alloc);
  EXPECT_EQ(this->counts->allocated.load(), 0);
}

}  // namespace
}  // namespace inferd
