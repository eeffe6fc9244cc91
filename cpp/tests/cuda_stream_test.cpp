// These tests run the same code on the host stand-in (no CUDA: CI) and on a GPU (make gpu-check),
// where they exercise real streams, device memory, asynchronous copies and events.
#include "inferd/cuda_stream.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "inferd/cuda_event.h"
#include "inferd/cuda_runtime.h"
#include "inferd/device_buffer_pool.h"
#include "inferd/pinned_buffer_pool.h"

namespace inferd {
namespace {

int test_device() { return CudaRuntime::get().available() ? 0 : -1; }

TEST(CudaRuntime, ReportsWhatItFound) {
  const CudaRuntime& cuda = CudaRuntime::get();
  EXPECT_FALSE(cuda.description().empty());
  EXPECT_EQ(cuda.available(), cuda.device_count() > 0);
  if (!cuda.available()) {
    EXPECT_EQ(cuda.device_alloc(0, 16), nullptr);
    EXPECT_NE(cuda.memcpy_async(nullptr, nullptr, 0, CudaRuntime::CopyKind::kHostToDevice, nullptr), 0);
    std::printf("no CUDA here (%s): testing the host stand-ins\n", cuda.description().c_str());
  }
}

TEST(CudaStream, CopiesRoundTripThroughDeviceMemory) {
  CudaStream stream(test_device());
  EXPECT_EQ(stream.on_device(), CudaRuntime::get().available());
  PinnedBufferPool host(1 << 24);
  DeviceBufferPool device(stream.device(), 1 << 24);
  constexpr size_t kCount = 1 << 20;
  auto in = host.lease(kCount * sizeof(float));
  auto out = host.lease(kCount * sizeof(float));
  auto* values = reinterpret_cast<float*>(in->data);
  std::iota(values, values + kCount, 0.5f);
  std::memset(out->data, 0, kCount * sizeof(float));
  auto on_device = device.lease(kCount * sizeof(float));
  ASSERT_TRUE(stream.copy_to_device(on_device->data, in->data, kCount * sizeof(float)).ok());
  ASSERT_TRUE(stream.copy_to_host(out->data, on_device->data, kCount * sizeof(float)).ok());
  ASSERT_TRUE(stream.synchronize().ok());
  EXPECT_EQ(std::memcmp(in->data, out->data, kCount * sizeof(float)), 0);
}

TEST(CudaEvent, TimesTheWorkBetweenTwoRecords) {
  CudaStream stream(test_device());
  CudaEvent start(stream.device()), end(stream.device());
  PinnedBufferPool host(1 << 26);
  DeviceBufferPool device(stream.device(), 1 << 26);
  auto src = host.lease(32 << 20);
  auto dst = device.lease(32 << 20);
  std::memset(src->data, 1, src->size);
  ASSERT_TRUE(start.record(stream).ok());
  if (!stream.on_device()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(stream.copy_to_device(dst->data, src->data, src->size).ok());
  ASSERT_TRUE(end.record(stream).ok());
  ASSERT_TRUE(end.synchronize().ok());
  float ms = -1;
  ASSERT_TRUE(CudaEvent::elapsed_ms(start, end, &ms).ok());
  EXPECT_GT(ms, 0.0f);
  EXPECT_LT(ms, 5000.0f);
}

TEST(CudaEvent, OrdersOneStreamAfterAnother) {
  CudaStream producer(test_device()), consumer(test_device());
  CudaEvent ready(producer.device());
  PinnedBufferPool host(1 << 24);
  DeviceBufferPool device(producer.device(), 1 << 24);
  auto src = host.lease(8 << 20);
  auto back = host.lease(8 << 20);
  auto mid = device.lease(8 << 20);
  std::memset(src->data, 7, src->size);
  std::memset(back->data, 0, back->size);
  ASSERT_TRUE(producer.copy_to_device(mid->data, src->data, src->size).ok());
  ASSERT_TRUE(ready.record(producer).ok());
  ASSERT_TRUE(ready.make_wait(consumer).ok());  // the consumer's copy waits on the GPU, not here
  ASSERT_TRUE(consumer.copy_to_host(back->data, mid->data, back->size).ok());
  ASSERT_TRUE(consumer.synchronize().ok());
  EXPECT_EQ(std::memcmp(src->data, back->data, src->size), 0);
}

TEST(CudaStream, CopiesInOppositeDirectionsOverlapOnTwoStreams) {
  if (!CudaRuntime::get().available()) GTEST_SKIP() << "needs a CUDA device: " << CudaRuntime::get().description();
  constexpr size_t kBytes = size_t{256} << 20;
  CudaStream up(0), down(0);
  PinnedBufferPool host(size_t{1} << 30);
  DeviceBufferPool device(0, size_t{1} << 30);
  auto host_a = host.lease(kBytes), host_b = host.lease(kBytes);
  ASSERT_TRUE(host_a->pinned) << "overlap needs page-locked host memory";
  auto dev_a = device.lease(kBytes), dev_b = device.lease(kBytes);
  auto timed = [&](bool upload, bool download) {
    const auto t0 = std::chrono::steady_clock::now();
    if (upload) {
      EXPECT_TRUE(up.copy_to_device(dev_a->data, host_a->data, kBytes).ok());
    }
    if (download) {
      EXPECT_TRUE(down.copy_to_host(host_b->data, dev_b->data, kBytes).ok());
    }
    EXPECT_TRUE(up.synchronize().ok());
    EXPECT_TRUE(down.synchronize().ok());
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  timed(true, true);  // warm-up
  const double alone = timed(true, false) + timed(false, true);
  const double together = timed(true, true);
  std::printf("256 MiB up + 256 MiB down: %.2f ms one after the other, %.2f ms on two streams\n", alone, together);
  EXPECT_LT(together, 0.8 * alone) << "the copy engines did not overlap";
}

}  // namespace
}  // namespace inferd
