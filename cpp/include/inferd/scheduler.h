#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "inferd/batch.h"
#include "inferd/completion_queue.h"
#include "inferd/dynamic_batcher.h"
#include "inferd/executor.h"
#include "inferd/inference_request.h"
#include "inferd/model_statistics.h"
#include "inferd/pinned_buffer_pool.h"
#include "inferd/request_batcher.h"
#include "inferd/request_scheduler.h"
#include "inferd/response_cache.h"
#include "inferd/running_requests.h"
#include "inferd/sequence_batcher.h"

namespace inferd {

class DecoupledRequests;

struct SchedulerOptions {
  std::string model_name;  // used in messages only
  BatcherOptions batching;
  // A stateful model (sequence_batching): its requests are queued by a SequenceBatcher with
  // `sequence`, and `batching` gives only max_batch_size and preserve_ordering.
  bool sequence_batching = false;
  SequenceOptions sequence;
  // The server's response cache, for a model with `response_cache { enable: true }` (null: none).
  // Never used by a stateful or decoupled model: their answers depend on more than the request.
  std::shared_ptr<ResponseCache> response_cache;
};

// A stateful model's sequences now: active (holding a place), in the backlog, and ended for
// being idle since the scheduler started.
struct SequenceCounts {
  size_t active = 0;
  size_t backlog = 0;
  uint64_t idle_ended = 0;
};

// Runs one model version: its batcher (a DynamicBatcher, or a SequenceBatcher for a stateful
// model, whose sequences ended for being idle are logged here) and one worker thread per executor
// instance. Each
// worker, when free, takes the next batch from the batcher, gathers its inputs into a buffer from
// the pinned pool, runs its executor, scatters the outputs back per request and completes them.
// With several instances, one assembles its batch while another computes. An expiry thread
// answers requests whose deadline or queue timeout passes while every worker is busy. A pipelined executor
// (Executor::pipelined) also gets a stager thread, which takes, gathers and stages batch N+1
// while the worker computes batch N; the two meet in a one-batch handoff.
//
// An executor that answers each request on its own (Executor::answers_each_request) gets the
// batch's requests instead of a gathered batch; each request is answered with its own result.
// A decoupled executor (Executor::decoupled) does too, and also gets a ResponseStream for the
// responses before each request's final result: they go to the request's sink as they come
// (CompletionSink::respond; not held back by preserve_ordering), and the model's statistics count
// them (responses, first_response). The final result completes the request as usual, with
// Completion::respond false when it is the final flag alone. A decoupled executor may also
// return before a request's final result (RequestResult::pending, as Triton's python backend lets
// execute return while a model's own thread sends): the worker takes the next batch at once, and
// the request stays open until its final result comes through the batch's LaterResponses, from
// any thread; a cancel still reaches it. Such a request is counted with its batch's statistics
// when execute returns; should it end in an error later, it is counted a failure too. A shutdown
// that drains waits for every open request; one that rejects fails them UNAVAILABLE.
//
// A batch of several requests that the executor fails is not failed as a whole: one request's
// input must not fail the others, nor reach them in a message. The worker runs it again in halves
// (bisection) until each failing request has failed alone, with its own run's message; the others
// get their results. Bound: at most min(2n-2, 4*ceil(log2 n)) extra executions for a batch of n
// requests (one culprit takes 2*ceil(log2 n)); requests still in a failing group when the bound
// is reached get a generic INTERNAL that names no other request. The batch's own message is
// logged with the request ids. A pipelined instance pauses its stager and executes what was
// already staged first, so that staging order still matches execution order.
//
// Invariants: every request accepted by submit() gets exactly one completion - computed, failed,
// expired, cancelled or rejected at shutdown (an open decoupled request before shutdown returns);
// each executor is used by one worker thread only; workers are joined before the scheduler is
// destroyed; with preserve_ordering, completions leave in enqueue order; an isolated batch costs
// at most the bound above in extra executions.
class Scheduler final : public RequestScheduler {
 public:
  enum class ShutdownMode {
    kDrain,   // queued requests are still computed
    kReject,  // queued requests are answered UNAVAILABLE without being computed
  };

  // Starts one worker per instance. `completions` and `pool` are shared with other schedulers.
  Scheduler(SchedulerOptions options, std::vector<std::unique_ptr<Executor>> instances,
            std::shared_ptr<CompletionQueue> completions, std::shared_ptr<PinnedBufferPool> pool);
  // Shuts down with kDrain if shutdown() was not called. Blocks until the workers exit.
  ~Scheduler() override;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Checks that each input's bytes match its shape (INVALID_ARGUMENT if not) and queues `request`
  // (see DynamicBatcher::enqueue for the other refusals). With a response cache, a request whose
  // answer is kept there is answered on this thread instead, in its place when ordering is kept.
  // Thread-safe; never blocks beyond the batcher's lock. On success the scheduler owns the
  // request; on failure it stays with the caller.
  Status submit(std::unique_ptr<InferenceRequest>&& request) override;

  // Answers the request with `token` CANCELLED if it is still queued; returns whether it was.
  // A request already in a batch runs to the end; an executor that answers each request is told
  // (ExecutorRequest::cancellation) and may end it early. Thread-safe, non-blocking.
  bool cancel(uint64_t token) override;

  // Closes intake, answers or computes what is queued (per `mode`) and joins the workers.
  // Thread-safe and idempotent; blocks until every worker has exited.
  void shutdown(ShutdownMode mode);

  // Thread-safe, non-blocking snapshots.
  StatisticsSnapshot statistics() const { return statistics_.snapshot(); }
  size_t pending_requests() const { return batcher_->size(); }
  SequenceCounts sequence_counts() const;
  const BatcherOptions& batcher_options() const { return options_.batching; }

 private:
  // Defined in cpp/src: scheduler.cpp (the public face, completing in order), scheduler_workers.cpp
  // (the threads), scheduler_execution.cpp (one batch through its executor), scheduler_isolation.cpp
  // (re-running a failed batch); StagedBatch and StagedBatchSlot in staged_batch.h.
  struct StagedBatch;
  class StagedBatchSlot;
  // The next non-empty batch (rejections answered on the way); false once the batcher has ended.
  bool take_batch(uint32_t instance, std::vector<std::unique_ptr<InferenceRequest>>* batch);
  void run_instance(Executor* executor, uint32_t instance);
  void run_pipelined_instance(Executor* executor, uint32_t instance);
  // Answers requests whose deadline or queue timeout passes while every worker is busy.
  void run_expiry_watch();
  StagedBatch stage_batch(Executor* executor, std::vector<std::unique_ptr<InferenceRequest>>* batch);
  // Computes a staged batch and completes its requests; a failed batch of several requests goes
  // to isolate_failures. `slot`: the pipelined instance's handoff, null for a plain instance.
  void execute_batch(Executor* executor, uint32_t instance, StagedBatch* staged, StagedBatchSlot* slot);
  // Executes a staged batch and splits its outputs per request; on success completes the
  // requests. On failure returns the status and leaves the requests in `staged`.
  Status run_batch(Executor* executor, uint32_t instance, StagedBatch* staged);
  // run_batch for an executor that answers each request: each request completed or failed alone.
  Status run_requests(Executor* executor, uint32_t instance, StagedBatch* staged);
  // A stateful model's computed batch: each request's next state kept from its outputs
  // (SequenceStates::keep), and the outputs cut to the client's; a request whose state cannot be
  // kept fails alone and leaves `batch` (with its outputs).
  // `cancelled` (iterative: per request, whether it was cancelled during the step; else empty) is
  // kept beside the requests that stay.
  void keep_states(RequestBatch* batch, std::vector<std::vector<Tensor>>* per_request, std::vector<bool>* cancelled);
  // An iterative model's computed step: each request that ended (its end output, max_steps) is
  // completed with the step's outputs; one cancelled meanwhile fails CANCELLED; every other one
  // streams the step's outputs as a response (a decoupled model's), is fed them back and goes
  // back to the batcher for its next step.
  void step_iterative(RequestBatch* batch, std::vector<std::vector<Tensor>>* per_request,
                      const std::vector<bool>& cancelled, uint32_t instance, const BatchTimeline& timeline,
                      size_t batch_requests);
  // A request its model gave back for another step (RequestResult::reschedule): queued again for
  // an iterative model, unless it was cancelled meanwhile or ran max_steps; failed otherwise.
  void reschedule(std::unique_ptr<InferenceRequest> request, bool cancelled);
  // Records a computed batch and completes its requests with their outputs (per_request[i] for
  // the i-th); `batch_requests`: how many requests the executed batch held.
  void complete_batch(RequestBatch* batch, std::vector<std::vector<Tensor>>* per_request, uint32_t instance,
                      const BatchTimeline& timeline, size_t batch_requests);
  // The timing every request of an executed batch is answered with; `rows`: the batch's rows.
  RequestTiming batch_timing(uint32_t instance, const BatchTimeline& timeline, size_t batch_requests, int64_t rows);
  // Completes computed requests with their outputs; `respond`: per request Completion::respond
  // (empty: all true).
  void complete_computed(RequestBatch* batch, std::vector<std::vector<Tensor>>* per_request,
                         const RequestTiming& timing, const std::vector<bool>& respond = {});
  // An open decoupled request's final result (DecoupledRequests' Complete), from any thread.
  void complete_open(std::unique_ptr<InferenceRequest> request, RequestResult&& result, const RequestTiming& timing);
  // Re-runs a failed batch in halves so that only the requests that fail alone fail (see above).
  // Precondition: nothing is staged on `executor` ahead of what this stages.
  void isolate_failures(Executor* executor, uint32_t instance, RequestBatch requests, const Status& status);
  void fail(std::unique_ptr<InferenceRequest> request, const Status& status);
  // Answers `request` with its cached `outputs`, looked up at `start`; refused once closed.
  Status answer_from_cache(std::unique_ptr<InferenceRequest>&& request, std::vector<Tensor>&& outputs,
                           Clock::time_point start);
  void complete(Completion&& completion, uint64_t sequence);
  // To the request's own sink if it has one, else to the completion queue.
  void deliver(Completion&& completion);

  const SchedulerOptions options_;
  std::vector<std::unique_ptr<Executor>> instances_;
  std::shared_ptr<CompletionQueue> completions_;
  std::shared_ptr<PinnedBufferPool> pool_;
  const std::unique_ptr<RequestBatcher> batcher_;
  SequenceBatcher* const sequences_;       // batcher_, for a stateful model; else null
  const IterativeSteps* const iterative_;  // an iterative model's steps; else null
  ModelStatistics statistics_;
  VersionCache cache_;       // after statistics_, which it records in
  RunningRequests running_;  // the requests of batches executors answer request by request
  // Decoupled batches with a request still open after their execute returned.
  std::shared_ptr<DecoupledRequests> decoupled_;
  std::atomic<uint64_t> next_batch_id_{1};

  std::mutex order_mutex_;               // with preserve_ordering only
  uint64_t next_to_complete_ = 0;        // guarded by order_mutex_
  std::map<uint64_t, Completion> held_;  // guarded by order_mutex_: done, waiting for earlier ones
  // Guarded by order_mutex_: a thread is delivering released answers (outside the lock, since a
  // sink may call back into this scheduler: an ensemble cancelling its other steps); others
  // only add theirs to `held_` and leave them to it.
  bool delivering_ = false;

  std::mutex shutdown_mutex_;         // serializes shutdown() callers
  std::vector<std::thread> workers_;  // guarded by shutdown_mutex_ after construction; + the expiry thread
};

}  // namespace inferd
