#include "inferd/request_parameters.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string_view>

#include "inferd/structured_log.h"
#include "request_messages.h"

namespace inferd {
namespace {

using request_messages::invalid;

// A reserved request parameter that must be a non-negative integer; 0 when absent.
Status non_negative(const ParsedInferRequest& parsed, const char* key, uint64_t* value) {
  const WireParameter* p = find_parameter(parsed.parameters, key);
  *value = 0;
  if (p == nullptr || p->kind == WireParameter::Kind::kNone) return Status::Ok();
  if (p->kind == WireParameter::Kind::kUint64) {
    *value = p->uint64_value;
  } else if (p->kind == WireParameter::Kind::kInt64 && p->int64_value >= 0) {
    *value = static_cast<uint64_t>(p->int64_value);
  } else {
    return invalid(std::string("request parameter '") + key + "' must be a non-negative integer");
  }
  return Status::Ok();
}

// Triton's sequence parameters asking for a sequence (a non-zero or non-empty sequence_id, a true
// sequence_start or sequence_end) are refused for a model without sequence batching, naming the
// first: it keeps no state between requests, and serving them one by one would answer a stateful
// client wrongly without a word. sequence_id 0 (or "") and false flags are what a stateless
// client may send.
Status refuse_sequence(const ParsedInferRequest& parsed) {
  for (const char* key : {"sequence_id", "sequence_start", "sequence_end"}) {
    const WireParameter* p = find_parameter(parsed.parameters, key);
    if (p == nullptr) continue;
    const bool asks = (p->kind == WireParameter::Kind::kBool && p->bool_value) ||
                      (p->kind == WireParameter::Kind::kInt64 && p->int64_value != 0) ||
                      (p->kind == WireParameter::Kind::kUint64 && p->uint64_value != 0) ||
                      (p->kind == WireParameter::Kind::kString && !p->string_value.empty()) ||
                      (p->kind == WireParameter::Kind::kDouble && p->double_value != 0);
    if (asks) {
      return invalid(std::string("request parameter '") + key +
                     "': the model has no sequence batching (sequence_batching in its config); the request would "
                     "be served without its sequence's state");
    }
  }
  return Status::Ok();
}

// The sequence parameters of a request to a model with sequence batching.
Status read_sequence(const ParsedInferRequest& parsed, SequenceFlags* out) {
  if (const WireParameter* id = find_parameter(parsed.parameters, "sequence_id")) {
    switch (id->kind) {
      case WireParameter::Kind::kUint64:
        out->id = id->uint64_value;
        break;
      case WireParameter::Kind::kInt64:
        if (id->int64_value < 0) return invalid("request parameter 'sequence_id' must not be negative");
        out->id = static_cast<uint64_t>(id->int64_value);
        break;
      case WireParameter::Kind::kString:
        out->string_id = std::string(id->string_value);
        break;
      default:
        return invalid("request parameter 'sequence_id' must be an integer or a string");
    }
  }
  for (auto [key, flag] : {std::pair{"sequence_start", &out->start}, std::pair{"sequence_end", &out->end}}) {
    const WireParameter* p = find_parameter(parsed.parameters, key);
    if (p == nullptr) continue;
    if (p->kind != WireParameter::Kind::kBool)
      return invalid(std::string("request parameter '") + key + "' must be a bool");
    *flag = p->bool_value;
  }
  return Status::Ok();
}

}  // namespace

Status read_request_parameters(const ParsedInferRequest& parsed, const ModelSignature& model, InferenceRequest* out) {
  uint64_t priority = 0, timeout = 0;
  Status status = non_negative(parsed, "priority", &priority);
  if (status.ok()) status = non_negative(parsed, "timeout", &timeout);
  if (status.ok()) {
    status = model.sequence_batching ? read_sequence(parsed, &out->sequence_flags) : refuse_sequence(parsed);
  }
  if (!status.ok()) return status;
  // Past 2^32 - 1 no model has the level; the batcher answers INVALID_ARGUMENT for it.
  out->priority = static_cast<uint32_t>(std::min<uint64_t>(priority, UINT32_MAX));
  out->timeout_us = timeout;
  if (model.keeps_parameters) out->parameters_json = parameters_json(parsed.parameters);
  return Status::Ok();
}

std::string parameters_json(const std::vector<WireParameter>& parameters) {
  std::string json = "{";
  for (const WireParameter& parameter : parameters) {
    const std::string_view key = parameter.key;
    if (parameter.kind == WireParameter::Kind::kNone || key == "priority" || key == "timeout" || key == "sequence_id" ||
        key == "sequence_start" || key == "sequence_end" || key.substr(0, 7) == "triton_") {
      continue;
    }
    if (json.size() > 1) json += ',';
    append_json_string(json, std::string(key));
    json += ':';
    switch (parameter.kind) {
      case WireParameter::Kind::kBool:
        json += parameter.bool_value ? "true" : "false";
        break;
      case WireParameter::Kind::kInt64:
        json += std::to_string(parameter.int64_value);
        break;
      case WireParameter::Kind::kUint64:
        json += std::to_string(parameter.uint64_value);
        break;
      case WireParameter::Kind::kDouble:
        if (std::isfinite(parameter.double_value)) {
          char number[32];
          std::snprintf(number, sizeof number, "%.17g", parameter.double_value);
          json += number;
        } else {
          json += "null";
        }
        break;
      case WireParameter::Kind::kString:
        append_json_string(json, std::string(parameter.string_value));
        break;
      case WireParameter::Kind::kNone:
        break;
    }
  }
  json += '}';
  return json;
}

}  // namespace inferd
