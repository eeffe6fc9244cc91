#include "inferd/iterative_steps.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "collect_completions.h"
#include "inferd/model_signature.h"
#include "inferd/scheduler.h"
#include "int_tensors.h"

namespace inferd {
namespace {

using namespace std::chrono_literals;
using int_tensors::int_tensor;
using int_tensors::ints;

// One step of a counting "decoder" over a gathered batch. Inputs: TOKEN (fed back), LENGTH (the
// client's), STEP (implicit state). Outputs: NEXT = TOKEN + 1, DONE = STEP + 1 >= LENGTH, then
// the state's STEP + 1 (not the client's).
class CountingExecutor : public Executor {
 public:
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    const std::vector<int32_t> token = ints(inputs.at(0)), length = ints(inputs.at(1)), step = ints(inputs.at(2));
    std::vector<int32_t> next(token.size()), done(token.size()), stepped(token.size());
    for (size_t i = 0; i < token.size(); ++i) {
      next[i] = token[i] + 1;
      stepped[i] = step[i] + 1;
      done[i] = stepped[i] >= length[i] ? 1 : 0;
    }
    const auto rows = static_cast<int64_t>(token.size());
    outputs->push_back(int_tensor({rows, 1}, next));
    outputs->push_back(int_tensor({rows, 1}, done));
    outputs->push_back(int_tensor({rows, 1}, stepped));
    {
      std::lock_guard<std::mutex> lock(mutex);
      batch_sizes.push_back(token.size());
    }
    std::this_thread::sleep_for(2ms);  // a step takes a while: new requests arrive during it
    return Status::Ok();
  }
  std::mutex mutex;
  std::vector<size_t> batch_sizes;
};

// A stream call's end of one request: each response's NEXT, then the final answer.
class StreamSink : public CompletionSink {
 public:
  void respond(const InferenceRequest&, RequestResult&& response) override {
    std::lock_guard<std::mutex> lock(mutex_);
    tokens_.push_back(ints(response.outputs.at(0))[0]);
  }
  void complete(Completion&& completion) override {
    std::lock_guard<std::mutex> lock(mutex_);
    status_ = completion.status;
    if (completion.status.ok()) tokens_.push_back(ints(completion.outputs.at(0))[0]);
    outputs_ = completion.outputs.size();
    done_ = true;
    changed_.notify_all();
  }
  bool streams_responses() const override { return true; }

  // The tokens, once the final answer came (or after 10 s).
  std::vector<int32_t> wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, 10s, [&] { return done_; });
    return tokens_;
  }
  size_t responses() {
    std::lock_guard<std::mutex> lock(mutex_);
    return tokens_.size();
  }
  Status status() {
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
  }
  size_t outputs() {
    std::lock_guard<std::mutex> lock(mutex_);
    return outputs_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int32_t> tokens_;
  Status status_;
  size_t outputs_ = 0;
  bool done_ = false;
};

struct IterativeModel {
  explicit IterativeModel(uint32_t max_steps = 1000, uint32_t candidates = 8) {
    auto executor = std::make_unique<CountingExecutor>();
    counting = executor.get();
    std::vector<std::unique_ptr<Executor>> instances;
    instances.push_back(std::move(executor));
    SchedulerOptions options;
    options.model_name = "counter";
    options.batching.max_batch_size = 8;
    options.sequence_batching = true;
    options.sequence.strategy = SequenceOptions::Strategy::kOldest;
    options.sequence.max_candidate_sequences = candidates;
    StateSpec step;
    step.input_name = "STEP";
    step.input = 2;
    step.output = 2;
    step.dtype = DataType::kInt32;
    step.dims = {1};
    step.initial_dims = {1};
    options.sequence.state_specs = {step};
    options.sequence.visible_outputs = 2;
    options.sequence.state_memory =
        std::make_shared<SequenceStateMemory>(std::numeric_limits<uint64_t>::max(), "--max-sequence-state-bytes");
    IterativeOptions iterative;
    iterative.feedback = {{0, 0}};  // NEXT -> TOKEN
    iterative.end_output = 1;       // DONE
    iterative.max_steps = max_steps;
    options.sequence.iterative = std::make_shared<IterativeSteps>(iterative);
    signature->decoupled = true;
    scheduler = std::make_unique<Scheduler>(options, std::move(instances), std::make_shared<CompletionQueue>(),
                                            std::make_shared<PinnedBufferPool>(1 << 20, false));
  }

  std::shared_ptr<StreamSink> generate(uint64_t token, int32_t first, int32_t length) {
    auto sink = std::make_shared<StreamSink>();
    auto request = std::make_unique<InferenceRequest>();
    request->token = token;
    request->inputs = {int_tensor({1, 1}, {first}), int_tensor({1, 1}, {length}), Tensor::Absent(DataType::kInt32)};
    request->signature = signature;
    request->sink = sink;
    EXPECT_TRUE(scheduler->submit(std::move(request)).ok());
    return sink;
  }

  std::shared_ptr<ModelSignature> signature = std::make_shared<ModelSignature>();
  CountingExecutor* counting = nullptr;
  std::unique_ptr<Scheduler> scheduler;
};

TEST(IterativeSequences, EachStepStreamsAndTheLastCarriesTheFinalFlag) {
  IterativeModel model;
  auto sink = model.generate(1, 5, 3);
  EXPECT_EQ(sink->wait(), (std::vector<int32_t>{6, 7, 8}));  // each step fed the last one's token
  EXPECT_TRUE(sink->status().ok());
  EXPECT_EQ(sink->outputs(), 2u);  // NEXT and DONE: the state's output is not the client's
  auto one = model.generate(2, 40, 1);
  EXPECT_EQ(one->wait(), (std::vector<int32_t>{41}));
  const StatisticsSnapshot stats = model.scheduler->statistics();
  EXPECT_EQ(stats.success.count, 2u);    // two requests
  EXPECT_EQ(stats.execution_count, 4u);  // four steps
  EXPECT_EQ(stats.responses, 4u);
}

TEST(IterativeSequences, SequencesJoinAndLeaveTheBatchAtEveryStep) {
  IterativeModel model;
  std::vector<std::shared_ptr<StreamSink>> sinks;
  const std::vector<int32_t> lengths{20, 3, 12, 1, 7, 16, 5, 9};
  for (size_t i = 0; i < lengths.size(); ++i) {
    sinks.push_back(model.generate(i + 1, static_cast<int32_t>(100 * i), lengths[i]));
    std::this_thread::sleep_for(3ms);  // arriving while others run
  }
  size_t steps = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int32_t> expected;
    for (int32_t k = 1; k <= lengths[i]; ++k) expected.push_back(static_cast<int32_t>(100 * i) + k);
    EXPECT_EQ(sinks[i]->wait(), expected) << "request " << i;
    steps += static_cast<size_t>(lengths[i]);
  }
  std::lock_guard<std::mutex> lock(model.counting->mutex);
  size_t rows = 0, most = 0;
  for (size_t size : model.counting->batch_sizes) {
    rows += size;
    most = std::max(most, size);
  }
  EXPECT_EQ(rows, steps);  // every step of every request ran once
  EXPECT_GT(most, 1u);     // sequences at different steps shared batches
  EXPECT_LT(model.counting->batch_sizes.size(), steps);
}

TEST(IterativeSequences, MaxStepsEndsALongGenerationAndACancelEndsOneBetweenSteps) {
  IterativeModel model(10);
  auto capped = model.generate(1, 0, 1000);
  EXPECT_EQ(capped->wait().size(), 10u);
  EXPECT_TRUE(capped->status().ok());

  IterativeModel long_running;
  auto cancelled = long_running.generate(2, 0, 1000);
  for (int i = 0; i < 5000 && cancelled->responses() < 3; ++i) std::this_thread::sleep_for(1ms);
  long_running.scheduler->cancel(2);
  const size_t streamed = cancelled->wait().size();
  EXPECT_EQ(cancelled->status().code, StatusCode::kCancelled);
  EXPECT_GE(streamed, 3u);
  EXPECT_LT(streamed, 1000u);
}

TEST(IterativeSequences, AGenerationCancelledWhileItWaitsForAPlaceLeavesNone) {
  IterativeModel model(1000, /*candidates=*/1);
  auto running = model.generate(1, 0, 30);
  auto waiting = model.generate(2, 0, 30);  // in the backlog: the one place is taken
  EXPECT_TRUE(model.scheduler->cancel(2));
  waiting->wait();
  EXPECT_EQ(waiting->status().code, StatusCode::kCancelled);
  EXPECT_EQ(running->wait().size(), 30u);
  EXPECT_EQ(model.scheduler->sequence_counts().active, 0u);  // no sequence is left holding it
  EXPECT_EQ(model.scheduler->sequence_counts().backlog, 0u);
}

TEST(IterativeSequences, TheDeadlineEndsAGenerationBetweenSteps) {
  IterativeModel model;
  auto sink = std::make_shared<StreamSink>();
  auto request = std::make_unique<InferenceRequest>();
  request->token = 1;
  request->inputs = {int_tensor({1, 1}, {0}), int_tensor({1, 1}, {1000}), Tensor::Absent(DataType::kInt32)};
  request->signature = model.signature;
  request->sink = sink;
  request->deadline = Clock::now() + 30ms;  // about 15 steps of 2 ms
  ASSERT_TRUE(model.scheduler->submit(std::move(request)).ok());
  const size_t streamed = sink->wait().size();
  EXPECT_EQ(sink->status().code, StatusCode::kDeadlineExceeded);
  EXPECT_GE(streamed, 1u);
  EXPECT_LT(streamed, 1000u);
}

TEST(IterativeSequences, ARequestsOwnSequenceParametersDoNotMakeItAnotherGeneration) {
  IterativeModel model;
  // Two requests naming one sequence, as perf_analyzer names them: two generations at once.
  std::vector<std::shared_ptr<StreamSink>> sinks;
  for (uint64_t token : {1, 2}) {
    auto sink = std::make_shared<StreamSink>();
    auto request = std::make_unique<InferenceRequest>();
    request->token = token;
    request->inputs = {int_tensor({1, 1}, {static_cast<int32_t>(10 * token)}), int_tensor({1, 1}, {3}),
                       Tensor::Absent(DataType::kInt32)};
    request->sequence_flags.id = 7;
    request->sequence_flags.start = token == 1;
    request->signature = model.signature;
    request->sink = sink;
    ASSERT_TRUE(model.scheduler->submit(std::move(request)).ok());
    sinks.push_back(sink);
  }
  EXPECT_EQ(sinks[0]->wait(), (std::vector<int32_t>{11, 12, 13}));
  EXPECT_EQ(sinks[1]->wait(), (std::vector<int32_t>{21, 22, 23}));
}

// A model that answers each request and keeps its own state (Triton's python backend): a request
// asking for N steps is given back (RequestResult::reschedule) until its N-th execute, then answered
// with N. It counts by the sequence id the core gives each request.
class ReschedulingExecutor : public Executor {
 public:
  bool answers_each_request() const override { return true; }
  Status execute(const std::vector<Tensor>&, std::vector<Tensor>*) override {
    return Status::Error(StatusCode::kInternal, "takes its batch as requests");
  }
  Status execute_requests(const std::vector<ExecutorRequest>& requests, std::vector<RequestResult>* results,
                          ResponseStream*) override {
    for (const ExecutorRequest& request : requests) {
      const uint64_t id = request.sequence != nullptr ? request.sequence->id : 0;
      if (request.sequence != nullptr && request.sequence->start) counts[id] = 0;
      const int32_t steps = ++counts[id];
      RequestResult result;
      if (steps < ints(request.inputs.at(0))[0]) {
        result.reschedule = true;
      } else {
        result.outputs.push_back(int_tensor({1, 1}, {steps}));
      }
      results->push_back(std::move(result));
    }
    batches.fetch_add(1);
    std::this_thread::sleep_for(2ms);  // the other requests come back or arrive meanwhile
    return Status::Ok();
  }
  std::map<uint64_t, int32_t> counts;  // the worker thread's only
  std::atomic<int> batches{0};
};

// A ReschedulingExecutor's scheduler: iterative (oldest, 8 candidates) or not.
std::unique_ptr<Scheduler> rescheduling(bool iterative, std::shared_ptr<CompletionQueue> queue,
                                        ReschedulingExecutor** model) {
  auto executor = std::make_unique<ReschedulingExecutor>();
  *model = executor.get();
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::move(executor));
  SchedulerOptions options;
  options.model_name = "countdown";
  options.batching.max_batch_size = 8;
  if (iterative) {
    options.sequence_batching = true;
    options.sequence.strategy = SequenceOptions::Strategy::kOldest;
    options.sequence.max_candidate_sequences = 8;
    IterativeOptions steps;
    steps.max_steps = 100;
    options.sequence.iterative = std::make_shared<IterativeSteps>(steps);
  }
  return std::make_unique<Scheduler>(options, std::move(instances), std::move(queue),
                                     std::make_shared<PinnedBufferPool>(1 << 20, false));
}

std::unique_ptr<InferenceRequest> countdown(uint64_t token, int32_t steps) {
  auto request = std::make_unique<InferenceRequest>();
  request->token = token;
  request->inputs = {int_tensor({1, 1}, {steps})};
  return request;
}

TEST(IterativeSequences, AModelThatAnswersEachRequestReschedulesItUntilItAnswers) {
  auto queue = std::make_shared<CompletionQueue>();
  ReschedulingExecutor* model = nullptr;
  auto scheduler = rescheduling(true, queue, &model);
  const std::vector<int32_t> wanted{1, 6, 3, 9, 2};
  for (size_t i = 0; i < wanted.size(); ++i) ASSERT_TRUE(scheduler->submit(countdown(i + 1, wanted[i])).ok());
  std::map<uint64_t, Completion> answers = collect(*queue, wanted.size());
  ASSERT_EQ(answers.size(), wanted.size());
  for (size_t i = 0; i < wanted.size(); ++i) {
    const Completion& answer = answers.at(i + 1);
    ASSERT_TRUE(answer.status.ok()) << answer.status.message;
    EXPECT_EQ(ints(answer.outputs.at(0)), std::vector<int32_t>{wanted[i]}) << "request " << i;
  }
  EXPECT_LT(model->batches.load(), 1 + 6 + 3 + 9 + 2);  // requests at different steps shared batches
  EXPECT_EQ(scheduler->statistics().success.count, wanted.size());
}

TEST(IterativeSequences, ReschedulingARequestOfAModelThatIsNotIterativeFailsIt) {
  auto queue = std::make_shared<CompletionQueue>();
  ReschedulingExecutor* model = nullptr;
  auto scheduler = rescheduling(false, queue, &model);
  ASSERT_TRUE(scheduler->submit(countdown(1, 3)).ok());
  std::map<uint64_t, Completion> answers = collect(*queue, 1);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers.at(1).status.code, StatusCode::kInternal);
  EXPECT_NE(answers.at(1).status.message.find("iterative_sequence"), std::string::npos) << answers.at(1).status.message;
}

}  // namespace
}  // namespace inferd
