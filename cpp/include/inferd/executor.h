#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "inferd/sequence_flags.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// Runs one model instance on one batch. Implemented in the core (OnnxRuntimeExecutor: ONNX models
// on the CPU, no GIL) and by the binding (executors written in Python: ONNX Runtime on a GPU,
// TensorRT, test executors). One executor serves one worker thread at a time, so implementations need
// not be thread-safe, except that a pipelined executor's stage() runs on a second thread,
// concurrently with execute().
// One request's answer from an executor that answers each request of a batch on its own.
struct RequestResult {
  Status status;
  std::vector<Tensor> outputs;  // in model output order, with the request's own batch dim, when ok
  // A decoupled request's final result: false when it ends with its final flag alone (no response
  // with it; status ok, outputs empty). Always true for a request that is not decoupled.
  bool respond = true;
  // A decoupled request that goes on after execute_requests returns (Triton's python backend: a
  // model's execute may return before it has sent a request's responses, and the instance takes
  // its next batch meanwhile): its later responses and its final result come through the batch's
  // LaterResponses (ResponseStream::later). `status`, `outputs` and `respond` are then ignored.
  bool pending = false;
  // An iterative model's request that the model gives back for another step (Triton's python
  // backend: request.set_release_flags(RESCHEDULE), and no response for it): the scheduler queues
  // it again, unanswered. `status` ok, `outputs` empty.
  bool reschedule = false;
};

// Whether a running request's client is gone: its cancellation (a flag the scheduler sets) or its
// deadline passing (the core answers DEADLINE_EXCEEDED then). Cheap to copy and to ask, from any
// thread, for as long as a copy is kept.
struct RequestCancellation {
  std::shared_ptr<const std::atomic<bool>> flag;  // null when the scheduler does not track the request
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();

  bool requested() const {
    return (flag != nullptr && flag->load(std::memory_order_acquire)) || std::chrono::steady_clock::now() >= deadline;
  }
};

// One request of a batch as an executor answering each request (Executor::execute_requests) takes
// it. The views stay valid while execute_requests runs (and no longer: a request left pending is
// answered without them).
struct ExecutorRequest {
  std::vector<Tensor> inputs;                       // model input order, with the request's own batch dim
  std::string_view id;                              // the client's request id ("" when it gave none)
  std::vector<std::string_view> requested_outputs;  // the outputs the client asked for, by name; empty: all
  std::string_view parameters;                      // its own parameters as JSON, for a model that keeps them
  const SequenceFlags* sequence = nullptr;          // a stateful model's request: its sequence
  // Requested while it runs: the executor may stop early; whatever it answers is dropped.
  RequestCancellation cancellation;
};

// How a decoupled batch's requests are answered from any thread, during execute_requests() and
// after it returned, until each has its final result: the requests it left pending
// (RequestResult::pending) are answered only this way. Thread-safe. Calls for a request that has
// ended (its final result given, or the whole batch failed) change nothing and return false.
// Never blocks beyond handing the answer to its request's sink, so a caller must not hold a lock
// a sink may take (the binding releases the GIL around each call).
class LaterResponses {
 public:
  virtual ~LaterResponses() = default;
  // One more response, not the last, to request `index`: ok with its outputs in model output
  // order, or an error response; the request goes on after either.
  virtual bool respond(size_t index, RequestResult&& response) = 0;
  // Request `index`'s final result (RequestResult::respond false: the final flag alone); it ends.
  virtual bool finish(size_t index, RequestResult&& result) = 0;
};

// Where a decoupled executor (Executor::decoupled) sends the responses of a batch's requests that
// come before each request's final result. Given by the scheduler to execute_requests().
class ResponseStream {
 public:
  virtual ~ResponseStream() = default;
  // One more response, not the last, to request `index` of the batch being executed: ok with its
  // outputs in model output order, or an error response; the request goes on after either. Called
  // on the executor's thread during execute_requests(); never blocks.
  virtual void respond(size_t index, RequestResult&& response) = 0;
  // The batch's LaterResponses, for answering from other threads and after execute_requests
  // returns. The executor keeps a copy while one of the batch's requests is open; when the last
  // copy goes, requests still open fail (INTERNAL), so none is left without an answer.
  virtual std::shared_ptr<LaterResponses> later() = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;

  // Pipelined executors (on a GPU) take a batch in two steps, so that the copies of batch N+1 to
  // the device overlap the computation of batch N (double buffering): stage() queues the copies of
  // the inputs and returns without waiting for them; execute() later computes that batch, with the
  // same inputs. The scheduler calls execute() for staged batches in staging order, at most one
  // batch ahead. A failed stage() is not followed by execute() for that batch.
  virtual bool pipelined() const { return false; }
  virtual Status stage(const std::vector<Tensor>& inputs) {
    (void)inputs;
    return Status::Ok();
  }

  // Computes every model output for `inputs` (model input order, batch along dim 0 when the model
  // batches). On success fills `outputs` in model output order; the tensors' owners keep their
  // memory alive. On failure returns the error and `outputs` is ignored. May block for the
  // duration of the computation; must not throw.
  virtual Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) = 0;

  // An executor whose model answers each request of a batch on its own (Triton's python backend:
  // execute(requests) returns one response per request, any of which may be an error) takes the
  // batch as its requests, not gathered: the scheduler calls execute_requests() instead of
  // execute() and answers each request with its own result (no padding, no bisection: a failed
  // request fails alone by construction).
  virtual bool answers_each_request() const { return false; }
  // A decoupled model (model_transaction_policy { decoupled: true }, Triton's) answers each request
  // with any number of responses, then its final result. A decoupled executor answers each request
  // (the scheduler calls execute_requests() whatever answers_each_request() says).
  virtual bool decoupled() const { return false; }
  // `requests`: each request's inputs in model input order, with its own batch dim, its id and the
  // outputs it asked for. Returns a
  // failure of the whole batch (every request fails with it), or ok with `results` holding one
  // result per request, in order: its final result. `responses` is non-null exactly when
  // decoupled(): the responses before each request's final result go there, while this runs. May
  // block for the computation; must not throw.
  virtual Status execute_requests(const std::vector<ExecutorRequest>& requests, std::vector<RequestResult>* results,
                                  ResponseStream* responses) {
    (void)requests;
    (void)results;
    (void)responses;
    return Status::Error(StatusCode::kUnimplemented, "this executor takes gathered batches");
  }
};

}  // namespace inferd
