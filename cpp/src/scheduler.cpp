#include "inferd/scheduler.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "decoupled_batch.h"
#include "inferd/model_signature.h"
#include "inferd/sequence_state.h"
#include "inferd/structured_log.h"

namespace inferd {
namespace {

std::unique_ptr<RequestBatcher> batcher_for(const SchedulerOptions& options, size_t instances,
                                            const std::shared_ptr<PinnedBufferPool>& pool) {
  if (!options.sequence_batching) return std::make_unique<DynamicBatcher>(options.batching);
  SequenceOptions sequence = options.sequence;
  sequence.max_batch_size = options.batching.max_batch_size;
  sequence.instances = static_cast<uint32_t>(std::max<size_t>(instances, 1));
  if (!sequence.state_specs.empty() && sequence.states == nullptr) {
    auto memory = sequence.state_memory;
    if (memory == nullptr)
      memory = std::make_shared<SequenceStateMemory>(std::numeric_limits<uint64_t>::max(), "no bound");
    sequence.states = std::make_shared<SequenceStates>(sequence.state_specs, sequence.max_batch_size > 0,
                                                       sequence.visible_outputs, std::move(memory), pool);
  }
  // Triton ends such a sequence silently; users ask to hear of it (server#3492, #6846).
  sequence.idle_ended = [model = options.model_name, timeout = sequence.max_sequence_idle](const SequenceFlags& ended) {
    if (!core_logs(LogLevel::kWarning)) return;
    LogRecord("sequence ended: idle past max_sequence_idle_microseconds", LogLevel::kWarning)
        .add("model", model)
        .add("sequence_id", ended.shown())
        .add("max_sequence_idle_microseconds", std::to_string(timeout.count()))
        .write();
  };
  return std::make_unique<SequenceBatcher>(std::move(sequence));
}

}  // namespace

Scheduler::Scheduler(SchedulerOptions options, std::vector<std::unique_ptr<Executor>> instances,
                     std::shared_ptr<CompletionQueue> completions, std::shared_ptr<PinnedBufferPool> pool)
    : options_(std::move(options)),
      instances_(std::move(instances)),
      completions_(std::move(completions)),
      pool_(std::move(pool)),
      batcher_(batcher_for(options_, instances_.size(), pool_)),
      sequences_(options_.sequence_batching ? static_cast<SequenceBatcher*>(batcher_.get()) : nullptr),
      iterative_(options_.sequence_batching ? options_.sequence.iterative.get() : nullptr),
      cache_(options_.sequence_batching ? nullptr : options_.response_cache, &statistics_),
      decoupled_(std::make_shared<DecoupledRequests>(
          [this](std::unique_ptr<InferenceRequest> request, RequestResult&& result, const RequestTiming& timing) {
            complete_open(std::move(request), std::move(result), timing);
          },
          &statistics_)) {
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
                             "' is decoupled (model_transaction_policy { decoupled: true }): ModelInfer and HTTP "
                             "infer answer one response per request; use ModelStreamInfer (gRPC) or "
                             "generate_stream (HTTP)");
  }
  for (size_t i = 0; !request->checked && i < request->inputs.size(); ++i) {
    Status valid = validate_tensor(request->inputs[i]);
    if (!valid.ok()) {
      return Status::Error(valid.code,
                           "input " + std::to_string(i) + " of model '" + options_.model_name + "': " + valid.message);
    }
  }
  if (cache_.enabled()) {
    const Clock::time_point start = Clock::now();
    if (auto outputs = cache_.lookup(request.get(), start)) {
      return answer_from_cache(std::move(request), std::move(*outputs), start);
    }
  }
  Status status = batcher_->enqueue(std::move(request));
  if (!status.ok()) status.message = "model '" + options_.model_name + "': " + status.message;
  return status;
}

Status Scheduler::answer_from_cache(std::unique_ptr<InferenceRequest>&& request, std::vector<Tensor>&& outputs,
                                    Clock::time_point start) {
  const std::optional<uint64_t> place = batcher_->admit_answered();
  if (!place) {
    return Status::Error(StatusCode::kUnavailable, "model '" + options_.model_name + "': the model is shutting down");
  }
  request->enqueue_time = start;
  request->sequence = *place;
  complete(cache_.answer(std::move(request), std::move(outputs), start), *place);
  return Status::Ok();
}

bool Scheduler::cancel(uint64_t token) {
  auto request = batcher_->cancel(token);
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
  batcher_->close();
  if (mode == ShutdownMode::kReject || instances_.empty()) {
    const Status status = Status::Error(StatusCode::kUnavailable, "model '" + options_.model_name + "' was unloaded");
    for (auto& request : batcher_->take_all()) fail(std::move(request), status);
  }
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
  // No batch starts now; what the executors left open is answered before the scheduler goes.
  if (mode == ShutdownMode::kReject) {
    decoupled_->fail_open(Status::Error(StatusCode::kUnavailable, "model '" + options_.model_name + "' was unloaded"));
  } else {
    decoupled_->wait_until_none_open();
  }
  decoupled_->close();
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

SequenceCounts Scheduler::sequence_counts() const {
  if (sequences_ == nullptr) return {};
  return SequenceCounts{sequences_->active_sequences(), sequences_->backlog_sequences(), sequences_->idle_ended()};
}

void Scheduler::complete(Completion&& completion, uint64_t sequence) {
  // A stateful model's sequence may go on with its next request now.
  if (completion.request != nullptr) batcher_->finished(*completion.request);
  cache_.remember(completion);
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
