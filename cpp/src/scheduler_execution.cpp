// One batch's way through its executor: gathering its inputs (and staging them), executing it,
// scattering the outputs per request and completing the requests.

#include <algorithm>
#include <exception>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "decoupled_batch.h"
#include "inferd/model_signature.h"
#include "inferd/scheduler.h"
#include "inferd/sequence_state.h"
#include "request_answers.h"
#include "staged_batch.h"

namespace inferd {
namespace {

// Whether `executor` takes a batch as its requests (execute_requests) rather than gathered.
bool takes_requests(const Executor& executor) { return executor.answers_each_request() || executor.decoupled(); }

}  // namespace

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

Status Scheduler::run_batch(Executor* executor, uint32_t instance, StagedBatch* staged) {
  if (staged->status.ok() && takes_requests(*executor)) return run_requests(executor, instance, staged);
  auto* batch = &staged->requests;
  BatchTimeline& timeline = staged->timeline;
  Status status = staged->status;
  std::vector<std::vector<Tensor>> per_request;
  // An iterative batch's cancels are looked at between steps: its requests are watched meanwhile.
  std::optional<RunningRequests::Watch> watch;
  if (iterative_ != nullptr) {
    std::vector<uint64_t> tokens;
    for (const auto& request : *batch) tokens.push_back(request->token);
    watch.emplace(&running_, std::move(tokens));
  }
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
  const size_t batch_requests = batch->size();
  // The watch goes before its flags are read: a cancel that comes later is remembered for the
  // request's next step (RunningRequests), none is lost in between.
  std::vector<RunningRequests::Flag> flags;
  for (size_t i = 0; watch && i < batch->size(); ++i) flags.push_back(watch->flag(i));
  watch.reset();
  std::vector<bool> cancelled;
  for (const auto& flag : flags) cancelled.push_back(flag->load(std::memory_order_acquire));
  keep_states(batch, &per_request, &cancelled);
  if (iterative_ != nullptr) {
    step_iterative(batch, &per_request, cancelled, instance, timeline, batch_requests);
  } else if (!batch->empty()) {
    complete_batch(batch, &per_request, instance, timeline, batch_requests);
  }
  return Status::Ok();
}

void Scheduler::step_iterative(RequestBatch* batch, std::vector<std::vector<Tensor>>* per_request,
                               const std::vector<bool>& cancelled, uint32_t instance, const BatchTimeline& timeline,
                               size_t batch_requests) {
  // Decided before any request goes back: from then on another worker may run, and end, it.
  std::vector<const InferenceRequest*> stepped, finished;
  std::vector<bool> ended(batch->size());
  int64_t rows = 0;
  for (size_t i = 0; i < batch->size(); ++i) {
    InferenceRequest& request = *(*batch)[i];
    ++request.iteration;
    ended[i] = cancelled[i] || iterative_->ended(request, (*per_request)[i]);
    stepped.push_back(&request);
    rows += request.batch_size;
    if (ended[i] && !cancelled[i]) finished.push_back(&request);
  }
  statistics_.record_step(stepped, finished, timeline);
  const RequestTiming timing = batch_timing(instance, timeline, batch_requests, rows);
  RequestBatch done;
  std::vector<std::vector<Tensor>> done_outputs;
  // Generations that just joined are answered first: their first token waits for no other's.
  std::vector<size_t> order(batch->size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return (*batch)[i]->iteration == 1; });
  for (const size_t i : order) {
    std::unique_ptr<InferenceRequest>& request = (*batch)[i];
    if (cancelled[i]) {
      fail(std::move(request), Status::Error(StatusCode::kCancelled, "the request was cancelled"));
      continue;
    }
    const bool streams = request->signature != nullptr && request->signature->decoupled && request->sink != nullptr;
    if (streams) {  // each step is a response; the last one comes with the final flag
      const std::optional<uint64_t> first =
          request->iteration == 1 ? std::optional<uint64_t>(ns_between(request->enqueue_time, Clock::now()))
                                  : std::nullopt;
      statistics_.record_responses(1, first);
    }
    if (ended[i]) {
      done.push_back(std::move(request));
      done_outputs.push_back(std::move((*per_request)[i]));
      continue;
    }
    if (streams) {
      RequestResult response;
      response.outputs = (*per_request)[i];
      request->sink->respond(*request, std::move(response));
    }
    iterative_->feed_back((*per_request)[i], request.get());
    if (!sequences_->reschedule(request)) {
      fail(std::move(request),
           Status::Error(StatusCode::kUnavailable, "model '" + options_.model_name + "' was unloaded"));
    }
  }
  batch->clear();
  if (!done.empty()) complete_computed(&done, &done_outputs, timing);
}

void Scheduler::keep_states(RequestBatch* batch, std::vector<std::vector<Tensor>>* per_request,
                            std::vector<bool>* cancelled) {
  const SequenceStates* states = sequences_ != nullptr ? sequences_->states() : nullptr;
  if (states == nullptr) return;
  size_t kept = 0;
  for (size_t i = 0; i < batch->size(); ++i) {
    const Status status = states->keep((*batch)[i].get(), &(*per_request)[i]);
    if (!status.ok()) {
      fail(std::move((*batch)[i]), status);  // its sequence keeps the state it was fed
      continue;
    }
    if (kept != i) {  // never a self-move: it would empty the outputs
      (*batch)[kept] = std::move((*batch)[i]);
      (*per_request)[kept] = std::move((*per_request)[i]);
      if (kept < cancelled->size()) (*cancelled)[kept] = (*cancelled)[i];
    }
    ++kept;
  }
  batch->resize(kept);
  per_request->resize(kept);
  if (cancelled->size() > kept) cancelled->resize(kept);
}

Status Scheduler::run_requests(Executor* executor, uint32_t instance, StagedBatch* staged) {
  RequestBatch& batch = staged->requests;
  BatchTimeline& timeline = staged->timeline;
  staged->executor_failed = false;  // a failure of the whole batch is not bisected: it fails every request
  std::vector<uint64_t> tokens;
  for (const auto& request : batch) tokens.push_back(request->token);
  auto running = std::make_unique<RunningRequests::Watch>(&running_, std::move(tokens));
  for (size_t i = 0; i < staged->request_inputs.size(); ++i) {
    staged->request_inputs[i].cancellation.flag = running->flag(i);
  }
  // A decoupled batch's requests may stay open past execute: the batch keeps their watch.
  std::shared_ptr<DecoupledBatch> open;
  std::optional<DecoupledBatch::Stream> responses;
  if (executor->decoupled()) {
    open = decoupled_->open(batch, std::move(running));
    responses.emplace(open);
  }
  std::vector<RequestResult> results;
  Status status;
  try {
    status = executor->execute_requests(staged->request_inputs, &results, responses ? &*responses : nullptr);
  } catch (const std::exception& e) {
    status = Status::Error(StatusCode::kInternal, std::string("batch execution failed: ") + e.what());
  }
  timeline.infer_done = timeline.output_done = Clock::now();
  std::vector<RunningRequests::Flag> cancels;  // for the requests the model rescheduled
  for (const ExecutorRequest& request : staged->request_inputs) cancels.push_back(request.cancellation.flag);
  staged->request_inputs.clear();
  if (status.ok() && results.size() != batch.size()) {
    status = Status::Error(StatusCode::kInternal, "the executor answered " + std::to_string(results.size()) +
                                                      " results for " + std::to_string(batch.size()) + " requests");
  }
  const size_t batch_requests = batch.size();
  // Only a decoupled request may end with its final flag alone.
  auto answered = [&open](const RequestResult& result) { return !open || result.respond || !result.status.ok(); };
  auto check_shapes = [&](size_t i) {
    if (answered(results[i]) && results[i].status.ok() && !results[i].reschedule) {
      const Status shapes = check_answer_shapes(*batch[i], results[i].outputs);
      if (!shapes.ok()) results[i].status = shapes;
    }
  };
  // Statistics before settle(): from there an open request may be completed, and freed, at once.
  std::vector<bool> was_pending(batch.size(), false);
  std::vector<const InferenceRequest*> executed;  // computed, or left open
  std::vector<const InferenceRequest*> finished;  // of those, the ones not rescheduled
  int64_t rows = 0;
  for (size_t i = 0; status.ok() && i < batch.size(); ++i) {
    was_pending[i] = open && results[i].pending;  // only a decoupled request may stay open
    if (!was_pending[i]) check_shapes(i);
    if (!was_pending[i] && !results[i].status.ok()) continue;
    executed.push_back(batch[i].get());
    if (was_pending[i] || !results[i].reschedule) finished.push_back(batch[i].get());
    rows += batch[i]->batch_size;
  }
  if (!executed.empty()) statistics_.record_step(executed, finished, timeline);
  const RequestTiming timing = batch_timing(instance, timeline, batch_requests, rows);
  // Pending requests without a final result yet move into `open` (their places left null).
  if (open) open->settle(status, timing, &results, &batch);
  if (!status.ok()) return status;  // each fails with it
  // As in run_batch: a request's watch goes before the cancel of one that goes on is read.
  if (running != nullptr) running.reset();
  RequestBatch computed;
  std::vector<std::vector<Tensor>> outputs;
  std::vector<bool> respond;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i] == nullptr) continue;    // open: answered later, through `open`
    if (was_pending[i]) check_shapes(i);  // its final result came while execute ran
    if (results[i].status.ok() && results[i].reschedule) {
      reschedule(std::move(batch[i]), cancels[i] != nullptr && cancels[i]->load(std::memory_order_acquire));
      continue;
    }
    if (results[i].status.ok()) {
      const bool with_response = answered(results[i]);
      computed.push_back(std::move(batch[i]));
      outputs.push_back(with_response ? std::move(results[i].outputs) : std::vector<Tensor>{});
      respond.push_back(with_response);
    } else {
      fail(std::move(batch[i]), results[i].status);
    }
  }
  batch.clear();
  if (!computed.empty()) complete_computed(&computed, &outputs, timing, respond);
  return Status::Ok();
}

void Scheduler::reschedule(std::unique_ptr<InferenceRequest> request, bool cancelled) {
  if (iterative_ == nullptr) {
    return fail(std::move(request),
                Status::Error(StatusCode::kInternal, "model '" + options_.model_name +
                                                         "' rescheduled a request (set_release_flags(RESCHEDULE)): "
                                                         "that needs sequence_batching { iterative_sequence: true }"));
  }
  if (cancelled) return fail(std::move(request), Status::Error(StatusCode::kCancelled, "the request was cancelled"));
  ++request->iteration;
  if (iterative_->ended(*request, {})) {
    return fail(std::move(request),
                Status::Error(StatusCode::kInternal, "model '" + options_.model_name + "' rescheduled a request past " +
                                                         std::to_string(request->iteration) +
                                                         " executions (inferd.iterative.max_steps)"));
  }
  if (!sequences_->reschedule(request)) {
    fail(std::move(request),
         Status::Error(StatusCode::kUnavailable, "model '" + options_.model_name + "' was unloaded"));
  }
}

void Scheduler::complete_batch(RequestBatch* batch, std::vector<std::vector<Tensor>>* per_request, uint32_t instance,
                               const BatchTimeline& timeline, size_t batch_requests) {
  statistics_.record_batch(*batch, timeline);
  int64_t rows = 0;
  for (const auto& request : *batch) rows += request->batch_size;
  complete_computed(batch, per_request, batch_timing(instance, timeline, batch_requests, rows));
}

RequestTiming Scheduler::batch_timing(uint32_t instance, const BatchTimeline& timeline, size_t batch_requests,
                                      int64_t rows) {
  RequestTiming timing;
  timing.compute_start = timeline.start;
  timing.input_done = timeline.input_done;
  timing.infer_done = timeline.infer_done;
  timing.compute_end = timeline.output_done;
  timing.batch_id = next_batch_id_.fetch_add(1, std::memory_order_relaxed);
  timing.batch_requests = static_cast<uint32_t>(batch_requests);
  timing.batch_rows = rows;
  timing.instance = instance;
  return timing;
}

void Scheduler::complete_computed(RequestBatch* batch, std::vector<std::vector<Tensor>>* per_request,
                                  const RequestTiming& timing, const std::vector<bool>& respond) {
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

void Scheduler::complete_open(std::unique_ptr<InferenceRequest> request, RequestResult&& result,
                              const RequestTiming& timing) {
  if (result.status.ok() && result.respond) result.status = check_answer_shapes(*request, result.outputs);
  if (!result.status.ok()) {
    fail(std::move(request), result.status);
    return;
  }
  Completion completion;
  completion.token = request->token;
  completion.timing = timing;
  completion.timing.enqueued = request->enqueue_time;
  completion.outputs = std::move(result.outputs);
  completion.respond = result.respond;
  const uint64_t sequence = request->sequence;
  completion.request = std::move(request);
  complete(std::move(completion), sequence);
}

}  // namespace inferd
