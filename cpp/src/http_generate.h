#pragma once

// Triton's generate extension as the v2 infer messages it stands for (http_generate.cpp).

#include <cstddef>
#include <string>

#include "inferd/model_signature.h"
#include "inferd/status.h"

namespace inferd {

// The v2 infer request JSON a generate request body stands for, given the model it goes to: each
// field naming an input becomes that input (its datatype, its dims with a -1 taking the value's
// element count, behind a batch of 1 when the model batches; nested arrays flattened), `id` the
// id, and the other fields and `parameters`' entries the request's parameters (strings, numbers or
// bools). INVALID_ARGUMENT for a body that is not a JSON object (parsed in place, within
// `max_depth`: parse_json_in_place), or a parameter of another kind. Never recurses on the
// request's nesting.
Status generate_to_infer_json(std::string* body, const ModelSignature& model, size_t max_depth, std::string* out);

// A v2 infer answer (its outputs as JSON data) as a generate answer: model_name, model_version,
// id when there is one, and each output as a field (its one element as a value, its elements as a
// flat array otherwise).
Status infer_answer_to_generate_json(const std::string& answer, std::string* out);

}  // namespace inferd
