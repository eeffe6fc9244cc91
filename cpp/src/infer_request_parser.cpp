#include "inferd/infer_request_parser.h"

#include <cstring>
#include <string>

namespace inferd {
namespace {

// Field numbers of grpc_service.proto.
namespace request_field {
constexpr uint32_t kModelName = 1, kModelVersion = 2, kId = 3, kParameters = 4, kInputs = 5, kOutputs = 6,
                   kRawInputContents = 7;
}
namespace input_field {
constexpr uint32_t kName = 1, kDatatype = 2, kShape = 3, kParameters = 4, kContents = 5;
}
namespace output_field {
constexpr uint32_t kName = 1, kParameters = 2;
}
namespace parameter_field {
constexpr uint32_t kBool = 1, kInt64 = 2, kString = 3, kDouble = 4, kUint64 = 5;
}

// Counts against ParseLimits, for one request.
struct Budget {
  size_t parameters = 0, dims = 0, chunks = 0;
  bool take(size_t* used, size_t limit) { return ++*used <= limit; }
};

Status malformed(const std::string& where) {
  return Status::Error(StatusCode::kInvalidArgument, "malformed ModelInferRequest: " + where);
}

Status too_many(const std::string& what) {
  return malformed("more than " + std::to_string(ParseLimits::kTensors) + " " + what);
}

// A string field: a length-delimited, UTF-8 payload.
bool read_string(WireReader* reader, WireType type, std::string_view* value) {
  return type == WireType::kLengthDelimited && reader->read_bytes(value) && is_valid_utf8(*value);
}

bool read_message(WireReader* reader, WireType type, std::string_view* payload) {
  return type == WireType::kLengthDelimited && reader->read_bytes(payload);
}

// inference.InferParameter, merged into `out` (a later oneof member replaces an earlier one).
bool parse_parameter_value(std::string_view bytes, WireParameter* out) {
  WireReader reader(bytes);
  while (!reader.done()) {
    uint32_t field = 0;
    WireType type{};
    if (!reader.read_tag(&field, &type)) return false;
    uint64_t v = 0;
    switch (field) {
      case parameter_field::kBool:
      case parameter_field::kInt64:
      case parameter_field::kUint64:
        if (type != WireType::kVarint || !reader.read_varint(&v)) return false;
        if (field == parameter_field::kBool) {
          out->kind = WireParameter::Kind::kBool;
          out->bool_value = v != 0;
        } else if (field == parameter_field::kInt64) {
          out->kind = WireParameter::Kind::kInt64;
          out->int64_value = static_cast<int64_t>(v);
        } else {
          out->kind = WireParameter::Kind::kUint64;
          out->uint64_value = v;
        }
        break;
      case parameter_field::kString:
        if (!read_string(&reader, type, &out->string_value)) return false;
        out->kind = WireParameter::Kind::kString;
        break;
      case parameter_field::kDouble: {
        if (type != WireType::kFixed64 || !reader.read_fixed64(&v)) return false;
        std::memcpy(&out->double_value, &v, sizeof v);
        out->kind = WireParameter::Kind::kDouble;
        break;
      }
      default:
        if (!reader.skip(type)) return false;
    }
  }
  return true;
}

// One map<string, InferParameter> entry (key = 1, value = 2).
bool parse_parameter_entry(std::string_view bytes, std::vector<WireParameter>* out, Budget* budget) {
  if (!budget->take(&budget->parameters, ParseLimits::kParameters)) return false;
  WireParameter parameter;
  WireReader reader(bytes);
  while (!reader.done()) {
    uint32_t field = 0;
    WireType type{};
    if (!reader.read_tag(&field, &type)) return false;
    std::string_view payload;
    if (field == 1) {
      if (!read_string(&reader, type, &parameter.key)) return false;
    } else if (field == 2) {
      if (!read_message(&reader, type, &payload) || !parse_parameter_value(payload, &parameter)) return false;
    } else if (!reader.skip(type)) {
      return false;
    }
  }
  out->push_back(parameter);
  return true;
}

// InferTensorContents: its fields are kept as chunks, decoded once the datatype is known.
bool parse_contents(std::string_view bytes, std::vector<ContentsChunk>* out, Budget* budget) {
  WireReader reader(bytes);
  while (!reader.done()) {
    const size_t key_at = bytes.size() - reader.remaining();
    uint32_t field = 0;
    WireType type{};
    if (!reader.read_tag(&field, &type)) return false;
    if (field < 1 || field > 8) {
      if (!reader.skip(type)) return false;
      continue;
    }
    if (field != 8 && type == WireType::kLengthDelimited) {  // a packed run
      ContentsChunk chunk{field, type, true, {}};
      if (!reader.read_bytes(&chunk.bytes)) return false;
      if (!budget->take(&budget->chunks, ParseLimits::kContentsChunks)) return false;
      out->push_back(chunk);
      continue;
    }
    if (!reader.skip(type)) return false;
    const std::string_view whole = bytes.substr(key_at, bytes.size() - reader.remaining() - key_at);
    ContentsChunk* last = out->empty() ? nullptr : &out->back();
    if (last != nullptr && !last->packed && last->field == field && last->type == type &&
        last->bytes.data() + last->bytes.size() == whole.data()) {
      last->bytes = std::string_view(last->bytes.data(), last->bytes.size() + whole.size());  // extends the stretch
      continue;
    }
    if (!budget->take(&budget->chunks, ParseLimits::kContentsChunks)) return false;
    out->push_back(ContentsChunk{field, type, false, whole});
  }
  return true;
}

// A repeated int64 field, packed or not.
bool read_int64s(WireReader* reader, WireType type, std::vector<int64_t>* out, Budget* budget) {
  uint64_t v = 0;
  if (type == WireType::kVarint) {
    if (!reader->read_varint(&v) || !budget->take(&budget->dims, ParseLimits::kDims)) return false;
    out->push_back(static_cast<int64_t>(v));
    return true;
  }
  std::string_view packed;
  if (type != WireType::kLengthDelimited || !reader->read_bytes(&packed)) return false;
  WireReader values(packed);
  while (!values.done()) {
    if (!values.read_varint(&v) || !budget->take(&budget->dims, ParseLimits::kDims)) return false;
    out->push_back(static_cast<int64_t>(v));
  }
  return true;
}

bool parse_input(std::string_view bytes, WireInput* out, Budget* budget) {
  WireReader reader(bytes);
  while (!reader.done()) {
    uint32_t field = 0;
    WireType type{};
    if (!reader.read_tag(&field, &type)) return false;
    std::string_view payload;
    switch (field) {
      case input_field::kName:
        if (!read_string(&reader, type, &out->name)) return false;
        break;
      case input_field::kDatatype:
        if (!read_string(&reader, type, &out->datatype)) return false;
        break;
      case input_field::kShape:
        if (!read_int64s(&reader, type, &out->shape, budget)) return false;
        break;
      case input_field::kParameters:
        if (!read_message(&reader, type, &payload) || !parse_parameter_entry(payload, &out->parameters, budget)) {
          return false;
        }
        break;
      case input_field::kContents:
        if (!read_message(&reader, type, &payload) || !parse_contents(payload, &out->contents, budget)) return false;
        out->has_contents = true;
        break;
      default:
        if (!reader.skip(type)) return false;
    }
  }
  return true;
}

bool parse_output(std::string_view bytes, WireOutput* out, Budget* budget) {
  WireReader reader(bytes);
  while (!reader.done()) {
    uint32_t field = 0;
    WireType type{};
    if (!reader.read_tag(&field, &type)) return false;
    std::string_view payload;
    if (field == output_field::kName) {
      if (!read_string(&reader, type, &out->name)) return false;
    } else if (field == output_field::kParameters) {
      if (!read_message(&reader, type, &payload) || !parse_parameter_entry(payload, &out->parameters, budget)) {
        return false;
      }
    } else if (!reader.skip(type)) {
      return false;
    }
  }
  return true;
}

}  // namespace

const WireParameter* find_parameter(const std::vector<WireParameter>& parameters, std::string_view key) {
  for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {
    if (it->key == key) return &*it;
  }
  return nullptr;
}

Status parse_infer_request(const std::byte* data, size_t size, ParsedInferRequest* out) {
  *out = ParsedInferRequest{};
  Budget budget;
  WireReader reader(data, size);
  while (!reader.done()) {
    uint32_t field = 0;
    WireType type{};
    if (!reader.read_tag(&field, &type)) return malformed("a field key is invalid or truncated");
    std::string_view payload;
    switch (field) {
      case request_field::kModelName:
        if (!read_string(&reader, type, &out->model_name)) return malformed("model_name");
        break;
      case request_field::kModelVersion:
        if (!read_string(&reader, type, &out->model_version)) return malformed("model_version");
        break;
      case request_field::kId:
        if (!read_string(&reader, type, &out->id)) return malformed("id");
        break;
      case request_field::kParameters:
        if (!read_message(&reader, type, &payload) || !parse_parameter_entry(payload, &out->parameters, &budget)) {
          return malformed("parameters (at most " + std::to_string(ParseLimits::kParameters) + " in all)");
        }
        break;
      case request_field::kInputs:
        if (!read_message(&reader, type, &payload)) return malformed("inputs");
        if (out->inputs.size() == ParseLimits::kTensors) return too_many("inputs");
        out->inputs.emplace_back();
        if (!parse_input(payload, &out->inputs.back(), &budget)) {
          return malformed("inputs[" + std::to_string(out->inputs.size() - 1) + "]");
        }
        break;
      case request_field::kOutputs:
        if (!read_message(&reader, type, &payload)) return malformed("outputs");
        if (out->outputs.size() == ParseLimits::kTensors) return too_many("outputs");
        out->outputs.emplace_back();
        if (!parse_output(payload, &out->outputs.back(), &budget)) {
          return malformed("outputs[" + std::to_string(out->outputs.size() - 1) + "]");
        }
        break;
      case request_field::kRawInputContents:
        if (!read_message(&reader, type, &payload)) return malformed("raw_input_contents");
        if (out->raw_input_contents.size() == ParseLimits::kTensors) return too_many("raw_input_contents");
        out->raw_input_contents.push_back(payload);
        break;
      default:
        if (!reader.skip(type)) return malformed("field " + std::to_string(field));
    }
  }
  return Status::Ok();
}

bool is_valid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    size_t n = 0;
    uint32_t min = 0, cp = 0;
    if ((c & 0xE0) == 0xC0) {
      n = 1, min = 0x80, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, min = 0x800, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, min = 0x10000, cp = c & 0x07;
    } else {
      return false;
    }
    if (static_cast<size_t>(end - p) <= n) return false;
    for (size_t i = 1; i <= n; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    p += n + 1;
  }
  return true;
}

}  // namespace inferd
