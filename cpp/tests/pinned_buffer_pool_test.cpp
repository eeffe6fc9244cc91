#include "inferd/pinned_buffer_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "inferd/cuda_runtime.h"

namespace inferd {
namespace {

TEST(PinnedBufferPool, ReusesBuffersSoSteadyStateAllocatesNothing) {
  PinnedBufferPool pool(1 << 20, /*use_cuda=*/false);
  for (int i = 0; i < 100; ++i) {
    auto a = pool.lease(10'000);
    auto b = pool.lease(3'000);
    ASSERT_GE(a->size, 10'000u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 4096, 0u);  // page-aligned
    a->data[9'999] = std::byte{1};
  }
  const auto stats = pool.stats();
  EXPECT_EQ(stats.allocations, 2u);  // one per size class, then only reuse
  EXPECT_EQ(stats.reuses, 198u);
  EXPECT_EQ(stats.leased_bytes, 0u);
  EXPECT_EQ(stats.fallbacks, 0u);
}

TEST(PinnedBufferPool, OverTheBoundFreesOtherSizesThenFallsBack) {
  PinnedBufferPool pool(64 * 1024, /*use_cuda=*/false);
  pool.lease(4096);                  // returned at once: 4 KiB cached
  auto big = pool.lease(64 * 1024);  // needs the cached 4 KiB freed first
  EXPECT_TRUE(big->pooled);
  EXPECT_EQ(pool.stats().pooled_bytes, 64u * 1024);
  auto extra = pool.lease(4096);  // nothing left to free: outside the pool
  EXPECT_FALSE(extra->pooled);
  EXPECT_EQ(pool.stats().fallbacks, 1u);
}

TEST(PinnedBufferPool, BuffersOutliveThePool) {
  std::shared_ptr<PooledBuffer> kept;
  {
    PinnedBufferPool pool(1 << 20, /*use_cuda=*/false);
    kept = pool.lease(100);
  }
  kept->data[0] = std::byte{7};  // still valid; freed when `kept` goes (ASan checks)
  EXPECT_EQ(kept->data[0], std::byte{7});
}

// Before the one pool template the pinned pool had no closed flag; buffer_pool_test.cpp checks it
// with counted allocations. Here the public name: a buffer released after the pool is freed, not
// cached (LeakSanitizer, in the ASan build, would report a cached one).
TEST(PinnedBufferPool, ABufferReleasedAfterThePoolIsFreed) {
  auto pool = std::make_unique<PinnedBufferPool>(1 << 20, /*use_cuda=*/false);
  auto kept = pool->lease(100);
  EXPECT_TRUE(kept->pooled);
  EXPECT_FALSE(kept->pinned);
  pool.reset();
  kept.reset();
}

TEST(PinnedBufferPool, PinsOnlyWithCuda) {
  EXPECT_FALSE(PinnedBufferPool(1 << 20, /*use_cuda=*/false).stats().pinned);
  PinnedBufferPool pool(1 << 20);
  EXPECT_EQ(pool.stats().pinned, CudaRuntime::get().available());
  EXPECT_EQ(pool.lease(100)->pinned, CudaRuntime::get().available());
  EXPECT_FALSE(PinnedBufferPool(4096).lease(8192)->pinned);  // a fallback is ordinary memory
}

TEST(PinnedBufferPool, ConcurrentLeasesAreDistinct) {
  PinnedBufferPool pool(1 << 24, /*use_cuda=*/false);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 1000; ++i) {
        auto b = pool.lease(8192);
        b->data[0] = static_cast<std::byte>(t);
        std::this_thread::yield();
        ASSERT_EQ(b->data[0], static_cast<std::byte>(t));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(pool.stats().allocations, 4u);
}

}  // namespace
}  // namespace inferd
