#include "inferd/response_cache.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collect_completions.h"
#include "inferd/scheduler.h"

namespace inferd {
namespace {

// A tensor owning a copy of `values`, of `dtype` and `shape`.
template <typename T>
Tensor tensor_of(DataType dtype, std::vector<int64_t> shape, std::vector<T> values) {
  auto data = std::make_shared<std::vector<T>>(std::move(values));
  return Tensor{dtype, std::move(shape), reinterpret_cast<const std::byte*>(data->data()), data->size() * sizeof(T),
                data};
}

std::unique_ptr<InferenceRequest> request_of(uint64_t token, Tensor input) {
  auto request = std::make_unique<InferenceRequest>();
  request->token = token;
  request->inputs.push_back(std::move(input));
  return request;
}

std::vector<Tensor> answer_of(int32_t value, size_t elements = 1) {
  return {
      tensor_of<int32_t>(DataType::kInt32, {1, static_cast<int64_t>(elements)}, std::vector<int32_t>(elements, value))};
}

int32_t first_int(const std::vector<Tensor>& outputs) {
  int32_t value = 0;
  std::memcpy(&value, outputs.at(0).data, sizeof(value));
  return value;
}

TEST(CacheKey, TheSameBytesUnderAnotherShapeOrDatatypeAreAnotherKey) {
  const std::vector<int32_t> bytes{1, 2, 3, 4};
  auto flat = request_of(1, tensor_of<int32_t>(DataType::kInt32, {1, 4}, bytes));
  auto square = request_of(2, tensor_of<int32_t>(DataType::kInt32, {2, 2}, bytes));
  auto as_float = request_of(3, tensor_of<int32_t>(DataType::kFp32, {1, 4}, bytes));
  auto again = request_of(4, tensor_of<int32_t>(DataType::kInt32, {1, 4}, bytes));
  const auto key = [](const InferenceRequest& r) { return *CacheKey::of(7, r); };
  EXPECT_NE(key(*flat).bytes(), key(*square).bytes());
  EXPECT_NE(key(*flat).bytes(), key(*as_float).bytes());
  EXPECT_EQ(key(*flat).bytes(), key(*again).bytes());
  EXPECT_EQ(key(*flat).hash(), key(*again).hash());
  EXPECT_NE(CacheKey::of(8, *flat)->bytes(), key(*flat).bytes());  // another model version
  again->requested_outputs = {1};
  EXPECT_NE(key(*flat).bytes(), key(*again).bytes());
  again->requested_outputs.clear();
  again->parameters_json = R"({"k":1})";
  EXPECT_NE(key(*flat).bytes(), key(*again).bytes());
}

TEST(ResponseCache, AHitGivesTheStoredCopyAndAMissNothing) {
  ResponseCache cache(1 << 20);
  auto request = request_of(1, tensor_of<int32_t>(DataType::kInt32, {1, 1}, {5}));
  const CacheKey key = *CacheKey::of(cache.new_scope(), *request);
  EXPECT_FALSE(cache.lookup(key).has_value());
  std::vector<Tensor> outputs = answer_of(10);
  cache.insert(key, outputs);
  // The cache keeps a copy: what the executor's buffer holds later does not matter.
  std::memset(const_cast<std::byte*>(outputs[0].data), 0, outputs[0].byte_size);
  auto hit = cache.lookup(key);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(first_int(*hit), 10);
  EXPECT_EQ(hit->at(0).shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(cache.stats().entries, 1u);
}

TEST(ResponseCache, EvictsTheLeastRecentlyUsedWithinItsSize) {
  // Room for about three entries of 4 KiB answers.
  ResponseCache cache(3 * 4096 + 3 * 1024);
  const uint64_t scope = cache.new_scope();
  std::vector<CacheKey> keys;
  for (int32_t i = 0; i < 3; ++i) {
    keys.push_back(*CacheKey::of(scope, *request_of(1, tensor_of<int32_t>(DataType::kInt32, {1, 1}, {i}))));
    cache.insert(keys.back(), answer_of(i, 1024));
  }
  ASSERT_EQ(cache.stats().entries, 3u);
  ASSERT_TRUE(cache.lookup(keys[0]).has_value());  // 0 is now the most recently used: 1 goes first
  keys.push_back(*CacheKey::of(scope, *request_of(1, tensor_of<int32_t>(DataType::kInt32, {1, 1}, {3}))));
  auto held = cache.lookup(keys[1]);  // a hit still answering keeps its tensors past eviction
  cache.lookup(keys[0]);
  cache.lookup(keys[2]);
  cache.insert(keys[3], answer_of(3, 1024));
  const ResponseCacheStats stats = cache.stats();
  EXPECT_LE(stats.bytes, stats.limit_bytes);
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_FALSE(cache.lookup(keys[1]).has_value());
  EXPECT_TRUE(cache.lookup(keys[0]).has_value());
  EXPECT_TRUE(cache.lookup(keys[3]).has_value());
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(first_int(*held), 1);
  // Many more answers than fit: the bytes never pass the limit.
  for (int32_t i = 10; i < 200; ++i) {
    cache.insert(*CacheKey::of(scope, *request_of(1, tensor_of<int32_t>(DataType::kInt32, {1, 1}, {i}))),
                 answer_of(i, 1024));
    ASSERT_LE(cache.stats().bytes, cache.stats().limit_bytes);
  }
}

TEST(ResponseCache, AnAnswerLargerThanTheCacheIsNotKept) {
  ResponseCache cache(4096);
  const CacheKey key =
      *CacheKey::of(cache.new_scope(), *request_of(1, tensor_of<int32_t>(DataType::kInt32, {1, 1}, {1})));
  cache.insert(key, answer_of(1, 4096));
  EXPECT_FALSE(cache.lookup(key).has_value());
  EXPECT_EQ(cache.stats().rejected, 1u);
  EXPECT_EQ(cache.stats().bytes, 0u);
}

TEST(ResponseCache, ForgettingAScopeDropsOnlyItsEntries) {
  ResponseCache cache(1 << 20);
  const uint64_t a = cache.new_scope(), b = cache.new_scope();
  auto request = request_of(1, tensor_of<int32_t>(DataType::kInt32, {1, 1}, {1}));
  cache.insert(*CacheKey::of(a, *request), answer_of(1));
  cache.insert(*CacheKey::of(b, *request), answer_of(2));
  cache.forget(a);
  EXPECT_FALSE(cache.lookup(*CacheKey::of(a, *request)).has_value());
  EXPECT_EQ(first_int(*cache.lookup(*CacheKey::of(b, *request))), 2);
  EXPECT_EQ(cache.stats().entries, 1u);
}

// Doubles an INT32 input, counting its executions; fails inputs of 13; holds while `hold` is set.
class CountingExecutor : public Executor {
 public:
  explicit CountingExecutor(std::atomic<int>* runs) : runs_(runs) {}
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    runs_->fetch_add(1);
    {
      std::unique_lock<std::mutex> lock(mutex);
      released.wait(lock, [&] { return !hold; });
    }
    const Tensor& in = inputs.at(0);
    std::vector<int32_t> values(in.byte_size / 4);
    std::memcpy(values.data(), in.data, in.byte_size);
    for (int32_t& v : values) {
      if (v == 13) return Status::Error(StatusCode::kInvalidArgument, "13 is refused");
      v *= 2;
    }
    outputs->push_back(tensor_of<int32_t>(DataType::kInt32, in.shape, std::move(values)));
    return Status::Ok();
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      hold = false;
    }
    released.notify_all();
  }
  std::mutex mutex;
  std::condition_variable released;
  bool hold = false;

 private:
  std::atomic<int>* runs_;
};

struct CachedScheduler {
  explicit CachedScheduler(std::shared_ptr<ResponseCache> cache, bool preserve_ordering = false) {
    SchedulerOptions options;
    options.model_name = "double";
    options.batching.max_batch_size = 8;
    options.batching.preserve_ordering = preserve_ordering;
    options.response_cache = std::move(cache);
    auto owned = std::make_unique<CountingExecutor>(&runs);
    executor = owned.get();
    std::vector<std::unique_ptr<Executor>> instances;
    instances.push_back(std::move(owned));
    scheduler = std::make_unique<Scheduler>(std::move(options), std::move(instances), queue,
                                            std::make_shared<PinnedBufferPool>(1 << 20, false));
  }
  std::shared_ptr<CompletionQueue> queue = std::make_shared<CompletionQueue>();
  std::atomic<int> runs{0};
  CountingExecutor* executor = nullptr;
  std::unique_ptr<Scheduler> scheduler;
};

std::unique_ptr<InferenceRequest> int_request(uint64_t token, int32_t value) {
  return request_of(token, tensor_of<int32_t>(DataType::kInt32, {1, 1}, {value}));
}

TEST(SchedulerWithCache, ARepeatedRequestIsAnsweredFromTheCacheAndCountedAsTritonCountsIt) {
  auto cache = std::make_shared<ResponseCache>(1 << 20);
  CachedScheduler served(cache);
  ASSERT_TRUE(served.scheduler->submit(int_request(1, 21)).ok());
  ASSERT_EQ(collect(*served.queue, 1).at(1).status.code, StatusCode::kOk);
  for (uint64_t token = 2; token <= 4; ++token) ASSERT_TRUE(served.scheduler->submit(int_request(token, 21)).ok());
  auto done = collect(*served.queue, 3);
  ASSERT_EQ(done.size(), 3u);
  for (auto& [token, completion] : done) {
    ASSERT_TRUE(completion.status.ok()) << completion.status.message;
    EXPECT_EQ(first_int(completion.outputs), 42);
    EXPECT_NE(completion.request, nullptr);
  }
  EXPECT_EQ(served.runs.load(), 1);
  const StatisticsSnapshot stats = served.scheduler->statistics();
  EXPECT_EQ(stats.cache_hit.count, 3u);
  EXPECT_EQ(stats.cache_miss.count, 1u);
  EXPECT_GT(stats.cache_miss.ns, 0u);
  EXPECT_EQ(stats.success.count, 4u);  // hits are successes
  EXPECT_EQ(stats.queue.count, 4u);
  EXPECT_EQ(stats.inference_count, 1u);  // but neither inferences nor executions
  EXPECT_EQ(stats.execution_count, 1u);
}

TEST(SchedulerWithCache, FailuresAreNotCachedAndOtherInputsMiss) {
  auto cache = std::make_shared<ResponseCache>(1 << 20);
  CachedScheduler served(cache);
  for (uint64_t token = 1; token <= 2; ++token) {
    ASSERT_TRUE(served.scheduler->submit(int_request(token, 13)).ok());
    EXPECT_EQ(collect(*served.queue, 1).at(token).status.code, StatusCode::kInvalidArgument);
  }
  ASSERT_TRUE(served.scheduler->submit(int_request(3, 2)).ok());
  EXPECT_EQ(first_int(collect(*served.queue, 1).at(3).outputs), 4);
  EXPECT_EQ(served.runs.load(), 3);
  EXPECT_EQ(served.scheduler->statistics().cache_hit.count, 0u);
  EXPECT_EQ(served.scheduler->statistics().cache_miss.count, 3u);
  EXPECT_EQ(cache->stats().entries, 1u);
}

TEST(SchedulerWithCache, AHitWaitsForEarlierRequestsWhenOrderIsPreserved) {
  auto cache = std::make_shared<ResponseCache>(1 << 20);
  CachedScheduler served(cache, /*preserve_ordering=*/true);
  ASSERT_TRUE(served.scheduler->submit(int_request(1, 5)).ok());
  collect(*served.queue, 1);
  {
    std::lock_guard<std::mutex> lock(served.executor->mutex);
    served.executor->hold = true;
  }
  ASSERT_TRUE(served.scheduler->submit(int_request(2, 6)).ok());  // computes, held
  while (served.runs.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(served.scheduler->submit(int_request(3, 5)).ok());  // a hit, behind request 2
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(served.queue->drain().empty());
  served.executor->release();
  std::vector<uint64_t> order;
  auto done = collect(*served.queue, 2, &order);
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(first_int(done.at(3).outputs), 10);
  EXPECT_EQ(served.scheduler->statistics().cache_hit.count, 1u);
}

TEST(SchedulerWithCache, UnloadingTheVersionDropsItsEntries) {
  auto cache = std::make_shared<ResponseCache>(1 << 20);
  {
    CachedScheduler served(cache);
    ASSERT_TRUE(served.scheduler->submit(int_request(1, 1)).ok());
    collect(*served.queue, 1);
    EXPECT_EQ(cache->stats().entries, 1u);
  }
  EXPECT_EQ(cache->stats().entries, 0u);
  EXPECT_EQ(cache->stats().bytes, 0u);
}

TEST(SchedulerWithCache, AStatefulModelIsNeverCached) {
  auto cache = std::make_shared<ResponseCache>(1 << 20);
  SchedulerOptions options;
  options.model_name = "stateful";
  options.batching.max_batch_size = 8;
  options.sequence_batching = true;
  options.response_cache = cache;
  std::atomic<int> runs{0};
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::make_unique<CountingExecutor>(&runs));
  auto queue = std::make_shared<CompletionQueue>();
  Scheduler scheduler(std::move(options), std::move(instances), queue,
                      std::make_shared<PinnedBufferPool>(1 << 20, false));
  for (uint64_t token = 1; token <= 2; ++token) {
    auto request = int_request(token, 3);
    request->sequence_flags.id = 9;
    request->sequence_flags.start = token == 1;
    ASSERT_TRUE(scheduler.submit(std::move(request)).ok());
    ASSERT_TRUE(collect(*queue, 1).at(token).status.ok());
  }
  EXPECT_EQ(runs.load(), 2);
  EXPECT_EQ(cache->stats().entries, 0u);
}

}  // namespace
}  // namespace inferd
