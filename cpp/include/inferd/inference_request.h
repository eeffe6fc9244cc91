#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "inferd/carried_state.h"
#include "inferd/executor.h"
#include "inferd/sequence_flags.h"
#include "inferd/shared_memory.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

using Clock = std::chrono::steady_clock;

// The ns from `from` to `to`; 0 when `to` is not later (a time not reached is time_point{}).
inline uint64_t ns_between(Clock::time_point from, Clock::time_point to) {
  if (to <= from) return 0;
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count());
}
struct ModelSignature;
struct Completion;
struct InferenceRequest;
class CacheKey;

// An output the client asked to be written into its shared memory instead of the answer.
struct SharedMemoryOutput {
  uint32_t output = 0;  // index into signature->outputs
  SharedMemorySlice slice;
};

// Where a request's answer goes when not to the scheduler's CompletionQueue: the gRPC transport's
// calls answer their clients from the worker thread that completes the request.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // Called once per request, on a core worker thread (or the submitting thread for a request
  // cancelled there). Must not block.
  virtual void complete(Completion&& completion) = 0;
  // One response of a decoupled model's request before its final completion (see
  // ResponseStream), on the core worker thread that executes it. Must not block. Only a stream
  // call can answer a request more than once: the default drops the response, so a decoupled
  // request whose caller's sink does not override this (or that has no sink at all: the
  // CompletionQueue) gets its final completion only.
  virtual void respond(const InferenceRequest& request, RequestResult&& response) {
    (void)request;
    (void)response;
  }
  // Whether respond() carries each response to the caller: a decoupled model's request is taken
  // only from a caller whose sink does (Scheduler::submit refuses the others). Thread-safe.
  virtual bool streams_responses() const { return false; }
};

// One inference request as the core sees it: already decoded and validated against the model by
// the caller, inputs in the model's input order. `token` is the caller's handle for the answer.
struct InferenceRequest {
  // Set by the caller.
  uint64_t token = 0;
  std::vector<Tensor> inputs;
  int64_t batch_size = 1;   // rows along dim 0 when the model batches, else 1
  uint32_t priority = 0;    // 1 = highest; 0 = the model's default level
  uint64_t timeout_us = 0;  // the request's queue timeout, when the policy lets it override; 0 = none
  Clock::time_point deadline = Clock::time_point::max();  // the caller's deadline
  bool checked = false;          // inputs already checked against their shapes (build_inference_request)
  SequenceFlags sequence_flags;  // a stateful model's request: its sequence (SequenceBatcher)

  // For a request that came as protocol bytes: what its answer is written from (null otherwise).
  std::shared_ptr<const ModelSignature> signature;
  std::string id;                           // echoed in the answer
  std::string parameters_json;              // the request's own parameters, when the signature keeps them
  std::vector<uint32_t> requested_outputs;  // indices into signature->outputs, in request order; empty = all
  std::vector<SharedMemoryOutput> shared_memory_outputs;  // of the requested outputs, those written there
  bool stream = false;                                    // answered as a ModelStreamInferResponse
  // Each streamed response says whether it is the request's last (`triton_final_response`), and a
  // decoupled request's final flag without a response is sent as an empty response: the request
  // parameter `triton_enable_empty_final_response: true` (Triton's).
  bool final_response_flag = false;
  std::shared_ptr<CompletionSink> sink;  // null: the answer goes to the scheduler's CompletionQueue

  // Set by the scheduler at enqueue.
  Clock::time_point enqueue_time{};
  Clock::time_point timeout_at = Clock::time_point::max();  // the queue policy's timeout
  uint64_t sequence = 0;                                    // enqueue order, for preserve_ordering
  std::vector<int64_t> shape_key;                           // non-batch dims of every input: requests batch when equal
  // A stateful model's implicit state, while the request carries it (SequenceStates): a START
  // request's initial state from enqueue; the sequence's state from the batch it joins until its
  // final answer, replaced by what it computed.
  CarriedState state;
  uint32_t iteration = 0;  // an iterative sequence's request: the steps it has run
  // A request of a model with response_cache that missed: its key, under which a successful
  // answer is kept (VersionCache::remember).
  std::shared_ptr<const CacheKey> cache_key;
};

struct EnsembleStepTiming;

// How one request went through the core, on the steady clock (time_point{} = did not happen).
// The batch fields say which batch it rode in: ids count up per scheduler from 1. An ensemble
// request rides no batch itself: its steps' timings say how each step's request went.
struct RequestTiming {
  Clock::time_point enqueued{}, compute_start{}, input_done{}, infer_done{}, compute_end{};
  uint64_t batch_id = 0;
  uint32_t batch_requests = 0;            // requests in the batch
  int64_t batch_rows = 0;                 // rows in the batch (sum of batch sizes)
  uint32_t instance = 0;                  // which executor instance ran it
  std::vector<EnsembleStepTiming> steps;  // an ensemble request's finished steps; empty otherwise
};

// One finished step of an ensemble request: which step, the composing model version that ran it,
// when it was handed to that version's scheduler and when its answer came back.
struct EnsembleStepTiming {
  uint32_t step = 0;  // index in the ensemble's steps
  std::string model;
  int64_t version = 0;
  Clock::time_point submitted{}, answered{};
  RequestTiming timing;  // the step request's own (its batch)
};

// The answer to one request. `request` travels back with it so that the caller's buffers are
// released on the caller's own thread (for Python, where the GIL is already held) rather than on
// a core worker thread.
struct Completion {
  uint64_t token = 0;
  Status status;
  std::vector<Tensor> outputs;  // in the model's output order; empty on error
  // False: a decoupled request ended with its final flag alone (status ok, no outputs): nothing to
  // answer, unless the caller sends the flag on its own (RequestResult::respond).
  bool respond = true;
  RequestTiming timing;
  std::unique_ptr<InferenceRequest> request;
};

}  // namespace inferd
