// Python models' calls to other models on the worker ring (model_calls.h, and the calls' half of
// python_worker_executor.h): the descriptions, routing by the serving snapshot, the refusals, and
// the ends a call can have besides its answer.

#include "inferd/model_calls.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "inferd/python_worker_executor.h"
#include "inferd/worker_messages.h"
#include "inferd/worker_ring.h"
#include "worker_ring_support.h"

namespace inferd::worker {
namespace {

using ring_testing::floats;
using ring_testing::self_pidfd;
using ring_testing::worker_end;
using ring_testing::x_to_y_options;

TEST(WorkerMessages, CallsAndTheirAnswersRoundTrip) {
  CallDescription call;
  call.model = "double";
  call.version = -1;
  call.id = "c1";
  call.parameters = {CallParameter{"flag", CallParameter::Kind::kBool, 1, {}},
                     CallParameter{"n", CallParameter::Kind::kInt64, -7, {}},
                     CallParameter{"s", CallParameter::Kind::kString, 0, "text"}};
  call.chain = {"a", "b"};
  call.requested_outputs = {"y"};
  call.timeout_us = 1500;
  call.inputs.push_back(TensorPlace{"x", DataType::kFp32, {3}, 128, 12});
  const std::string bytes = encode_call(call);
  CallDescription decoded;
  ASSERT_TRUE(decode_call(bytes, 4096, &decoded).ok());
  EXPECT_EQ(decoded.model, "double");
  EXPECT_EQ(decoded.version, -1);
  EXPECT_EQ(decoded.id, "c1");
  ASSERT_EQ(decoded.parameters.size(), 3u);
  EXPECT_EQ(decoded.parameters[0].kind, CallParameter::Kind::kBool);
  EXPECT_EQ(decoded.parameters[1].number, -7);
  EXPECT_EQ(decoded.parameters[2].text, "text");
  EXPECT_EQ(decoded.chain, (std::vector<std::string_view>{"a", "b"}));
  EXPECT_EQ(decoded.requested_outputs, (std::vector<std::string_view>{"y"}));
  EXPECT_EQ(decoded.timeout_us, 1500u);
  ASSERT_EQ(decoded.inputs.size(), 1u);
  EXPECT_EQ(decoded.inputs[0].offset, 128u);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_FALSE(decode_call(std::string_view(bytes).substr(0, cut), 4096, &decoded).ok()) << cut;
  }
  EXPECT_FALSE(decode_call(bytes, 100, &decoded).ok());  // its input lies outside the arena

  CallAnswerDescription answer;
  answer.code = StatusCode::kNotFound;
  answer.error = "no such model";
  const std::string failed = encode_call_answer(answer);
  CallAnswerDescription read;
  ASSERT_TRUE(decode_call_answer(failed, 0, &read).ok());
  EXPECT_EQ(read.code, StatusCode::kNotFound);
  EXPECT_EQ(read.error, "no such model");
  std::string unknown_code = failed;
  unknown_code[0] = 99;
  EXPECT_FALSE(decode_call_answer(unknown_code, 0, &read).ok());
}

// A worker of the test's own, in a thread: for each execute it makes one call, `call`, with the
// batch's first input as the call's "x", waits for its answer, and answers every request of the
// batch with the call's output "y", or fails them with the call's error ("CODE: message").
class CallingWorker {
 public:
  CallingWorker(const WorkerRing& server, CallDescription call) : ring_(worker_end(server)), call_(std::move(call)) {
    thread_ = std::thread([this] { run(); });
  }
  ~CallingWorker() {
    stop_ = true;
    ring_.wake();
    thread_.join();
  }
  // Answers each batch without waiting for its call's answer (the call outlives its batch).
  std::atomic<bool> abandon_calls{false};

 private:
  bool next(Message* message) {
    while (!stop_) {
      if (ring_.receive(message)) return true;
      ring_.wait(100);
    }
    return false;
  }

  void run() {
    uint64_t number = 0;
    Message execute;
    while (next(&execute)) {
      if (execute.kind != static_cast<uint32_t>(MessageKind::kExecute)) continue;
      ASSERT_TRUE(ring_.inputs().cover(execute.offset + execute.length));
      const std::string bytes(reinterpret_cast<const char*>(ring_.inputs().data() + execute.offset), execute.length);
      BatchDescription batch;
      ASSERT_TRUE(decode_batch(bytes, ring_.inputs().size(), &batch).ok());
      // The call: its input at the floor, its description after.
      const TensorPlace& x = batch.requests.at(0).inputs.at(0);
      uint64_t at = execute.floor;
      ring_.outputs().reserve(at + x.nbytes + 4096);
      std::memcpy(ring_.outputs().data() + at, ring_.inputs().data() + x.offset, x.nbytes);
      CallDescription call = call_;
      call.inputs = {TensorPlace{"x", x.dtype, x.shape, at, x.nbytes}};
      at = aligned(at + x.nbytes);
      const std::string description = encode_call(call);
      std::memcpy(ring_.outputs().data() + at, description.data(), description.size());
      Message sent;
      sent.kind = static_cast<uint32_t>(MessageKind::kCall);
      sent.batch = ++number;
      sent.floor = execute.batch;
      sent.offset = at;
      sent.length = description.size();
      ASSERT_TRUE(ring_.send(sent));
      at = aligned(at + description.size());

      std::vector<ResponseDescription> responses(batch.requests.size());
      std::string error;
      std::string y;
      TensorPlace y_place;
      Message reply;
      uint64_t taken = 0;
      while (!abandon_calls && next(&reply)) {
        if (reply.kind != static_cast<uint32_t>(MessageKind::kCallResult) || reply.batch != number) continue;
        ASSERT_TRUE(ring_.inputs().cover(reply.offset + reply.length));
        const std::string answer_bytes(reinterpret_cast<const char*>(ring_.inputs().data() + reply.offset),
                                       reply.length);
        CallAnswerDescription answer;
        ASSERT_TRUE(decode_call_answer(answer_bytes, ring_.inputs().size(), &answer).ok());
        ++taken;
        if (answer.code != StatusCode::kOk) {
          error = std::to_string(static_cast<int>(answer.code)) + ": " + std::string(answer.error);
        } else {
          y_place = answer.outputs.at(0);
          y.assign(reinterpret_cast<const char*>(ring_.inputs().data() + y_place.offset), y_place.nbytes);
        }
        break;
      }
      for (ResponseDescription& response : responses) {
        if (abandon_calls) {
          error = "abandoned";
        }
        if (!error.empty()) {
          response.ok = false;
          response.error = error;
          continue;
        }
        ring_.outputs().reserve(at + y.size() + 4096);
        std::memcpy(ring_.outputs().data() + at, y.data(), y.size());
        response.outputs.push_back(TensorPlace{"y", y_place.dtype, y_place.shape, at, y.size()});
        at = aligned(at + y.size());
      }
      const std::string answers = encode_responses(responses);
      ring_.outputs().reserve(at + answers.size());
      std::memcpy(ring_.outputs().data() + at, answers.data(), answers.size());
      Message result;
      result.kind = static_cast<uint32_t>(MessageKind::kResult);
      result.batch = execute.batch;
      result.count = static_cast<uint32_t>(responses.size());
      result.offset = at;
      result.length = answers.size();
      result.floor = taken;
      ASSERT_TRUE(ring_.send(result));
    }
  }

  WorkerRing ring_;
  const CallDescription call_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The called model: y = 2x, answered at once from submit(); or, with `hold`, kept unanswered.
class DoublingScheduler : public RequestScheduler {
 public:
  Status submit(std::unique_ptr<InferenceRequest>&& request) override {
    std::lock_guard<std::mutex> lock(mutex_);
    parameters.push_back(request->parameters_json);
    if (hold) {
      held_.push_back(std::move(request));
      return Status::Ok();
    }
    const Tensor& x = request->inputs.at(0);
    auto y = std::make_shared<std::vector<float>>(x.byte_size / sizeof(float));
    std::memcpy(y->data(), x.data, x.byte_size);
    for (float& value : *y) value *= 2;
    Completion completion;
    completion.token = request->token;
    Tensor output;
    output.dtype = DataType::kFp32;
    output.shape = x.shape;
    output.data = reinterpret_cast<const std::byte*>(y->data());
    output.byte_size = y->size() * sizeof(float);
    output.owner = y;
    completion.outputs.push_back(std::move(output));
    std::shared_ptr<CompletionSink> sink = request->sink;
    completion.request = std::move(request);
    sink->complete(std::move(completion));
    return Status::Ok();
  }
  bool cancel(uint64_t token) override {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled.push_back(token);
    return false;
  }

  std::atomic<bool> hold{false};
  std::vector<std::string> parameters;  // guarded by mutex_
  std::vector<uint64_t> cancelled;      // guarded by mutex_

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<InferenceRequest>> held_;
};

// A snapshot with one route: model "double", version 1, the one taken when a call names none.
std::shared_ptr<ModelCalls> calls_to(const std::shared_ptr<DoublingScheduler>& scheduler) {
  auto signature = std::make_shared<ModelSignature>();
  signature->name = "double";
  signature->version = "1";
  InputSignature x;
  x.name = "x";
  x.dims = {-1};
  signature->inputs.push_back(x);
  OutputSignature y;
  y.name = "y";
  y.dims = {-1};
  signature->outputs.push_back(y);
  signature->keeps_parameters = true;
  auto route = std::make_shared<ModelRoute>();
  route->model = "double";
  route->version = "1";
  route->scheduler = scheduler;
  route->signature = signature;
  auto snapshot = std::make_shared<ServingSnapshot>();
  snapshot->accepting = true;
  snapshot->models["double"][""] = route;
  snapshot->models["double"]["1"] = route;
  snapshot->schedulers.push_back(scheduler);
  auto state = std::make_shared<ServingState>();
  state->publish(snapshot);
  auto calls = std::make_shared<ModelCalls>();
  calls->serve_from([state] { return state->read(); });
  return calls;
}

CallDescription call_to(std::string_view model) {
  CallDescription call;
  call.model = model;
  call.chain = {"upstream"};
  return call;
}

struct RunResult {
  Status status;
  std::vector<RequestResult> results;
};

// One batch of one request x = [1, 2, 3] through `executor`.
RunResult run_one(PythonWorkerExecutor& executor, RequestCancellation cancellation = {}) {
  static const std::vector<float> x = {1, 2, 3};
  ExecutorRequest request;
  Tensor tensor;
  tensor.dtype = DataType::kFp32;
  tensor.shape = {3};
  tensor.data = reinterpret_cast<const std::byte*>(x.data());
  tensor.byte_size = sizeof(float) * x.size();
  request.inputs.push_back(tensor);
  request.id = "r";
  request.cancellation = std::move(cancellation);
  RunResult run;
  run.status = executor.execute_requests({request}, &run.results, nullptr);
  return run;
}

PythonWorkerHooks no_hooks() {
  return {[] { return Status::Ok(); }, [] { return Status::Ok(); }, {}, {}};
}

TEST(ModelCallsOnTheRing, ACallIsRoutedByTheSnapshotAndAnsweredWithItsOutputs) {
  auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));
  CallingWorker worker(*ring, call_to("double"));
  auto scheduler = std::make_shared<DoublingScheduler>();
  PythonWorkerExecutor executor(x_to_y_options("caller"), no_hooks());
  executor.set_model_calls(calls_to(scheduler));
  executor.attach(ring, self_pidfd());
  for (int batch = 0; batch < 3; ++batch) {
    RunResult run = run_one(executor);
    ASSERT_TRUE(run.status.ok()) << run.status.message;
    ASSERT_TRUE(run.results.at(0).status.ok()) << run.results[0].status.message;
    EXPECT_EQ(floats(run.results[0].outputs.at(0)), (std::vector<float>{2, 4, 6}));
  }
  // The called model hears the chain that led to it: the caller's, then the caller.
  ASSERT_EQ(scheduler->parameters.size(), 3u);
  EXPECT_NE(scheduler->parameters[0].find(R"("inferd_bls_chain":"[\"upstream\",\"caller\"]")"), std::string::npos)
      << scheduler->parameters[0];
}

TEST(ModelCallsOnTheRing, ACallThatWouldWaitOnItselfIsRefusedNamingTheCycle) {
  auto scheduler = std::make_shared<DoublingScheduler>();
  for (const std::string_view target : {"caller", "upstream"}) {
    auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));
    CallingWorker worker(*ring, call_to(target));
    PythonWorkerExecutor executor(x_to_y_options("caller"), no_hooks());
    executor.set_model_calls(calls_to(scheduler));
    executor.attach(ring, self_pidfd());
    RunResult run = run_one(executor);
    ASSERT_TRUE(run.status.ok()) << run.status.message;
    const std::string& error = run.results.at(0).status.message;
    EXPECT_EQ(error.rfind("1: ", 0), 0u) << error;  // INVALID_ARGUMENT
    if (target == "caller") {
      EXPECT_NE(error.find("cannot call itself"), std::string::npos) << error;
    } else {
      EXPECT_NE(error.find("(upstream -> caller -> upstream)"), std::string::npos) << error;
    }
  }
  EXPECT_TRUE(scheduler->parameters.empty());  // neither reached the scheduler
}

TEST(ModelCallsOnTheRing, ACallWithNoRouteGoesToThePythonSide) {
  auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));
  CallingWorker worker(*ring, call_to("elsewhere"));
  std::vector<std::string> asked;
  PythonWorkerHooks hooks = no_hooks();
  hooks.call_unrouted = [&asked](const CallDescription& call, const std::vector<Tensor>& inputs, ModelCallDone done) {
    asked.emplace_back(call.model);
    EXPECT_EQ(floats(inputs.at(0)), (std::vector<float>{1, 2, 3}));
    done(ModelCallAnswer{Status::Error(StatusCode::kNotFound, "no model 'elsewhere'"), {}});
  };
  PythonWorkerExecutor executor(x_to_y_options("caller"), hooks);
  executor.set_model_calls(calls_to(std::make_shared<DoublingScheduler>()));
  executor.attach(ring, self_pidfd());
  RunResult run = run_one(executor);
  ASSERT_TRUE(run.status.ok()) << run.status.message;
  EXPECT_EQ(run.results.at(0).status.message, "2: no model 'elsewhere'");
  EXPECT_EQ(asked, (std::vector<std::string>{"elsewhere"}));
}

TEST(ModelCallsOnTheRing, ACallPastItsTimeoutIsAnsweredDeadlineExceededAndItsRequestCancelled) {
  auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));
  CallDescription call = call_to("double");
  call.timeout_us = 30'000;
  CallingWorker worker(*ring, call);
  auto scheduler = std::make_shared<DoublingScheduler>();
  scheduler->hold = true;
  PythonWorkerExecutor executor(x_to_y_options("caller"), no_hooks());
  executor.set_model_calls(calls_to(scheduler));
  executor.attach(ring, self_pidfd());
  const auto started = std::chrono::steady_clock::now();
  RunResult run = run_one(executor);
  ASSERT_TRUE(run.status.ok()) << run.status.message;
  EXPECT_EQ(run.results.at(0).status.message.rfind("5: ", 0), 0u) << run.results[0].status.message;
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(30));
  EXPECT_EQ(scheduler->cancelled.size(), 1u);
}

TEST(ModelCallsOnTheRing, ABatchWhoseRequestsAllEndedCancelsItsCalls) {
  auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));
  CallingWorker worker(*ring, call_to("double"));
  auto scheduler = std::make_shared<DoublingScheduler>();
  scheduler->hold = true;
  PythonWorkerExecutor executor(x_to_y_options("caller"), no_hooks());
  executor.set_model_calls(calls_to(scheduler));
  executor.attach(ring, self_pidfd());
  auto flag = std::make_shared<std::atomic<bool>>(false);
  std::thread canceller([flag] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    flag->store(true);
  });
  RequestCancellation cancellation;
  cancellation.flag = flag;
  RunResult run = run_one(executor, cancellation);
  canceller.join();
  ASSERT_TRUE(run.status.ok()) << run.status.message;
  const std::string& error = run.results.at(0).status.message;
  EXPECT_EQ(error.rfind("6: ", 0), 0u) << error;  // CANCELLED
  EXPECT_NE(error.find("every request of the calling batch"), std::string::npos) << error;
  EXPECT_EQ(scheduler->cancelled.size(), 1u);
}

TEST(ModelCallsOnTheRing, ACallThatOutlivesItsBatchIsAnsweredLateOnce) {
  auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));
  CallingWorker worker(*ring, call_to("double"));
  worker.abandon_calls = true;
  auto scheduler = std::make_shared<DoublingScheduler>();
  std::mutex mutex;
  std::vector<std::pair<uint64_t, std::vector<float>>> late;  // guarded by mutex
  PythonWorkerHooks hooks = no_hooks();
  hooks.call_answered_late = [&](uint64_t number, ModelCallAnswer&& answer) {
    std::lock_guard<std::mutex> lock(mutex);
    late.emplace_back(number, answer.status.ok() ? floats(answer.outputs.at(0).second) : std::vector<float>{});
  };
  PythonWorkerExecutor executor(x_to_y_options("caller"), hooks);
  executor.set_model_calls(calls_to(scheduler));
  executor.attach(ring, self_pidfd());
  for (int batch = 0; batch < 20; ++batch) {
    RunResult run = run_one(executor);
    ASSERT_TRUE(run.status.ok()) << run.status.message;
    EXPECT_EQ(run.results.at(0).status.message, "abandoned");
  }
  // Whether its answer was on the ring untaken or not yet computed when the batch was answered,
  // each call's answer reaches the hook exactly once, and none was cancelled.
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(late.size(), 20u);
  for (size_t k = 0; k < late.size(); ++k) {
    EXPECT_EQ(late[k].first, k + 1);
    EXPECT_EQ(late[k].second, (std::vector<float>{2, 4, 6}));
  }
  EXPECT_TRUE(scheduler->cancelled.empty());
}

TEST(ModelCallsOnTheRing, ACallStillOpenWhenItsBatchEndsIsCancelledWhenNobodyTakesLateAnswers) {
  auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));
  CallingWorker worker(*ring, call_to("double"));
  worker.abandon_calls = true;
  auto scheduler = std::make_shared<DoublingScheduler>();
  scheduler->hold = true;
  PythonWorkerExecutor executor(x_to_y_options("caller"), no_hooks());
  executor.set_model_calls(calls_to(scheduler));
  executor.attach(ring, self_pidfd());
  RunResult run = run_one(executor);
  ASSERT_TRUE(run.status.ok()) << run.status.message;
  EXPECT_EQ(run.results.at(0).status.message, "abandoned");
  // The result may come before the call: the next batch is served, and every started call ended.
  run = run_one(executor);
  ASSERT_TRUE(run.status.ok()) << run.status.message;
  EXPECT_EQ(scheduler->cancelled.size(), scheduler->parameters.size());
}

}  // namespace
}  // namespace inferd::worker
