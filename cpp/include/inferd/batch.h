#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/padding.h"
#include "inferd/pinned_buffer_pool.h"

namespace inferd {

using RequestBatch = std::vector<std::unique_ptr<InferenceRequest>>;

// Gathers the inputs of the requests of one batch into one tensor per input, concatenated along
// dim 0 in request order, in buffers leased from `pool`. Inputs that `padding` pads are padded to
// the longest of the batch in every non-batch dim. A batch of one request is passed through
// without a copy.
// Precondition: every request has the same inputs with equal dtypes and equal non-batch dims,
// except padded inputs, which have equal ranks, and absent inputs, absent in every request (the
// batcher only batches such requests). An absent input stays absent in the batch.
// Thread-safe (reads its arguments only). Throws std::bad_alloc.
std::vector<Tensor> gather_inputs(const RequestBatch& batch, PinnedBufferPool* pool, const Padding& padding);

// Splits each batch output along dim 0 back to the requests, by their batch sizes. A plain split
// gives views that share the batch output's owner (no copy); an output that `padding` slices back
// is copied out, per request, at the request's own lengths. Fails if an output's dim 0 does not
// equal the sum of the batch sizes, or a BYTES output is malformed.
Status scatter_outputs(const std::vector<Tensor>& outputs, const RequestBatch& batch, const Padding& padding,
                       PinnedBufferPool* pool, std::vector<std::vector<Tensor>>* per_request);

}  // namespace inferd
