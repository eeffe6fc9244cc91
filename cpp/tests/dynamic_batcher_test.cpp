#include "inferd/dynamic_batcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
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

// Gives `batcher` recent traffic: max_batch_size one-row requests (tokens from 1000) arriving
// while others wait, taken at once as one full batch. Requests after it find the batcher busy
// (that batch's taker has not called again), so the estimate expects company.
void prime(DynamicBatcher& batcher) {
  const auto rows = static_cast<uint64_t>(batcher.options().max_batch_size);
  for (uint64_t t = 0; t < rows; ++t) ASSERT_TRUE(batcher.enqueue(request(1000 + t)).ok());
  ASSERT_EQ(next(batcher).size(), rows);
}

// A worker that takes batches as a scheduler's does, "computes" each for `compute`, then answers
// it; records every batch with how long its oldest request waited in the queue.
class Taker {
 public:
  struct Taken {
    std::vector<uint64_t> tokens;
    Clock::duration waited;
  };

  explicit Taker(DynamicBatcher& batcher, std::chrono::milliseconds compute = 0ms)
      : batcher_(batcher), thread_([this, compute] { run(compute); }) {}
  ~Taker() {
    batcher_.close();
    thread_.join();
  }

  // Blocks until `count` batches have been taken (maybe still computing); false after 30 s.
  bool wait_taken(size_t count) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, 30s, [&] { return batches_taken_ >= count; });
  }
  // Blocks until `count` requests in all have been answered; false after 30 s.
  bool wait_answered(size_t count) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, 30s, [&] { return answered_.size() >= count; });
  }
  // Blocks until the request `token` has been answered; false after 30 s.
  bool wait_answered_token(uint64_t token) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, 30s, [&] { return answered_.count(token) != 0; });
  }
  std::vector<Taken> taken() {
    std::lock_guard<std::mutex> lock(mutex_);
    return taken_;
  }

 private:
  void run(std::chrono::milliseconds compute) {
    Batch batch;
    std::vector<Rejection> rejected;
    while (batcher_.next_batch(&batch, &rejected)) {
      EXPECT_TRUE(rejected.empty());
      if (batch.empty()) continue;
      const auto now = Clock::now();
      Taken taken{{}, Clock::duration::zero()};
      for (const auto& r : batch) {
        taken.tokens.push_back(r->token);
        taken.waited = std::max(taken.waited, now - r->enqueue_time);
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++batches_taken_;
      }
      changed_.notify_all();
      std::this_thread::sleep_for(compute);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        answered_.insert(taken.tokens.begin(), taken.tokens.end());
        taken_.push_back(std::move(taken));
      }
      changed_.notify_all();
      batch.clear();
    }
  }

  DynamicBatcher& batcher_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Taken> taken_;               // guarded by mutex_
  size_t batches_taken_ = 0;               // guarded by mutex_
  std::unordered_set<uint64_t> answered_;  // guarded by mutex_
  std::thread thread_;                     // last: starts once the rest is built
};

TEST(BusyArrivalRate, CountsArrivalsPerSecondOfBusyTime) {
  BusyArrivalRate rate;
  Clock::time_point t{};
  rate.advance(t, false);
  // 10 ms busy, 10 ms idle, 50 times over, with 5 arrivals in each busy span: 500 per busy second,
  // though only 250 per second of wall time.
  for (int i = 0; i < 50; ++i) {
    for (int k = 0; k < 5; ++k) {
      t += 2ms;
      rate.advance(t, true);
      rate.count_arrival();
    }
    t += 10ms;
    rate.advance(t, false);
  }
  EXPECT_NEAR(rate.per_second(0.0), 500.0, 50.0);
  EXPECT_LT(rate.per_second(1.0), rate.per_second(0.0));  // the prior only lowers it
}

TEST(BusyArrivalRate, ALoneClosedLoopClientNeverCounts) {
  // Concurrency 1: each request arrives idle (not counted), then keeps the batcher busy 1 ms.
  BusyArrivalRate rate;
  Clock::time_point t{};
  for (int i = 0; i < 1000; ++i) {
    t += 1ms;
    rate.advance(t, false);  // the answer's round trip; the next request arrives idle
    t += 1ms;
    rate.advance(t, true);  // queued and computed
  }
  EXPECT_EQ(rate.per_second(0.0), 0.0);
}

TEST(BusyArrivalRate, FadesOnceTrafficStops) {
  BusyArrivalRate rate;
  Clock::time_point t{};
  for (int i = 0; i < 1000; ++i) {  // 1 s fully busy, an arrival every ms: 1000/s
    t += 1ms;
    rate.advance(t, true);
    rate.count_arrival();
  }
  const double delay_s = 0.002;
  const double prior_s = DynamicBatcher::kPriorDelays * delay_s;
  EXPECT_GE(rate.per_second(prior_s) * delay_s, 1.0);  // a batch would wait for company
  // Then quiet. The decayed arrival count A is about 1000/s * kMemory = 250 now; the estimate says
  // "no company within the delay" once A * exp(-t / kMemory) < kPriorDelays (busy time fades
  // alike), i.e. after kMemory * ln(250 / 4) ~ 1.03 s.
  const auto memory_s = std::chrono::duration<double>(BusyArrivalRate::kMemory).count();
  const double fade_s = memory_s * std::log(250.0 / DynamicBatcher::kPriorDelays);
  rate.advance(t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(fade_s * 0.8)), false);
  EXPECT_GE(rate.per_second(prior_s) * delay_s, 1.0);
  rate.advance(t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(fade_s * 1.2)), false);
  EXPECT_LT(rate.per_second(prior_s) * delay_s, 1.0);
  rate.advance(t + 10s, false);
  EXPECT_LT(rate.per_second(prior_s), 1e-6);
}

TEST(BusyArrivalRate, IgnoresTimesBeforeTheLastOne) {
  BusyArrivalRate rate;
  const Clock::time_point t = Clock::time_point{} + 1s;
  rate.advance(t, true);
  rate.count_arrival();
  const double before = rate.per_second(0.01);
  rate.advance(t - 1ms, true);  // read before its caller got the lock
  EXPECT_EQ(rate.per_second(0.01), before);
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

TEST(DynamicBatcher, ALoneClosedLoopClientIsNotHeldForCompany) {
  // Concurrency 1: each request is sent 2 ms (the network) after the previous one was answered,
  // so its gap (~3 ms) is far below the 200 ms delay, yet no other request can come meanwhile.
  DynamicBatcher batcher(dynamic(8, 200'000));
  Taker taker(batcher, 1ms);
  constexpr uint64_t kRequests = 20;
  for (uint64_t t = 1; t <= kRequests; ++t) {
    std::this_thread::sleep_for(2ms);
    ASSERT_TRUE(batcher.enqueue(request(t)).ok());
    ASSERT_TRUE(taker.wait_answered(t));
  }
  const auto taken = taker.taken();
  ASSERT_EQ(taken.size(), kRequests);
  for (const auto& batch : taken) {
    EXPECT_EQ(batch.tokens.size(), 1u);
    EXPECT_LT(batch.waited, 100ms) << "request " << batch.tokens[0] << " was held for company";
  }
  EXPECT_LT(batcher.busy_arrival_rate() * 0.2, 1.0);
}

TEST(DynamicBatcher, ArrivalsWhileABatchComputesCountWithNothingQueued) {
  // Each request comes while the one before computes (5 ms), after it left the queue: nothing
  // ever waits, yet this is traffic, and the estimate must see it (not stay at zero).
  DynamicBatcher batcher(dynamic(8, 1'000));  // 1 ms: too short to ever wait for one per 5 ms
  Taker taker(batcher, 5ms);
  constexpr uint64_t kRequests = 20;
  for (uint64_t t = 1; t <= kRequests; ++t) {
    ASSERT_TRUE(batcher.enqueue(request(t)).ok());
    ASSERT_TRUE(taker.wait_taken(t));
  }
  // About one arrival per 5 ms of busy time: 200 per busy second (less the 4 ms prior).
  EXPECT_GE(batcher.busy_arrival_rate(), 50.0);
  ASSERT_TRUE(taker.wait_answered(kRequests));
  for (const auto& batch : taker.taken()) EXPECT_EQ(batch.tokens.size(), 1u);
}

TEST(DynamicBatcher, ConcurrentClientsShareBatchesAndWaitForCompany) {
  // Eight closed-loop clients against one worker computing 2 ms a batch: requests arrive while
  // others wait or compute, so batches grow, and (max 16 never fills) they wait for company.
  constexpr uint64_t kClients = 8, kEach = 20;
  const auto delay = 20ms;
  DynamicBatcher batcher(dynamic(16, 20'000));
  Taker taker(batcher, 2ms);
  std::vector<std::thread> clients;
  for (uint64_t c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (uint64_t i = 0; i < kEach; ++i) {
        const uint64_t token = c * kEach + i;
        ASSERT_TRUE(batcher.enqueue(request(token)).ok());
        ASSERT_TRUE(taker.wait_answered_token(token));
        std::this_thread::sleep_for(1ms);
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_GE(batcher.busy_arrival_rate() * 0.02, 1.0);  // traffic seen: company is expected
  const auto taken = taker.taken();
  size_t requests = 0, largest = 0;
  Clock::duration longest{};
  for (const auto& batch : taken) {
    requests += batch.tokens.size();
    largest = std::max(largest, batch.tokens.size());
    longest = std::max(longest, batch.waited);
  }
  EXPECT_EQ(requests, kClients * kEach);
  EXPECT_GE(requests, 2 * taken.size()) << "batches of " << double(requests) / double(taken.size());
  EXPECT_GT(largest, 1u);
  EXPECT_GE(longest, delay / 4);   // held for company...
  EXPECT_LT(longest, delay + 1s);  // ...never much past the delay (margin for slow CI only)
}

TEST(DynamicBatcher, UnderTrafficALoneRequestWaitsForCompanyButNotPastTheDelay) {
  DynamicBatcher batcher(dynamic(16, 100'000));  // 100 ms
  for (int i = 0; i < 4; ++i) prime(batcher);    // 64 arrivals while others waited
  ASSERT_TRUE(batcher.enqueue(request(1)).ok());
  auto start = Clock::now();
  std::thread late([&] {
    std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(batcher.enqueue(request(2)).ok());
  });
  Batch batch = next(batcher);
  auto waited = Clock::now() - start;
  late.join();
  EXPECT_EQ(tokens(batch), (std::vector<uint64_t>{1, 2}));  // the late one joined while it waited
  EXPECT_GE(waited, 15ms);
  EXPECT_LT(waited, 1s);

  ASSERT_TRUE(batcher.enqueue(request(3)).ok());  // no company comes: goes alone, by the delay
  start = Clock::now();
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{3}));
  waited = Clock::now() - start;
  EXPECT_GE(waited, 10ms);
  EXPECT_LT(waited, 1s);
}

TEST(DynamicBatcher, AfterTrafficStopsALoneRequestGoesPromptlyAgain) {
  // A burst of 64 requests arriving while the worker computes the first (5 ms), then quiet.
  DynamicBatcher batcher(dynamic(16, 100'000));  // 100 ms
  Taker taker(batcher, 5ms);
  for (uint64_t t = 1; t <= 64; ++t) ASSERT_TRUE(batcher.enqueue(request(t)).ok());
  ASSERT_TRUE(taker.wait_answered(64));
  EXPECT_GE(batcher.busy_arrival_rate() * 0.1, 1.0);  // a lone request now would wait
  // The decayed count of busy arrivals is at most 63; the estimate stops predicting company
  // within the delay once 63 * exp(-t / kMemory) < kPriorDelays: t > 250 ms * ln(63 / 4) = 0.69 s.
  std::this_thread::sleep_for(1500ms);
  EXPECT_LT(batcher.busy_arrival_rate() * 0.1, 1.0);
  ASSERT_TRUE(batcher.enqueue(request(100)).ok());
  ASSERT_TRUE(taker.wait_answered(65));
  const auto taken = taker.taken();
  EXPECT_EQ(taken.back().tokens, (std::vector<uint64_t>{100}));
  EXPECT_LT(taken.back().waited, 50ms);  // not held for the 100 ms delay
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
  prime(batcher);  // with traffic, the batch would wait for company
  for (uint64_t t = 1; t <= 4; ++t) ASSERT_TRUE(batcher.enqueue(request(t)).ok());
  const auto start = Clock::now();
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1, 2, 3}));  // the largest preferred size reached
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST(DynamicBatcher, WithoutTrafficWhatIsReadyGoesAtOnce) {
  BatcherOptions o = dynamic(8, 10'000'000);
  o.preferred_batch_sizes = {2, 3};
  DynamicBatcher batcher(o);
  // Three arrivals while others waited are too few to expect a fourth within the delay.
  for (uint64_t t = 1; t <= 4; ++t) ASSERT_TRUE(batcher.enqueue(request(t)).ok());
  const auto start = Clock::now();
  EXPECT_EQ(tokens(next(batcher)), (std::vector<uint64_t>{1, 2, 3, 4}));  // all, not the preferred 3
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
  o.default_queue_policy.max_queue_size = 2;
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
    o.default_queue_policy.default_timeout_us = 20'000;  // 20 ms
    o.default_queue_policy.delay_on_timeout = delay;
    o.default_queue_policy.allow_timeout_override = true;
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
  o.default_queue_policy.default_timeout_us = 10'000;
  o.default_queue_policy.allow_timeout_override = true;
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
  prime(batcher);  // so that the request waits for company
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
  prime(batcher);  // so that the request waits for company
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
