#include "inferd/dynamic_batcher.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace inferd {
namespace {

using namespace std::chrono_literals;
using Batch = std::vector<std::unique_ptr<InferenceRequest>>;

// A request of `rows` rows whose one input has non-batch dims `dims` (no data: the batcher only
// reads shapes).
std::unique_ptr<InferenceRequest> request(uint64_t token, int64_t rows = 1, std::vector<int64_t> dims = {4},
                                          uint32_t priority = 0) {
  auto r = std::make_unique<InferenceRequest>();
  r->token = token;
  r->batch_size = rows;
  r->priority = priority;
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), dims.begin(), dims.end());
  r->inputs.push_back(Tensor{DataType::kFp32, shape, nullptr, 0, nullptr});
  return r;
}

BatcherOptions dynamic(int64_t max_batch_size, uint64_t delay_us = 0) {
  BatcherOptions o;
  o.dynamic = true;
  o.max_batch_size = max_batch_size;
  o.max_queue_delay_us = delay_us;
  return o;
}

std::vector<uint64_t> tokens(const Batch& batch) {
  std::vector<uint64_t> out;
  for (const auto& r : batch) out.push_back(r->token);
  return out;
}

// Takes the next batch, failing the test if only rejections came.
Batch next(DynamicBatcher& batcher) {
  Batch batch;
  std::vector<Rejection> rejected;
  EXPECT_TRUE(batcher.next_batch(&batch, &rejected));
  EXPECT_TRUE(rejected.empty());
  return batch;
}

TEST(DynamicBatcher, WithoutDynamicBatchingEachRequestIsAlone) {
  BatcherOptions o;
  o.max_batch_size = 8;
  DynamicBatcher batcher(o);
  for (uint64_t t = 1; t <= 3; ++t) ASSERT_TRUE(batcher.enqueue(request(t)).ok());
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1}));
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{2}));
}

TEST(DynamicBatcher, ZeroDelaySendsWhatIsReady) {
  DynamicBatcher batcher(dynamic(8));
  for (uint64_t t = 1; t <= 3; ++t) ASSERT_TRUE(batcher.enqueue(request(t)).ok());
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1, 2, 3}));
}

TEST(DynamicBatcher, CutsAtMaxBatchSizeInRows) {
  DynamicBatcher batcher(dynamic(4));
  ASSERT_TRUE(batcher.enqueue(request(1, 2)).ok());
  ASSERT_TRUE(batcher.enqueue(request(2, 1)).ok());
  ASSERT_TRUE(batcher.enqueue(request(3, 2)).ok());  // would make 5 rows
  ASSERT_TRUE(batcher.enqueue(request(4, 1)).ok());
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{3, 4}));
}

TEST(DynamicBatcher, WaitsForTheDelayThenSendsWhatItHas) {
  DynamicBatcher batcher(dynamic(8, 100'000));  // 100 ms
  ASSERT_TRUE(batcher.enqueue(request(1)).ok());
  const auto start = Clock::now();
  std::thread late([&] {
    std::this_thread::sleep_for(30ms);
    ASSERT_TRUE(batcher.enqueue(request(2)).ok());
  });
  Batch batch = next(batcher);
  const auto waited = Clock::now() - start;
  late.join();
  EXPECT_EQ(tokens(batch), (std::vector<uint64_t>{1, 2}));  // the late one joined while it waited
  EXPECT_GE(waited, 95ms);
  EXPECT_LT(waited, 1s);
}

TEST(DynamicBatcher, AFullBatchDoesNotWaitForTheDelay) {
  DynamicBatcher batcher(dynamic(2, 10'000'000));  // 10 s delay
  ASSERT_TRUE(batcher.enqueue(request(1)).ok());
  ASSERT_TRUE(batcher.enqueue(request(2)).ok());
  const auto start = Clock::now();
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1, 2}));
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST(DynamicBatcher, APreferredSizeIsSentBeforeTheDelay) {
  BatcherOptions o = dynamic(8, 10'000'000);
  o.preferred_batch_sizes = {2, 3};
  DynamicBatcher batcher(o);
  for (uint64_t t = 1; t <= 4; ++t) ASSERT_TRUE(batcher.enqueue(request(t)).ok());
  const auto start = Clock::now();
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1, 2, 3}));  // the largest preferred size reached
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST(DynamicBatcher, OtherShapesKeepTheirPlaceInsteadOfCuttingTheBatch) {
  DynamicBatcher batcher(dynamic(8));
  ASSERT_TRUE(batcher.enqueue(request(1, 1, {4})).ok());
  ASSERT_TRUE(batcher.enqueue(request(2, 1, {7})).ok());
  ASSERT_TRUE(batcher.enqueue(request(3, 1, {4})).ok());
  ASSERT_TRUE(batcher.enqueue(request(4, 1, {7})).ok());
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{2, 4}));
}

TEST(DynamicBatcher, HigherPriorityGoesFirstAndFifoWithinALevel) {
  BatcherOptions o = dynamic(2);
  o.priority_levels = 3;
  o.default_priority_level = 2;
  DynamicBatcher batcher(o);
  ASSERT_TRUE(batcher.enqueue(request(1, 1, {4}, 3)).ok());
  ASSERT_TRUE(batcher.enqueue(request(2, 1, {4}, 0)).ok());  // default: level 2
  ASSERT_TRUE(batcher.enqueue(request(3, 1, {4}, 1)).ok());
  ASSERT_TRUE(batcher.enqueue(request(4, 1, {4}, 1)).ok());
  ASSERT_TRUE(batcher.enqueue(request(5, 1, {4}, 2)).ok());
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{2, 5}));
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1}));
  EXPECT_EQ(batcher.enqueue(request(6, 1, {4}, 4)).code, StatusCode::kInvalidArgument);
}

TEST(DynamicBatcher, AFullQueueRefusesWithResourceExhausted) {
  BatcherOptions o = dynamic(8);
  o.default_policy.max_queue_size = 2;
  DynamicBatcher batcher(o);
  ASSERT_TRUE(batcher.enqueue(request(1)).ok());
  ASSERT_TRUE(batcher.enqueue(request(2)).ok());
  auto third = request(3);
  EXPECT_EQ(batcher.enqueue(std::move(third)).code, StatusCode::kResourceExhausted);
  ASSERT_NE(third, nullptr);  // still the caller's
  next(batcher);
  EXPECT_TRUE(batcher.enqueue(std::move(third)).ok());
}

TEST(DynamicBatcher, QueueTimeoutRejectsOrDelays) {
  for (bool delay : {false, true}) {
    BatcherOptions o = dynamic(1, 0);
    o.default_policy.default_timeout_us = 20'000;  // 20 ms
    o.default_policy.delay_on_timeout = delay;
    o.default_policy.allow_timeout_override = true;
    DynamicBatcher batcher(o);
    auto quick = request(1);
    quick->timeout_us = 1'000;  // shortened by the request
    ASSERT_TRUE(batcher.enqueue(std::move(quick)).ok());
    std::this_thread::sleep_for(30ms);
    ASSERT_TRUE(batcher.enqueue(request(2)).ok());
    Batch batch;
    std::vector<Rejection> rejected;
    ASSERT_TRUE(batcher.next_batch(&batch, &rejected));
    if (delay) {
      EXPECT_TRUE(rejected.empty());
      EXPECT_EQ(tokens(batch), (std::vector<uint64_t>{2}));  // the timed-out one went behind
      EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1}));
    } else {
      ASSERT_EQ(rejected.size(), 1u);  // only the one that waited past its (shortened) timeout
      EXPECT_EQ(rejected[0].first->token, 1u);
      EXPECT_EQ(rejected[0].second.code, StatusCode::kUnavailable);
      EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{2}));
    }
  }
}

TEST(DynamicBatcher, AnOverrideCannotLengthenTheTimeout) {
  BatcherOptions o = dynamic(1);
  o.default_policy.default_timeout_us = 10'000;
  o.default_policy.allow_timeout_override = true;
  DynamicBatcher batcher(o);
  auto r = request(1);
  r->timeout_us = 60'000'000;
  ASSERT_TRUE(batcher.enqueue(std::move(r)).ok());
  std::this_thread::sleep_for(20ms);
  Batch batch;
  std::vector<Rejection> rejected;
  ASSERT_TRUE(batcher.next_batch(&batch, &rejected));
  EXPECT_EQ(rejected.size(), 1u);
}

TEST(DynamicBatcher, APassedDeadlineIsAnsweredWithoutRunning) {
  DynamicBatcher batcher(dynamic(8, 10'000'000));
  auto r = request(1);
  r->deadline = Clock::now() + 10ms;
  ASSERT_TRUE(batcher.enqueue(std::move(r)).ok());
  Batch batch;
  std::vector<Rejection> rejected;
  const auto start = Clock::now();
  ASSERT_TRUE(batcher.next_batch(&batch, &rejected));  // wakes for the deadline, not the 10 s delay
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_TRUE(batch.empty());
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_EQ(rejected[0].second.code, StatusCode::kDeadlineExceeded);
}

TEST(DynamicBatcher, CancelTakesAWaitingRequestOut) {
  DynamicBatcher batcher(dynamic(8));
  ASSERT_TRUE(batcher.enqueue(request(1)).ok());
  ASSERT_TRUE(batcher.enqueue(request(2)).ok());
  auto cancelled = batcher.cancel(1);
  ASSERT_NE(cancelled, nullptr);
  EXPECT_EQ(cancelled->token, 1u);
  EXPECT_EQ(batcher.cancel(1), nullptr);
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{2}));
}

TEST(DynamicBatcher, CloseFlushesWithoutWaitingThenEnds) {
  DynamicBatcher batcher(dynamic(8, 10'000'000));
  ASSERT_TRUE(batcher.enqueue(request(1)).ok());
  std::thread closer([&] {
    std::this_thread::sleep_for(20ms);
    batcher.close();
  });
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1}));
  closer.join();
  EXPECT_EQ(batcher.enqueue(request(2)).code, StatusCode::kUnavailable);
  Batch batch;
  std::vector<Rejection> rejected;
  EXPECT_FALSE(batcher.next_batch(&batch, &rejected));
}

TEST(DynamicBatcher, ManyProducersAndConsumersHandOutEachRequestOnce) {
  DynamicBatcher batcher(dynamic(16, 200));
  constexpr int kProducers = 4, kEach = 2000;
  std::vector<std::thread> threads;
  std::vector<std::vector<uint64_t>> seen(3);
  for (int c = 0; c < 3; ++c) {
    threads.emplace_back([&, c] {
      Batch batch;
      std::vector<Rejection> rejected;
      while (batcher.next_batch(&batch, &rejected)) {
        for (auto& r : batch) seen[c].push_back(r->token);
        batch.clear();
      }
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kEach; ++i) {
        ASSERT_TRUE(batcher.enqueue(request(static_cast<uint64_t>(p * kEach + i), 1, {i % 3})).ok());
      }
    });
  }
  for (auto& t : producers) t.join();
  batcher.close();
  for (auto& t : threads) t.join();
  std::vector<bool> got(kProducers * kEach, false);
  size_t total = 0;
  for (const auto& s : seen) {
    for (uint64_t token : s) {
      EXPECT_FALSE(got[token]) << "token " << token << " handed out twice";
      got[token] = true;
      ++total;
    }
  }
  EXPECT_EQ(total, static_cast<size_t>(kProducers * kEach));
}

TEST(DynamicBatcher, RequestsLeavingAnOptionalInputOutBatchApart) {
  DynamicBatcher batcher(dynamic(8));
  auto with_optional = [](uint64_t token, bool given) {
    auto r = request(token);
    r->inputs.push_back(given ? Tensor{DataType::kFp32, {1, 4}, nullptr, 0, nullptr} : Tensor::Absent(DataType::kFp32));
    return r;
  };
  ASSERT_TRUE(batcher.enqueue(with_optional(1, true)).ok());
  ASSERT_TRUE(batcher.enqueue(with_optional(2, false)).ok());
  ASSERT_TRUE(batcher.enqueue(with_optional(3, true)).ok());
  ASSERT_TRUE(batcher.enqueue(with_optional(4, false)).ok());
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{2, 4}));
}

TEST(DynamicBatcher, PaddedInputsOfDifferentLengthsShareABatch) {
  BatcherOptions o = dynamic(8);
  o.padding.inputs = {true};
  o.padding.reference_input = 0;
  DynamicBatcher batcher(o);
  ASSERT_TRUE(batcher.enqueue(request(1, 1, {4})).ok());
  ASSERT_TRUE(batcher.enqueue(request(2, 1, {7})).ok());
  ASSERT_TRUE(batcher.enqueue(request(3, 1, {4, 2})).ok());  // another rank: another bucket
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{3}));
}

}  // namespace
}  // namespace inferd
