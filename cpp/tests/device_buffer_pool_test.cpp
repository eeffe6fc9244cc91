// DeviceBufferPool through its public name; the algorithm's own tests (both memory kinds, counted
// allocations) are in buffer_pool_test.cpp. Real device memory on a GPU, the host stand-in else.
#include "inferd/device_buffer_pool.h"

#include <gtest/gtest.h>

#include <memory>

#include "inferd/cuda_runtime.h"

namespace inferd {
namespace {

int test_device() { return CudaRuntime::get().available() ? 0 : -1; }

TEST(DeviceBufferPool, ReusesFallsBackAndOutlivesThePool) {
  auto pool = std::make_unique<DeviceBufferPool>(test_device(), 64 << 10);
  {
    auto a = pool->lease(10000);
  }  // 16 KiB class, back to the free list
  auto b = pool->lease(12000);
  EXPECT_EQ(pool->stats().reuses, 1u);
  EXPECT_EQ(pool->stats().allocations, 1u);
  auto big = pool->lease(128 << 10);  // over the 64 KiB bound: outside the pool
  EXPECT_FALSE(big->pooled);
  EXPECT_EQ(pool->stats().fallbacks, 1u);
  EXPECT_EQ(pool->stats().leased_bytes, 16u << 10);
  pool.reset();  // buffers still leased are freed when released (ASan checks)
  b.reset();
  big.reset();
}

// Before the one pool template the device pool did not evict: the 64 KiB lease fell back to an
// allocation outside the pool while 16 KiB of free buffers sat cached.
TEST(DeviceBufferPool, OverTheBoundFreesOtherSizesThenFallsBack) {
  DeviceBufferPool pool(test_device(), 64 << 10);
  pool.lease(16 << 10);  // returned at once: 16 KiB cached
  auto big = pool.lease(64 << 10);
  EXPECT_TRUE(big->pooled);
  EXPECT_EQ(pool.stats().fallbacks, 0u);
  EXPECT_EQ(pool.stats().pooled_bytes, 64u << 10);
  EXPECT_EQ(pool.stats().allocations, 2u);
  auto extra = pool.lease(4096);  // nothing left to free: outside the pool
  EXPECT_FALSE(extra->pooled);
  EXPECT_EQ(pool.stats().fallbacks, 1u);
}

TEST(DeviceBufferPool, ReportsItsDeviceAndWhetherItIsOnOne) {
  DeviceBufferPool pool(test_device(), 1 << 20);
  EXPECT_EQ(pool.device(), test_device());
  EXPECT_EQ(pool.stats().on_device, test_device() >= 0);
  EXPECT_EQ(pool.stats().capacity_bytes, 1u << 20);
  DeviceBufferPool host(-1, 1 << 20);  // -1: the host stand-in, even with a GPU
  EXPECT_EQ(host.device(), -1);
  EXPECT_FALSE(host.stats().on_device);
}

}  // namespace
}  // namespace inferd
