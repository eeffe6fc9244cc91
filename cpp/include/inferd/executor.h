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
};

}  // namespace inferd
