#include "inferd/ensemble_scheduler.h"

#include <array>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "inferd/request_token.h"

namespace inferd {
namespace {

// Step requests share composing schedulers with direct traffic: their own range of tokens, one
// counter for the process, keeps them apart from it and from each other (request_token.h).
uint64_t next_step_token() {
  static RequestTokenCounter counter{kEnsembleStepTokenRange, 0};
  return counter.next();
}

// The definition with every tensor name turned into a slot of a run's tensor table: the
// ensemble's inputs first, then each step's outputs.
struct Plan {
  struct Step {
    std::string model_name;
    int64_t model_version = -1;
    std::vector<size_t> input_slots;                  // in the composing model's input order
    std::vector<std::pair<uint32_t, size_t>> output;  // composing model's output index -> slot
  };
  std::string name;
  bool batched = false;
  size_t slot_count = 0;
  size_t input_count = 0;
  std::vector<Step> steps;
  std::vector<std::vector<size_t>> consumers;  // per slot: the steps that read it
  std::vector<size_t> output_slots;            // per ensemble output

  explicit Plan(const EnsembleDefinition& definition) : name(definition.name) {
    batched = definition.max_batch_size > 0;
    std::unordered_map<std::string, size_t> slots;
    auto add = [&](const std::string& tensor) {
      if (!slots.emplace(tensor, slot_count).second) {
        throw std::invalid_argument("ensemble '" + name + "': tensor '" + tensor + "' is produced twice");
      }
      ++slot_count;
    };
    for (const auto& input : definition.inputs) add(input.name);
    input_count = slot_count;
    for (const auto& step : definition.steps) {
      for (const auto& output : step.output_map) add(output.mapping.ensemble_tensor);
    }
    auto find = [&](const std::string& tensor, const std::string& what) {
      auto it = slots.find(tensor);
      if (it == slots.end()) {
        throw std::invalid_argument("ensemble '" + name + "': " + what + " '" + tensor + "' is produced by nothing");
      }
      return it->second;
    };
    consumers.resize(slot_count);
    for (size_t s = 0; s < definition.steps.size(); ++s) {
      const EnsembleStep& source = definition.steps[s];
      Step step;
      step.model_name = source.model_name;
      step.model_version = source.model_version;
      for (const auto& input : source.input_map) {
        const size_t slot = find(input.ensemble_tensor, "step " + std::to_string(s) + " input");
        step.input_slots.push_back(slot);
        consumers[slot].push_back(s);
      }
      for (const auto& output : source.output_map) {
        step.output.emplace_back(output.model_output, slots.at(output.mapping.ensemble_tensor));
      }
      steps.push_back(std::move(step));
    }
    for (const auto& output : definition.outputs) output_slots.push_back(find(output.name, "output"));
  }
};

}  // namespace

// One request's trip through the graph. Every field but `token` and `start` is guarded by `mutex`.
struct EnsembleRun {
  enum class StepState : uint8_t { kWaiting, kStarted, kDone };

  std::mutex mutex;
  uint64_t token = 0;
  Clock::time_point start;
  std::unique_ptr<InferenceRequest> request;  // null once answered
  std::vector<Tensor> tensors;                // per slot
  std::vector<bool> present;                  // per slot
  std::vector<size_t> inputs_missing;         // per step
  std::vector<StepState> steps;
  std::vector<uint64_t> step_tokens;                      // per started step
  std::vector<std::weak_ptr<Scheduler>> step_schedulers;  // per started step, for cancel (never owning)
  std::vector<EnsembleStepTiming> step_timings;           // per step; `answered` set once it is done
  bool cancelled = false;
};

struct EnsembleScheduler::Shared : std::enable_shared_from_this<Shared> {
  Shared(const EnsembleDefinition& definition, SchedulerResolver resolve, std::shared_ptr<CompletionQueue> queue,
         std::shared_ptr<ResponseCache> response_cache)
      : plan(definition),
        resolver(std::move(resolve)),
        completions(std::move(queue)),
        cache(std::move(response_cache), &statistics) {}

  // Where a step's answer goes: back into its run.
  class StepSink : public CompletionSink {
   public:
    StepSink(std::shared_ptr<Shared> shared, std::shared_ptr<EnsembleRun> run, size_t step)
        : shared_(std::move(shared)), run_(std::move(run)), step_(step) {}
    void complete(Completion&& completion) override { shared_->step_done(run_, step_, std::move(completion)); }

   private:
    std::shared_ptr<Shared> shared_;
    std::shared_ptr<EnsembleRun> run_;
    size_t step_;
  };

  const Plan plan;
  const SchedulerResolver resolver;
  const std::shared_ptr<CompletionQueue> completions;

  ModelStatistics statistics;  // the ensemble's own, as a model's
  VersionCache cache;          // the ensemble's own answers (response_cache), after statistics

  mutable std::mutex mutex;
  std::condition_variable drained;                                  // notified when `runs` empties
  bool closed = false;                                              // guarded by mutex
  std::unordered_map<uint64_t, std::shared_ptr<EnsembleRun>> runs;  // guarded by mutex: unanswered
  uint64_t requests = 0;                                            // guarded by mutex
  std::vector<EnsembleStepStatistics> step_stats =
      std::vector<EnsembleStepStatistics>(plan.steps.size());  // guarded by mutex

  // Marks `ready` started and submits each; what cannot start fails the run.
  void start_steps(const std::shared_ptr<EnsembleRun>& run, std::vector<size_t> ready);
  void step_done(const std::shared_ptr<EnsembleRun>& run, size_t step, Completion&& completion);
  // Answers the run with `status` unless answered already; cancels its queued steps.
  void fail(const std::shared_ptr<EnsembleRun>& run, Status status);
  // Delivers the answer of a run whose request (and finished steps' timings) were taken out under
  // its lock (no lock held), and records it.
  void answer(const std::shared_ptr<EnsembleRun>& run, std::unique_ptr<InferenceRequest> request, Status status,
              std::vector<Tensor> outputs, std::vector<EnsembleStepTiming> steps);
  // Answers `request` with its cached `outputs`, looked up at `start`, without running a step.
  Status answer_from_cache(std::unique_ptr<InferenceRequest>&& request, std::vector<Tensor>&& outputs,
                           Clock::time_point start);
  // To the request's own sink if it has one, else to the completion queue.
  void deliver(Completion&& completion);
  static std::vector<EnsembleStepTiming> finished_steps(EnsembleRun* run);
  // Cancels, in their schedulers, the started steps of a run (no lock held).
  static void cancel_steps(std::vector<std::pair<uint64_t, std::weak_ptr<Scheduler>>> started);
  static std::vector<std::pair<uint64_t, std::weak_ptr<Scheduler>>> started_steps(const EnsembleRun& run);
  std::string step_label(size_t step) const {
    return "ensemble '" + plan.name + "' step " + std::to_string(step) + " (model '" + plan.steps[step].model_name +
           "')";
  }
};

std::vector<std::pair<uint64_t, std::weak_ptr<Scheduler>>> EnsembleScheduler::Shared::started_steps(
    const EnsembleRun& run) {
  std::vector<std::pair<uint64_t, std::weak_ptr<Scheduler>>> started;
  for (size_t s = 0; s < run.steps.size(); ++s) {
    if (run.steps[s] == EnsembleRun::StepState::kStarted && run.step_tokens[s] != 0) {
      started.emplace_back(run.step_tokens[s], run.step_schedulers[s]);
    }
  }
  return started;
}

void EnsembleScheduler::Shared::cancel_steps(std::vector<std::pair<uint64_t, std::weak_ptr<Scheduler>>> started) {
  for (auto& [token, weak] : started) {
    if (auto scheduler = weak.lock()) scheduler->cancel(token);
  }
}

std::vector<EnsembleStepTiming> EnsembleScheduler::Shared::finished_steps(EnsembleRun* run) {
  std::vector<EnsembleStepTiming> finished;
  for (auto& timing : run->step_timings) {
    if (timing.answered != Clock::time_point{}) finished.push_back(std::move(timing));
  }
  return finished;
}

void EnsembleScheduler::Shared::answer(const std::shared_ptr<EnsembleRun>& run,
                                       std::unique_ptr<InferenceRequest> request, Status status,
                                       std::vector<Tensor> outputs, std::vector<EnsembleStepTiming> steps) {
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = runs.find(run->token);
    if (it != runs.end() && it->second == run) runs.erase(it);
    if (runs.empty()) drained.notify_all();
  }
  if (status.ok()) {
    // As Triton reports an ensemble: its queue and compute phases are its steps' summed.
    std::array<uint64_t, 4> phases{};
    for (const EnsembleStepTiming& step : steps) {
      const RequestTiming& t = step.timing;
      phases[0] += ns_between(t.enqueued, t.compute_start);
      phases[1] += ns_between(t.compute_start, t.input_done);
      phases[2] += ns_between(t.input_done, t.infer_done);
      phases[3] += ns_between(t.infer_done, t.compute_end);
    }
    statistics.record_request(request->batch_size, ns_between(run->start, now), phases);
  } else {
    statistics.record_failures(1, ns_between(run->start, now));
  }
  Completion completion;
  completion.token = run->token;
  completion.status = std::move(status);
  completion.outputs = std::move(outputs);
  completion.timing.enqueued = run->start;
  completion.timing.compute_end = now;
  completion.timing.steps = std::move(steps);
  completion.request = std::move(request);
  cache.remember(completion);
  deliver(std::move(completion));
}

Status EnsembleScheduler::Shared::answer_from_cache(std::unique_ptr<InferenceRequest>&& request,
                                                    std::vector<Tensor>&& outputs, Clock::time_point start) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (closed) return Status::Error(StatusCode::kUnavailable, "ensemble '" + plan.name + "' is shutting down");
    ++requests;
  }
  deliver(cache.answer(std::move(request), std::move(outputs), start));
  return Status::Ok();
}

void EnsembleScheduler::Shared::deliver(Completion&& completion) {
  std::shared_ptr<CompletionSink> sink = completion.request->sink;
  if (sink) {
    sink->complete(std::move(completion));
  } else {
    completions->push(std::move(completion));
  }
}

void EnsembleScheduler::Shared::fail(const std::shared_ptr<EnsembleRun>& run, Status status) {
  std::unique_ptr<InferenceRequest> request;
  std::vector<std::pair<uint64_t, std::weak_ptr<Scheduler>>> started;
  std::vector<EnsembleStepTiming> steps;
  {
    std::lock_guard<std::mutex> lock(run->mutex);
    request = std::move(run->request);
    if (!request) return;
    started = started_steps(*run);
    steps = finished_steps(run.get());
  }
  answer(run, std::move(request), std::move(status), {}, std::move(steps));
  cancel_steps(std::move(started));  // their answers find the run answered and are dropped
}

void EnsembleScheduler::Shared::start_steps(const std::shared_ptr<EnsembleRun>& run, std::vector<size_t> ready) {
  for (size_t step : ready) {
    const Plan::Step& plan_step = plan.steps[step];
    auto request = std::make_unique<InferenceRequest>();
    {
      std::lock_guard<std::mutex> lock(run->mutex);
      if (!run->request || run->cancelled) return;  // answered meanwhile: start nothing more
      const InferenceRequest& source = *run->request;
      request->token = next_step_token();
      request->id = source.id;
      request->batch_size = source.batch_size;
      request->priority = source.priority;
      request->timeout_us = source.timeout_us;
      request->deadline = source.deadline;
      request->inputs.reserve(plan_step.input_slots.size());
      for (size_t slot : plan_step.input_slots) request->inputs.push_back(run->tensors[slot]);
      run->step_tokens[step] = request->token;
    }
    ResolvedScheduler resolved = resolver(plan_step.model_name, plan_step.model_version);
    std::shared_ptr<Scheduler> scheduler = std::move(resolved.scheduler);
    if (!scheduler) {
      fail(run,
           Status::Error(StatusCode::kUnavailable, step_label(step) + ": the model version " +
                                                       std::to_string(plan_step.model_version) + " is not loaded"));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(run->mutex);
      run->step_schedulers[step] = scheduler;
      EnsembleStepTiming& timing = run->step_timings[step];
      timing.version = resolved.version;
      timing.submitted = Clock::now();
    }
    const uint64_t token = request->token;
    request->sink = std::make_shared<StepSink>(shared_from_this(), run, step);
    Status submitted = scheduler->submit(std::move(request));
    if (!submitted.ok()) {
      fail(run, Status::Error(submitted.code, step_label(step) + ": " + submitted.message));
      return;
    }
    // A cancel() or failure between the check above and the submit did not see this step queued.
    bool late;
    {
      std::lock_guard<std::mutex> lock(run->mutex);
      late = !run->request || run->cancelled;
    }
    if (late) {
      scheduler->cancel(token);
      return;
    }
  }
}

void EnsembleScheduler::Shared::step_done(const std::shared_ptr<EnsembleRun>& run, size_t step,
                                          Completion&& completion) {
  const Clock::time_point now = Clock::now();
  Clock::time_point submitted;
  {
    std::lock_guard<std::mutex> lock(run->mutex);
    EnsembleStepTiming& timing = run->step_timings[step];
    timing.answered = now;
    timing.timing = std::move(completion.timing);
    submitted = timing.submitted;
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    EnsembleStepStatistics& stats = step_stats[step];
    (completion.status.ok() ? stats.success : stats.fail).add(1, ns_between(submitted, now));
  }
  if (!completion.status.ok()) {
    fail(run, Status::Error(completion.status.code, step_label(step) + ": " + completion.status.message));
    return;
  }
  for (const auto& output : plan.steps[step].output) {
    if (output.first >= completion.outputs.size()) {
      fail(run, Status::Error(StatusCode::kInternal,
                              step_label(step) + ": the model answered " + std::to_string(completion.outputs.size()) +
                                  " outputs, the ensemble reads output " + std::to_string(output.first)));
      return;
    }
  }
  std::vector<size_t> ready;
  std::unique_ptr<InferenceRequest> request;
  std::vector<Tensor> outputs;
  std::vector<EnsembleStepTiming> steps;
  bool cancelled = false;
  {
    std::lock_guard<std::mutex> lock(run->mutex);
    if (!run->request) return;  // answered already: a late completion
    run->steps[step] = EnsembleRun::StepState::kDone;
    if (run->cancelled) {
      cancelled = true;
    } else {
      for (const auto& [model_output, slot] : plan.steps[step].output) {
        run->tensors[slot] = std::move(completion.outputs[model_output]);
        run->present[slot] = true;
        for (size_t consumer : plan.consumers[slot]) {
          if (--run->inputs_missing[consumer] == 0 && run->steps[consumer] == EnsembleRun::StepState::kWaiting) {
            run->steps[consumer] = EnsembleRun::StepState::kStarted;
            ready.push_back(consumer);
          }
        }
      }
      bool complete = true;
      for (size_t slot : plan.output_slots) complete = complete && run->present[slot];
      if (complete) {
        request = std::move(run->request);
        for (size_t slot : plan.output_slots) outputs.push_back(run->tensors[slot]);
        steps = finished_steps(run.get());
      }
    }
  }
  if (cancelled) {
    fail(run, Status::Error(StatusCode::kCancelled, "the request was cancelled"));
  } else if (request) {
    answer(run, std::move(request), Status::Ok(), std::move(outputs), std::move(steps));
  } else {
    start_steps(run, std::move(ready));
  }
}

EnsembleScheduler::EnsembleScheduler(EnsembleDefinition definition, SchedulerResolver resolver,
                                     std::shared_ptr<CompletionQueue> completions,
                                     std::shared_ptr<ResponseCache> response_cache)
    : shared_(std::make_shared<Shared>(definition, std::move(resolver), std::move(completions),
                                       std::move(response_cache))) {}

EnsembleScheduler::~EnsembleScheduler() { shutdown(); }

Status EnsembleScheduler::submit(std::unique_ptr<InferenceRequest>&& request) {
  const Plan& plan = shared_->plan;
  if (request->inputs.size() != plan.input_count) {
    return Status::Error(StatusCode::kInvalidArgument, "ensemble '" + plan.name + "' takes " +
                                                           std::to_string(plan.input_count) + " inputs, got " +
                                                           std::to_string(request->inputs.size()));
  }
  if (shared_->cache.enabled()) {
    const Clock::time_point start = Clock::now();
    if (auto outputs = shared_->cache.lookup(request.get(), start)) {
      return shared_->answer_from_cache(std::move(request), std::move(*outputs), start);
    }
  }
  auto run = std::make_shared<EnsembleRun>();
  run->token = request->token;
  run->start = Clock::now();
  run->tensors.resize(plan.slot_count);
  run->present.assign(plan.slot_count, false);
  for (size_t i = 0; i < plan.input_count; ++i) {
    run->tensors[i] = request->inputs[i];
    run->present[i] = true;
  }
  run->steps.assign(plan.steps.size(), EnsembleRun::StepState::kWaiting);
  run->step_tokens.assign(plan.steps.size(), 0);
  run->step_schedulers.resize(plan.steps.size());
  run->step_timings.resize(plan.steps.size());
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    run->step_timings[s].step = static_cast<uint32_t>(s);
    run->step_timings[s].model = plan.steps[s].model_name;
  }
  std::vector<size_t> ready;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    size_t missing = 0;
    for (size_t slot : plan.steps[s].input_slots) missing += run->present[slot] ? 0 : 1;
    run->inputs_missing.push_back(missing);
    if (missing == 0) {
      run->steps[s] = EnsembleRun::StepState::kStarted;
      ready.push_back(s);
    }
  }
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->closed) {
      return Status::Error(StatusCode::kUnavailable, "ensemble '" + plan.name + "' is shutting down");
    }
    if (!shared_->runs.emplace(run->token, run).second) {
      return Status::Error(StatusCode::kInvalidArgument, "ensemble '" + plan.name + "': request token " +
                                                             std::to_string(run->token) + " is already in flight");
    }
    ++shared_->requests;
    run->request = std::move(request);  // accepted: from here on answered exactly once
  }
  shared_->start_steps(run, std::move(ready));
  return Status::Ok();
}

bool EnsembleScheduler::cancel(uint64_t token) {
  std::shared_ptr<EnsembleRun> run;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    auto it = shared_->runs.find(token);
    if (it == shared_->runs.end()) return false;
    run = it->second;
  }
  std::vector<std::pair<uint64_t, std::weak_ptr<Scheduler>>> started;
  bool computing = false;  // a step is started: its answer (or its cancellation) answers the run
  {
    std::lock_guard<std::mutex> lock(run->mutex);
    if (!run->request || run->cancelled) return false;
    run->cancelled = true;
    started = Shared::started_steps(*run);
    computing = !started.empty();
  }
  if (!computing) {
    shared_->fail(run, Status::Error(StatusCode::kCancelled, "the request was cancelled"));
    return true;
  }
  // A queued step answers CANCELLED at once; one already in a batch answers when it ends, and
  // step_done then answers the run CANCELLED.
  Shared::cancel_steps(std::move(started));
  return true;
}

void EnsembleScheduler::shutdown() {
  std::unordered_map<uint64_t, std::shared_ptr<EnsembleRun>> running;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->closed = true;
    running = shared_->runs;
  }
  for (auto& [token, run] : running) {
    shared_->fail(run,
                  Status::Error(StatusCode::kUnavailable, "ensemble '" + shared_->plan.name + "' is shutting down"));
  }
}

void EnsembleScheduler::drain() {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  shared_->closed = true;
  shared_->drained.wait(lock, [&] { return shared_->runs.empty(); });
}

EnsembleStatisticsSnapshot EnsembleScheduler::statistics() const {
  EnsembleStatisticsSnapshot snapshot;
  snapshot.model = shared_->statistics.snapshot();
  std::lock_guard<std::mutex> lock(shared_->mutex);
  snapshot.requests = shared_->requests;
  snapshot.steps = shared_->step_stats;
  return snapshot;
}

size_t EnsembleScheduler::running_requests() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->runs.size();
}

}  // namespace inferd
