#include "inferd/ensemble_scheduler.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "inferd/scheduler_directory.h"

namespace inferd {
namespace {

using std::chrono::milliseconds;

// Computes one INT32 output element by element from its INT32 inputs (all of one shape). `before`
// runs first on every batch (to hold it, record it or fail it); `after` sees the output made.
class ElementwiseExecutor : public Executor {
 public:
  using Fn = std::function<int32_t(const std::vector<int32_t>&)>;
  using Before = std::function<Status(const std::vector<Tensor>&)>;
  using After = std::function<void(const Tensor&)>;
  ElementwiseExecutor(Fn fn, Before before, After after)
      : fn_(std::move(fn)), before_(std::move(before)), after_(std::move(after)) {}
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    if (before_) {
      Status status = before_(inputs);
      if (!status.ok()) return status;
    }
    const size_t n = inputs.at(0).byte_size / 4;
    auto out = std::make_shared<std::vector<int32_t>>(n);
    std::vector<int32_t> args(inputs.size());
    for (size_t i = 0; i < n; ++i) {
      for (size_t k = 0; k < inputs.size(); ++k) args[k] = reinterpret_cast<const int32_t*>(inputs[k].data)[i];
      (*out)[i] = fn_(args);
    }
    Tensor tensor{DataType::kInt32, inputs[0].shape, reinterpret_cast<const std::byte*>(out->data()), n * 4, out};
    if (after_) after_(tensor);
    outputs->push_back(std::move(tensor));
    return Status::Ok();
  }

 private:
  Fn fn_;
  Before before_;
  After after_;
};

// A gate that holds every batch that reaches it until opened.
struct Gate {
  std::mutex mutex;
  std::condition_variable changed;
  bool open = false;
  int waiting = 0;
  Status pass() {
    std::unique_lock<std::mutex> lock(mutex);
    ++waiting;
    changed.notify_all();
    changed.wait_for(lock, std::chrono::seconds(10), [&] { return open; });
    return Status::Ok();
  }
  void wait_for_waiter() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait_for(lock, std::chrono::seconds(10), [&] { return waiting > 0; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    open = true;
    changed.notify_all();
  }
};

struct ModelSpec {
  ElementwiseExecutor::Fn fn;
  ElementwiseExecutor::Before before = nullptr;
  ElementwiseExecutor::After after = nullptr;
  int64_t max_batch_size = 8;
  bool dynamic = false;
  int instances = 1;
};

std::shared_ptr<Scheduler> make_scheduler(const std::string& name, const ModelSpec& spec,
                                          const std::shared_ptr<CompletionQueue>& queue) {
  SchedulerOptions options;
  options.model_name = name;
  options.batching.max_batch_size = spec.max_batch_size;
  options.batching.dynamic = spec.dynamic;
  std::vector<std::unique_ptr<Executor>> instances;
  for (int i = 0; i < spec.instances; ++i) {
    instances.push_back(std::make_unique<ElementwiseExecutor>(spec.fn, spec.before, spec.after));
  }
  return std::make_shared<Scheduler>(options, std::move(instances), queue,
                                     std::make_shared<PinnedBufferPool>(1 << 22, false));
}

// The composing models of a test, by name (any version).
struct Models {
  std::map<std::string, std::shared_ptr<Scheduler>> schedulers;
  SchedulerResolver resolver() {
    return [this](const std::string& model, int64_t) -> ResolvedScheduler {
      auto it = schedulers.find(model);
      if (it == schedulers.end()) return {};
      return {it->second, 1};
    };
  }
  // Shuts every scheduler down first, so that no step completes into a test's dying state.
  ~Models() {
    for (auto& [name, scheduler] : schedulers) scheduler->shutdown(Scheduler::ShutdownMode::kReject);
  }
};

EnsembleStep step(const std::string& model, std::vector<std::pair<std::string, std::string>> inputs,
                  const std::string& output) {
  EnsembleStep s;
  s.model_name = model;
  for (auto& [model_tensor, ensemble_tensor] : inputs) s.input_map.push_back({model_tensor, ensemble_tensor});
  s.output_map.push_back({0, {"OUT0", output}});
  return s;
}

EnsembleDefinition definition(const std::string& name, std::vector<std::string> outputs,
                              std::vector<EnsembleStep> steps) {
  EnsembleDefinition d;
  d.name = name;
  d.max_batch_size = 8;
  d.inputs.push_back({"IN", DataType::kInt32, {1}});
  for (auto& output : outputs) d.outputs.push_back({output, DataType::kInt32, {1}});
  d.steps = std::move(steps);
  return d;
}

std::unique_ptr<InferenceRequest> int_request(uint64_t token, int32_t value) {
  auto data = std::make_shared<int32_t>(value);
  auto r = std::make_unique<InferenceRequest>();
  r->token = token;
  r->id = "req-" + std::to_string(token);
  r->inputs.push_back(Tensor{DataType::kInt32, {1, 1}, reinterpret_cast<const std::byte*>(data.get()), 4, data});
  return r;
}

int32_t value(const Tensor& tensor) { return *reinterpret_cast<const int32_t*>(tensor.data); }

// Collects completions until `n` have arrived (or a 10 s guard passes); a token answered twice fails.
std::map<uint64_t, Completion> collect(CompletionQueue& queue, size_t n, milliseconds guard = milliseconds(10000)) {
  std::map<uint64_t, Completion> done;
  const auto deadline = Clock::now() + guard;
  while (done.size() < n && Clock::now() < deadline) {
    pollfd p{queue.fd(), POLLIN, 0};
    ::poll(&p, 1, 20);
    for (auto& c : queue.drain()) EXPECT_TRUE(done.emplace(c.token, std::move(c)).second) << "token answered twice";
  }
  return done;
}

ElementwiseExecutor::Fn plus(int32_t k) {
  return [k](const std::vector<int32_t>& a) { return a[0] + k; };
}
ElementwiseExecutor::Fn times(int32_t k) {
  return [k](const std::vector<int32_t>& a) { return a[0] * k; };
}

TEST(EnsembleScheduler, AChainOfThreeAnswersWhatTheModelsComputeInTurn) {
  auto queue = std::make_shared<CompletionQueue>();
  Models models;
  models.schedulers["a"] = make_scheduler("a", {plus(1)}, queue);
  models.schedulers["b"] = make_scheduler("b", {times(2)}, queue);
  models.schedulers["c"] = make_scheduler("c", {plus(-3)}, queue);
  EnsembleScheduler ensemble(definition("chain", {"OUT"},
                                        {step("a", {{"IN0", "IN"}}, "t1"), step("b", {{"IN0", "t1"}}, "t2"),
                                         step("c", {{"IN0", "t2"}}, "OUT")}),
                             models.resolver(), queue);
  constexpr int kRequests = 20;
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(ensemble.submit(int_request(static_cast<uint64_t>(i), i)).ok());
  auto done = collect(*queue, kRequests);
  ASSERT_EQ(done.size(), static_cast<size_t>(kRequests));
  for (auto& [token, c] : done) {
    ASSERT_TRUE(c.status.ok()) << c.status.message;
    ASSERT_EQ(c.outputs.size(), 1u);
    EXPECT_EQ(value(c.outputs[0]), (static_cast<int32_t>(token) + 1) * 2 - 3);
    ASSERT_NE(c.request, nullptr);  // handed back for release on the consumer's thread
    EXPECT_EQ(c.request->id, "req-" + std::to_string(token));
    // Each step's timing: which model ran it, in which batch, between its submission and answer.
    ASSERT_EQ(c.timing.steps.size(), 3u);
    for (uint32_t s = 0; s < 3; ++s) {
      const EnsembleStepTiming& step = c.timing.steps[s];
      EXPECT_EQ(step.step, s);
      EXPECT_EQ(step.model, std::string(1, static_cast<char>('a' + s)));
      EXPECT_EQ(step.version, 1);
      EXPECT_GT(step.timing.batch_id, 0u);
      EXPECT_LE(c.timing.enqueued, step.submitted);
      EXPECT_LE(step.submitted, step.answered);
      EXPECT_LE(step.answered, c.timing.compute_end);
      if (s > 0) {
        EXPECT_LE(c.timing.steps[s - 1].answered, step.submitted);  // a chain
      }
    }
  }
  auto stats = ensemble.statistics();
  EXPECT_EQ(stats.requests, static_cast<uint64_t>(kRequests));
  EXPECT_EQ(stats.model.success.count, static_cast<uint64_t>(kRequests));
  EXPECT_EQ(stats.model.fail.count, 0u);
  EXPECT_GT(stats.model.success.ns, 0u);
  // As Triton counts an ensemble: one execution per request, its rows as inferences.
  EXPECT_EQ(stats.model.execution_count, static_cast<uint64_t>(kRequests));
  EXPECT_EQ(stats.model.inference_count, static_cast<uint64_t>(kRequests));
  EXPECT_GT(stats.model.last_inference_ms, 0u);
  // Its queue and compute phases are its steps' summed, one count per request (perf_analyzer finds
  // a model's version by the queue count growing).
  EXPECT_EQ(stats.model.queue.count, static_cast<uint64_t>(kRequests));
  EXPECT_EQ(stats.model.compute_infer.count, static_cast<uint64_t>(kRequests));
  EXPECT_GT(stats.model.queue.ns + stats.model.compute_infer.ns, 0u);
  EXPECT_LE(stats.model.queue.ns + stats.model.compute_input.ns + stats.model.compute_infer.ns +
                stats.model.compute_output.ns,
            stats.model.success.ns);
  ASSERT_EQ(stats.steps.size(), 3u);
  for (const EnsembleStepStatistics& step : stats.steps) {
    EXPECT_EQ(step.success.count, static_cast<uint64_t>(kRequests));
    EXPECT_EQ(step.fail.count, 0u);
  }
  EXPECT_EQ(ensemble.running_requests(), 0u);
  for (const char* model : {"a", "b", "c"}) {
    EXPECT_EQ(models.schedulers[model]->statistics().success.count, static_cast<uint64_t>(kRequests)) << model;
  }
}

// Where an answer goes when the request has a sink of its own (the gRPC transport's calls).
class RecordingSink : public CompletionSink {
 public:
  void complete(Completion&& completion) override {
    std::lock_guard<std::mutex> lock(mutex_);
    completions_.push_back(std::move(completion));
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return completions_.size();
  }
  Completion take() {
    std::lock_guard<std::mutex> lock(mutex_);
    Completion c = std::move(completions_.at(0));
    completions_.erase(completions_.begin());
    return c;
  }

 private:
  std::mutex mutex_;
  std::vector<Completion> completions_;
};

TEST(EnsembleScheduler, AnswersARequestWithASinkThroughItsSink) {
  auto queue = std::make_shared<CompletionQueue>();
  Models models;
  models.schedulers["a"] = make_scheduler("a", {plus(1)}, queue);
  EnsembleScheduler ensemble(definition("one", {"OUT"}, {step("a", {{"IN0", "IN"}}, "OUT")}), models.resolver(), queue);
  auto sink = std::make_shared<RecordingSink>();
  auto request = int_request(7, 41);
  request->sink = sink;
  ASSERT_TRUE(ensemble.submit(std::move(request)).ok());
  for (int i = 0; i < 500 && sink->size() == 0; ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_EQ(sink->size(), 1u);
  Completion c = sink->take();
  EXPECT_EQ(c.token, 7u);
  ASSERT_TRUE(c.status.ok()) << c.status.message;
  EXPECT_EQ(value(c.outputs.at(0)), 42);
  EXPECT_TRUE(queue->drain().empty());
}

// Two executors that each wait (up to 5 s) for the other to start: both see the other started
// before either finishes only when they run concurrently.
struct Rendezvous {
  std::mutex mutex;
  std::condition_variable changed;
  int started = 0;
  int finished = 0;
  bool both_started_before_a_finish = false;
  Status meet() {
    std::unique_lock<std::mutex> lock(mutex);
    ++started;
    changed.notify_all();
    changed.wait_for(lock, std::chrono::seconds(5), [&] { return started >= 2; });
    if (finished == 0) both_started_before_a_finish = started >= 2;
    ++finished;
    return Status::Ok();
  }
};

TEST(EnsembleScheduler, ADiamondRunsItsIndependentStepsConcurrentlyAndPassesTensorsWithoutCopies) {
  auto queue = std::make_shared<CompletionQueue>();
  Rendezvous rendezvous;
  std::mutex mutex;
  const std::byte* produced_by_a = nullptr;  // guarded by mutex
  std::vector<const std::byte*> read_by_b;   // guarded by mutex
  Models models;
  models.schedulers["a"] = make_scheduler("a",
                                          {plus(1), nullptr,
                                           [&](const Tensor& out) {
                                             std::lock_guard<std::mutex> lock(mutex);
                                             produced_by_a = out.data;
                                           }},
                                          queue);
  models.schedulers["b"] = make_scheduler("b",
                                          {times(2),
                                           [&](const std::vector<Tensor>& in) {
                                             {
                                               std::lock_guard<std::mutex> lock(mutex);
                                               read_by_b.push_back(in[0].data);
                                             }
                                             return rendezvous.meet();
                                           }},
                                          queue);
  models.schedulers["c"] =
      make_scheduler("c", {times(3), [&](const std::vector<Tensor>&) { return rendezvous.meet(); }}, queue);
  models.schedulers["d"] =
      make_scheduler("d", {[](const std::vector<int32_t>& a) { return a[0] * 100 + a[1]; }}, queue);
  // Outputs in an order of their own: the sum first, then a middle tensor.
  EnsembleScheduler ensemble(definition("diamond", {"OUT", "A"},
                                        {step("d", {{"IN0", "B"}, {"IN1", "C"}}, "OUT"), step("b", {{"IN0", "A"}}, "B"),
                                         step("a", {{"IN0", "IN"}}, "A"), step("c", {{"IN0", "A"}}, "C")}),
                             models.resolver(), queue);
  ASSERT_TRUE(ensemble.submit(int_request(1, 4)).ok());
  auto done = collect(*queue, 1);
  ASSERT_EQ(done.size(), 1u);
  Completion& c = done.at(1);
  ASSERT_TRUE(c.status.ok()) << c.status.message;
  ASSERT_EQ(c.outputs.size(), 2u);
  EXPECT_EQ(value(c.outputs[0]), 10 * 100 + 15);  // (4+1)*2 and (4+1)*3
  EXPECT_EQ(value(c.outputs[1]), 5);
  {
    std::lock_guard<std::mutex> lock(rendezvous.mutex);
    EXPECT_TRUE(rendezvous.both_started_before_a_finish) << "the two middle steps did not run at the same time";
  }
  std::lock_guard<std::mutex> lock(mutex);
  // The step that produced A, the step that read it and the answer all hold the same bytes.
  ASSERT_NE(produced_by_a, nullptr);
  EXPECT_EQ(c.outputs[1].data, produced_by_a);
  ASSERT_EQ(read_by_b.size(), 1u);
  EXPECT_EQ(read_by_b[0], produced_by_a);
}

TEST(EnsembleScheduler, AFailingStepFailsOnlyItsRequestAndIsNamed) {
  auto queue = std::make_shared<CompletionQueue>();
  Models models;
  models.schedulers["a"] = make_scheduler("a", {plus(1)}, queue);
  models.schedulers["b"] =
      make_scheduler("b",
                     {times(2),
                      [](const std::vector<Tensor>& in) {
                        return value(in[0]) == 14 ? Status::Error(StatusCode::kInternal, "poisoned") : Status::Ok();
                      },
                      nullptr, /*max_batch_size=*/0},
                     queue);
  models.schedulers["c"] = make_scheduler("c", {plus(-3)}, queue);
  EnsembleScheduler ensemble(definition("chain", {"OUT"},
                                        {step("a", {{"IN0", "IN"}}, "t1"), step("b", {{"IN0", "t1"}}, "t2"),
                                         step("c", {{"IN0", "t2"}}, "OUT")}),
                             models.resolver(), queue);
  constexpr int kRequests = 20;
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(ensemble.submit(int_request(static_cast<uint64_t>(i), i)).ok());
  auto done = collect(*queue, kRequests);
  ASSERT_EQ(done.size(), static_cast<size_t>(kRequests));
  for (auto& [token, c] : done) {
    if (token == 13) {
      EXPECT_EQ(c.status.code, StatusCode::kInternal);
      EXPECT_EQ(c.status.message, "ensemble 'chain' step 1 (model 'b'): poisoned");
      EXPECT_TRUE(c.outputs.empty());
    } else {
      ASSERT_TRUE(c.status.ok()) << token << ": " << c.status.message;
      EXPECT_EQ(value(c.outputs.at(0)), (static_cast<int32_t>(token) + 1) * 2 - 3);
    }
  }
  EXPECT_EQ(models.schedulers["c"]->statistics().success.count, static_cast<uint64_t>(kRequests - 1));
  auto stats = ensemble.statistics();
  EXPECT_EQ(stats.model.success.count, static_cast<uint64_t>(kRequests - 1));
  EXPECT_EQ(stats.model.fail.count, 1u);
  ASSERT_EQ(stats.steps.size(), 3u);
  EXPECT_EQ(stats.steps[1].fail.count, 1u);  // only the failing step counts the failure
  EXPECT_EQ(stats.steps[0].fail.count + stats.steps[2].fail.count, 0u);
  EXPECT_EQ(stats.steps[2].success.count, static_cast<uint64_t>(kRequests - 1));
}

TEST(EnsembleScheduler, DeadlineAndCancelReachTheQueuedStep) {
  auto queue = std::make_shared<CompletionQueue>();
  Gate gate;
  std::atomic<int> computed{0};
  Models models;
  models.schedulers["a"] = make_scheduler("a",
                                          {plus(1),
                                           [&](const std::vector<Tensor>&) {
                                             computed.fetch_add(1);
                                             return gate.pass();
                                           }},
                                          queue);
  EnsembleScheduler ensemble(definition("one", {"OUT"}, {step("a", {{"IN0", "IN"}}, "OUT")}), models.resolver(), queue);
  // A direct request holds model a's only instance at the gate; the ensemble's steps queue behind it.
  ASSERT_TRUE(models.schedulers["a"]->submit(int_request(100, 0)).ok());
  gate.wait_for_waiter();
  const auto start = Clock::now();
  auto late = int_request(1, 1);
  late->deadline = start + milliseconds(50);
  ASSERT_TRUE(ensemble.submit(std::move(late)).ok());
  ASSERT_TRUE(ensemble.submit(int_request(2, 2)).ok());
  std::this_thread::sleep_for(milliseconds(10));  // step of request 2 is queued in model a
  EXPECT_EQ(models.schedulers["a"]->pending_requests(), 2u);
  EXPECT_TRUE(ensemble.cancel(2));
  EXPECT_FALSE(ensemble.cancel(2));  // answered already
  auto done = collect(*queue, 2);
  EXPECT_LT(Clock::now() - start, milliseconds(5000));  // answered while the gate still holds
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done.at(1).status.code, StatusCode::kDeadlineExceeded);
  EXPECT_EQ(done.at(1).status.message.rfind("ensemble 'one' step 0 (model 'a'): ", 0), 0u) << done.at(1).status.message;
  EXPECT_EQ(done.at(2).status.code, StatusCode::kCancelled);
  EXPECT_EQ(models.schedulers["a"]->pending_requests(), 0u);  // both steps left model a's queue
  gate.release();
  EXPECT_EQ(collect(*queue, 1).count(100), 1u);
  EXPECT_EQ(computed.load(), 1);  // only the direct request ran
  EXPECT_EQ(ensemble.statistics().model.fail.count, 2u);
}

TEST(EnsembleScheduler, AStepWhoseModelIsNotLoadedFailsTheRequestUnavailable) {
  auto queue = std::make_shared<CompletionQueue>();
  Models models;
  models.schedulers["a"] = make_scheduler("a", {plus(1)}, queue);
  EnsembleScheduler ensemble(
      definition("chain", {"OUT"}, {step("a", {{"IN0", "IN"}}, "t1"), step("gone", {{"IN0", "t1"}}, "OUT")}),
      models.resolver(), queue);
  ASSERT_TRUE(ensemble.submit(int_request(1, 1)).ok());
  auto done = collect(*queue, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done.at(1).status.code, StatusCode::kUnavailable);
  EXPECT_EQ(done.at(1).status.message, "ensemble 'chain' step 1 (model 'gone'): the model version -1 is not loaded");
  EXPECT_EQ(ensemble.running_requests(), 0u);
}

TEST(EnsembleScheduler, RefusesAWrongInputCountAndSubmitAfterShutdownKeepingTheRequest) {
  auto queue = std::make_shared<CompletionQueue>();
  Models models;
  models.schedulers["a"] = make_scheduler("a", {plus(1)}, queue);
  EnsembleScheduler ensemble(definition("one", {"OUT"}, {step("a", {{"IN0", "IN"}}, "OUT")}), models.resolver(), queue);
  auto two_inputs = int_request(1, 1);
  two_inputs->inputs.push_back(two_inputs->inputs[0]);
  EXPECT_EQ(ensemble.submit(std::move(two_inputs)).code, StatusCode::kInvalidArgument);
  EXPECT_NE(two_inputs, nullptr);
  ensemble.shutdown();
  auto request = int_request(2, 1);
  EXPECT_EQ(ensemble.submit(std::move(request)).code, StatusCode::kUnavailable);
  EXPECT_NE(request, nullptr);
  EXPECT_EQ(ensemble.statistics().requests, 0u);
}

TEST(EnsembleScheduler, ShutdownAnswersEveryRunningRequestOnceAndDropsTheirLateSteps) {
  auto queue = std::make_shared<CompletionQueue>();
  Gate gate;
  Models models;
  models.schedulers["a"] =
      make_scheduler("a", {plus(1), [&](const std::vector<Tensor>&) { return gate.pass(); }}, queue);
  constexpr int kRequests = 5;
  {
    EnsembleScheduler ensemble(definition("one", {"OUT"}, {step("a", {{"IN0", "IN"}}, "OUT")}), models.resolver(),
                               queue);
    for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(ensemble.submit(int_request(static_cast<uint64_t>(i), i)).ok());
    gate.wait_for_waiter();  // one step computing, the others queued
    ensemble.shutdown();
    EXPECT_EQ(ensemble.running_requests(), 0u);
  }  // destroyed while a step still computes: its answer must find no dangling state
  gate.release();
  auto done = collect(*queue, kRequests + 1, milliseconds(500));
  ASSERT_EQ(done.size(), static_cast<size_t>(kRequests));
  for (auto& [token, c] : done) EXPECT_EQ(c.status.code, StatusCode::kUnavailable) << token;
  models.schedulers["a"]->shutdown(Scheduler::ShutdownMode::kDrain);  // the computing step ends
  EXPECT_TRUE(queue->drain().empty());
}

TEST(EnsembleScheduler, DrainWaitsForEveryRunningRequestAndRefusesNewOnes) {
  auto queue = std::make_shared<CompletionQueue>();
  Gate gate;
  Models models;
  models.schedulers["a"] =
      make_scheduler("a", {plus(1), [&](const std::vector<Tensor>&) { return gate.pass(); }}, queue);
  models.schedulers["b"] = make_scheduler("b", {times(2)}, queue);
  EnsembleScheduler ensemble(
      definition("chain", {"OUT"}, {step("a", {{"IN0", "IN"}}, "t"), step("b", {{"IN0", "t"}}, "OUT")}),
      models.resolver(), queue);
  constexpr int kRequests = 3;
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(ensemble.submit(int_request(static_cast<uint64_t>(i), i)).ok());
  gate.wait_for_waiter();  // step 0 of a request computing, the others queued
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    ensemble.drain();
    drained = true;
  });
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(drained) << "drain returned while requests were still running";
  EXPECT_EQ(ensemble.submit(int_request(99, 1)).code, StatusCode::kUnavailable);  // intake closed
  gate.release();
  drainer.join();
  EXPECT_EQ(ensemble.running_requests(), 0u);
  auto done = collect(*queue, kRequests);
  ASSERT_EQ(done.size(), static_cast<size_t>(kRequests));
  for (auto& [token, c] : done) {
    ASSERT_TRUE(c.status.ok()) << token << ": " << c.status.message;  // drained, not failed
    EXPECT_EQ(value(c.outputs.at(0)), (static_cast<int32_t>(token) + 1) * 2);
  }
}

TEST(EnsembleScheduler, ManyConcurrentRequestsWithCancelsAreEachAnsweredOnce) {
  auto queue = std::make_shared<CompletionQueue>();
  Models models;
  ModelSpec batched{plus(1)};
  batched.dynamic = true;
  batched.instances = 2;
  models.schedulers["a"] = make_scheduler("a", batched, queue);
  batched.fn = times(2);
  models.schedulers["b"] = make_scheduler("b", batched, queue);
  batched.fn = times(3);
  models.schedulers["c"] = make_scheduler("c", batched, queue);
  batched.fn = [](const std::vector<int32_t>& a) { return a[0] + a[1]; };
  models.schedulers["d"] = make_scheduler("d", batched, queue);
  EnsembleScheduler ensemble(
      definition("diamond", {"OUT"},
                 {step("a", {{"IN0", "IN"}}, "A"), step("b", {{"IN0", "A"}}, "B"), step("c", {{"IN0", "A"}}, "C"),
                  step("d", {{"IN0", "B"}, {"IN1", "C"}}, "OUT")}),
      models.resolver(), queue);
  constexpr int kClients = 8;
  constexpr int kPerClient = 100;
  std::atomic<int> cancelled{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < kPerClient; ++i) {
        const int n = c * kPerClient + i;
        ASSERT_TRUE(ensemble.submit(int_request(static_cast<uint64_t>(n), n)).ok());
        if (n % 7 == 0 && ensemble.cancel(static_cast<uint64_t>(n))) cancelled.fetch_add(1);
      }
    });
  }
  for (auto& t : clients) t.join();
  auto done = collect(*queue, kClients * kPerClient);
  ASSERT_EQ(done.size(), static_cast<size_t>(kClients * kPerClient));
  int ok = 0;
  for (auto& [token, c] : done) {
    if (c.status.ok()) {
      ++ok;
      EXPECT_EQ(value(c.outputs.at(0)), (static_cast<int32_t>(token) + 1) * 5);
    } else {
      EXPECT_EQ(c.status.code, StatusCode::kCancelled) << c.status.message;
      EXPECT_EQ(token % 7, 0u);
    }
  }
  EXPECT_EQ(ok + cancelled.load(), kClients * kPerClient);  // cancel() == true <=> answered CANCELLED
  EXPECT_EQ(ensemble.running_requests(), 0u);
  auto stats = ensemble.statistics();
  EXPECT_EQ(stats.requests, static_cast<uint64_t>(kClients * kPerClient));
  EXPECT_EQ(stats.model.success.count + stats.model.fail.count, stats.requests);
  EXPECT_TRUE(collect(*queue, 1, milliseconds(100)).empty());  // nothing answered twice, late
}

TEST(EnsembleScheduler, EnsembleStepsBatchWithDirectTrafficInTheComposingModel) {
  auto queue = std::make_shared<CompletionQueue>();
  Gate gate;
  Models models;
  ModelSpec spec{plus(1), [&](const std::vector<Tensor>&) { return gate.pass(); }};
  spec.dynamic = true;
  models.schedulers["a"] = make_scheduler("a", spec, queue);
  EnsembleScheduler ensemble(definition("one", {"OUT"}, {step("a", {{"IN0", "IN"}}, "OUT")}), models.resolver(), queue);
  Scheduler& a = *models.schedulers["a"];
  ASSERT_TRUE(a.submit(int_request(100, 0)).ok());  // a batch of one, held at the gate
  gate.wait_for_waiter();
  for (uint64_t t = 101; t < 104; ++t) ASSERT_TRUE(a.submit(int_request(t, 0)).ok());
  for (uint64_t t = 1; t < 5; ++t) ASSERT_TRUE(ensemble.submit(int_request(t, static_cast<int32_t>(t))).ok());
  EXPECT_EQ(a.pending_requests(), 7u);
  gate.release();
  auto done = collect(*queue, 8);
  ASSERT_EQ(done.size(), 8u);
  for (auto& [token, c] : done) ASSERT_TRUE(c.status.ok()) << c.status.message;
  for (uint64_t t = 1; t < 5; ++t) EXPECT_EQ(value(done.at(t).outputs.at(0)), static_cast<int32_t>(t) + 1);
  auto stats = a.statistics();
  EXPECT_EQ(stats.execution_count, 2u);
  EXPECT_EQ(stats.batches.count(7), 1u) << "3 direct and 4 ensemble requests did not share a batch";
}

TEST(SchedulerDirectory, FindsANamedVersionAndTheHighestOneStillAlive) {
  auto queue = std::make_shared<CompletionQueue>();
  auto v1 = make_scheduler("m", {plus(1)}, queue);
  auto v2 = make_scheduler("m", {plus(2)}, queue);
  auto v3 = make_scheduler("m", {plus(3)}, queue);
  auto directory = std::make_shared<SchedulerDirectory>();
  EXPECT_EQ(directory->find("m", -1).scheduler, nullptr);  // nothing published yet
  directory->publish({{"m", {{1, v1}, {2, v2}, {3, v3}}}});
  EXPECT_EQ(directory->find("m", 2).scheduler, v2);
  EXPECT_EQ(directory->find("m", 2).version, 2);
  EXPECT_EQ(directory->find("m", -1).scheduler, v3);
  EXPECT_EQ(directory->find("m", -1).version, 3);
  EXPECT_EQ(directory->find("m", 4).scheduler, nullptr);
  EXPECT_EQ(directory->find("other", -1).scheduler, nullptr);
  // The directory does not own: a version whose owner let go is skipped by "latest".
  v3->shutdown(Scheduler::ShutdownMode::kReject);
  v3.reset();
  EXPECT_EQ(directory->find("m", 3).scheduler, nullptr);
  EXPECT_EQ(directory->find("m", -1).scheduler, v2);
  EXPECT_EQ(directory->find("m", -1).version, 2);
  // A new publication replaces the old one whole.
  directory->publish({{"m", {{1, v1}}}});
  EXPECT_EQ(directory->find("m", 2).scheduler, nullptr);
  EXPECT_EQ(directory->find("m", -1).scheduler, v1);
  SchedulerResolver resolve = SchedulerDirectory::resolver(directory);
  EXPECT_EQ(resolve("m", -1).scheduler, v1);
  for (auto* s : {&v1, &v2}) (*s)->shutdown(Scheduler::ShutdownMode::kReject);
}

}  // namespace
}  // namespace inferd
