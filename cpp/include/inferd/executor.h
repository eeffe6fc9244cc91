#pragma once

#include <vector>

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
  // `requests`: each request's inputs in model input order, with its own batch dim. Returns a
  // failure of the whole batch (every request fails with it), or ok with `results` holding one
  // result per request, in order. May block for the computation; must not throw.
  virtual Status execute_requests(const std::vector<std::vector<Tensor>>& requests,
                                  std::vector<RequestResult>* results) {
    (void)requests;
    (void)results;
    return Status::Error(StatusCode::kUnimplemented, "this executor takes gathered batches");
  }
};

}  // namespace inferd
