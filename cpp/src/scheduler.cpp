#include "inferd/scheduler.h"

#include <pthread.h>

#include <condition_variable>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "inferd/batch.h"

namespace inferd {
namespace {

uint64_t ns_since(Clock::time_point t, Clock::time_point now) {
  return now > t ? static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - t).count()) : 0;
}

}  // namespace

// A batch taken from the batcher with its inputs gathered (and, for a pipelined executor, staged).
struct Scheduler::StagedBatch {
  std::vector<std::unique_ptr<InferenceRequest>> requests;
  std::vector<Tensor> inputs;
  BatchTimeline timeline;
  Status status;  // not ok: gathering or staging failed; the requests are failed with it
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

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<StagedBatch> batch_;  // guarded by mutex_
  bool finished_ = false;             // guarded by mutex_
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
  if (!request) return false;
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
    execute_batch(executor, instance, &staged);
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
    while (take_batch(&batch)) slot.put(stage_batch(executor, &batch));
    slot.finish();
  });
  StagedBatch staged;
  while (slot.take(&staged)) execute_batch(executor, instance, &staged);
  stager.join();
}

Scheduler::StagedBatch Scheduler::stage_batch(Executor* executor,
                                              std::vector<std::unique_ptr<InferenceRequest>>* batch) {
  StagedBatch staged;
  staged.requests = std::move(*batch);
  staged.timeline.start = Clock::now();
  try {
    staged.inputs = gather_inputs(staged.requests, pool_.get(), options_.batching.padding);
    if (executor->pipelined()) staged.status = executor->stage(staged.inputs);
  } catch (const std::exception& e) {
    staged.status = Status::Error(StatusCode::kInternal, std::string("batch assembly failed: ") + e.what());
  }
  staged.timeline.input_done = Clock::now();
  return staged;
}

void Scheduler::execute_batch(Executor* executor, uint32_t instance, StagedBatch* staged) {
  auto* batch = &staged->requests;
  BatchTimeline& timeline = staged->timeline;
  Status status = staged->status;
  std::vector<std::vector<Tensor>> per_request;
  if (status.ok()) {
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
  }
  staged->inputs.clear();  // the batch buffers go back to the pool before the answers go out
  if (!status.ok()) {
    for (auto& request : *batch) fail(std::move(request), status);
    batch->clear();
    return;
  }
  statistics_.record_batch(*batch, timeline);
  RequestTiming timing;
  timing.compute_start = timeline.start;
  timing.input_done = timeline.input_done;
  timing.infer_done = timeline.infer_done;
  timing.compute_end = timeline.output_done;
  timing.batch_id = next_batch_id_.fetch_add(1, std::memory_order_relaxed);
  timing.batch_requests = static_cast<uint32_t>(batch->size());
  for (const auto& request : *batch) timing.batch_rows += request->batch_size;
  timing.instance = instance;
  for (size_t i = 0; i < batch->size(); ++i) {
    Completion completion;
    completion.token = (*batch)[i]->token;
    completion.timing = timing;
    completion.timing.enqueued = (*batch)[i]->enqueue_time;
    completion.outputs = std::move(per_request[i]);
    const uint64_t sequence = (*batch)[i]->sequence;
    completion.request = std::move((*batch)[i]);
    complete(std::move(completion), sequence);
  }
}

void Scheduler::fail(std::unique_ptr<InferenceRequest> request, const Status& status) {
  statistics_.record_failures(1, ns_since(request->enqueue_time, Clock::now()));
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
  std::lock_guard<std::mutex> lock(order_mutex_);
  held_.emplace(sequence, std::move(completion));
  while (!held_.empty() && held_.begin()->first == next_to_complete_) {
    deliver(std::move(held_.begin()->second));
    held_.erase(held_.begin());
    ++next_to_complete_;
  }
}

}  // namespace inferd
