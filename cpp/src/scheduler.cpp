#include "inferd/scheduler.h"

#include <exception>
#include <utility>

#include "inferd/batch.h"

namespace inferd {
namespace {

uint64_t ns_since(Clock::time_point t, Clock::time_point now) {
  return now > t ? static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - t).count()) : 0;
}

}  // namespace

Scheduler::Scheduler(SchedulerOptions options, std::vector<std::unique_ptr<Executor>> instances,
                     std::shared_ptr<CompletionQueue> completions)
    : options_(std::move(options)), instances_(std::move(instances)), completions_(std::move(completions)) {
  workers_.reserve(instances_.size());
  for (auto& instance : instances_) {
    workers_.emplace_back([this, executor = instance.get()] { run_instance(executor); });
  }
}

Scheduler::~Scheduler() { shutdown(ShutdownMode::kDrain); }

Status Scheduler::submit(std::unique_ptr<InferenceRequest>&& request) {
  for (size_t i = 0; i < request->inputs.size(); ++i) {
    Status valid = validate_tensor(request->inputs[i]);
    if (!valid.ok()) {
      return Status::Error(valid.code, "input " + std::to_string(i) + " of model '" + options_.model_name +
                                           "': " + valid.message);
    }
  }
  request->enqueue_time = Clock::now();
  if (!queue_.push(std::move(request))) {
    return Status::Error(StatusCode::kUnavailable, "model '" + options_.model_name + "' is shutting down");
  }
  return Status::Ok();
}

void Scheduler::shutdown(ShutdownMode mode) {
  std::lock_guard<std::mutex> lock(shutdown_mutex_);
  if (mode == ShutdownMode::kReject) reject_queued_.store(true);
  queue_.close();
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
  // No worker left (for example zero instances): answer whatever is still queued.
  auto left = queue_.drain();
  if (!left.empty()) {
    fail_batch(&left, Status::Error(StatusCode::kUnavailable, "model '" + options_.model_name + "' was unloaded"));
  }
}

void Scheduler::run_instance(Executor* executor) {
  // pop_wait returns empty only once the queue is closed and drained, so nothing accepted is left.
  while (auto request = queue_.pop_wait()) {
    std::vector<std::unique_ptr<InferenceRequest>> batch;
    batch.push_back(std::move(*request));
    if (reject_queued_.load()) {
      fail_batch(&batch, Status::Error(StatusCode::kUnavailable,
                                       "model '" + options_.model_name + "' is shutting down"));
      continue;
    }
    execute_batch(executor, &batch);
  }
}

void Scheduler::execute_batch(Executor* executor, std::vector<std::unique_ptr<InferenceRequest>>* batch) {
  BatchTimeline timeline;
  timeline.start = Clock::now();
  Status status;
  std::vector<std::vector<Tensor>> per_request;
  try {
    std::vector<Tensor> inputs = gather_inputs(*batch);
    timeline.input_done = Clock::now();
    std::vector<Tensor> outputs;
    status = executor->execute(inputs, &outputs);
    timeline.infer_done = Clock::now();
    if (status.ok()) {
      std::vector<int64_t> batch_sizes;
      batch_sizes.reserve(batch->size());
      for (const auto& request : *batch) batch_sizes.push_back(request->batch_size);
      status = scatter_outputs(outputs, batch_sizes, &per_request);
    }
    timeline.output_done = Clock::now();
  } catch (const std::exception& e) {
    status = Status::Error(StatusCode::kInternal, std::string("batch execution failed: ") + e.what());
  }
  if (!status.ok()) {
    fail_batch(batch, status);
    return;
  }
  statistics_.record_batch(*batch, timeline);
  for (size_t i = 0; i < batch->size(); ++i) {
    Completion completion;
    completion.token = (*batch)[i]->token;
    completion.outputs = std::move(per_request[i]);
    completion.request = std::move((*batch)[i]);
    completions_->push(std::move(completion));
  }
}

void Scheduler::fail_batch(std::vector<std::unique_ptr<InferenceRequest>>* batch, const Status& status) {
  const auto now = Clock::now();
  uint64_t total_ns = 0;
  for (auto& request : *batch) {
    total_ns += ns_since(request->enqueue_time, now);
    Completion completion;
    completion.token = request->token;
    completion.status = status;
    completion.request = std::move(request);
    completions_->push(std::move(completion));
  }
  statistics_.record_failures(batch->size(), total_ns);
}

}  // namespace inferd
