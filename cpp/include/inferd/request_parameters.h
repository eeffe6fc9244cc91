#pragma once

#include <string>
#include <vector>

#include "inferd/infer_request_parser.h"
#include "inferd/inference_request.h"
#include "inferd/model_signature.h"
#include "inferd/status.h"

namespace inferd {

// The request-level parameters (ModelInferRequest.parameters) the core reads, into `out`:
// - `priority` and `timeout`, non-negative integers (0 when absent) -> out->priority (past
//   2^32 - 1 kept as UINT32_MAX: no model has the level, and the batcher answers INVALID_ARGUMENT
//   for it) and out->timeout_us;
// - Triton's sequence parameters -> out->sequence_flags, for a model with sequence batching:
//   `sequence_id` a non-negative integer or a string, `sequence_start` and `sequence_end` bools
//   (the SequenceBatcher refuses what Triton's does); for any other model they are refused when
//   they ask for a sequence (a non-zero or non-empty sequence_id, a true sequence_start or
//   sequence_end), naming the first: it keeps no state between requests, and serving them one by
//   one would answer a stateful client wrongly without a word; sequence_id 0 (or "") and false
//   flags are what a stateless client may send;
// - with `model.keeps_parameters` (python models), the rest as JSON (out->parameters_json, see
//   parameters_json).
// Checked in that order. On failure `out` is partly written and must be dropped, as
// build_inference_request's is. Thread-safe (reads `parsed` only); never blocks. INVALID_ARGUMENT
// naming the parameter.
Status read_request_parameters(const ParsedInferRequest& parsed, const ModelSignature& model, InferenceRequest* out);

// A request's own parameters as a JSON object, as Triton's python backend gives them to model code
// (request.parameters()); those the server reads itself (priority, timeout, the sequence's,
// triton_*) and those
// without a value are left out, the others kept in the request's order. A double that JSON cannot
// hold (NaN, infinity) is null. Thread-safe; never blocks.
std::string parameters_json(const std::vector<WireParameter>& parameters);

}  // namespace inferd
