#include "inferd/infer_response_writer.h"

#include "answer_outputs.h"
#include "inferd/shared_memory.h"
#include "inferd/wire_format.h"

namespace inferd {
namespace {

// Field numbers of grpc_service.proto.
namespace response_field {
constexpr uint32_t kModelName = 1, kModelVersion = 2, kId = 3, kParameters = 4, kOutputs = 5, kRawOutputContents = 6;
}
namespace output_field {
constexpr uint32_t kName = 1, kDatatype = 2, kShape = 3, kParameters = 4;
}
namespace map_entry_field {
constexpr uint32_t kKey = 1, kValue = 2;
}
namespace parameter_field {
constexpr uint32_t kBool = 1, kInt64 = 2, kString = 3;
}
namespace stream_field {
constexpr uint32_t kErrorMessage = 1, kInferResponse = 2;
}

// proto3 leaves empty strings out.
size_t string_field_size(uint32_t field, std::string_view value) {
  return value.empty() ? 0 : length_delimited_size(field, value.size());
}

void write_string_field(WireWriter* writer, uint32_t field, std::string_view value) {
  if (!value.empty()) writer->bytes_field(field, value);
}

// One entry of an output's parameters map: key -> InferParameter{int64_param | string_param}.
struct ParameterEntry {
  std::string_view key;
  bool is_string;
  uint64_t int64_value;
  std::string_view string_value;

  size_t value_size() const {
    return is_string ? length_delimited_size(parameter_field::kString, string_value.size())
                     : tag_size(parameter_field::kInt64) + varint_size(int64_value);
  }
  size_t entry_size() const {
    return length_delimited_size(map_entry_field::kKey, key.size()) +
           length_delimited_size(map_entry_field::kValue, value_size());
  }
  void write(WireWriter* writer) const {
    writer->length_prefix(output_field::kParameters, entry_size());
    writer->bytes_field(map_entry_field::kKey, key);
    writer->length_prefix(map_entry_field::kValue, value_size());
    if (is_string) {
      writer->bytes_field(parameter_field::kString, string_value);
    } else {
      writer->tag(parameter_field::kInt64, WireType::kVarint);
      writer->varint(int64_value);
    }
  }
};

// The response parameter `triton_final_response` (bool), as the map entry protobuf writes: key,
// then InferParameter{bool_param} (a oneof member: written even when false).
constexpr std::string_view kFinalResponseKey = "triton_final_response";
constexpr size_t kFinalValueSize = 2;  // tag and one-byte varint
size_t final_response_entry_size() {
  return length_delimited_size(map_entry_field::kKey, kFinalResponseKey.size()) +
         length_delimited_size(map_entry_field::kValue, kFinalValueSize);
}
void write_final_response(WireWriter* writer, bool value) {
  writer->length_prefix(response_field::kParameters, final_response_entry_size());
  writer->bytes_field(map_entry_field::kKey, kFinalResponseKey);
  writer->length_prefix(map_entry_field::kValue, kFinalValueSize);
  writer->tag(parameter_field::kBool, WireType::kVarint);
  writer->varint(value ? 1 : 0);
}

// The shared-memory parameters of an output written into `target`, in key order.
std::vector<ParameterEntry> shared_memory_parameters(const SharedMemoryOutput& target) {
  return {{"shared_memory_byte_size", false, target.slice.size, {}},
          {"shared_memory_offset", false, target.slice.offset, {}},
          {"shared_memory_region", true, 0, target.slice.region->description().name}};
}

}  // namespace

InferResponseWriter::InferResponseWriter(const InferenceRequest& request, Empty, bool stream, bool final_response)
    : request_(request), model_(*request.signature), stream_(stream), final_response_(final_response) {
  size_message();
}

InferResponseWriter InferResponseWriter::empty_response(const InferenceRequest& request, bool stream,
                                                        bool final_response) {
  return InferResponseWriter(request, Empty{}, stream, final_response);
}

InferResponseWriter::InferResponseWriter(const InferenceRequest& request, const std::vector<Tensor>& outputs,
                                         bool stream, std::optional<bool> final_response)
    : request_(request), model_(*request.signature), stream_(stream), final_response_(final_response) {
  std::vector<AnswerOutput> answers;
  status_ = answer_outputs(request, outputs, &answers);
  outputs_.reserve(answers.size());
  for (AnswerOutput& answer : answers) {
    Output out{answer.spec, answer.tensor, std::move(answer.shape), 0, 0, answer.shared_memory, 0};
    if (out.shared_memory != nullptr) {
      for (const ParameterEntry& entry : shared_memory_parameters(*out.shared_memory)) {
        out.parameters_bytes += length_delimited_size(output_field::kParameters, entry.entry_size());
      }
    }
    for (int64_t d : out.shape) out.shape_bytes += varint_size(static_cast<uint64_t>(d));
    out.message_bytes = string_field_size(output_field::kName, out.spec->name) +
                        string_field_size(output_field::kDatatype, datatype_name(out.spec->dtype)) +
                        (out.shape.empty() ? 0 : length_delimited_size(output_field::kShape, out.shape_bytes)) +
                        out.parameters_bytes;
    outputs_.push_back(std::move(out));
  }
  size_message();
}

void InferResponseWriter::size_message() {
  message_size_ = string_field_size(response_field::kModelName, model_.name) +
                  string_field_size(response_field::kModelVersion, model_.version) +
                  string_field_size(response_field::kId, request_.id);
  if (final_response_) message_size_ += length_delimited_size(response_field::kParameters, final_response_entry_size());
  for (const Output& o : outputs_) {
    message_size_ += length_delimited_size(response_field::kOutputs, o.message_bytes);
    // Outputs always travel raw (tritonclient reads only raw_output_contents), even when empty;
    // one in shared memory has an empty entry.
    const size_t raw_bytes = o.shared_memory != nullptr ? 0 : o.tensor->byte_size;
    message_size_ += length_delimited_size(response_field::kRawOutputContents, raw_bytes);
    data_bytes_ += raw_bytes;
  }
  total_size_ = stream_ ? length_delimited_size(stream_field::kInferResponse, message_size_) : message_size_;
}

void InferResponseWriter::write(std::byte* out) const {
  WireWriter writer(out, total_size_);
  if (stream_) writer.length_prefix(stream_field::kInferResponse, message_size_);
  write_string_field(&writer, response_field::kModelName, model_.name);
  write_string_field(&writer, response_field::kModelVersion, model_.version);
  write_string_field(&writer, response_field::kId, request_.id);
  if (final_response_) write_final_response(&writer, *final_response_);
  for (const Output& o : outputs_) {
    writer.length_prefix(response_field::kOutputs, o.message_bytes);
    write_string_field(&writer, output_field::kName, o.spec->name);
    write_string_field(&writer, output_field::kDatatype, datatype_name(o.spec->dtype));
    if (!o.shape.empty()) {
      writer.length_prefix(output_field::kShape, o.shape_bytes);
      for (int64_t d : o.shape) writer.varint(static_cast<uint64_t>(d));
    }
    if (o.shared_memory != nullptr) {
      for (const ParameterEntry& entry : shared_memory_parameters(*o.shared_memory)) entry.write(&writer);
    }
  }
  for (const Output& o : outputs_) {
    const size_t raw_bytes = o.shared_memory != nullptr ? 0 : o.tensor->byte_size;
    writer.length_prefix(response_field::kRawOutputContents, raw_bytes);
    writer.raw(o.tensor->data, raw_bytes);
  }
}

std::string stream_error_response(std::string_view message, std::string_view id, std::optional<bool> final_response) {
  const size_t inner =
      string_field_size(response_field::kId, id) +
      (final_response ? length_delimited_size(response_field::kParameters, final_response_entry_size()) : 0);
  const size_t size = string_field_size(stream_field::kErrorMessage, message) +
                      length_delimited_size(stream_field::kInferResponse, inner);
  std::string out(size, '\0');
  WireWriter writer(reinterpret_cast<std::byte*>(out.data()), out.size());
  write_string_field(&writer, stream_field::kErrorMessage, message);
  writer.length_prefix(stream_field::kInferResponse, inner);
  write_string_field(&writer, response_field::kId, id);
  if (final_response) write_final_response(&writer, *final_response);
  return out;
}

std::string final_response_parameter(bool last) {
  std::string out(length_delimited_size(response_field::kParameters, final_response_entry_size()), '\0');
  WireWriter writer(reinterpret_cast<std::byte*>(out.data()), out.size());
  write_final_response(&writer, last);
  return out;
}

}  // namespace inferd
