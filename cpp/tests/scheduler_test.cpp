#include "inferd/scheduler.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "collect_completions.h"
#include "inferd/model_signature.h"

namespace inferd {
namespace {

// Doubles an INT32 input; can be told to fail or to hold until released.
class DoublingExecutor : public Executor {
 public:
  explicit DoublingExecutor(std::atomic<int>* calls, bool fail = false) : calls_(calls), fail_(fail) {}
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    calls_->fetch_add(1);
    if (fail_) return Status::Error(StatusCode::kInternal, "boom");
    const Tensor& in = inputs.at(0);
    auto out = std::make_shared<std::vector<int32_t>>(in.byte_size / 4);
    const auto* src = reinterpret_cast<const int32_t*>(in.data);
    for (size_t i = 0; i < out->size(); ++i) (*out)[i] = src[i] * 2;
    outputs->push_back(
        Tensor{DataType::kInt32, in.shape, reinterpret_cast<const std::byte*>(out->data()), out->size() * 4, out});
    return Status::Ok();
  }

 private:
  std::atomic<int>* calls_;
  bool fail_;
};

std::unique_ptr<InferenceRequest> int_request(uint64_t token, int32_t value) {
  auto data = std::make_shared<int32_t>(value);
  auto r = std::make_unique<InferenceRequest>();
  r->token = token;
  r->inputs.push_back(Tensor{DataType::kInt32, {1, 1}, reinterpret_cast<const std::byte*>(data.get()), 4, data});
  return r;
}

// An executor's answer of one INT32 value, shape [1, 1].
RequestResult int_result(int32_t value) {
  auto data = std::make_shared<int32_t>(value);
  RequestResult result;
  result.outputs.push_back(Tensor{DataType::kInt32, {1, 1}, reinterpret_cast<const std::byte*>(data.get()), 4, data});
  return result;
}

SchedulerOptions options(const std::string& name, int64_t max_batch_size, bool dynamic = false) {
  SchedulerOptions o;
  o.model_name = name;
  o.batching.max_batch_size = max_batch_size;
  o.batching.dynamic = dynamic;
  return o;
}

std::shared_ptr<PinnedBufferPool> test_pool() { return std::make_shared<PinnedBufferPool>(1 << 24, false); }

std::vector<std::unique_ptr<Executor>> executors(int n, std::atomic<int>* calls, bool fail = false) {
  std::vector<std::unique_ptr<Executor>> out;
  for (int i = 0; i < n; ++i) out.push_back(std::make_unique<DoublingExecutor>(calls, fail));
  return out;
}

TEST(Scheduler, EveryRequestGetsItsOwnAnswer) {
  auto queue = std::make_shared<CompletionQueue>();
  std::atomic<int> calls{0};
  Scheduler scheduler(options("double", 8), executors(3, &calls), queue, test_pool());
  constexpr int kRequests = 500;
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (int i = c; i < kRequests; i += 4) {
        ASSERT_TRUE(scheduler.submit(int_request(static_cast<uint64_t>(i), i)).ok());
      }
    });
  }
  for (auto& t : clients) t.join();
  auto done = collect(*queue, kRequests);
  ASSERT_EQ(done.size(), static_cast<size_t>(kRequests));
  for (auto& [token, c] : done) {
    ASSERT_TRUE(c.status.ok()) << c.status.message;
    EXPECT_EQ(*reinterpret_cast<const int32_t*>(c.outputs.at(0).data), static_cast<int32_t>(token) * 2);
    EXPECT_NE(c.request, nullptr);  // handed back for release on the consumer's thread
  }
  auto stats = scheduler.statistics();
  EXPECT_EQ(stats.inference_count, static_cast<uint64_t>(kRequests));
  EXPECT_EQ(stats.execution_count, static_cast<uint64_t>(kRequests));
  EXPECT_EQ(stats.success.count, static_cast<uint64_t>(kRequests));
  EXPECT_EQ(stats.batches.at(1).compute_infer.count, static_cast<uint64_t>(kRequests));
}

TEST(Scheduler, ExecutorFailureAnswersTheRequestAndCountsIt) {
  auto queue = std::make_shared<CompletionQueue>();
  std::atomic<int> calls{0};
  Scheduler scheduler(options("broken", 0), executors(1, &calls, /*fail=*/true), queue, test_pool());
  ASSERT_TRUE(scheduler.submit(int_request(1, 1)).ok());
  auto done = collect(*queue, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done.at(1).status.code, StatusCode::kInternal);
  EXPECT_EQ(done.at(1).status.message, "boom");
  EXPECT_EQ(scheduler.statistics().fail.count, 1u);
}

TEST(Scheduler, SubmitAfterShutdownIsUnavailableAndKeepsTheRequest) {
  auto queue = std::make_shared<CompletionQueue>();
  std::atomic<int> calls{0};
  Scheduler scheduler(options("m", 0), executors(1, &calls), queue, test_pool());
  scheduler.shutdown(Scheduler::ShutdownMode::kDrain);
  auto request = int_request(9, 1);
  EXPECT_EQ(scheduler.submit(std::move(request)).code, StatusCode::kUnavailable);
  EXPECT_NE(request, nullptr);
}

TEST(Scheduler, ShutdownWithQueuedRequestsAnswersEachOnce) {
  for (auto [dynamic, mode] :
       {std::pair{false, Scheduler::ShutdownMode::kDrain}, std::pair{false, Scheduler::ShutdownMode::kReject},
        std::pair{true, Scheduler::ShutdownMode::kDrain}, std::pair{true, Scheduler::ShutdownMode::kReject}}) {
    SCOPED_TRACE(dynamic ? "dynamic batching" : "one request a batch");
    auto queue = std::make_shared<CompletionQueue>();
    std::atomic<int> calls{0};
    constexpr int kRequests = 200;
    {
      // With dynamic batching, batches of up to 8 rows (and a delay) are running or forming
      // while the shutdown comes.
      SchedulerOptions o = options("m", dynamic ? 8 : 0, dynamic);
      o.batching.max_queue_delay_us = dynamic ? 1000 : 0;
      Scheduler scheduler(o, executors(2, &calls), queue, test_pool());
      for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(scheduler.submit(int_request(static_cast<uint64_t>(i), i)).ok());
      scheduler.shutdown(mode);
    }
    auto done = collect(*queue, kRequests);
    ASSERT_EQ(done.size(), static_cast<size_t>(kRequests));
    int ok = 0;
    for (auto& [token, c] : done) {
      if (c.status.ok()) {
        ++ok;
      } else {
        EXPECT_EQ(c.status.code, StatusCode::kUnavailable);
      }
    }
    if (mode == Scheduler::ShutdownMode::kDrain) {
      EXPECT_EQ(ok, kRequests);
    }
    if (!dynamic) {
      EXPECT_EQ(ok, calls.load());  // nothing computed without being answered, nor answered twice
    }
  }
}

TEST(Scheduler, ZeroInstancesStillAnswersOnShutdown) {
  auto queue = std::make_shared<CompletionQueue>();
  std::atomic<int> calls{0};
  Scheduler scheduler(options("m", 0), executors(0, &calls), queue, test_pool());
  ASSERT_TRUE(scheduler.submit(int_request(1, 1)).ok());
  scheduler.shutdown(Scheduler::ShutdownMode::kDrain);
  auto done = collect(*queue, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done.at(1).status.code, StatusCode::kUnavailable);
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

TEST(Scheduler, StatisticsCountRowsAsInferencesAndRequestsAsSuccesses) {
  auto queue = std::make_shared<CompletionQueue>();
  std::atomic<int> calls{0};
  Scheduler scheduler(options("rows", 8), executors(1, &calls), queue, test_pool());
  auto values = std::make_shared<std::vector<int32_t>>(std::vector<int32_t>{1, 2, 3});
  auto request = std::make_unique<InferenceRequest>();
  request->token = 1;
  request->batch_size = 3;
  request->inputs.push_back(
      Tensor{DataType::kInt32, {3, 1}, reinterpret_cast<const std::byte*>(values->data()), 12, values});
  ASSERT_TRUE(scheduler.submit(std::move(request)).ok());
  ASSERT_EQ(collect(*queue, 1).size(), 1u);
  auto stats = scheduler.statistics();
  EXPECT_EQ(stats.inference_count, 3u);
  EXPECT_EQ(stats.execution_count, 1u);
  EXPECT_EQ(stats.success.count, 1u);
  EXPECT_EQ(stats.batches.count(3), 1u);
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

size_t thread_count() {
  size_t n = 0;
  for (DIR* dir = opendir("/proc/self/task"); dir != nullptr;) {
    dirent* entry = readdir(dir);
    if (entry == nullptr) {
      closedir(dir);
      break;
    }
    if (entry->d_name[0] != '.') ++n;
  }
  return n;
}

// A joined thread can stay listed in /proc for a moment while the kernel reaps it: the count is
// taken once it has held still for 50 ms (or after a second).
size_t settled_thread_count() {
  size_t last = thread_count();
  for (int still = 0, i = 0; still < 5 && i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const size_t now = thread_count();
    still = now == last ? still + 1 : 0;
    last = now;
  }
  return last;
}

TEST(Scheduler, LeavesNoThreadBehind) {
  auto queue = std::make_shared<CompletionQueue>();
  std::atomic<int> calls{0};
  // Warm-up: a sanitizer runtime may start a helper thread of its own at the first thread.
  {
    Scheduler warm_up(options("m", 0), executors(1, &calls), queue, test_pool());
  }
  const size_t before = settled_thread_count();
  {
    Scheduler scheduler(options("m", 0), executors(4, &calls), queue, test_pool());
    EXPECT_EQ(thread_count(), before + 5);  // a worker per instance and the expiry thread
    ASSERT_TRUE(scheduler.submit(int_request(1, 1)).ok());
  }  // destroyed without an explicit shutdown: drains and joins
  // A joined thread can stay listed in /proc for a moment while the kernel reaps it.
  for (int i = 0; i < 100 && thread_count() != before; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(thread_count(), before);
  EXPECT_EQ(collect(*queue, 1).size(), 1u);
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

TEST(Scheduler, RefusesInputsWhoseBytesDoNotMatchTheirShape) {
  auto queue = std::make_shared<CompletionQueue>();
  std::atomic<int> calls{0};
  Scheduler scheduler(options("m", 0), executors(1, &calls), queue, test_pool());
  auto request = int_request(1, 1);
  request->inputs[0].shape = {2, 1};  // 4 bytes given, 8 needed
  Status status = scheduler.submit(std::move(request));
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("input 0 of model 'm'"), std::string::npos) << status.message;
  EXPECT_NE(request, nullptr);
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

// Records the rows of each batch; sleeps `delay` per batch (longer for odd first values, to let
// instances overtake each other).
class RecordingExecutor : public Executor {
 public:
  RecordingExecutor(std::vector<int64_t>* rows, std::mutex* mutex, std::chrono::milliseconds delay, bool skew)
      : rows_(rows), mutex_(mutex), delay_(delay), skew_(skew) {}
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    const Tensor& in = inputs.at(0);
    {
      std::lock_guard<std::mutex> lock(*mutex_);
      rows_->push_back(in.shape[0]);
    }
    const auto* src = reinterpret_cast<const int32_t*>(in.data);
    std::this_thread::sleep_for(skew_ && src[0] % 2 == 0 ? delay_ * 5 : delay_);
    auto out = std::make_shared<std::vector<int32_t>>(src, src + in.byte_size / 4);
    for (auto& v : *out) v *= 2;
    outputs->push_back(
        Tensor{DataType::kInt32, in.shape, reinterpret_cast<const std::byte*>(out->data()), out->size() * 4, out});
    return Status::Ok();
  }

 private:
  std::vector<int64_t>* rows_;
  std::mutex* mutex_;
  std::chrono::milliseconds delay_;
  bool skew_;
};

TEST(Scheduler, BatchesQueuedRequestsAndScattersEachAnswerBack) {
  auto queue = std::make_shared<CompletionQueue>();
  std::vector<int64_t> rows;
  std::mutex mutex;
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::make_unique<RecordingExecutor>(&rows, &mutex, std::chrono::milliseconds(20), false));
  auto pool = test_pool();
  Scheduler scheduler(options("batched", 8, /*dynamic=*/true), std::move(instances), queue, pool);
  constexpr int kRequests = 40;
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(scheduler.submit(int_request(static_cast<uint64_t>(i), i)).ok());
  auto done = collect(*queue, kRequests);
  ASSERT_EQ(done.size(), static_cast<size_t>(kRequests));
  for (auto& [token, c] : done) {
    ASSERT_TRUE(c.status.ok()) << c.status.message;
    EXPECT_EQ(*reinterpret_cast<const int32_t*>(c.outputs.at(0).data), static_cast<int32_t>(token) * 2);
  }
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_LT(rows.size(), static_cast<size_t>(kRequests));  // requests shared executions
  int64_t total = 0;
  for (int64_t r : rows) {
    EXPECT_LE(r, 8);
    total += r;
  }
  EXPECT_EQ(total, kRequests);
  EXPECT_EQ(scheduler.statistics().execution_count, rows.size());
  EXPECT_GT(pool->stats().reuses, 0u);  // batch buffers came back to the pool
}

// Answers each request on its own, as a python-backend model does: doubles it, fails a request
// whose value is 13 with its own message, and records how many requests each call held. Fails the
// whole batch if given a ResponseStream (it is not decoupled).
class PerRequestExecutor : public Executor {
 public:
  PerRequestExecutor(std::vector<size_t>* calls, std::mutex* mutex, bool fail_whole = false)
      : calls_(calls), mutex_(mutex), fail_whole_(fail_whole) {}
  Status execute(const std::vector<Tensor>&, std::vector<Tensor>*) override {
    return Status::Error(StatusCode::kInternal, "execute() called on an executor answering each request");
  }
  bool answers_each_request() const override { return true; }
  Status execute_requests(const std::vector<ExecutorRequest>& requests, std::vector<RequestResult>* results,
                          ResponseStream* responses) override {
    {
      std::lock_guard<std::mutex> lock(*mutex_);
      calls_->push_back(requests.size());
    }
    // Only a decoupled executor gets a stream for responses before the final ones.
    if (responses != nullptr) return Status::Error(StatusCode::kInternal, "a ResponseStream for a plain executor");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // later requests queue meanwhile
    if (fail_whole_) return Status::Error(StatusCode::kInternal, "the worker process died");
    for (const ExecutorRequest& request : requests) {
      const Tensor& in = request.inputs.at(0);
      const auto* src = reinterpret_cast<const int32_t*>(in.data);
      RequestResult result;
      if (src[0] == 13) {
        result.status = Status::Error(StatusCode::kInvalidArgument, "13 is refused by the model");
      } else {
        auto out = std::make_shared<std::vector<int32_t>>(src, src + in.byte_size / 4);
        for (auto& v : *out) v *= 2;
        result.outputs.push_back(
            Tensor{DataType::kInt32, in.shape, reinterpret_cast<const std::byte*>(out->data()), out->size() * 4, out});
      }
      results->push_back(std::move(result));
    }
    return Status::Ok();
  }

 private:
  std::vector<size_t>* calls_;
  std::mutex* mutex_;
  bool fail_whole_;
};

TEST(Scheduler, AnExecutorAnsweringEachRequestGetsTheBatchAsRequestsAndFailsOnlyTheOneItRefuses) {
  auto queue = std::make_shared<CompletionQueue>();
  std::vector<size_t> calls;
  std::mutex mutex;
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::make_unique<PerRequestExecutor>(&calls, &mutex));
  Scheduler scheduler(options("python", 8, /*dynamic=*/true), std::move(instances), queue, test_pool());
  constexpr int kRequests = 30;
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(scheduler.submit(int_request(static_cast<uint64_t>(i), i)).ok());
  auto done = collect(*queue, kRequests);
  ASSERT_EQ(done.size(), static_cast<size_t>(kRequests));
  for (auto& [token, c] : done) {
    if (token == 13) {
      EXPECT_EQ(c.status.code, StatusCode::kInvalidArgument);
      EXPECT_EQ(c.status.message, "13 is refused by the model");
    } else {
      ASSERT_TRUE(c.status.ok()) << token << ": " << c.status.message;
      EXPECT_EQ(*reinterpret_cast<const int32_t*>(c.outputs.at(0).data), static_cast<int32_t>(token) * 2);
      EXPECT_GT(c.timing.batch_requests, 0u);
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_LT(calls.size(), static_cast<size_t>(kRequests));  // requests shared calls
  size_t total = 0;
  for (size_t n : calls) total += n;
  EXPECT_EQ(total, static_cast<size_t>(kRequests));  // each request once: no bisection re-runs
  const StatisticsSnapshot stats = scheduler.statistics();
  EXPECT_EQ(stats.success.count, static_cast<uint64_t>(kRequests - 1));
  EXPECT_EQ(stats.fail.count, 1u);
}

// Issue 25, item 9: a python model's outputs are checked against its config: rank, the batch dim
// (the request's batch size) and every fixed dim. PerRequestExecutor answers with the input's
// shape, [1, 1]; a config of dims [1] fits, [2] or [1, 1] do not, and -1 takes any.
TEST(Scheduler, AnOutputWhoseShapeTheConfigDoesNotAllowFailsItsRequest) {
  for (const auto& [dims, fits] :
       std::vector<std::pair<std::vector<int64_t>, bool>>{{{1}, true}, {{-1}, true}, {{2}, false}, {{1, 1}, false}}) {
    auto signature = std::make_shared<ModelSignature>();
    signature->name = "python";
    signature->max_batch_size = 8;
    signature->outputs = {OutputSignature{"OUT", DataType::kInt32, dims, false}};
    auto queue = std::make_shared<CompletionQueue>();
    std::vector<size_t> calls;
    std::mutex mutex;
    std::vector<std::unique_ptr<Executor>> instances;
    instances.push_back(std::make_unique<PerRequestExecutor>(&calls, &mutex));
    Scheduler scheduler(options("python", 8, /*dynamic=*/true), std::move(instances), queue, test_pool());
    auto request = int_request(1, 21);
    request->signature = signature;
    request->batch_size = 1;
    ASSERT_TRUE(scheduler.submit(std::move(request)).ok());
    auto done = collect(*queue, 1);
    ASSERT_EQ(done.size(), 1u);
    const Completion& c = done.begin()->second;
    if (fits) {
      EXPECT_TRUE(c.status.ok()) << c.status.message;
    } else {
      EXPECT_EQ(c.status.code, StatusCode::kInternal);
      EXPECT_EQ(c.status.message.find("model 'python' answered output 'OUT' with shape [1, 1], not its config's"), 0u)
          << c.status.message;
    }
  }
}

TEST(Scheduler, AWholeBatchFailureOfAnExecutorAnsweringEachRequestFailsEveryRequestOnce) {
  auto queue = std::make_shared<CompletionQueue>();
  std::vector<size_t> calls;
  std::mutex mutex;
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::make_unique<PerRequestExecutor>(&calls, &mutex, /*fail_whole=*/true));
  Scheduler scheduler(options("python", 8, /*dynamic=*/true), std::move(instances), queue, test_pool());
  constexpr int kRequests = 10;
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(scheduler.submit(int_request(static_cast<uint64_t>(i), i)).ok());
  auto done = collect(*queue, kRequests);
  ASSERT_EQ(done.size(), static_cast<size_t>(kRequests));
  for (auto& [token, c] : done) EXPECT_EQ(c.status.message, "the worker process died") << token;
  std::lock_guard<std::mutex> lock(mutex);
  size_t total = 0;
  for (size_t n : calls) total += n;
  EXPECT_EQ(total, static_cast<size_t>(kRequests));  // not re-run in halves
}

// A decoupled model, as a decoupled python-backend model answers: a request of value v gets v
// streamed responses (each its own number 0..v-1), then its final result: value 1 ends with its
// final flag alone, value 5 fails with its own error; others end with a last response of 100 + v.
class DecoupledExecutor : public Executor {
 public:
  Status execute(const std::vector<Tensor>&, std::vector<Tensor>*) override {
    return Status::Error(StatusCode::kInternal, "execute() called on a decoupled executor");
  }
  bool decoupled() const override { return true; }
  Status execute_requests(const std::vector<ExecutorRequest>& requests, std::vector<RequestResult>* results,
                          ResponseStream* responses) override {
    if (responses == nullptr) return Status::Error(StatusCode::kInternal, "no ResponseStream for a decoupled executor");
    for (size_t i = 0; i < requests.size(); ++i) {
      const int32_t value = *reinterpret_cast<const int32_t*>(requests[i].inputs.at(0).data);
      for (int32_t n = 0; n < value; ++n) responses->respond(i, int_result(n));
      if (value == 1) {
        RequestResult flag_only;
        flag_only.respond = false;
        results->push_back(std::move(flag_only));
      } else if (value == 5) {
        results->push_back(RequestResult{Status::Error(StatusCode::kInvalidArgument, "5 ends in an error"), {}});
      } else {
        results->push_back(int_result(100 + value));
      }
    }
    return Status::Ok();
  }
};

// Records, per request token, every streamed response's number (-1 for an error response) and
// then its final completion; a response after the final one is recorded as -2.
class RecordingSink : public CompletionSink {
 public:
  struct Seen {
    std::vector<int32_t> responses;
    std::vector<Completion> finals;
  };
  void respond(const InferenceRequest& request, RequestResult&& response) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Seen& seen = seen_[request.token];
    if (!seen.finals.empty()) {
      seen.responses.push_back(-2);
    } else if (!response.status.ok()) {
      seen.responses.push_back(-1);
    } else {
      seen.responses.push_back(*reinterpret_cast<const int32_t*>(response.outputs.at(0).data));
    }
  }
  void complete(Completion&& completion) override {
    std::lock_guard<std::mutex> lock(mutex_);
    seen_[completion.token].finals.push_back(std::move(completion));
    ++finals_;
  }
  // Waits (10 s at most) for `n` final completions; returns what was seen.
  std::map<uint64_t, Seen> wait(size_t n) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (finals_ >= n) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return std::move(seen_);
  }

 private:
  std::mutex mutex_;
  std::map<uint64_t, Seen> seen_;
  size_t finals_ = 0;
};

TEST(Scheduler, ADecoupledExecutorStreamsEachRequestsResponsesInOrderThenOneFinalCompletion) {
  auto queue = std::make_shared<CompletionQueue>();
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::make_unique<DecoupledExecutor>());
  Scheduler scheduler(options("decoupled", 8, /*dynamic=*/true), std::move(instances), queue, test_pool());
  auto sink = std::make_shared<RecordingSink>();
  // Tokens 1..3 stream 0, 1 (then the final flag alone) and 5 (then an error) responses; token 4
  // (value 2) has no sink: its final completion goes to the queue, its responses nowhere.
  const std::vector<int32_t> values = {0, 1, 5, 2};
  for (size_t i = 0; i < values.size(); ++i) {
    auto request = int_request(i + 1, values[i]);
    if (i < 3) request->sink = sink;
    ASSERT_TRUE(scheduler.submit(std::move(request)).ok());
  }
  auto seen = sink->wait(3);
  auto queued = collect(*queue, 1);
  ASSERT_EQ(seen.size(), 3u);
  for (auto& [token, s] : seen) ASSERT_EQ(s.finals.size(), 1u) << token;
  EXPECT_EQ(seen[1].responses, std::vector<int32_t>{});
  EXPECT_EQ(seen[2].responses, std::vector<int32_t>{0});
  EXPECT_EQ(seen[3].responses, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  const Completion& last = seen[1].finals[0];  // value 0: no streamed response, a final one
  ASSERT_TRUE(last.status.ok()) << last.status.message;
  EXPECT_TRUE(last.respond);
  EXPECT_EQ(*reinterpret_cast<const int32_t*>(last.outputs.at(0).data), 100);
  const Completion& flag_only = seen[2].finals[0];
  EXPECT_TRUE(flag_only.status.ok()) << flag_only.status.message;
  EXPECT_FALSE(flag_only.respond);
  EXPECT_TRUE(flag_only.outputs.empty());
  EXPECT_EQ(seen[3].finals[0].status.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(seen[3].finals[0].status.message, "5 ends in an error");
  ASSERT_EQ(queued.size(), 1u);
  ASSERT_TRUE(queued.at(4).status.ok()) << queued.at(4).status.message;
  EXPECT_TRUE(queued.at(4).respond);
  EXPECT_EQ(*reinterpret_cast<const int32_t*>(queued.at(4).outputs.at(0).data), 102);

  const StatisticsSnapshot stats = scheduler.statistics();
  // Responses: 0 + 1 + 5 + 2 streamed; finals with a response: value 0, 5 (its error) and 2.
  EXPECT_EQ(stats.responses, 8u + 3u);
  uint64_t first_responses = 0;
  for (uint64_t count : stats.first_response.counts) first_responses += count;
  EXPECT_EQ(first_responses, 4u);  // one per request, the flag-only final of value 1 included
  EXPECT_GT(stats.first_response.sum_ns, 0u);
  EXPECT_EQ(stats.success.count, 3u);
  EXPECT_EQ(stats.fail.count, 1u);
}

// A decoupled executor whose execute returns at once, each request left open
// (RequestResult::pending), as a python model whose own thread sends: the test answers them
// through the LaterResponses kept here, by request value. A request of value 4 is given its final
// result (44) while execute runs. With `keep` false the executor lets go of the batch at once.
class InFlightExecutor : public Executor {
 public:
  struct Open {
    std::shared_ptr<LaterResponses> later;
    size_t index = 0;
    RequestCancellation cancellation;
  };
  explicit InFlightExecutor(bool keep = true) : keep_(keep) {}
  Status execute(const std::vector<Tensor>&, std::vector<Tensor>*) override {
    return Status::Error(StatusCode::kInternal, "execute() called on a decoupled executor");
  }
  bool decoupled() const override { return true; }
  Status execute_requests(const std::vector<ExecutorRequest>& requests, std::vector<RequestResult>* results,
                          ResponseStream* responses) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      const int32_t value = *reinterpret_cast<const int32_t*>(requests[i].inputs.at(0).data);
      if (value == 4) {
        EXPECT_TRUE(responses->later()->finish(i, int_result(44)));
      }
      RequestResult pending;
      pending.pending = true;
      results->push_back(std::move(pending));
      std::lock_guard<std::mutex> lock(mutex_);
      if (keep_) open_[value] = Open{responses->later(), i, requests[i].cancellation};
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++batches_;
    changed_.notify_all();
    return Status::Ok();
  }
  // The open request of `value` (10 s at most; a null `later` if it never came).
  Open wait_for(int32_t value) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(10), [&] { return open_.count(value) != 0; });
    const auto found = open_.find(value);
    return found == open_.end() ? Open{} : found->second;
  }
  int batches() {
    std::lock_guard<std::mutex> lock(mutex_);
    return batches_;
  }
  void forget() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_.clear();
  }

 private:
  const bool keep_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int32_t, Open> open_;
  int batches_ = 0;
};

RequestResult flag_only() {
  RequestResult result;
  result.respond = false;
  return result;
}

// A scheduler with one InFlightExecutor (`keep` as it takes it), its requests answered to `sink`.
struct InFlightServing {
  explicit InFlightServing(bool keep = true) {
    auto owned = std::make_unique<InFlightExecutor>(keep);
    executor = owned.get();
    std::vector<std::unique_ptr<Executor>> instances;
    instances.push_back(std::move(owned));
    scheduler = std::make_unique<Scheduler>(options("in-flight", 8, /*dynamic=*/true), std::move(instances),
                                            std::make_shared<CompletionQueue>(), test_pool());
  }
  ~InFlightServing() { executor->forget(); }  // before the scheduler goes: nothing held open
  InFlightServing(const InFlightServing&) = delete;
  InFlightServing& operator=(const InFlightServing&) = delete;

  bool submit(uint64_t token, int32_t value) {
    auto request = int_request(token, value);
    request->sink = sink;
    return scheduler->submit(std::move(request)).ok();
  }

  InFlightExecutor* executor = nullptr;
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  std::unique_ptr<Scheduler> scheduler;
};

TEST(Scheduler, ADecoupledExecutorMayReturnBeforeItsFinalResponsesAndTheInstanceTakesItsNextBatch) {
  InFlightServing serving;
  ASSERT_TRUE(serving.submit(1, 1));
  const InFlightExecutor::Open one = serving.executor->wait_for(1);
  ASSERT_NE(one.later, nullptr);
  // Request 1 is still open, yet the one instance takes request 2's batch.
  ASSERT_TRUE(serving.submit(2, 2));
  const InFlightExecutor::Open two = serving.executor->wait_for(2);
  ASSERT_NE(two.later, nullptr);
  EXPECT_EQ(serving.executor->batches(), 2);
  // Answered from another thread, interleaved across the two batches.
  std::thread answering([&] {
    EXPECT_TRUE(one.later->respond(one.index, int_result(10)));
    EXPECT_TRUE(two.later->respond(two.index, int_result(20)));
    EXPECT_TRUE(two.later->finish(two.index, int_result(21)));
    EXPECT_TRUE(one.later->respond(one.index, int_result(11)));
    EXPECT_TRUE(one.later->finish(one.index, flag_only()));
  });
  answering.join();
  // A request that ended takes nothing more.
  EXPECT_FALSE(one.later->respond(one.index, int_result(12)));
  EXPECT_FALSE(two.later->finish(two.index, int_result(22)));
  // Value 4's final result came while its execute ran: it completes when execute returns.
  ASSERT_TRUE(serving.submit(3, 4));
  auto seen = serving.sink->wait(3);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].responses, (std::vector<int32_t>{10, 11}));
  ASSERT_EQ(seen[1].finals.size(), 1u);
  EXPECT_TRUE(seen[1].finals[0].status.ok()) << seen[1].finals[0].status.message;
  EXPECT_FALSE(seen[1].finals[0].respond);
  EXPECT_EQ(seen[2].responses, std::vector<int32_t>{20});
  ASSERT_EQ(seen[2].finals.size(), 1u);
  ASSERT_TRUE(seen[2].finals[0].status.ok()) << seen[2].finals[0].status.message;
  EXPECT_EQ(*reinterpret_cast<const int32_t*>(seen[2].finals[0].outputs.at(0).data), 21);
  EXPECT_NE(seen[2].finals[0].timing.batch_id, seen[1].finals[0].timing.batch_id);
  ASSERT_EQ(seen[3].finals.size(), 1u);
  ASSERT_TRUE(seen[3].finals[0].status.ok()) << seen[3].finals[0].status.message;
  EXPECT_EQ(*reinterpret_cast<const int32_t*>(seen[3].finals[0].outputs.at(0).data), 44);
  const StatisticsSnapshot stats = serving.scheduler->statistics();
  EXPECT_EQ(stats.execution_count, 3u);
  EXPECT_EQ(stats.success.count, 3u);
  EXPECT_EQ(stats.responses, 3u + 2u);  // three streamed; the finals of requests 2 and 3
}

TEST(Scheduler, AnOpenDecoupledRequestIsToldOfItsCancellation) {
  InFlightServing serving;
  ASSERT_TRUE(serving.submit(7, 1));
  const InFlightExecutor::Open open = serving.executor->wait_for(1);
  ASSERT_NE(open.later, nullptr);
  EXPECT_FALSE(open.cancellation.requested());
  EXPECT_FALSE(serving.scheduler->cancel(7));  // not queued: running, and told
  EXPECT_TRUE(open.cancellation.requested());
  EXPECT_TRUE(open.later->finish(open.index, RequestResult{Status::Error(StatusCode::kCancelled, "stopped"), {}}));
  auto seen = serving.sink->wait(1);
  ASSERT_EQ(seen[7].finals.size(), 1u);
  EXPECT_EQ(seen[7].finals[0].status.code, StatusCode::kCancelled);
}

TEST(Scheduler, ARequestLeftOpenByAnExecutorThatLetsGoOfItsBatchFails) {
  InFlightServing serving(/*keep=*/false);
  ASSERT_TRUE(serving.submit(1, 1));
  auto seen = serving.sink->wait(1);
  ASSERT_EQ(seen[1].finals.size(), 1u);
  EXPECT_EQ(seen[1].finals[0].status.code, StatusCode::kInternal);
  EXPECT_EQ(seen[1].finals[0].status.message, "the model released the request without sending its final response");
}

TEST(Scheduler, ShutdownRejectingFailsOpenDecoupledRequestsAndDrainingWaitsForThem) {
  for (const bool reject : {true, false}) {
    InFlightServing serving;
    ASSERT_TRUE(serving.submit(1, 1));
    const InFlightExecutor::Open open = serving.executor->wait_for(1);
    ASSERT_NE(open.later, nullptr);
    std::atomic<bool> finished{false};
    std::thread model;
    if (!reject) {
      model = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        finished = true;
        EXPECT_TRUE(open.later->finish(open.index, int_result(5)));
      });
    }
    serving.scheduler->shutdown(reject ? Scheduler::ShutdownMode::kReject : Scheduler::ShutdownMode::kDrain);
    if (!reject) {
      EXPECT_TRUE(finished) << "a draining shutdown returned while a request was open";
    }
    auto seen = serving.sink->wait(1);
    ASSERT_EQ(seen[1].finals.size(), 1u) << reject;
    if (reject) {
      EXPECT_EQ(seen[1].finals[0].status.code, StatusCode::kUnavailable);
      EXPECT_EQ(seen[1].finals[0].status.message, "model 'in-flight' was unloaded");
      // After the shutdown nothing reaches the scheduler.
      EXPECT_FALSE(open.later->respond(open.index, int_result(6)));
    } else {
      model.join();
      EXPECT_TRUE(seen[1].finals[0].status.ok()) << seen[1].finals[0].status.message;
    }
  }
}

// A sink that, on its request's answer, cancels another request of the same scheduler (what an
// ensemble does with a failed run's other steps), and records every answer.
class CancellingSink : public CompletionSink {
 public:
  CancellingSink(Scheduler** scheduler, uint64_t victim, std::mutex* mutex, std::map<uint64_t, Completion>* done)
      : scheduler_(scheduler), victim_(victim), mutex_(mutex), done_(done) {}
  void complete(Completion&& completion) override {
    const uint64_t token = completion.token;
    if (victim_ != 0) (*scheduler_)->cancel(victim_);
    std::lock_guard<std::mutex> lock(*mutex_);
    done_->emplace(token, std::move(completion));
  }

 private:
  Scheduler** scheduler_;
  uint64_t victim_;
  std::mutex* mutex_;
  std::map<uint64_t, Completion>* done_;
};

TEST(Scheduler, ASinkMayCancelAnotherRequestWhilePreservingOrder) {
  auto queue = std::make_shared<CompletionQueue>();
  std::vector<int64_t> rows;
  std::mutex rows_mutex;
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::make_unique<RecordingExecutor>(&rows, &rows_mutex, std::chrono::milliseconds(50), false));
  SchedulerOptions o = options("ordered", 1, /*dynamic=*/true);
  o.batching.preserve_ordering = true;
  Scheduler scheduler(o, std::move(instances), queue, test_pool());
  Scheduler* self = &scheduler;
  std::mutex mutex;
  std::map<uint64_t, Completion> done;
  // Request 1 computes; 2 waits in the queue; 1's answer cancels 2 from inside the delivery.
  auto first = int_request(1, 1);
  first->sink = std::make_shared<CancellingSink>(&self, 2, &mutex, &done);
  auto second = int_request(2, 2);
  second->sink = std::make_shared<CancellingSink>(&self, 0, &mutex, &done);
  ASSERT_TRUE(scheduler.submit(std::move(first)).ok());
  ASSERT_TRUE(scheduler.submit(std::move(second)).ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (done.size() == 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(done.size(), 2u) << "a sink re-entering the scheduler deadlocked its delivery";
  EXPECT_TRUE(done.at(1).status.ok()) << done.at(1).status.message;
  EXPECT_EQ(done.at(2).status.code, StatusCode::kCancelled);
}

TEST(Scheduler, EachAnswerCarriesItsTimelineAndTheBatchItRodeIn) {
  auto queue = std::make_shared<CompletionQueue>();
  std::vector<int64_t> rows;
  std::mutex mutex;
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::make_unique<RecordingExecutor>(&rows, &mutex, std::chrono::milliseconds(20), false));
  Scheduler scheduler(options("timed", 8, /*dynamic=*/true), std::move(instances), queue, test_pool());
  constexpr int kRequests = 12;
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(scheduler.submit(int_request(static_cast<uint64_t>(i), i)).ok());
  auto done = collect(*queue, kRequests);
  std::map<uint64_t, uint32_t> seen_in_batch;  // batch id -> answers that name it
  for (auto& [token, c] : done) {
    const RequestTiming& t = c.timing;
    ASSERT_TRUE(c.status.ok());
    EXPECT_NE(t.enqueued, Clock::time_point{});
    EXPECT_LE(t.enqueued, t.compute_start);
    EXPECT_LE(t.compute_start, t.input_done);
    EXPECT_LE(t.input_done, t.infer_done);
    EXPECT_GE(t.infer_done - t.input_done, std::chrono::milliseconds(20));  // the executor's sleep
    EXPECT_LE(t.infer_done, t.compute_end);
    EXPECT_GE(t.batch_id, 1u);
    EXPECT_EQ(t.batch_rows, static_cast<int64_t>(t.batch_requests));  // one row each
    EXPECT_EQ(t.instance, 0u);
    ++seen_in_batch[t.batch_id];
  }
  for (auto& [token, c] : done) EXPECT_EQ(seen_in_batch[c.timing.batch_id], c.timing.batch_requests);
  EXPECT_EQ(seen_in_batch.size(), scheduler.statistics().execution_count);
}

// Stages (copies) and computes each batch in 20 ms each, recording when; execute checks that it
// gets the batches in staging order.
class PipelinedExecutor : public Executor {
 public:
  struct Interval {
    Clock::time_point begin, end;
  };
  bool pipelined() const override { return true; }
  Status stage(const std::vector<Tensor>& inputs) override {
    const auto begin = Clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> lock(mutex);
    staged.push_back(inputs.at(0).data);
    stages.push_back({begin, Clock::now()});
    return Status::Ok();
  }
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    const auto begin = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (staged.empty() || staged.front() != inputs.at(0).data) {
        return Status::Error(StatusCode::kInternal, "executed a batch that was not staged next");
      }
      staged.erase(staged.begin());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    *outputs = inputs;  // identity
    std::lock_guard<std::mutex> lock(mutex);
    executions.push_back({begin, Clock::now()});
    return Status::Ok();
  }
  std::mutex mutex;
  std::vector<const std::byte*> staged;
  std::vector<Interval> stages, executions;
};

TEST(Scheduler, APipelinedInstanceStagesTheNextBatchWhileOneComputes) {
  auto queue = std::make_shared<CompletionQueue>();
  auto owned = std::make_unique<PipelinedExecutor>();
  PipelinedExecutor* executor = owned.get();
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::move(owned));
  constexpr int kRequests = 8;
  Scheduler scheduler(options("pipelined", 8), std::move(instances), queue, test_pool());
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(scheduler.submit(int_request(static_cast<uint64_t>(i), i)).ok());
  auto done = collect(*queue, kRequests);
  ASSERT_EQ(done.size(), static_cast<size_t>(kRequests));
  for (auto& [token, c] : done) {
    ASSERT_TRUE(c.status.ok()) << c.status.message;
    EXPECT_EQ(*reinterpret_cast<const int32_t*>(c.outputs.at(0).data), static_cast<int32_t>(token));
  }
  scheduler.shutdown(Scheduler::ShutdownMode::kDrain);
  std::lock_guard<std::mutex> lock(executor->mutex);
  ASSERT_EQ(executor->executions.size(), static_cast<size_t>(kRequests));
  int overlapping = 0;  // batches staged while another one computed
  for (const auto& s : executor->stages) {
    for (const auto& e : executor->executions) overlapping += s.begin < e.end && e.begin < s.end;
  }
  EXPECT_GE(overlapping, kRequests / 2);
  // Serial would take 8 x 40 ms; pipelined about 8 x 20 ms + 20 ms.
  const auto total = executor->executions.back().end - executor->stages.front().begin;
  EXPECT_LT(total, std::chrono::milliseconds(8 * 40 - 60));
}

TEST(Scheduler, PreserveOrderingCompletesInEnqueueOrder) {
  auto queue = std::make_shared<CompletionQueue>();
  std::vector<int64_t> rows;
  std::mutex mutex;
  std::vector<std::unique_ptr<Executor>> instances;
  for (int i = 0; i < 3; ++i) {
    instances.push_back(std::make_unique<RecordingExecutor>(&rows, &mutex, std::chrono::milliseconds(2), true));
  }
  SchedulerOptions o = options("ordered", 1, /*dynamic=*/true);
  o.batching.preserve_ordering = true;
  Scheduler scheduler(o, std::move(instances), queue, test_pool());
  constexpr int kRequests = 30;
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(scheduler.submit(int_request(static_cast<uint64_t>(i), i)).ok());
  std::vector<uint64_t> order;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (order.size() < kRequests && std::chrono::steady_clock::now() < deadline) {
    pollfd p{queue->fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
    for (auto& c : queue->drain()) order.push_back(c.token);
  }
  ASSERT_EQ(order.size(), static_cast<size_t>(kRequests));
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], static_cast<uint64_t>(i));
}

TEST(Scheduler, CancelAnswersAQueuedRequestWithoutRunningIt) {
  auto queue = std::make_shared<CompletionQueue>();
  std::vector<int64_t> rows;
  std::mutex mutex;
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::make_unique<RecordingExecutor>(&rows, &mutex, std::chrono::milliseconds(50), false));
  Scheduler scheduler(options("m", 1, /*dynamic=*/true), std::move(instances), queue, test_pool());
  ASSERT_TRUE(scheduler.submit(int_request(1, 1)).ok());  // occupies the only instance
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(scheduler.submit(int_request(2, 2)).ok());
  EXPECT_TRUE(scheduler.cancel(2));
  EXPECT_FALSE(scheduler.cancel(2));
  auto done = collect(*queue, 2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_TRUE(done.at(1).status.ok());
  EXPECT_EQ(done.at(2).status.code, StatusCode::kCancelled);
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_EQ(rows.size(), 1u);
}

// Answers each request with its value, or with its value negated once it sees the request cancelled
// (it waits up to 300 ms per batch for that). Signals when it starts running.
class CancellableExecutor : public Executor {
 public:
  Status execute(const std::vector<Tensor>&, std::vector<Tensor>*) override {
    return Status::Error(StatusCode::kInternal, "execute() called on an executor answering each request");
  }
  bool answers_each_request() const override { return true; }
  Status execute_requests(const std::vector<ExecutorRequest>& requests, std::vector<RequestResult>* results,
                          ResponseStream*) override {
    running.store(true);
    const auto patience = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    for (const ExecutorRequest& request : requests) {
      const int32_t value = *reinterpret_cast<const int32_t*>(request.inputs.at(0).data);
      bool cancelled = request.cancellation.requested();
      while (!cancelled && std::chrono::steady_clock::now() < patience) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        cancelled = request.cancellation.requested();
      }
      results->push_back(int_result(cancelled ? -value : value));
    }
    return Status::Ok();
  }
  std::atomic<bool> running{false};
};

TEST(Scheduler, ARunningRequestsExecutorIsToldOfItsCancellationAndTheNextRequestIsNot) {
  auto queue = std::make_shared<CompletionQueue>();
  auto executor = std::make_unique<CancellableExecutor>();
  CancellableExecutor* running = executor.get();
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::move(executor));
  Scheduler scheduler(options("python", 8, /*dynamic=*/true), std::move(instances), queue, test_pool());
  ASSERT_TRUE(scheduler.submit(int_request(1, 7)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!running->running.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(running->running.load());
  EXPECT_FALSE(scheduler.cancel(1));  // not queued: it runs on, told
  auto done = collect(*queue, 1);
  ASSERT_EQ(done.size(), 1u);
  ASSERT_TRUE(done.at(1).status.ok()) << done.at(1).status.message;
  EXPECT_EQ(*reinterpret_cast<const int32_t*>(done.at(1).outputs.at(0).data), -7);
  EXPECT_FALSE(scheduler.cancel(1));  // done: nothing left to tell
  // The next request starts with a flag of its own, not set.
  ASSERT_TRUE(scheduler.submit(int_request(2, 9)).ok());
  done = collect(*queue, 1);
  ASSERT_EQ(done.size(), 1u);
  ASSERT_TRUE(done.at(2).status.ok()) << done.at(2).status.message;
  EXPECT_EQ(*reinterpret_cast<const int32_t*>(done.at(2).outputs.at(0).data), 9);
}

// A cancel that finds its request neither queued nor running (being staged) is remembered: the
// request's flag starts set when it registers, and only that request's.
TEST(RunningRequests, ACancelBeforeRegistrationSetsTheFlagWhenTheRequestRegisters) {
  RunningRequests running;
  EXPECT_FALSE(running.cancel(5));
  {
    const RunningRequests::Watch watch(&running, {4, 5, 6});
    EXPECT_FALSE(watch.flag(0)->load());
    EXPECT_TRUE(watch.flag(1)->load());
    EXPECT_FALSE(watch.flag(2)->load());
    EXPECT_TRUE(running.cancel(6));  // running: told now
    EXPECT_TRUE(watch.flag(2)->load());
    EXPECT_FALSE(watch.flag(0)->load());
  }
  const RunningRequests::Watch again(&running, {5});  // the remembered cancel was taken
  EXPECT_FALSE(again.flag(0)->load());
}

TEST(RunningRequests, OnlyTheLatestCancelsAreRemembered) {
  RunningRequests running;
  for (uint64_t token = 1; token <= RunningRequests::kRememberedCancels + 1; ++token) {
    EXPECT_FALSE(running.cancel(token));
  }
  const RunningRequests::Watch watch(&running, {1, 2, RunningRequests::kRememberedCancels + 1});
  EXPECT_FALSE(watch.flag(0)->load());  // the oldest was forgotten
  EXPECT_TRUE(watch.flag(1)->load());
  EXPECT_TRUE(watch.flag(2)->load());
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

// A deadline or queue timeout that passes while the only instance computes is answered then, not
// when the instance is free again (no worker is in the batcher to see it: the expiry thread is).
TEST(Scheduler, ExpiriesAreAnsweredWhileEveryInstanceIsBusy) {
  auto queue = std::make_shared<CompletionQueue>();
  std::vector<int64_t> rows;
  std::mutex mutex;
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::make_unique<RecordingExecutor>(&rows, &mutex, std::chrono::milliseconds(600), false));
  SchedulerOptions o = options("m", 1, /*dynamic=*/true);
  o.batching.default_queue_policy.default_timeout_us = 50'000;  // REJECT after 50 ms
  Scheduler scheduler(o, std::move(instances), queue, test_pool());
  ASSERT_TRUE(scheduler.submit(int_request(1, 1)).ok());  // occupies the only instance for 600 ms
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto start = Clock::now();
  auto late = int_request(2, 2);
  late->deadline = start + std::chrono::milliseconds(30);
  ASSERT_TRUE(scheduler.submit(std::move(late)).ok());
  ASSERT_TRUE(scheduler.submit(int_request(3, 3)).ok());  // only the queue timeout
  auto done = collect(*queue, 2);
  const auto waited = Clock::now() - start;
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done.at(2).status.code, StatusCode::kDeadlineExceeded);
  EXPECT_EQ(done.at(3).status.code, StatusCode::kUnavailable);
  EXPECT_LT(waited, std::chrono::milliseconds(400));  // the busy batch is still running
  EXPECT_EQ(collect(*queue, 1).count(1), 1u);
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_EQ(rows.size(), 1u);
}

// Doubles an INT32 input, but fails a batch in which any row holds a poisoned value, with a
// message that lists every value of the batch (as runtimes' messages quote their inputs).
// Optionally pipelined, checking that it executes batches in staging order. Its first call
// (stage or execute) waits at a gate until the test opens it, so that the test can queue every
// other request meanwhile and the batches that follow are full.
class PoisonedExecutor : public Executor {
 public:
  PoisonedExecutor(std::vector<int32_t> poison, bool pipelined) : poison_(std::move(poison)), pipelined_(pipelined) {}
  bool pipelined() const override { return pipelined_; }
  void wait_at_gate() {
    std::unique_lock<std::mutex> lock(gate_mutex_);
    gate_changed_.wait(lock, [&] { return gate_entered_; });
  }
  void open_gate() {
    std::lock_guard<std::mutex> lock(gate_mutex_);
    gate_open_ = true;
    gate_changed_.notify_all();
  }
  Status stage(const std::vector<Tensor>& inputs) override {
    pass_gate();
    std::lock_guard<std::mutex> lock(mutex);
    staged.push_back(inputs.at(0).data);
    return Status::Ok();
  }
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    pass_gate();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const Tensor& in = inputs.at(0);
    const auto* src = reinterpret_cast<const int32_t*>(in.data);
    const size_t n = in.byte_size / 4;
    std::lock_guard<std::mutex> lock(mutex);
    executions.push_back(static_cast<int64_t>(n));
    if (pipelined_) {
      if (staged.empty() || staged.front() != in.data) {
        out_of_order = true;
        return Status::Error(StatusCode::kInternal, "executed a batch that was not staged next");
      }
      staged.erase(staged.begin());
    }
    std::string values;
    bool poisoned = false;
    for (size_t i = 0; i < n; ++i) {
      values += " value=" + std::to_string(src[i]);
      poisoned = poisoned || std::find(poison_.begin(), poison_.end(), src[i]) != poison_.end();
    }
    if (poisoned) return Status::Error(StatusCode::kInternal, "poisoned batch:" + values);
    auto out = std::make_shared<std::vector<int32_t>>(src, src + n);
    for (auto& v : *out) v *= 2;
    outputs->push_back(
        Tensor{DataType::kInt32, in.shape, reinterpret_cast<const std::byte*>(out->data()), out->size() * 4, out});
    return Status::Ok();
  }
  std::mutex mutex;
  std::vector<int64_t> executions;  // rows of each execution, failed ones included
  std::vector<const std::byte*> staged;
  bool out_of_order = false;

 private:
  void pass_gate() {
    std::unique_lock<std::mutex> lock(gate_mutex_);
    if (gate_entered_) return;
    gate_entered_ = true;
    gate_changed_.notify_all();
    gate_changed_.wait(lock, [&] { return gate_open_; });
  }
  std::vector<int32_t> poison_;
  bool pipelined_;
  std::mutex gate_mutex_;
  std::condition_variable gate_changed_;
  bool gate_entered_ = false;  // guarded by gate_mutex_
  bool gate_open_ = false;     // guarded by gate_mutex_
};

struct IsolationRun {
  std::vector<uint64_t> order;  // tokens in completion order
  std::map<uint64_t, Completion> done;
  std::vector<int64_t> executions;
  StatisticsSnapshot stats;
  bool out_of_order = false;
};

// Submits `requests` requests (token i holds value 1000 + i) to one instance of a
// PoisonedExecutor that batches up to 8, behind a first request (token `requests`, value
// 1000 + requests) that holds the instance at its gate until the others are queued, so that they
// form full batches of 8; collects every answer.
IsolationRun run_poisoned(int requests, std::vector<int32_t> poison, bool pipelined, bool preserve_ordering) {
  auto queue = std::make_shared<CompletionQueue>();
  auto owned = std::make_unique<PoisonedExecutor>(std::move(poison), pipelined);
  PoisonedExecutor* executor = owned.get();
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::move(owned));
  SchedulerOptions o = options("poisoned", 8, /*dynamic=*/true);
  o.batching.preserve_ordering = preserve_ordering;
  IsolationRun run;
  {
    Scheduler scheduler(o, std::move(instances), queue, test_pool());
    EXPECT_TRUE(scheduler.submit(int_request(static_cast<uint64_t>(requests), 1000 + requests)).ok());
    executor->wait_at_gate();
    for (int i = 0; i < requests; ++i) {
      EXPECT_TRUE(scheduler.submit(int_request(static_cast<uint64_t>(i), 1000 + i)).ok());
    }
    executor->open_gate();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (run.done.size() < static_cast<size_t>(requests) + 1 && std::chrono::steady_clock::now() < deadline) {
      pollfd p{queue->fd(), POLLIN, 0};
      ::poll(&p, 1, 100);
      for (auto& c : queue->drain()) {
        run.order.push_back(c.token);
        EXPECT_TRUE(run.done.emplace(c.token, std::move(c)).second) << "token answered twice";
      }
    }
    scheduler.shutdown(Scheduler::ShutdownMode::kDrain);
    run.stats = scheduler.statistics();
    std::lock_guard<std::mutex> lock(executor->mutex);  // owned by the scheduler
    run.executions = executor->executions;
    run.out_of_order = executor->out_of_order;
  }
  return run;
}

// Whether `message` quotes the value of any request but `token`'s.
bool quotes_another_request(const std::string& message, uint64_t token, int requests) {
  for (int i = 0; i < requests; ++i) {
    if (static_cast<uint64_t>(i) != token && message.find("value=" + std::to_string(1000 + i)) != std::string::npos) {
      return true;
    }
  }
  return false;
}

TEST(Scheduler, OnlyTheRequestThatFailsAloneFailsAndItsMessageIsItsOwn) {
  for (bool pipelined : {false, true}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "plain");
    constexpr int kRequests = 16;
    IsolationRun run = run_poisoned(kRequests, {1005}, pipelined, /*preserve_ordering=*/true);
    ASSERT_EQ(run.done.size(), static_cast<size_t>(kRequests) + 1);
    EXPECT_FALSE(run.out_of_order);
    for (auto& [token, c] : run.done) {
      if (token == 5) {
        EXPECT_EQ(c.status.code, StatusCode::kInternal);
        EXPECT_EQ(c.status.message, "poisoned batch: value=1005");  // its own run's, alone
        continue;
      }
      ASSERT_TRUE(c.status.ok()) << token << ": " << c.status.message;
      EXPECT_EQ(*reinterpret_cast<const int32_t*>(c.outputs.at(0).data), 2 * (1000 + static_cast<int32_t>(token)));
    }
    EXPECT_EQ(run.order.at(0), static_cast<uint64_t>(kRequests));  // the first request, at the gate
    for (int i = 0; i < kRequests; ++i) EXPECT_EQ(run.order.at(static_cast<size_t>(i) + 1), static_cast<uint64_t>(i));
    // The first request alone, then two batches of 8; the poisoned one is bisected:
    // 8 -> 4 + 4 -> 2 + 2 -> 1 + 1, six re-runs (a pipelined instance may execute the second
    // batch, already staged, before them).
    std::sort(run.executions.begin(), run.executions.end());
    EXPECT_EQ(run.executions, (std::vector<int64_t>{1, 1, 1, 2, 2, 4, 4, 8, 8}));
    EXPECT_EQ(run.stats.success.count, static_cast<uint64_t>(kRequests));
    EXPECT_EQ(run.stats.fail.count, 1u);
    EXPECT_EQ(run.stats.inference_count, static_cast<uint64_t>(kRequests));
    EXPECT_EQ(run.stats.execution_count, 5u);  // the successful ones: the first, the other 8, 4, 2 and 1
  }
}

TEST(Scheduler, TwoCulpritsInOneBatchEachFailAlone) {
  constexpr int kRequests = 8;
  IsolationRun run = run_poisoned(kRequests, {1001, 1006}, /*pipelined=*/false, /*preserve_ordering=*/false);
  ASSERT_EQ(run.done.size(), static_cast<size_t>(kRequests) + 1);
  for (auto& [token, c] : run.done) {
    if (token == 1 || token == 6) {
      EXPECT_EQ(c.status.message, "poisoned batch: value=" + std::to_string(1000 + token));
    } else {
      EXPECT_TRUE(c.status.ok()) << token << ": " << c.status.message;
    }
  }
  // The first request, the batch of 8 and its re-runs: 8 -> 4 + 4 -> (2 + 2) twice -> 1 + 1 twice.
  EXPECT_EQ(run.executions.size(), 2u + 10u);  // within the bound for 8: min(2*8-2, 4*3) = 12
}

TEST(Scheduler, AnExecutorThatFailsEveryBatchCostsBoundedReRunsAndLeaksNothing) {
  constexpr int kRequests = 8;
  std::vector<int32_t> everything;
  for (int i = 0; i < kRequests; ++i) everything.push_back(1000 + i);
  IsolationRun run = run_poisoned(kRequests, everything, /*pipelined=*/false, /*preserve_ordering=*/false);
  ASSERT_EQ(run.done.size(), static_cast<size_t>(kRequests) + 1);
  // The first request, one batch of 8 and at most min(2*8-2, 4*ceil(log2 8)) = 12 re-runs.
  EXPECT_EQ(run.executions.size(), 2u + 12u);
  EXPECT_TRUE(run.done.at(static_cast<uint64_t>(kRequests)).status.ok());  // the first request: not poisoned
  run.done.erase(static_cast<uint64_t>(kRequests));
  size_t alone = 0;
  for (auto& [token, c] : run.done) {
    EXPECT_EQ(c.status.code, StatusCode::kInternal);
    EXPECT_FALSE(quotes_another_request(c.status.message, token, kRequests)) << token << ": " << c.status.message;
    alone += c.status.message == "poisoned batch: value=" + std::to_string(1000 + token);
  }
  EXPECT_EQ(alone, 6u);  // 12 re-runs reach six requests alone; the last pair gets the generic message
  EXPECT_EQ(run.stats.fail.count, static_cast<uint64_t>(kRequests));
  EXPECT_EQ(run.stats.execution_count, 1u);  // the first request's
}

}  // namespace
}  // namespace inferd
