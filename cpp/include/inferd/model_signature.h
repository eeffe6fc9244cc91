#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "inferd/datatype_names.h"  // the names the checks' messages use; callers use them too
#include "inferd/infer_request_parser.h"
#include "inferd/inference_request.h"
#include "inferd/shared_memory.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// An input as the protocol shows it (`dims`, without the batch dim) and as the model takes it
// (`reshape`, when the config has one).
struct InputSignature {
  std::string name;
  DataType dtype = DataType::kFp32;
  std::vector<int64_t> dims;  // -1 = any
  bool has_reshape = false;
  std::vector<int64_t> reshape;
  bool optional = false;  // a request may leave it out
  bool utf8 = false;      // BYTES elements must be UTF-8 text (ONNX strings)
  // A stateful model's control input (sequence_batching.control_input) or implicit state
  // (sequence_batching.state): the core writes it into each request (SequenceBatcher); a client
  // that gives it is refused, as for any unknown input.
  bool core_written = false;
};

struct OutputSignature {
  std::string name;
  DataType dtype = DataType::kFp32;
  std::vector<int64_t> dims;  // the protocol's dims; used when the model's shape is reshaped
  bool has_reshape = false;
};

// What a model version accepts and answers, for checking requests and writing answers in the core.
// Immutable once built; shared by the requests that are checked against it.
struct ModelSignature {
  std::string name;
  std::string version;
  int64_t max_batch_size = 0;  // 0: the model does not batch
  std::vector<InputSignature> inputs;
  std::vector<OutputSignature> outputs;
  // model_transaction_policy { decoupled: true }: any number of responses per request, served on
  // ModelStreamInfer only.
  bool decoupled = false;
  // Requests keep their own parameters as JSON (InferenceRequest::parameters_json): Triton's python
  // backend hands them to model code as request.parameters().
  bool keeps_parameters = false;
  // sequence_batching: requests belong to sequences (the sequence_id, sequence_start and
  // sequence_end parameters), queued by a SequenceBatcher.
  bool sequence_batching = false;
};

// Checks `parsed` against `signature` and fills `out` (an empty request) with the model's inputs
// in model order, views of the request's bytes where the wire gave them raw, decoded into buffers
// of the request's own where it gave typed contents; `owner` keeps the bytes alive and becomes each
// raw tensor's owner. Every check of a request happens here, once: names, datatypes, shapes,
// element and byte counts, BYTES length prefixes (walked once), batch size, optional inputs,
// requested outputs and the reserved parameters `priority` and `timeout`. Buffers are sized only
// after their element counts were checked against the bytes received. On failure `out` must be
// dropped. Thread-safe (reads only); never blocks. INVALID_ARGUMENT or UNIMPLEMENTED, with a
// message naming the tensor.
//
// Tensors may name slices of `shared_memory`'s regions instead (Triton's shared-memory
// parameters): a fixed-size input becomes a view of its slice marked client_memory (read at
// gather through copy_from_slice), a BYTES input is copied out once here and checked on the copy,
// and an output becomes a SharedMemoryOutput the answer is written into. raw_input_contents then
// holds only the other inputs. A null `shared_memory` refuses such tensors with PERMISSION_DENIED
// (this call's listener may not use it).
//
// Its steps, in order: what the protocol alone says (shared-memory parameters, datatype names,
// raw_input_contents' count), the inputs, the requested outputs, then the request's parameters
// (request_parameters.h). Typed contents are decoded by typed_contents.h, shared-memory
// parameters read by shared_memory_params.h.
Status build_inference_request(const std::shared_ptr<const ModelSignature>& signature, const ParsedInferRequest& parsed,
                               const std::shared_ptr<const void>& owner, InferenceRequest* out,
                               const SharedMemoryRegistry* shared_memory = nullptr);

// `shape` with its non-batch dims replaced by `dims`, whose one -1 takes what is left of the
// element count: the config's reshape, from the protocol's dims to the model's or back. Returns
// false when the result does not hold the same number of elements (e.g. 3 elements and [-1, 2]).
bool reshape_dims(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims, bool batched,
                  std::vector<int64_t>* out);

}  // namespace inferd
