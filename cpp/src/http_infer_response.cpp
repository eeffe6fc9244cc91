// Encoding the answer of a computed request as Triton's HTTP/REST inference response (KServe v2
// JSON with Triton's binary tensor extension), and Triton's JSON error body. Which outputs an
// answer carries, in which shape, and the shared-memory writes are answer_outputs', shared with
// InferResponseWriter (gRPC); only the JSON is written here, by RapidJSON's Writer.
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <charconv>
#include <cmath>
#include <cstring>

#include "answer_outputs.h"
#include "inferd/datatype_names.h"
#include "inferd/http_infer_codec.h"

namespace inferd {
namespace {

// NaN and infinities are written as NaN, Infinity and -Infinity (what Python's json reads).
using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                                     rapidjson::CrtAllocator, rapidjson::kWriteNanAndInfFlag>;

void key(JsonWriter* writer, std::string_view name) {
  writer->Key(name.data(), static_cast<rapidjson::SizeType>(name.size()));
}

void string(JsonWriter* writer, std::string_view text) {
  writer->String(text.data(), static_cast<rapidjson::SizeType>(text.size()));
}

template <typename T>
T read(const std::byte* data, size_t index) {
  T value;
  // The tensor may be a view into a batch buffer at any offset: read unaligned.
  std::memcpy(&value, data + index * sizeof(T), sizeof(T));
  return value;
}

// A float or double, shortest round-trip (std::to_chars), as a JSON number.
template <typename T>
void number(JsonWriter* writer, T value) {
  if (!std::isfinite(value)) {
    writer->Double(static_cast<double>(value));  // NaN, Infinity, -Infinity
    return;
  }
  if (value == 0 && std::signbit(value)) {
    writer->RawValue("-0.0", 4, rapidjson::kNumberType);  // "-0" would read back as the integer 0
    return;
  }
  char text[64];
  const auto result = std::to_chars(text, text + sizeof text, value);
  writer->RawValue(text, static_cast<size_t>(result.ptr - text), rapidjson::kNumberType);
}

// Checks that a BYTES output's length-prefixed elements are `elements` UTF-8 strings filling it.
Status check_bytes_output(const AnswerOutput& output, int64_t elements, const std::string& where) {
  const std::byte* data = output.tensor->data;
  const size_t size = output.tensor->byte_size;
  size_t pos = 0;
  int64_t e = 0;
  for (; e < elements; ++e) {
    uint32_t len = 0;
    if (size - pos < 4) break;
    std::memcpy(&len, data + pos, 4);
    if (size - pos - 4 < len) break;
    if (!is_valid_utf8(std::string_view(reinterpret_cast<const char*>(data + pos + 4), len))) {
      return Status::Error(StatusCode::kInvalidArgument,
                           where + " element " + std::to_string(e) +
                               " is not UTF-8 text, which JSON cannot carry; ask for the output in binary "
                               "(the 'binary_data' parameter)");
    }
    pos += 4 + static_cast<size_t>(len);
  }
  if (e != elements || pos != size) {
    return Status::Error(StatusCode::kInternal,
                         where + " holds " + std::to_string(size) + " bytes, not the BYTES elements of its shape");
  }
  return Status::Ok();
}

// An output's `data`: its elements as JSON values, flat, row-major.
Status write_data(JsonWriter* writer, const AnswerOutput& output, const std::string& where) {
  const DataType dtype = output.spec->dtype;
  if (dtype == DataType::kFp16 || dtype == DataType::kBf16) {
    // Triton's rule and words (WriteDataToJson).
    return Status::Error(StatusCode::kInvalidArgument, std::string("sending ") + datatype_name(dtype) +
                                                           " data via JSON is not supported; ask for " + where +
                                                           " in binary (the 'binary_data' parameter)");
  }
  const int64_t elements = element_count(output.shape);
  if (elements < 0) return Status::Error(StatusCode::kInternal, where + " has a shape without an element count");
  const std::byte* data = output.tensor->data;
  const auto n = static_cast<size_t>(elements);
  if (dtype == DataType::kBytes) {
    Status status = check_bytes_output(output, elements, where);
    if (!status.ok()) return status;
  } else if (output.tensor->byte_size / element_size(dtype) != n ||
             output.tensor->byte_size % element_size(dtype) != 0) {
    return Status::Error(StatusCode::kInternal, where + " holds " + std::to_string(output.tensor->byte_size) +
                                                    " bytes, which do not fit its shape");
  }
  writer->StartArray();
  size_t pos = 0;
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DataType::kBool:
        writer->Bool(read<uint8_t>(data, i) != 0);
        break;
      case DataType::kUint8:
        writer->Uint(read<uint8_t>(data, i));
        break;
      case DataType::kUint16:
        writer->Uint(read<uint16_t>(data, i));
        break;
      case DataType::kUint32:
        writer->Uint(read<uint32_t>(data, i));
        break;
      case DataType::kUint64:
        writer->Uint64(read<uint64_t>(data, i));
        break;
      case DataType::kInt8:
        writer->Int(read<int8_t>(data, i));
        break;
      case DataType::kInt16:
        writer->Int(read<int16_t>(data, i));
        break;
      case DataType::kInt32:
        writer->Int(read<int32_t>(data, i));
        break;
      case DataType::kInt64:
        writer->Int64(read<int64_t>(data, i));
        break;
      case DataType::kFp32:
        number(writer, read<float>(data, i));
        break;
      case DataType::kFp64:
        number(writer, read<double>(data, i));
        break;
      case DataType::kBytes: {
        uint32_t len = 0;
        std::memcpy(&len, data + pos, 4);  // walked by check_bytes_output
        writer->String(reinterpret_cast<const char*>(data + pos + 4), len);
        pos += 4 + static_cast<size_t>(len);
        break;
      }
      case DataType::kFp16:
      case DataType::kBf16:
        break;
    }
  }
  writer->EndArray();
  return Status::Ok();
}

// `text` with every byte that does not begin a well-formed UTF-8 sequence replaced by U+FFFD.
std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t n = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    if (n != 0 && text.size() - i >= n && is_valid_utf8(text.substr(i, n))) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace

Status encode_http_infer_response(const InferenceRequest& request, const std::vector<Tensor>& outputs,
                                  const HttpAnswerFormat& format, std::string* out, size_t* json_length,
                                  std::optional<bool> final_response) {
  std::vector<AnswerOutput> answers;
  Status status = answer_outputs(request, outputs, &answers);
  if (!status.ok()) return status;
  const ModelSignature& model = *request.signature;
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  writer.StartObject();
  key(&writer, "model_name");
  string(&writer, model.name);
  key(&writer, "model_version");
  string(&writer, model.version);
  if (!request.id.empty()) {
    key(&writer, "id");
    string(&writer, request.id);
  }
  if (final_response) {
    key(&writer, "parameters");
    writer.StartObject();
    key(&writer, "triton_final_response");
    writer.Bool(*final_response);
    writer.EndObject();
  }
  key(&writer, "outputs");
  writer.StartArray();
  std::vector<const Tensor*> binary;
  size_t binary_bytes = 0;
  for (const AnswerOutput& output : answers) {
    writer.StartObject();
    key(&writer, "name");
    string(&writer, output.spec->name);
    key(&writer, "datatype");
    writer.String(datatype_name(output.spec->dtype));
    key(&writer, "shape");
    writer.StartArray();
    for (int64_t d : output.shape) writer.Int64(d);
    writer.EndArray();
    if (output.shared_memory != nullptr) {
      // Written into the client's slice: the answer names the slice, as the request did.
      const SharedMemorySlice& slice = output.shared_memory->slice;
      key(&writer, "parameters");
      writer.StartObject();
      key(&writer, "shared_memory_region");
      string(&writer, slice.region->description().name);
      key(&writer, "shared_memory_byte_size");
      writer.Uint64(slice.size);
      key(&writer, "shared_memory_offset");
      writer.Uint64(slice.offset);
      writer.EndObject();
    } else if (format.binary(output.spec->name)) {
      key(&writer, "parameters");
      writer.StartObject();
      key(&writer, "binary_data_size");
      writer.Uint64(output.tensor->byte_size);
      writer.EndObject();
      binary.push_back(output.tensor);
      binary_bytes += output.tensor->byte_size;
    } else {
      key(&writer, "data");
      status = write_data(&writer, output, "output '" + output.spec->name + "' of model '" + model.name + "'");
      if (!status.ok()) return status;
    }
    writer.EndObject();
  }
  writer.EndArray();
  writer.EndObject();
  std::string answer;
  answer.reserve(buffer.GetSize() + binary_bytes);
  answer.append(buffer.GetString(), buffer.GetSize());
  for (const Tensor* tensor : binary) answer.append(reinterpret_cast<const char*>(tensor->data), tensor->byte_size);
  *json_length = buffer.GetSize();
  *out = std::move(answer);
  return Status::Ok();
}

std::string http_error_body(std::string_view message) {
  const std::string text = valid_utf8(message);
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> writer(buffer);
  writer.StartObject();
  writer.Key("error");
  writer.String(text.data(), static_cast<rapidjson::SizeType>(text.size()));
  writer.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
}

}  // namespace inferd
