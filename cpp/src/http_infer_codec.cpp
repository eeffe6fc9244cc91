// Decoding Triton's HTTP/REST inference request (KServe v2 JSON with Triton's binary tensor
// extension) into the ParsedInferRequest the gRPC parser gives. The JSON is parsed in place by
// parse_json_in_place (http_json_parse.h: iterative, its nesting bounded while it parses); the
// walk over the Document below recurses only through `data`, whose depth that bound caps.
#include "inferd/http_infer_codec.h"

#include <rapidjson/document.h>

#include <cfloat>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "http_json_parse.h"
#include "inferd/datatype_names.h"
#include "request_messages.h"

namespace inferd {
namespace {

using rapidjson::Document;
using rapidjson::SizeType;
using rapidjson::Value;
using request_messages::invalid;
using request_messages::quoted;
using request_messages::shape_text;

std::string_view view(const Value& string) { return {string.GetString(), string.GetStringLength()}; }

const char* json_type_name(const Value& value) {
  if (value.IsNull()) return "null";
  if (value.IsBool()) return "a bool";
  if (value.IsNumber()) return "a number";
  if (value.IsString()) return "a string";
  if (value.IsArray()) return "an array";
  return "an object";
}

// What one decode reads and the budgets it spends (ParseLimits, as the gRPC parser's).
struct Decoder {
  HttpInferRequest* out;
  std::string_view binary;  // the binary section, which inputs take in order
  size_t binary_taken = 0;
  size_t parameters = 0;
  size_t dims = 0;
};

// The members of `object` named by `keys`, into `found` (null where absent), each at most once.
// Unknown members are skipped, as Triton does.
template <size_t N>
Status members(const Value& object, const char* const (&keys)[N], const std::string& where, const Value* (&found)[N]) {
  for (const Value*& f : found) f = nullptr;
  for (auto m = object.MemberBegin(); m != object.MemberEnd(); ++m) {
    const std::string_view name = view(m->name);
    for (size_t k = 0; k < N; ++k) {
      if (name != keys[k]) continue;
      if (found[k] != nullptr) return invalid(where + ": " + quoted(name) + " is given twice");
      found[k] = &m->value;
    }
  }
  return Status::Ok();
}

Status expect_string(const Value* value, const std::string& where, const char* key, bool required) {
  if (value == nullptr) return required ? invalid(where + ": " + quoted(key) + " is missing") : Status::Ok();
  if (!value->IsString()) {
    return invalid(where + ": " + quoted(key) + " must be a string, got " + json_type_name(*value));
  }
  return Status::Ok();
}

// A JSON parameters object into `out`, each value as the InferParameter oneof member it maps to.
Status read_parameters(Decoder* decoder, const Value* object, const std::string& where,
                       std::vector<WireParameter>* out) {
  if (object == nullptr) return Status::Ok();
  if (!object->IsObject()) return invalid(where + ": 'parameters' must be an object, got " + json_type_name(*object));
  for (auto m = object->MemberBegin(); m != object->MemberEnd(); ++m) {
    if (++decoder->parameters > ParseLimits::kParameters) {
      return invalid("the request has more than " + std::to_string(ParseLimits::kParameters) +
                     " parameters, all maps together");
    }
    WireParameter p;
    p.key = view(m->name);
    const Value& v = m->value;
    if (v.IsBool()) {
      p.kind = WireParameter::Kind::kBool;
      p.bool_value = v.GetBool();
    } else if (v.IsInt64()) {
      p.kind = WireParameter::Kind::kInt64;
      p.int64_value = v.GetInt64();
    } else if (v.IsUint64()) {
      p.kind = WireParameter::Kind::kUint64;
      p.uint64_value = v.GetUint64();
    } else if (v.IsNumber()) {
      p.kind = WireParameter::Kind::kDouble;
      p.double_value = v.GetDouble();
    } else if (v.IsString()) {
      p.kind = WireParameter::Kind::kString;
      p.string_value = view(v);
    } else {
      return invalid(where + ": parameter " + quoted(p.key) + " must be a bool, a number or a string, got " +
                     json_type_name(v));
    }
    out->push_back(p);
  }
  return Status::Ok();
}

// Takes the HTTP-only parameter `key` out of `parameters` (the last one given, as find_parameter
// reads; every one is removed). Returns whether it was there, its value in `*taken`.
bool take_parameter(std::vector<WireParameter>* parameters, std::string_view key, WireParameter* taken) {
  bool found = false;
  for (auto it = parameters->begin(); it != parameters->end();) {
    if (it->key == key) {
      *taken = *it;
      found = true;
      it = parameters->erase(it);
    } else {
      ++it;
    }
  }
  return found;
}

bool non_negative_integer(const WireParameter& p, uint64_t* value) {
  if (p.kind == WireParameter::Kind::kUint64) {
    *value = p.uint64_value;
    return true;
  }
  if (p.kind == WireParameter::Kind::kInt64 && p.int64_value >= 0) {
    *value = static_cast<uint64_t>(p.int64_value);
    return true;
  }
  return false;
}

// `data` as row-major elements: flat (an array of values) or nested exactly as `shape` (a shape
// of no dims: the value itself). Counts them into `count` and checks the form, before any buffer
// is sized; recursion is bounded by the JSON depth limit.
Status check_nesting(const Value& value, const std::vector<int64_t>& shape, size_t dim, const std::string& where,
                     size_t* count) {
  if (dim == shape.size()) {
    if (value.IsArray() || value.IsObject()) {
      return invalid(where + ": 'data' nests deeper than its shape " + shape_text(shape));
    }
    ++*count;
    return Status::Ok();
  }
  if (!value.IsArray()) return invalid(where + ": 'data' is not nested as its shape " + shape_text(shape));
  if (static_cast<int64_t>(value.Size()) != shape[dim]) {
    return invalid(where + ": 'data' has " + std::to_string(value.Size()) + " elements at depth " +
                   std::to_string(dim + 1) + ", its shape " + shape_text(shape) + " says " +
                   std::to_string(shape[dim]) + " (give 'data' flat or nested as the shape)");
  }
  for (const Value& element : value.GetArray()) {
    Status status = check_nesting(element, shape, dim + 1, where, count);
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

bool is_flat(const Value& data) {
  if (!data.IsArray()) return false;
  for (const Value& element : data.GetArray()) {
    if (element.IsArray() || element.IsObject()) return false;
  }
  return true;
}

// Calls `f` on each element of `data` (checked by check_nesting or flat) in row-major order.
template <typename F>
Status for_each_element(const Value& data, F&& f, size_t* index) {
  if (!data.IsArray()) return f(data, (*index)++);
  for (const Value& element : data.GetArray()) {
    Status status = for_each_element(element, f, index);
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

template <typename T>
void put(std::string* buffer, size_t* offset, T value) {
  // Little-endian hosts only (x86-64, aarch64), as the rest of the core: the raw bytes are the
  // value's memory.
  std::memcpy(buffer->data() + *offset, &value, sizeof value);
  *offset += sizeof value;
}

// One JSON element of a `dtype` tensor, written at `*offset` of `buffer` (sized for it).
Status put_element(const Value& v, DataType dtype, const std::string& where, size_t index, std::string* buffer,
                   size_t* offset) {
  auto refuse = [&](const char* want) {
    return invalid(where + ": element " + std::to_string(index) + " of 'data' must be " + want + " for " +
                   datatype_name(dtype) + ", got " + json_type_name(v));
  };
  auto out_of_range = [&]() {
    return invalid(where + ": element " + std::to_string(index) + " of 'data' is out of range for " +
                   datatype_name(dtype));
  };
  auto integer = [&](auto type_tag) -> Status {
    using T = decltype(type_tag);
    if (!v.IsNumber()) return refuse("an integer");
    if constexpr (std::is_signed_v<T>) {
      if (!v.IsInt64()) return v.IsUint64() ? out_of_range() : refuse("an integer");
      const int64_t x = v.GetInt64();
      if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max()) return out_of_range();
      put(buffer, offset, static_cast<T>(x));
    } else {
      if (!v.IsUint64()) return v.IsInt64() ? out_of_range() : refuse("an integer");
      const uint64_t x = v.GetUint64();
      if (x > std::numeric_limits<T>::max()) return out_of_range();
      put(buffer, offset, static_cast<T>(x));
    }
    return Status::Ok();
  };
  switch (dtype) {
    case DataType::kBool:
      if (!v.IsBool()) return refuse("true or false");
      put(buffer, offset, static_cast<uint8_t>(v.GetBool() ? 1 : 0));
      return Status::Ok();
    case DataType::kUint8:
      return integer(uint8_t{});
    case DataType::kUint16:
      return integer(uint16_t{});
    case DataType::kUint32:
      return integer(uint32_t{});
    case DataType::kUint64:
      return integer(uint64_t{});
    case DataType::kInt8:
      return integer(int8_t{});
    case DataType::kInt16:
      return integer(int16_t{});
    case DataType::kInt32:
      return integer(int32_t{});
    case DataType::kInt64:
      return integer(int64_t{});
    case DataType::kFp32: {
      if (!v.IsNumber()) return refuse("a number");
      const double x = v.GetDouble();
      if (x > FLT_MAX || x < -FLT_MAX) return out_of_range();
      put(buffer, offset, static_cast<float>(x));
      return Status::Ok();
    }
    case DataType::kFp64:
      if (!v.IsNumber()) return refuse("a number");
      put(buffer, offset, v.GetDouble());
      return Status::Ok();
    case DataType::kBytes: {
      if (!v.IsString()) return refuse("a string");
      put(buffer, offset, static_cast<uint32_t>(v.GetStringLength()));
      std::memcpy(buffer->data() + *offset, v.GetString(), v.GetStringLength());
      *offset += v.GetStringLength();
      return Status::Ok();
    }
    case DataType::kFp16:
    case DataType::kBf16:
      break;  // refused before: only as binary
  }
  return invalid(where + ": " + datatype_name(dtype) + " has no JSON form");
}

// An input's JSON `data`, converted to the tensor's raw bytes (as raw_input_contents carries them)
// in a buffer of the request's own, into `raw`.
Status convert_data(Decoder* decoder, const WireInput& input, const Value& data, const std::string& where,
                    std::string_view* raw) {
  DataType dtype{};
  if (!datatype_from_name(input.datatype, &dtype))
    return invalid(where + ": unknown datatype " + quoted(input.datatype));
  if (dtype == DataType::kFp16 || dtype == DataType::kBf16) {
    return invalid(where + ": " + datatype_name(dtype) +
                   " data cannot travel as JSON; send it in binary (the 'binary_data_size' parameter)");
  }
  const int64_t elements = element_count(input.shape);
  if (elements < 0) return invalid(where + ": shape " + shape_text(input.shape) + " has no element count");
  size_t count = 0;
  Status status;
  if (is_flat(data)) {
    count = data.Size();
  } else {
    status = check_nesting(data, input.shape, 0, where, &count);
    if (!status.ok()) return status;
  }
  if (static_cast<uint64_t>(elements) != count) {
    return invalid(where + ": 'data' holds " + std::to_string(count) + " elements, its shape " +
                   shape_text(input.shape) + " holds " + std::to_string(elements));
  }
  // Sized from the elements counted (each at least one byte of the body), never from the shape.
  size_t bytes = count * element_size(dtype);
  if (dtype == DataType::kBytes) {
    bytes = 0;
    size_t index = 0;
    status = for_each_element(
        data,
        [&](const Value& v, size_t) {
          if (v.IsString()) bytes += 4 + v.GetStringLength();
          return Status::Ok();
        },
        &index);
  }
  auto buffer = std::make_unique<std::string>(bytes, '\0');
  size_t offset = 0, index = 0;
  status = for_each_element(
      data, [&](const Value& v, size_t i) { return put_element(v, dtype, where, i, buffer.get(), &offset); }, &index);
  if (!status.ok()) return status;
  *raw = *buffer;
  decoder->out->converted.push_back(std::move(buffer));
  return Status::Ok();
}

// One element of `inputs`, into out->parsed.inputs, and its bytes (JSON data or the binary
// section's) into raw_input_contents unless it is in shared memory.
Status read_input(Decoder* decoder, const Value& json, size_t position) {
  std::string where = "inputs[" + std::to_string(position) + "]";
  if (!json.IsObject()) return invalid(where + " must be an object, got " + json_type_name(json));
  static constexpr const char* kKeys[] = {"name", "datatype", "shape", "parameters", "data"};
  const Value* field[5];
  Status status = members(json, kKeys, where, field);
  if (status.ok()) status = expect_string(field[0], where, "name", true);
  if (!status.ok()) return status;
  WireInput input;
  input.name = view(*field[0]);
  where = "input " + quoted(input.name);
  status = expect_string(field[1], where, "datatype", true);
  if (!status.ok()) return status;
  input.datatype = view(*field[1]);
  if (field[2] == nullptr) return invalid(where + ": 'shape' is missing");
  if (!field[2]->IsArray()) return invalid(where + ": 'shape' must be an array, got " + json_type_name(*field[2]));
  for (const Value& d : field[2]->GetArray()) {
    if (!d.IsInt64()) return invalid(where + ": 'shape' must hold integers (int64), got " + json_type_name(d));
    if (++decoder->dims > ParseLimits::kDims) {
      return invalid("the request's shapes have more than " + std::to_string(ParseLimits::kDims) +
                     " dims, all inputs together");
    }
    input.shape.push_back(d.GetInt64());
  }
  status = read_parameters(decoder, field[3], where, &input.parameters);
  if (!status.ok()) return status;
  WireParameter binary_size;
  const bool binary = take_parameter(&input.parameters, "binary_data_size", &binary_size);
  const bool shared_memory = find_parameter(input.parameters, "shared_memory_region") != nullptr;
  const bool data = field[4] != nullptr;
  if (int(binary) + int(shared_memory) + int(data) != 1) {
    // Triton's rule (ValidateInputContentType), in its words.
    return invalid(where + ": an input must set exactly one of 'data', 'binary_data_size' in 'parameters' and " +
                   "'shared_memory_region' in 'parameters', but " +
                   (!binary && !shared_memory && !data
                        ? std::string("none is set")
                        : std::string("sets") + (data ? " 'data'" : "") + (binary ? " 'binary_data_size'" : "") +
                              (shared_memory ? " 'shared_memory_region'" : "")));
  }
  ParsedInferRequest& parsed = decoder->out->parsed;
  if (binary) {
    uint64_t size = 0;
    if (!non_negative_integer(binary_size, &size)) {
      return invalid(where + ": parameter 'binary_data_size' must be a non-negative integer");
    }
    const size_t left = decoder->binary.size() - decoder->binary_taken;
    if (size > left) {
      return invalid(where + ": binary_data_size " + std::to_string(size) + " is more than the " +
                     std::to_string(left) +
                     " bytes left in the binary section (after Inference-Header-Content-Length)");
    }
    parsed.raw_input_contents.push_back(decoder->binary.substr(decoder->binary_taken, static_cast<size_t>(size)));
    decoder->binary_taken += static_cast<size_t>(size);
  } else if (data) {
    std::string_view raw;
    status = convert_data(decoder, input, *field[4], where, &raw);
    if (!status.ok()) return status;
    parsed.raw_input_contents.push_back(raw);
  }
  parsed.inputs.push_back(std::move(input));
  return Status::Ok();
}

// One element of `outputs`, into out->parsed.outputs, its `binary_data` into out->format.
Status read_output(Decoder* decoder, const Value& json, size_t position) {
  std::string where = "outputs[" + std::to_string(position) + "]";
  if (!json.IsObject()) return invalid(where + " must be an object, got " + json_type_name(json));
  static constexpr const char* kKeys[] = {"name", "parameters"};
  const Value* field[2];
  Status status = members(json, kKeys, where, field);
  if (status.ok()) status = expect_string(field[0], where, "name", true);
  if (!status.ok()) return status;
  WireOutput output;
  output.name = view(*field[0]);
  where = "output " + quoted(output.name);
  status = read_parameters(decoder, field[1], where, &output.parameters);
  if (!status.ok()) return status;
  WireParameter binary_data;
  if (take_parameter(&output.parameters, "binary_data", &binary_data)) {
    if (binary_data.kind != WireParameter::Kind::kBool)
      return invalid(where + ": parameter 'binary_data' must be a bool");
    if (binary_data.bool_value && find_parameter(output.parameters, "shared_memory_region") != nullptr) {
      return invalid(where + ": an output cannot set both 'shared_memory_region' and 'binary_data'");  // Triton's rule
    }
    decoder->out->format.by_output[std::string(output.name)] = binary_data.bool_value;
  }
  decoder->out->parsed.outputs.push_back(std::move(output));
  return Status::Ok();
}

Status read_request(Decoder* decoder, const Value& root) {
  if (!root.IsObject()) return invalid("the request must be a JSON object, got " + std::string(json_type_name(root)));
  static constexpr const char* kKeys[] = {"id", "parameters", "inputs", "outputs"};
  const Value* field[4];
  Status status = members(root, kKeys, "the request", field);
  if (status.ok()) status = expect_string(field[0], "the request", "id", false);
  if (!status.ok()) return status;
  ParsedInferRequest& parsed = decoder->out->parsed;
  if (field[0] != nullptr) parsed.id = view(*field[0]);
  status = read_parameters(decoder, field[1], "the request", &parsed.parameters);
  if (!status.ok()) return status;
  WireParameter binary_output;
  if (take_parameter(&parsed.parameters, "binary_data_output", &binary_output)) {
    if (binary_output.kind != WireParameter::Kind::kBool) {
      return invalid("request parameter 'binary_data_output' must be a bool");
    }
    decoder->out->format.binary_by_default = binary_output.bool_value;
  }
  for (size_t f = 2; f < 4; ++f) {
    const char* key = kKeys[f];
    if (field[f] == nullptr) continue;
    if (!field[f]->IsArray()) {
      return invalid(std::string("the request's ") + quoted(key) + " must be an array, got " +
                     json_type_name(*field[f]));
    }
    if (field[f]->Size() > ParseLimits::kTensors) {
      return invalid("the request has more than " + std::to_string(ParseLimits::kTensors) + " " + key);
    }
  }
  if (field[2] != nullptr) {
    const auto inputs = field[2]->GetArray();
    parsed.inputs.reserve(inputs.Size());
    for (SizeType i = 0; i < inputs.Size(); ++i) {
      status = read_input(decoder, inputs[i], i);
      if (!status.ok()) return status;
    }
  }
  if (decoder->binary_taken != decoder->binary.size()) {
    return invalid("the binary section (after Inference-Header-Content-Length) has " +
                   std::to_string(decoder->binary.size()) + " bytes, the inputs' binary_data_size add up to " +
                   std::to_string(decoder->binary_taken));
  }
  if (field[3] != nullptr) {
    const auto outputs = field[3]->GetArray();
    parsed.outputs.reserve(outputs.Size());
    for (SizeType i = 0; i < outputs.Size(); ++i) {
      status = read_output(decoder, outputs[i], i);
      if (!status.ok()) return status;
    }
  }
  return Status::Ok();
}

}  // namespace

bool HttpAnswerFormat::binary(std::string_view output) const {
  auto it = by_output.find(output);
  return it == by_output.end() ? binary_by_default : it->second;
}

Status decode_http_infer_request(std::string model_name, std::string model_version, std::shared_ptr<std::string> body,
                                 std::optional<size_t> json_length, const HttpDecodeLimits& limits,
                                 std::shared_ptr<HttpInferRequest>* out) {
  auto request = std::make_shared<HttpInferRequest>();
  request->model_name = std::move(model_name);
  request->model_version = std::move(model_version);
  request->body = body ? std::move(body) : std::make_shared<std::string>();
  std::string& text = *request->body;
  Decoder decoder{request.get(), {}};
  Document document;
  Status status;
  if (!json_length) {
    status = parse_json_in_place(text.data(), text.size(), limits.max_json_depth, &document);
  } else if (*json_length == 0) {
    status = invalid(
        "Inference-Header-Content-Length 0 (a body of one raw input, without JSON) is not supported; send the "
        "JSON header first and give its length");
  } else if (*json_length > text.size()) {
    status = invalid("Inference-Header-Content-Length " + std::to_string(*json_length) + " is more than the body's " +
                     std::to_string(text.size()) + " bytes");
  } else {
    request->header_copy.assign(text, 0, *json_length);
    decoder.binary = std::string_view(text).substr(*json_length);
    status =
        parse_json_in_place(request->header_copy.data(), request->header_copy.size(), limits.max_json_depth, &document);
  }
  if (status.ok()) status = read_request(&decoder, document);
  if (!status.ok()) return status;
  request->parsed.model_name = request->model_name;
  request->parsed.model_version = request->model_version;
  *out = std::move(request);
  return Status::Ok();
}

}  // namespace inferd
