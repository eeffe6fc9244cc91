#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

using Clock = std::chrono::steady_clock;

// One inference request as the core sees it: already decoded and validated against the model by
// the caller, inputs in the model's input order. `token` is the caller's handle for the answer.
struct InferenceRequest {
  uint64_t token = 0;
  std::vector<Tensor> inputs;
  int64_t batch_size = 1;  // rows along dim 0 when the model batches, else 1
  Clock::time_point enqueue_time{};
};

// The answer to one request. `request` travels back with it so that the caller's buffers are
// released on the caller's own thread (for Python, where the GIL is already held) rather than on
// a core worker thread.
struct Completion {
  uint64_t token = 0;
  Status status;
  std::vector<Tensor> outputs;  // in the model's output order; empty on error
  std::unique_ptr<InferenceRequest> request;
};

}  // namespace inferd
