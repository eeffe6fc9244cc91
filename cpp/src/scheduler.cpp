#include "inferd/scheduler.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "inferd/model_signature.h"
#include "inferd/structured_log.h"

namespace inferd {
namespace {

// The most extra executions that isolating the culprits of a failed batch of `n` requests may
// cost: enough for two culprits (2*ceil(log2 n) each), never more than the whole bisection tree.
size_t isolation_budget(size_t n) {
  size_t levels = 0;
  while ((size_t{1} << levels) < n) ++levels;
  return std::min(2 * n - 2, 4 * levels);
}

// How the server log names a request: its id, or its token when it has none.
std::string request_label(const InferenceRequest& request) {
  return request.id.empty() ? "#" + std::to_string(request.token) : request.id;
}

std::string request_labels(const RequestBatch& requests) {
  std::string out;
  for (const auto& request : requests) {
    if (!out.empty()) out += ",";
    out += request_label(*request);
  }
  return out;
}

// `request` as an executor answering each request is given it, `inputs` gathered: its id and the
// names of the outputs it asked for are views of the request and its signature, which outlive the
// batch's execution.
ExecutorRequest executor_request(const InferenceRequest& request, std::vector<Tensor>&& inputs) {
  ExecutorRequest taken{std::move(inputs), request.id, {}, request.parameters_json, {nullptr, request.deadline}};
  if (request.signature != nullptr) {
    for (const uint32_t output : request.requested_outputs) {
      taken.requested_outputs.push_back(request.signature->outputs.at(output).name);
    }
  }
  return taken;
}

// Whether `executor` takes a batch as its requests (execute_requests) rather than gathered.
bool takes_requests(const Executor& executor) { return executor.answers_each_request() || executor.decoupled(); }

// The ResponseStream a decoupled executor gets for one batch: hands each response to its
// request's sink (CompletionSink::respond; a request without a sink, answered through the
// CompletionQueue, gets only its final completion) and records the model's response statistics.
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// An executor that answers each request (a python model) computes its outputs' shapes itself: each
// output the request asked for must have the config's rank (one more with the batch dim), its
// batch dim equal to the request's batch size, and every fixed dim of the config; otherwise the
// request gets an INTERNAL error naming them, never a tensor its config does not allow (ONNX
// Runtime and TensorRT outputs come from models checked against the config at load). Outputs
// whose config reshapes them are left to the response writer. Outputs the request did not ask
// for may be empty stand-ins.
Status check_answer_shapes(const InferenceRequest& request, const std::vector<Tensor>& outputs) {
  if (request.signature == nullptr) return Status::Ok();
  const ModelSignature& model = *request.signature;
  const bool batched = model.max_batch_size > 0;
  const auto asked = [&](uint32_t index) {
    return request.requested_outputs.empty() ||
           std::find(request.requested_outputs.begin(), request.requested_outputs.end(), index) !=
               request.requested_outputs.end();
  };
  for (uint32_t i = 0; i < outputs.size() && i < model.outputs.size(); ++i) {
    const OutputSignature& spec = model.outputs[i];
    if (spec.has_reshape || !asked(i)) continue;
    const std::vector<int64_t>& shape = outputs[i].shape;
    bool fits = shape.size() == spec.dims.size() + (batched ? 1 : 0) && (!batched || shape[0] == request.batch_size);
    for (size_t d = 0; fits && d < spec.dims.size(); ++d) {
      fits = spec.dims[d] < 0 || shape[d + (batched ? 1 : 0)] == spec.dims[d];
    }
    if (!fits) {
      return Status::Error(
          StatusCode::kInternal,
          "model '" + model.name + "' answered output '" + spec.name + "' with shape " + shape_text(shape) +
              ", not its config's " + shape_text(spec.dims) +
              (batched ? " after a batch dim of " + std::to_string(request.batch_size) : std::string()));
    }
  }
  return Status::Ok();
}

// Used on the worker thread only.
class StreamedResponses final : public ResponseStream {
 public:
  StreamedResponses(const RequestBatch& batch, ModelStatistics* statistics)
      : batch_(batch), statistics_(statistics), responded_(batch.size(), false) {}

  void respond(size_t index, RequestResult&& response) override {
    if (index >= batch_.size()) return;  // no request of this batch (the binding refuses such an index first)
    statistics_->record_responses(1, first_response(index));
    const InferenceRequest& request = *batch_[index];
    if (response.status.ok()) {
      const Status shapes = check_answer_shapes(request, response.outputs);
      if (!shapes.ok()) response = RequestResult{shapes, {}};
    }
    if (request.sink) request.sink->respond(request, std::move(response));
  }

  // Request `index` has its final result (`with_response`: one that is answered, ok or an error).
  void finish(size_t index, bool with_response) {
    statistics_->record_responses(with_response ? 1 : 0, first_response(index));
  }

 private:
  // The time since the request's enqueue, when this is its first response.
  std::optional<uint64_t> first_response(size_t index) {
    if (responded_[index]) return std::nullopt;
    responded_[index] = true;
    return ns_between(batch_[index]->enqueue_time, Clock::now());
  }

  const RequestBatch& batch_;
  ModelStatistics* const statistics_;
  std::vector<bool> responded_;
};

}  // namespace

// A batch taken from the batcher with its inputs gathered (and, for a pipelined executor, staged).
struct Scheduler::StagedBatch {
  std::vector<std::unique_ptr<InferenceRequest>> requests;
  std::vector<Tensor> inputs;
  std::vector<ExecutorRequest> request_inputs;  // instead of `inputs`, for an executor answering each request
  BatchTimeline timeline;
  Status status;                 // not ok: gathering or staging failed; the requests are failed with it
  bool executor_failed = false;  // the executor (stage, execute or its outputs), not gathering, failed
};

// The handoff between a pipelined instance's stager thread and its worker: holds at most one
// staged batch, so the stager runs one batch ahead. Thread-safe.
class Scheduler::StagedBatchSlot {
 public:
  // Blocks while a batch is waiting (the worker takes every batch, so it returns).
  void put(StagedBatch&& batch) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !batch_; });
    batch_ = std::move(batch);
    staging_ = false;
    changed_.notify_all();
  }
  // Blocks until a batch is there (true) or the stager has finished and nothing is left (false).
  bool take(StagedBatch* out) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return batch_ || finished_; });
    if (!batch_) return false;
    *out = std::move(*batch_);
    batch_.reset();
    changed_.notify_all();
    return true;
  }
  void finish() {  // the stager has nothing more
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    changed_.notify_all();
  }
  // The stager, before it stages a batch: waits while the worker has paused staging.
  void begin_staging() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !paused_; });
    staging_ = true;
  }
  // The worker: stops the stager before its next batch and returns, in staging order, the
  // batches it had already staged (they are on the executor and must execute first).
  std::vector<StagedBatch> pause() {
    std::vector<StagedBatch> staged;
    std::unique_lock<std::mutex> lock(mutex_);
    paused_ = true;
    for (;;) {
      changed_.wait(lock, [&] { return batch_ || !staging_; });
      if (!batch_) return staged;
      staged.push_back(std::move(*batch_));
      batch_.reset();
      changed_.notify_all();
    }
  }
  void resume() {
    std::lock_guard<std::mutex> lock(mutex_);
    paused_ = false;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<StagedBatch> batch_;  // guarded by mutex_
  bool finished_ = false;             // guarded by mutex_
  bool paused_ = false;               // guarded by mutex_: the worker is isolating a failed batch
  bool staging_ = false;              // guarded by mutex_: from begin_staging() to put()
};

Scheduler::Scheduler(SchedulerOptions options, std::vector<std::unique_ptr<Executor>> instances,
                     std::shared_ptr<CompletionQueue> completions, std::shared_ptr<PinnedBufferPool> pool)
    : options_(std::move(options)),
      instances_(std::move(instances)),
      completions_(std::move(completions)),
      pool_(std::move(pool)),
      batcher_(options_.batching) {
  workers_.reserve(instances_.size());
  for (size_t i = 0; i < instances_.size(); ++i) {
    Executor* executor = instances_[i].get();
    const auto instance = static_cast<uint32_t>(i);
    if (executor->pipelined()) {
      workers_.emplace_back([this, executor, instance] { run_pipelined_instance(executor, instance); });
    } else {
      workers_.emplace_back([this, executor, instance] { run_instance(executor, instance); });
    }
  }
  workers_.emplace_back([this] { run_expiry_watch(); });
}

Scheduler::~Scheduler() { shutdown(ShutdownMode::kDrain); }

Status Scheduler::submit(std::unique_ptr<InferenceRequest>&& request) {
  // Decided here for every transport and caller: only a caller that streams responses can take
  // a request that may be answered many times.
  if (request->signature != nullptr && request->signature->decoupled &&
      (request->sink == nullptr || !request->sink->streams_responses())) {
    return Status::Error(StatusCode::kUnimplemented,
                         "model '" + options_.model_name +
                             "' is decoupled (model_transaction_policy { decoupled: true }): ModelInfer answers one "
                             "response per request; use ModelStreamInfer");
  }
  for (size_t i = 0; !request->checked && i < request->inputs.size(); ++i) {
    Status valid = validate_tensor(request->inputs[i]);
    if (!valid.ok()) {
      return Status::Error(valid.code,
                           "input " + std::to_string(i) + " of model '" + options_.model_name + "': " + valid.message);
    }
  }
  Status status = batcher_.enqueue(std::move(request));
  if (!status.ok()) status.message = "model '" + options_.model_name + "': " + status.message;
  return status;
}

bool Scheduler::cancel(uint64_t token) {
  auto request = batcher_.cancel(token);
  if (!request) {
    // Running, or between the batcher and its executor (staging: the cancel is remembered).
    running_.cancel(token);
    return false;
  }
  fail(std::move(request), Status::Error(StatusCode::kCancelled, "the request was cancelled"));
  return true;
}

void Scheduler::shutdown(ShutdownMode mode) {
  std::lock_guard<std::mutex> lock(shutdown_mutex_);
  batcher_.close();
  if (mode == ShutdownMode::kReject || instances_.empty()) {
    const Status status = Status::Error(StatusCode::kUnavailable, "model '" + options_.model_name + "' was unloaded");
    for (auto& request : batcher_.take_all()) fail(std::move(request), status);
  }
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
}

bool Scheduler::take_batch(std::vector<std::unique_ptr<InferenceRequest>>* batch) {
  batch->clear();
  std::vector<Rejection> rejected;
  // next_batch returns false only once the batcher is closed and empty: nothing accepted is left.
  while (batcher_.next_batch(batch, &rejected)) {
    for (auto& [request, status] : rejected) fail(std::move(request), status);
    rejected.clear();
    if (!batch->empty()) return true;
  }
  return false;
}

void Scheduler::run_expiry_watch() {
  pthread_setname_np(pthread_self(), "inferd-expiry");
  std::vector<Rejection> rejected;
  while (batcher_.next_expired(&rejected)) {
    for (auto& [request, status] : rejected) fail(std::move(request), status);
    rejected.clear();
  }
}

void Scheduler::run_instance(Executor* executor, uint32_t instance) {
  pthread_setname_np(pthread_self(), "inferd-worker");  // benchmarks group per-thread CPU by name
  std::vector<std::unique_ptr<InferenceRequest>> batch;
  while (take_batch(&batch)) {
    StagedBatch staged = stage_batch(executor, &batch);
    execute_batch(executor, instance, &staged, nullptr);
  }
}

void Scheduler::run_pipelined_instance(Executor* executor, uint32_t instance) {
  pthread_setname_np(pthread_self(), "inferd-worker");
  StagedBatchSlot slot;
  // The stager takes and stages batch N+1 while this thread computes batch N. It ends once the
  // batcher is closed and empty, so this thread, which drains the slot, answers everything.
  std::thread stager([&] {
    pthread_setname_np(pthread_self(), "inferd-stager");
    std::vector<std::unique_ptr<InferenceRequest>> batch;
    while (take_batch(&batch)) {
      slot.begin_staging();
      slot.put(stage_batch(executor, &batch));
    }
    slot.finish();
  });
  StagedBatch staged;
  while (slot.take(&staged)) execute_batch(executor, instance, &staged, &slot);
  stager.join();
}

Scheduler::StagedBatch Scheduler::stage_batch(Executor* executor,
                                              std::vector<std::unique_ptr<InferenceRequest>>* batch) {
  StagedBatch staged;
  staged.requests = std::move(*batch);
  staged.timeline.start = Clock::now();
  try {
    if (takes_requests(*executor)) {
      // Each request on its own: a batch of one is passed through, client memory copied out.
      for (size_t i = 0; i < staged.requests.size();) {
        RequestBatch one;
        one.push_back(std::move(staged.requests[i]));
        try {
          std::vector<Tensor> inputs = gather_inputs(one, pool_.get(), options_.batching.padding);
          staged.request_inputs.push_back(executor_request(*one.front(), std::move(inputs)));
          staged.requests[i++] = std::move(one.front());
        } catch (const ClientMemoryFault& fault) {
          fail(std::move(one.front()), Status::Error(StatusCode::kInvalidArgument, fault.what()));
          staged.requests.erase(staged.requests.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
      if (staged.requests.empty()) {
        staged.status = Status::Error(StatusCode::kInvalidArgument, "no request of the batch is left");
      }
      staged.timeline.input_done = Clock::now();
      return staged;
    }
    // A request whose client memory cannot be read fails alone; the rest are gathered again.
    while (true) {
      try {
        staged.inputs = gather_inputs(staged.requests, pool_.get(), options_.batching.padding);
        break;
      } catch (const ClientMemoryFault& fault) {
        auto culprit = staged.requests.begin() + static_cast<std::ptrdiff_t>(fault.request);
        fail(std::move(*culprit), Status::Error(StatusCode::kInvalidArgument, fault.what()));
        staged.requests.erase(culprit);
        if (staged.requests.empty()) {
          staged.status = Status::Error(StatusCode::kInvalidArgument, "no request of the batch is left");
          staged.timeline.input_done = Clock::now();
          return staged;
        }
      }
    }
    if (executor->pipelined()) {
      staged.status = executor->stage(staged.inputs);
      staged.executor_failed = !staged.status.ok();
    }
  } catch (const std::exception& e) {
    staged.status = Status::Error(StatusCode::kInternal, std::string("batch assembly failed: ") + e.what());
  }
  staged.timeline.input_done = Clock::now();
  return staged;
}

void Scheduler::execute_batch(Executor* executor, uint32_t instance, StagedBatch* staged, StagedBatchSlot* slot) {
  const Status status = run_batch(executor, instance, staged);
  if (status.ok()) return;
  if (!staged->executor_failed || staged->requests.size() < 2) {
    for (auto& request : staged->requests) fail(std::move(request), status);
    staged->requests.clear();
    return;
  }
  if (slot == nullptr) {
    isolate_failures(executor, instance, std::move(staged->requests), status);
    staged->requests.clear();
    return;
  }
  // Batches already staged on a pipelined executor execute first, in staging order; isolation
  // then stages and executes one group at a time while the stager waits.
  std::vector<std::pair<RequestBatch, Status>> failed;
  failed.emplace_back(std::move(staged->requests), status);
  staged->requests.clear();
  for (StagedBatch& next : slot->pause()) {
    const Status next_status = run_batch(executor, instance, &next);
    if (next_status.ok()) continue;
    if (next.executor_failed && next.requests.size() > 1) {
      failed.emplace_back(std::move(next.requests), next_status);
    } else {
      for (auto& request : next.requests) fail(std::move(request), next_status);
    }
  }
  for (auto& [requests, batch_status] : failed) isolate_failures(executor, instance, std::move(requests), batch_status);
  slot->resume();
}

Status Scheduler::run_batch(Executor* executor, uint32_t instance, StagedBatch* staged) {
  if (staged->status.ok() && takes_requests(*executor)) return run_requests(executor, instance, staged);
  auto* batch = &staged->requests;
  BatchTimeline& timeline = staged->timeline;
  Status status = staged->status;
  std::vector<std::vector<Tensor>> per_request;
  if (status.ok()) {
    staged->executor_failed = true;  // unless it succeeds below, the failure is the executor's
    try {
      std::vector<Tensor> outputs;
      status = executor->execute(staged->inputs, &outputs);
      timeline.infer_done = Clock::now();
      if (status.ok()) {
        status = scatter_outputs(outputs, *batch, options_.batching.padding, pool_.get(), &per_request);
      }
      timeline.output_done = Clock::now();
    } catch (const std::exception& e) {
      status = Status::Error(StatusCode::kInternal, std::string("batch execution failed: ") + e.what());
    }
    if (status.ok()) staged->executor_failed = false;
  }
  staged->inputs.clear();  // the batch buffers go back to the pool before the answers go out
  if (!status.ok()) return status;
  complete_batch(batch, &per_request, instance, timeline, batch->size());
  return Status::Ok();
}

Status Scheduler::run_requests(Executor* executor, uint32_t instance, StagedBatch* staged) {
  RequestBatch& batch = staged->requests;
  BatchTimeline& timeline = staged->timeline;
  staged->executor_failed = false;  // a failure of the whole batch is not bisected: it fails every request
  std::vector<RequestResult> results;
  std::optional<StreamedResponses> responses;
  if (executor->decoupled()) responses.emplace(batch, &statistics_);
  std::vector<uint64_t> tokens;
  for (const auto& request : batch) tokens.push_back(request->token);
  const RunningRequests::Watch running(&running_, std::move(tokens));
  for (size_t i = 0; i < staged->request_inputs.size(); ++i) {
    staged->request_inputs[i].cancellation.flag = running.flag(i);
  }
  Status status;
  try {
    status = executor->execute_requests(staged->request_inputs, &results, responses ? &*responses : nullptr);
  } catch (const std::exception& e) {
    status = Status::Error(StatusCode::kInternal, std::string("batch execution failed: ") + e.what());
  }
  timeline.infer_done = timeline.output_done = Clock::now();
  staged->request_inputs.clear();
  if (status.ok() && results.size() != batch.size()) {
    status = Status::Error(StatusCode::kInternal, "the executor answered " + std::to_string(results.size()) +
                                                      " results for " + std::to_string(batch.size()) + " requests");
  }
  if (!status.ok()) {
    for (size_t i = 0; responses && i < batch.size(); ++i) responses->finish(i, true);  // each fails with it
    return status;
  }
  const size_t batch_requests = batch.size();
  RequestBatch computed;
  std::vector<std::vector<Tensor>> outputs;
  std::vector<bool> respond;
  for (size_t i = 0; i < batch.size(); ++i) {
    // Only a decoupled request may end with its final flag alone.
    const bool answered = !responses || results[i].respond || !results[i].status.ok();
    if (answered && results[i].status.ok()) {
      const Status shapes = check_answer_shapes(*batch[i], results[i].outputs);
      if (!shapes.ok()) results[i].status = shapes;
    }
    if (responses) responses->finish(i, answered);
    if (results[i].status.ok()) {
      computed.push_back(std::move(batch[i]));
      outputs.push_back(answered ? std::move(results[i].outputs) : std::vector<Tensor>{});
      respond.push_back(answered);
    } else {
      fail(std::move(batch[i]), results[i].status);
    }
  }
  batch.clear();
  if (!computed.empty()) complete_batch(&computed, &outputs, instance, timeline, batch_requests, respond);
  return Status::Ok();
}

void Scheduler::complete_batch(RequestBatch* batch, std::vector<std::vector<Tensor>>* per_request, uint32_t instance,
                               const BatchTimeline& timeline, size_t batch_requests, const std::vector<bool>& respond) {
  statistics_.record_batch(*batch, timeline);
  RequestTiming timing;
  timing.compute_start = timeline.start;
  timing.input_done = timeline.input_done;
  timing.infer_done = timeline.infer_done;
  timing.compute_end = timeline.output_done;
  timing.batch_id = next_batch_id_.fetch_add(1, std::memory_order_relaxed);
  timing.batch_requests = static_cast<uint32_t>(batch_requests);
  for (const auto& request : *batch) timing.batch_rows += request->batch_size;
  timing.instance = instance;
  for (size_t i = 0; i < batch->size(); ++i) {
    Completion completion;
    completion.token = (*batch)[i]->token;
    completion.timing = timing;
    completion.timing.enqueued = (*batch)[i]->enqueue_time;
    completion.outputs = std::move((*per_request)[i]);
    completion.respond = respond.empty() || respond[i];
    const uint64_t sequence = (*batch)[i]->sequence;
    completion.request = std::move((*batch)[i]);
    complete(std::move(completion), sequence);
  }
  batch->clear();
}

void Scheduler::isolate_failures(Executor* executor, uint32_t instance, RequestBatch requests, const Status& status) {
  const size_t batch_size = requests.size();
  const std::string labels = request_labels(requests);
  size_t budget = isolation_budget(batch_size);
  size_t executions = 0;
  std::string culprits;
  // Groups that failed as a whole, each with its own run's status; depth first.
  std::vector<std::pair<RequestBatch, Status>> failing;
  failing.emplace_back(std::move(requests), status);
  const Status unresolved = Status::Error(
      StatusCode::kInternal, "model '" + options_.model_name + "' failed a batch of " + std::to_string(batch_size) +
                                 " requests that this request was in, and the request that caused it was not found " +
                                 "within " + std::to_string(budget) + " re-runs; the server log has the reason");
  while (!failing.empty()) {
    auto [group, group_status] = std::move(failing.back());
    failing.pop_back();
    if (group.size() == 1) {  // it failed alone: its own run's message names no other request
      if (!culprits.empty()) culprits += ",";
      culprits += request_label(*group.front());
      fail(std::move(group.front()), group_status);
      continue;
    }
    if (budget < 2) {
      for (auto& request : group) fail(std::move(request), unresolved);
      continue;
    }
    budget -= 2;
    const auto middle = group.begin() + static_cast<std::ptrdiff_t>(group.size() / 2);
    RequestBatch halves[2];
    halves[0].assign(std::make_move_iterator(group.begin()), std::make_move_iterator(middle));
    halves[1].assign(std::make_move_iterator(middle), std::make_move_iterator(group.end()));
    // Pushed second half first, so that the first half is isolated first (depth first).
    std::pair<RequestBatch, Status> failed[2];
    for (int h = 0; h < 2; ++h) {
      StagedBatch staged = stage_batch(executor, &halves[h]);
      ++executions;
      Status half_status = run_batch(executor, instance, &staged);
      if (half_status.ok()) continue;
      if (!staged.executor_failed) {  // gathering failed (no memory): not the requests' doing
        for (auto& request : staged.requests) fail(std::move(request), half_status);
        continue;
      }
      failed[h] = {std::move(staged.requests), std::move(half_status)};
    }
    for (int h = 1; h >= 0; --h) {
      if (!failed[h].first.empty()) failing.push_back(std::move(failed[h]));
    }
  }
  if (core_logs(LogLevel::kWarning)) {
    LogRecord("batch failed; its requests were re-run to find the ones that cause it", LogLevel::kWarning)
        .add("model", options_.model_name)
        .add("reason", status.message)
        .add("requests", labels)
        .add("failed_alone", culprits)
        .add("extra_executions", std::to_string(executions))
        .write();
  }
}

void Scheduler::fail(std::unique_ptr<InferenceRequest> request, const Status& status) {
  statistics_.record_failures(1, ns_between(request->enqueue_time, Clock::now()));
  Completion completion;
  completion.token = request->token;
  completion.status = status;
  completion.timing.enqueued = request->enqueue_time;
  const uint64_t sequence = request->sequence;
  completion.request = std::move(request);
  complete(std::move(completion), sequence);
}

void Scheduler::deliver(Completion&& completion) {
  std::shared_ptr<CompletionSink> sink = completion.request ? completion.request->sink : nullptr;
  if (sink) {
    sink->complete(std::move(completion));
  } else {
    completions_->push(std::move(completion));
  }
}

void Scheduler::complete(Completion&& completion, uint64_t sequence) {
  if (!options_.batching.preserve_ordering) {
    deliver(std::move(completion));
    return;
  }
  // Hold answers that overtook an earlier request; release every one that is now next in line.
  // One thread at a time delivers, in sequence order, without the lock held: a sink may re-enter
  // (cancel another request of this scheduler, whose answer comes back here).
  {
    std::lock_guard<std::mutex> lock(order_mutex_);
    held_.emplace(sequence, std::move(completion));
    if (delivering_) return;  // the delivering thread takes this one too once it is next
    delivering_ = true;
  }
  while (true) {
    std::vector<Completion> ready;
    {
      std::lock_guard<std::mutex> lock(order_mutex_);
      while (!held_.empty() && held_.begin()->first == next_to_complete_) {
        ready.push_back(std::move(held_.begin()->second));
        held_.erase(held_.begin());
        ++next_to_complete_;
      }
      if (ready.empty()) {
        delivering_ = false;
        return;
      }
    }
    for (Completion& next : ready) deliver(std::move(next));
  }
}

}  // namespace inferd
