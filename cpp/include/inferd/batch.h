#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/padding.h"
#include "inferd/pinned_buffer_pool.h"

namespace inferd {

using RequestBatch = std::vector<std::unique_ptr<InferenceRequest>>;

// Thrown by gather_inputs when a request's input in a client's shared memory cannot be read (the
// client shrank its object): that request fails alone, the others are gathered again without it.
struct ClientMemoryFault : std::runtime_error {
  ClientMemoryFault(size_t request_index, const std::string& message)
      : std::runtime_error(message), request(request_index) {}
  size_t request;  // index in the batch
};

// Gathers the inputs of the requests of one batch into one tensor per input, concatenated along
// dim 0 in request order, in buffers leased from `pool`. Inputs that `padding` pads are padded to
// the longest of the batch in every non-batch dim. A batch of one request is passed through
// without a copy, except inputs in client memory (Tensor::client_memory), which are always read
// through copy_from_slice into a leased buffer: the executor never sees the client's pages.
// Precondition: every request has the same inputs with equal dtypes and equal non-batch dims,
// except padded inputs, which have equal ranks, and absent inputs, absent in every request (the
// batcher only batches such requests). An absent input stays absent in the batch.
// Thread-safe (reads its arguments only). Throws std::bad_alloc, and ClientMemoryFault.
std::vector<Tensor> gather_inputs(const RequestBatch& batch, PinnedBufferPool* pool, const Padding& padding);

// Splits each batch output along dim 0 back to the requests, by their batch sizes. A plain split
// gives views that share the batch output's owner (no copy); an output that `padding` slices back
// is copied out, per request, at the request's own lengths. Fails if an output's dim 0 does not
// equal the sum of the batch sizes, or a BYTES output is malformed.
Status scatter_outputs(const std::vector<Tensor>& outputs, const RequestBatch& batch, const Padding& padding,
                       PinnedBufferPool* pool, std::vector<std::vector<Tensor>>* per_request);

}  // namespace inferd
