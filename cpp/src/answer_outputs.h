#pragma once

// Which outputs an answer carries and how, whatever protocol writes it (InferResponseWriter for
// gRPC, encode_http_infer_response for HTTP): private to cpp/src.

#include <cstdint>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/model_signature.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// One output of an answer: its signature, the computed tensor (read through data and byte_size:
// it may view a batch buffer), the shape the protocol shows, and the client's shared-memory slice
// it was written into (null: its bytes travel in the answer).
struct AnswerOutput {
  const OutputSignature* spec = nullptr;
  const Tensor* tensor = nullptr;
  std::vector<int64_t> shape;
  const SharedMemoryOutput* shared_memory = nullptr;
};

// The outputs `request`'s answer carries, into `out`: those it asked for, once each, in its order
// (every model output, in model order, when it asked for none); each in the protocol's dims where
// the config reshapes it; those asked for in shared memory copied into their slices here. `outputs`
// are every model output, in model order; `out` views them and `request`, which must outlive it.
// Returns the first failure: INTERNAL for fewer outputs than the signature lists (that output is
// left out) or an element count that does not fit the reshaped dims; INVALID_ARGUMENT for a slice
// too small for its output or one that could not be written (no slice is written after a
// failure). The other outputs are still listed: the answer is not to be sent then. Not
// thread-safe for one request (writes its slices); never blocks.
Status answer_outputs(const InferenceRequest& request, const std::vector<Tensor>& outputs,
                      std::vector<AnswerOutput>* out);

}  // namespace inferd
