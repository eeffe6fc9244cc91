#include "inferd/model_signature.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "inferd/structured_log.h"

namespace inferd {
namespace {

Status invalid(std::string message) { return Status::Error(StatusCode::kInvalidArgument, std::move(message)); }

std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

template <typename Names>
std::string names_text(const Names& names) {
  std::string out = "[";
  bool first = true;
  for (const auto& name : names) {
    out += (first ? "" : ", ") + quoted(name);
    first = false;
  }
  return out + "]";
}

// A tensor's shared-memory parameters, checked as Triton checks them (ParseSharedMemoryParams):
// `shared_memory_region` (string) names the region, `shared_memory_byte_size` (an integer, required
// with it) and `shared_memory_offset` (optional, default 0) the slice; either without a region is
// an error. `tensor`: "input 'X'" or "output 'X'", for the messages.
struct SharedMemoryParams {
  bool present = false;
  std::string_view region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

Status integer_parameter(const WireParameter& p, const std::string& tensor, uint64_t* value) {
  if (p.kind == WireParameter::Kind::kUint64) {
    *value = p.uint64_value;
  } else if (p.kind == WireParameter::Kind::kInt64 && p.int64_value >= 0) {
    *value = static_cast<uint64_t>(p.int64_value);
  } else {
    return invalid(tensor + ": '" + std::string(p.key) + "' must be a non-negative integer (int64_param)");
  }
  return Status::Ok();
}

Status shared_memory_params(const std::vector<WireParameter>& parameters, const std::string& tensor,
                            SharedMemoryParams* out) {
  const WireParameter* region = find_parameter(parameters, "shared_memory_region");
  const WireParameter* offset = find_parameter(parameters, "shared_memory_offset");
  const WireParameter* size = find_parameter(parameters, "shared_memory_byte_size");
  if (region == nullptr) {
    if (offset != nullptr || size != nullptr) {
      return invalid(tensor + ": '" + std::string((offset != nullptr ? offset : size)->key) +
                     "' can not be given without 'shared_memory_region'");
    }
    return Status::Ok();
  }
  if (region->kind != WireParameter::Kind::kString) {
    return invalid(tensor + ": 'shared_memory_region' must be a string (string_param)");
  }
  if (size == nullptr) return invalid(tensor + ": 'shared_memory_byte_size' must be given with 'shared_memory_region'");
  out->present = true;
  out->region = region->string_value;
  Status status = integer_parameter(*size, tensor, &out->byte_size);
  if (status.ok() && offset != nullptr) status = integer_parameter(*offset, tensor, &out->offset);
  return status;
}

// The slice a tensor names; PERMISSION_DENIED when this call may not use shared memory.
Status shared_memory_slice(const SharedMemoryRegistry* shared_memory, const SharedMemoryParams& params,
                           const std::string& tensor, SharedMemorySlice* out) {
  if (shared_memory == nullptr) {
    return Status::Error(StatusCode::kPermissionDenied,
                         tensor +
                             ": shared memory is not accepted on this listener (it is served on the Unix socket; "
                             "see --shared-memory and --shared-memory-listeners)");
  }
  Status status = shared_memory->slice(params.region, params.offset, params.byte_size, out);
  if (!status.ok()) status.message = tensor + ": " + status.message;
  return status;
}

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
// sequence_start or sequence_end) are refused, naming the first: no model here keeps state
// between requests yet, and serving them one by one would answer a stateful client wrongly
// without a word. sequence_id 0 (or "") and false flags are what a stateless client may send.
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
                     "': sequences are not supported yet (no sequence batching); the request would be served "
                     "without its sequence's state");
    }
  }
  return Status::Ok();
}

// Which InferTensorContents field carries each datatype; 0 for none (FP16, BF16: raw only).
uint32_t contents_field(DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
      return 1;
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kInt32:
      return 2;
    case DataType::kInt64:
      return 3;
    case DataType::kUint8:
    case DataType::kUint16:
    case DataType::kUint32:
      return 4;
    case DataType::kUint64:
      return 5;
    case DataType::kFp32:
      return 6;
    case DataType::kFp64:
      return 7;
    case DataType::kBytes:
      return 8;
    case DataType::kFp16:
    case DataType::kBf16:
      return 0;
  }
  return 0;
}

const char* contents_field_name(uint32_t field) {
  static constexpr const char* kNames[] = {"",
                                           "bool_contents",
                                           "int_contents",
                                           "int64_contents",
                                           "uint_contents",
                                           "uint64_contents",
                                           "fp32_contents",
                                           "fp64_contents",
                                           "bytes_contents"};
  return field < 9 ? kNames[field] : "unknown contents field";
}

WireType value_wire_type(uint32_t field) {
  return field == 6 ? WireType::kFixed32 : field == 7 ? WireType::kFixed64 : WireType::kVarint;
}

// Calls `scalar(raw)` for each value of a chunk of a scalar field (fields 1-7), or `element(view)`
// for each bytes_contents element (field 8), in order. Returns false, possibly after some calls,
// when the chunk is malformed: a value of another wire type than its field's, a packed run of
// fixed-width values cut inside one, a varint that does not end.
template <typename Scalar, typename Element>
bool for_each_value(const ContentsChunk& chunk, Scalar&& scalar, Element&& element) {
  const WireType want = value_wire_type(chunk.field);
  auto read_one = [&](WireReader* reader, WireType type) {
    uint64_t raw = 0;
    uint32_t raw32 = 0;
    switch (type) {
      case WireType::kVarint:
        if (!reader->read_varint(&raw)) return false;
        break;
      case WireType::kFixed32:
        if (!reader->read_fixed32(&raw32)) return false;
        raw = raw32;
        break;
      case WireType::kFixed64:
        if (!reader->read_fixed64(&raw)) return false;
        break;
      case WireType::kLengthDelimited:
        return false;
    }
    return scalar(raw);
  };
  WireReader reader(chunk.bytes);
  if (chunk.packed) {
    while (!reader.done()) {
      if (!read_one(&reader, want)) return false;
    }
    return true;
  }
  if (chunk.field == 8 ? chunk.type != WireType::kLengthDelimited : chunk.type != want) return false;
  while (!reader.done()) {  // a stretch of whole occurrences: key, then value
    uint32_t field = 0;
    WireType type{};
    if (!reader.read_tag(&field, &type)) return false;
    if (chunk.field == 8) {
      std::string_view value;
      if (!reader.read_bytes(&value) || !element(value)) return false;
    } else if (!read_one(&reader, type)) {
      return false;
    }
  }
  return true;
}

// Values (or elements) in the chunks of `field` and, for BYTES, their total length; -1 if a chunk
// is malformed. Walked value by value, as decode_values will (an overlong varint is malformed, not
// two values), but never past `limit` + 1 values: a request whose contents hold more values than
// its shape claims is refused after at most that many steps, however many bytes it sent. A packed
// run of fixed-width values is counted from its length alone.
int64_t count_values(const std::vector<ContentsChunk>& chunks, uint32_t field, int64_t limit, size_t* element_bytes) {
  int64_t count = 0;
  *element_bytes = 0;
  const WireType want = value_wire_type(field);
  for (const ContentsChunk& chunk : chunks) {
    if (chunk.field != field) continue;
    if (chunk.packed && want != WireType::kVarint) {
      const size_t width = want == WireType::kFixed32 ? 4 : 8;
      if (chunk.bytes.size() % width != 0) return -1;  // a value cut inside
      count += static_cast<int64_t>(std::min<size_t>(chunk.bytes.size() / width, static_cast<size_t>(limit) + 1));
    } else {
      bool over = false;
      auto step = [&]() { return !(over = ++count > limit); };
      const bool ok = for_each_value(
          chunk, [&](uint64_t) { return step(); },
          [&](std::string_view value) { return *element_bytes += value.size(), step(); });
      if (over) return count;
      if (!ok) return -1;
    }
    if (count > limit) return count;
  }
  return count;
}

template <typename T>
void store(std::byte* out, size_t index, T value) {
  std::memcpy(out + index * sizeof(T), &value, sizeof(T));
}

// Decodes the typed values of `field` into `out` (count * element size bytes, or BYTES' serialized
// form), sized by count_values over the same chunks.
Status decode_values(const std::vector<ContentsChunk>& chunks, uint32_t field, DataType dtype, const std::string& where,
                     std::vector<std::byte>* out) {
  size_t index = 0;
  auto put = [&](uint64_t raw) -> Status {
    std::byte* data = out->data();
    switch (dtype) {
      case DataType::kBool:
        store<uint8_t>(data, index, raw != 0);
        break;
      case DataType::kInt64:
        store<int64_t>(data, index, static_cast<int64_t>(raw));
        break;
      case DataType::kUint64:
        store<uint64_t>(data, index, raw);
        break;
      case DataType::kFp32:
        store<uint32_t>(data, index, static_cast<uint32_t>(raw));
        break;
      case DataType::kFp64:
        store<uint64_t>(data, index, raw);
        break;
      case DataType::kInt8:
      case DataType::kInt16:
      case DataType::kInt32: {
        const auto v = static_cast<int32_t>(static_cast<uint32_t>(raw));  // protobuf's int32 decoding
        const int64_t lo = dtype == DataType::kInt8 ? -128 : dtype == DataType::kInt16 ? -32768 : INT32_MIN;
        const int64_t hi = dtype == DataType::kInt8 ? 127 : dtype == DataType::kInt16 ? 32767 : INT32_MAX;
        if (v < lo || v > hi) {
          return invalid(where + ": int_contents does not fit " + datatype_name(dtype) + ": value " +
                         std::to_string(v) + " is out of range");
        }
        if (dtype == DataType::kInt8) store<int8_t>(data, index, static_cast<int8_t>(v));
        if (dtype == DataType::kInt16) store<int16_t>(data, index, static_cast<int16_t>(v));
        if (dtype == DataType::kInt32) store<int32_t>(data, index, v);
        break;
      }
      case DataType::kUint8:
      case DataType::kUint16:
      case DataType::kUint32: {
        const auto v = static_cast<uint32_t>(raw);
        const uint32_t hi = dtype == DataType::kUint8 ? 255u : dtype == DataType::kUint16 ? 65535u : UINT32_MAX;
        if (v > hi) {
          return invalid(where + ": uint_contents does not fit " + datatype_name(dtype) + ": value " +
                         std::to_string(v) + " is out of range");
        }
        if (dtype == DataType::kUint8) store<uint8_t>(data, index, static_cast<uint8_t>(v));
        if (dtype == DataType::kUint16) store<uint16_t>(data, index, static_cast<uint16_t>(v));
        if (dtype == DataType::kUint32) store<uint32_t>(data, index, v);
        break;
      }
      case DataType::kFp16:
      case DataType::kBf16:
      case DataType::kBytes:
        break;  // no typed field / handled below
    }
    ++index;
    return Status::Ok();
  };
  size_t bytes_pos = 0;
  // BYTES: each element as a 4-byte little-endian length, then its bytes.
  auto element = [&](std::string_view value) {
    const auto len = static_cast<uint32_t>(value.size());
    for (int i = 0; i < 4; ++i) (*out)[bytes_pos + i] = static_cast<std::byte>((len >> (8 * i)) & 0xFF);
    if (len > 0) std::memcpy(out->data() + bytes_pos + 4, value.data(), len);
    bytes_pos += 4 + len;
    return true;
  };
  Status status;
  auto scalar = [&](uint64_t raw) { return (status = put(raw)).ok(); };
  for (const ContentsChunk& chunk : chunks) {
    if (chunk.field == field && !for_each_value(chunk, scalar, element) && status.ok()) {
      status = invalid(where + ": " + contents_field_name(field) + " is malformed");  // not after counting
    }
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

// The typed contents of one input, as the datatype's little-endian bytes, into `buffer`.
Status typed_contents(const WireInput& input, const InputSignature& spec, const std::string& where, int64_t elements,
                      const std::vector<int64_t>& shape, std::vector<std::byte>* buffer) {
  const uint32_t field = contents_field(spec.dtype);
  if (field == 0) {
    return invalid("input " + quoted(input.name) + ": " + datatype_name(spec.dtype) +
                   " has no typed contents field; send it in raw_input_contents");
  }
  for (const ContentsChunk& chunk : input.contents) {
    if (chunk.field != field) {
      return invalid(where + ": " + datatype_name(spec.dtype) + " takes its typed contents in " +
                     contents_field_name(field) + ", got " + contents_field_name(chunk.field));
    }
  }
  size_t element_bytes = 0;
  const int64_t count = count_values(input.contents, field, elements, &element_bytes);
  if (count < 0) return invalid(where + ": " + contents_field_name(field) + " is malformed");
  if (count > elements) {
    return invalid(where + ": more values in " + contents_field_name(field) + " than shape " + shape_text(shape) +
                   " holds (" + std::to_string(elements) + ")");
  }
  if (count != elements) {
    return invalid(where + ": " + std::to_string(count) + " values in " + contents_field_name(field) + ", shape " +
                   shape_text(shape) + " needs " + std::to_string(elements));
  }
  // Sized from the values counted in the bytes received: at most 8 bytes per byte received (a
  // one-byte varint -> int64), or, for BYTES, the elements' bytes plus 4 per element.
  const size_t size = spec.dtype == DataType::kBytes ? element_bytes + 4 * static_cast<size_t>(count)
                                                     : static_cast<size_t>(count) * element_size(spec.dtype);
  buffer->resize(size);
  return decode_values(input.contents, field, spec.dtype, where, buffer);
}

// Checks a BYTES buffer's length prefixes (walked once): the element count and, for ONNX
// strings, that every element is UTF-8.
Status check_bytes(const std::byte* data, size_t size, const InputSignature& spec, const std::string& where,
                   int64_t elements, const std::vector<int64_t>& shape) {
  size_t pos = 0;
  int64_t count = 0;
  while (pos < size) {
    if (size - pos < 4) return invalid(where + ": malformed BYTES data: a length prefix is cut off");
    uint32_t len = 0;
    for (int i = 3; i >= 0; --i) len = (len << 8) | std::to_integer<uint32_t>(data[pos + i]);
    if (size - pos - 4 < len) {
      return invalid(where + ": malformed BYTES data: element " + std::to_string(count) + " claims " +
                     std::to_string(len) + " bytes, " + std::to_string(size - pos - 4) + " remain");
    }
    if (spec.utf8 && !is_valid_utf8(std::string_view(reinterpret_cast<const char*>(data + pos + 4), len))) {
      return invalid(where + " element " + std::to_string(count) +
                     " is not UTF-8 text, which ONNX Runtime strings require");
    }
    pos += 4 + static_cast<size_t>(len);
    if (++count > elements) {  // stops here: the rest of a flood of elements is never walked
      return invalid(where + ": more BYTES elements than shape " + shape_text(shape) + " holds (" +
                     std::to_string(elements) + ")");
    }
  }
  if (count != elements) {
    return invalid(where + ": " + std::to_string(count) + " BYTES elements for shape " + shape_text(shape));
  }
  return Status::Ok();
}

// A typed-contents buffer owned by the request's tensor.
std::shared_ptr<const void> own(std::vector<std::byte>&& buffer) {
  return std::make_shared<const std::vector<std::byte>>(std::move(buffer));
}

// A request's own parameters as a JSON object, as Triton's python backend gives them to model code;
// those the server reads itself (priority, timeout, triton_*) are left out. A double that JSON
// cannot hold (NaN, infinity) is null.
std::string parameters_json(const std::vector<WireParameter>& parameters) {
  std::string json = "{";
  for (const WireParameter& parameter : parameters) {
    const std::string_view key = parameter.key;
    if (parameter.kind == WireParameter::Kind::kNone || key == "priority" || key == "timeout" ||
        key.substr(0, 7) == "triton_") {
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

}  // namespace

bool reshape_dims(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims, bool batched,
                  std::vector<int64_t>* out) {
  out->clear();
  int64_t count = 1, known = 1;
  size_t first = 0;
  if (batched && !shape.empty()) {
    out->push_back(shape[0]);
    first = 1;
  }
  for (size_t i = first; i < shape.size(); ++i) count *= shape[i];
  for (int64_t d : dims) known *= d == -1 ? 1 : d;
  int64_t resolved = 1;
  for (int64_t d : dims) {
    out->push_back(d == -1 && known != 0 ? count / known : d);
    resolved *= out->back();
  }
  return resolved == count;
}

const char* datatype_name(DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
      return "BOOL";
    case DataType::kUint8:
      return "UINT8";
    case DataType::kUint16:
      return "UINT16";
    case DataType::kUint32:
      return "UINT32";
    case DataType::kUint64:
      return "UINT64";
    case DataType::kInt8:
      return "INT8";
    case DataType::kInt16:
      return "INT16";
    case DataType::kInt32:
      return "INT32";
    case DataType::kInt64:
      return "INT64";
    case DataType::kFp16:
      return "FP16";
    case DataType::kFp32:
      return "FP32";
    case DataType::kFp64:
      return "FP64";
    case DataType::kBytes:
      return "BYTES";
    case DataType::kBf16:
      return "BF16";
  }
  return "?";
}

bool datatype_from_name(std::string_view name, DataType* out) {
  for (int code = 1; code <= 14; ++code) {
    if (name == datatype_name(static_cast<DataType>(code))) {
      *out = static_cast<DataType>(code);
      return true;
    }
  }
  return false;
}

Status build_inference_request(const std::shared_ptr<const ModelSignature>& signature, const ParsedInferRequest& parsed,
                               const std::shared_ptr<const void>& owner, InferenceRequest* out,
                               const SharedMemoryRegistry* shared_memory) {
  const ModelSignature& model = *signature;
  const std::string model_text = "model " + quoted(model.name);
  const bool raw = !parsed.raw_input_contents.empty();
  // What the protocol alone says is wrong, before the model is consulted. raw_input_contents
  // holds the inputs not in shared memory, in input order (Triton's rule, which tritonclient
  // follows): raw_index[i] is input i's entry, -1 for one in shared memory.
  std::vector<SharedMemoryParams> input_shm(parsed.inputs.size());
  std::vector<int> raw_index(parsed.inputs.size(), -1);
  int raw_count = 0;
  for (size_t i = 0; i < parsed.inputs.size(); ++i) {
    const WireInput& input = parsed.inputs[i];
    const std::string tensor = "input " + quoted(input.name);
    Status status = shared_memory_params(input.parameters, tensor, &input_shm[i]);
    if (!status.ok()) return status;
    DataType ignored{};
    if (!datatype_from_name(input.datatype, &ignored))
      return invalid(tensor + ": unknown datatype " + quoted(input.datatype));
    if (input_shm[i].present) {
      if (input.has_contents) return invalid(tensor + ": contents must not be set for an input in shared memory");
      continue;
    }
    raw_index[i] = raw_count++;
    if (raw && input.has_contents) {
      return invalid(tensor + ": contents must not be set when raw_input_contents is used");
    }
  }
  if (raw && parsed.raw_input_contents.size() != static_cast<size_t>(raw_count)) {
    return invalid("raw_input_contents has " + std::to_string(parsed.raw_input_contents.size()) + " entries for " +
                   std::to_string(raw_count) + " inputs not in shared memory; give one per such input, in input order");
  }
  std::vector<SharedMemoryParams> output_shm(parsed.outputs.size());
  for (size_t o = 0; o < parsed.outputs.size(); ++o) {
    const WireOutput& output = parsed.outputs[o];
    Status status = shared_memory_params(output.parameters, "output " + quoted(output.name), &output_shm[o]);
    if (!status.ok()) return status;
    if (find_parameter(output.parameters, "classification") != nullptr) {
      return Status::Error(StatusCode::kUnimplemented,
                           "output " + quoted(output.name) + ": the classification extension is not supported");
    }
  }

  // Each given input, by the model's input index.
  std::vector<int> given(model.inputs.size(), -1);
  std::set<std::string_view> unexpected;
  for (size_t i = 0; i < parsed.inputs.size(); ++i) {
    const std::string_view name = parsed.inputs[i].name;
    auto spec =
        std::find_if(model.inputs.begin(), model.inputs.end(), [&](const InputSignature& s) { return s.name == name; });
    if (spec == model.inputs.end()) {
      unexpected.insert(name);
      continue;
    }
    int& slot = given[static_cast<size_t>(spec - model.inputs.begin())];
    if (slot >= 0) return invalid("input " + quoted(name) + " is given twice");
    slot = static_cast<int>(i);
  }
  if (!unexpected.empty()) {
    std::set<std::string_view> expected;
    for (const InputSignature& s : model.inputs) expected.insert(s.name);
    return invalid(model_text + " has no input(s) " + names_text(unexpected) + "; its inputs are " +
                   names_text(expected));
  }

  const bool batched = model.max_batch_size > 0;
  int64_t batch_size = -1;
  std::string_view first;
  out->inputs.reserve(model.inputs.size());
  for (size_t m = 0; m < model.inputs.size(); ++m) {
    const InputSignature& spec = model.inputs[m];
    if (given[m] < 0) {
      if (spec.optional) {
        out->inputs.push_back(Tensor::Absent(spec.dtype));
        continue;
      }
      return invalid(model_text + " needs input " + quoted(spec.name) + ", it is missing");
    }
    const auto index = static_cast<size_t>(given[m]);
    const WireInput& input = parsed.inputs[index];
    const std::string where = "input " + quoted(spec.name) + " of " + model_text;
    DataType dtype{};
    datatype_from_name(input.datatype, &dtype);
    if (dtype != spec.dtype) {
      return invalid(where + " takes " + datatype_name(spec.dtype) + ", got " + std::string(input.datatype));
    }
    const std::vector<int64_t>& shape = input.shape;
    if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) {
      return invalid(where + ": shape " + shape_text(shape) + " has a negative dimension");
    }
    std::vector<int64_t> want;
    if (batched) want.push_back(-1);
    want.insert(want.end(), spec.dims.begin(), spec.dims.end());
    bool matches = want.size() == shape.size();
    for (size_t d = 0; matches && d < want.size(); ++d) matches = want[d] == -1 || want[d] == shape[d];
    if (!matches) return invalid(where + " takes shape " + shape_text(want) + " (-1 = any), got " + shape_text(shape));
    const int64_t rows = batched ? shape[0] : 1;
    if (batched && (rows < 1 || rows > model.max_batch_size)) {
      return invalid(where + ": batch size " + std::to_string(rows) + " is outside 1.." +
                     std::to_string(model.max_batch_size) + " (max_batch_size)");
    }
    const int64_t elements = element_count(shape);
    // Beyond 2^56 elements no request can carry the bytes; refusing here keeps the sizes below exact.
    if (elements < 0 || elements > (int64_t{1} << 56))
      return invalid(where + ": shape " + shape_text(shape) + " has too many elements");

    Tensor tensor;
    tensor.dtype = spec.dtype;
    tensor.shape = shape;
    if (spec.has_reshape && !reshape_dims(shape, spec.reshape, batched, &tensor.shape)) {
      return invalid(where + ": shape " + shape_text(shape) + " cannot take the model's shape " +
                     shape_text(spec.reshape) + " (reshape)");
    }
    if (input_shm[index].present) {
      auto slice = std::make_shared<SharedMemorySlice>();
      Status status = shared_memory_slice(shared_memory, input_shm[index], where, slice.get());
      if (!status.ok()) return status;
      if (spec.dtype == DataType::kBytes) {
        // Copied once, here: the length prefixes are checked on bytes the client can no longer
        // change, so everything that walks them later walks what was checked.
        std::vector<std::byte> buffer(slice->size);
        std::string error;
        if (!copy_from_slice(buffer.data(), *slice, slice->size, &error)) return invalid(where + ": " + error);
        tensor.data = buffer.data();
        tensor.byte_size = buffer.size();
        tensor.owner = own(std::move(buffer));
      } else {
        // Fixed-size elements: the size is all that is checked, so the batch reads the region itself
        // (copy_from_slice, at gather); the client's writes meanwhile change only values.
        tensor.data = slice->data;
        tensor.byte_size = slice->size;
        tensor.owner = slice->region;
        tensor.client_memory = std::move(slice);
      }
    } else if (raw) {
      const std::string_view bytes = parsed.raw_input_contents[static_cast<size_t>(raw_index[index])];
      tensor.data = reinterpret_cast<const std::byte*>(bytes.data());
      tensor.byte_size = bytes.size();
      tensor.owner = owner;
    } else {
      std::vector<std::byte> buffer;
      Status status = typed_contents(input, spec, where, elements, shape, &buffer);
      if (!status.ok()) return status;
      tensor.data = buffer.data();
      tensor.byte_size = buffer.size();
      tensor.owner = own(std::move(buffer));  // the vector's heap block does not move with it
    }
    if (spec.dtype == DataType::kBytes) {
      Status status = check_bytes(tensor.data, tensor.byte_size, spec, where, elements, shape);
      if (!status.ok()) return status;
    } else {
      const uint64_t need = static_cast<uint64_t>(elements) * element_size(spec.dtype);
      if (tensor.byte_size != need) {
        return invalid(where + ": " + std::to_string(tensor.byte_size) + " bytes of data, shape " + shape_text(shape) +
                       " of " + datatype_name(spec.dtype) + " needs " + std::to_string(need));
      }
    }
    if (batch_size < 0) {
      batch_size = rows;
      first = spec.name;
    } else if (rows != batch_size) {
      return invalid("input " + quoted(spec.name) + " has batch size " + std::to_string(rows) + ", input " +
                     quoted(first) + " has " + std::to_string(batch_size));
    }
    out->inputs.push_back(std::move(tensor));
  }
  if (batch_size < 0) return invalid(model_text + ": a request must give at least one input");

  for (size_t o = 0; o < parsed.outputs.size(); ++o) {
    const WireOutput& output = parsed.outputs[o];
    auto spec = std::find_if(model.outputs.begin(), model.outputs.end(),
                             [&](const OutputSignature& s) { return s.name == output.name; });
    if (spec == model.outputs.end()) {
      std::set<std::string_view> names;
      for (const OutputSignature& s : model.outputs) names.insert(s.name);
      return invalid(model_text + " has no output " + quoted(output.name) + "; its outputs are " + names_text(names));
    }
    const auto index = static_cast<uint32_t>(spec - model.outputs.begin());
    if (std::find(out->requested_outputs.begin(), out->requested_outputs.end(), index) !=
        out->requested_outputs.end()) {
      return invalid("output " + quoted(output.name) + " already exists in request");  // Triton's words
    }
    out->requested_outputs.push_back(index);
    if (output_shm[o].present) {
      SharedMemoryOutput target;
      target.output = index;
      Status status = shared_memory_slice(shared_memory, output_shm[o], "output " + quoted(output.name), &target.slice);
      if (!status.ok()) return status;
      out->shared_memory_outputs.push_back(std::move(target));
    }
  }

  uint64_t priority = 0, timeout = 0;
  Status status = non_negative(parsed, "priority", &priority);
  if (status.ok()) status = non_negative(parsed, "timeout", &timeout);
  if (status.ok()) status = refuse_sequence(parsed);
  if (!status.ok()) return status;
  // Past 2^32 - 1 no model has the level; the batcher answers INVALID_ARGUMENT for it.
  out->priority = static_cast<uint32_t>(std::min<uint64_t>(priority, UINT32_MAX));
  out->timeout_us = timeout;
  out->batch_size = batch_size;
  out->checked = true;
  out->signature = signature;
  out->id = std::string(parsed.id);
  if (signature->keeps_parameters) out->parameters_json = parameters_json(parsed.parameters);
  return Status::Ok();
}

}  // namespace inferd
