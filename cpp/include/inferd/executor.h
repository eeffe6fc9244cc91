#pragma once

#include <vector>

#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// Runs one model instance on one batch. Implemented by the binding (executors written in Python:
// ONNX Runtime) and, later, by native executors. One executor serves one worker thread at a time,
// so implementations need not be thread-safe.
class Executor {
 public:
  virtual ~Executor() = default;

  // Computes every model output for `inputs` (model input order, batch along dim 0 when the model
  // batches). On success fills `outputs` in model output order; the tensors' owners keep their
  // memory alive. On failure returns the error and `outputs` is ignored. May block for the
  // duration of the computation; must not throw.
  virtual Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) = 0;
};

}  // namespace inferd
