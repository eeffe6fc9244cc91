#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/pinned_buffer_pool.h"

namespace inferd {

// Gathers the inputs of the requests of one batch into one tensor per input, concatenated along
// dim 0 in request order, in buffers leased from `pool`. A batch of one request is passed through
// without a copy.
// Precondition: every request has the same number of inputs with equal dtypes and equal non-batch
// dims (the scheduler only batches such requests). Thread-safe (reads its arguments only).
std::vector<Tensor> gather_inputs(const std::vector<std::unique_ptr<InferenceRequest>>& batch,
                                  PinnedBufferPool* pool);

// Splits each batch output along dim 0 back to the requests, by their batch sizes, as views that
// share the batch output's owner (no copy). Fails if an output's dim 0 does not equal the sum of
// the batch sizes, or a BYTES output is malformed.
Status scatter_outputs(const std::vector<Tensor>& outputs, const std::vector<int64_t>& batch_sizes,
                       std::vector<std::vector<Tensor>>* per_request);

}  // namespace inferd
