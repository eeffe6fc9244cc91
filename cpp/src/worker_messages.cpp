#include "inferd/worker_messages.h"

#include <cstring>
#include <limits>

namespace inferd::worker {
namespace {

constexpr uint32_t kMaxDims = 64;

// Reads a description front to back; any read past the end leaves it failed (and every later read
// a zero), so a decoder checks once per record.
class DescriptionReader {
 public:
  explicit DescriptionReader(std::string_view bytes) : bytes_(bytes) {}

  bool failed() const { return failed_; }
  bool at_end() const { return position_ == bytes_.size(); }

  uint32_t u32() { return fixed<uint32_t>(); }
  uint64_t u64() { return fixed<uint64_t>(); }
  std::string_view text() {
    const uint32_t size = u32();
    if (failed_ || size > bytes_.size() - position_) return fail_view();
    std::string_view value = bytes_.substr(position_, size);
    position_ += size;
    return value;
  }

 private:
  template <typename T>
  T fixed() {
    if (failed_ || bytes_.size() - position_ < sizeof(T)) {
      failed_ = true;
      return 0;
    }
    T value;
    std::memcpy(&value, bytes_.data() + position_, sizeof(T));
    position_ += sizeof(T);
    return value;
  }
  std::string_view fail_view() {
    failed_ = true;
    return {};
  }

  std::string_view bytes_;
  size_t position_ = 0;
  bool failed_ = false;
};

Status corrupt(const std::string& what) {
  return Status::Error(StatusCode::kInternal, "a corrupt description on the worker ring: " + what);
}

Status read_tensor(DescriptionReader* reader, size_t arena_size, TensorPlace* place) {
  place->name = reader->text();
  const uint32_t dtype = reader->u32();
  const uint32_t ndim = reader->u32();
  if (reader->failed()) return corrupt("truncated");
  if (!is_valid_datatype(static_cast<int>(dtype))) return corrupt("datatype " + std::to_string(dtype));
  if (ndim > kMaxDims) return corrupt(std::to_string(ndim) + " dims");
  place->dtype = static_cast<DataType>(dtype);
  place->shape.clear();
  for (uint32_t i = 0; i < ndim; ++i) {
    const auto dim = static_cast<int64_t>(reader->u64());
    if (dim < 0) return corrupt("a negative dim");
    place->shape.push_back(dim);
  }
  place->offset = reader->u64();
  place->nbytes = reader->u64();
  if (reader->failed()) return corrupt("truncated");
  if (place->offset > arena_size || place->nbytes > arena_size - place->offset) {
    return corrupt("tensor '" + std::string(place->name) + "' lies outside its arena");
  }
  const int64_t count = element_count(place->shape);
  if (count < 0) return corrupt("tensor '" + std::string(place->name) + "' has too many elements");
  const size_t width = element_size(place->dtype);
  if (width != 0 && (static_cast<uint64_t>(count) > std::numeric_limits<uint64_t>::max() / width ||
                     static_cast<uint64_t>(count) * width != place->nbytes)) {
    return corrupt("tensor '" + std::string(place->name) + "' has " + std::to_string(place->nbytes) +
                   " bytes for its shape");
  }
  return Status::Ok();
}

// A list of names: a count, then each.
std::vector<std::string_view> read_names(DescriptionReader* reader) {
  std::vector<std::string_view> names;
  const uint32_t count = reader->u32();
  for (uint32_t k = 0; k < count && !reader->failed(); ++k) names.push_back(reader->text());
  return names;
}

Status read_tensors(DescriptionReader* reader, size_t arena_size, std::vector<TensorPlace>* places) {
  const uint32_t count = reader->u32();
  if (reader->failed()) return corrupt("truncated");
  for (uint32_t k = 0; k < count; ++k) {
    TensorPlace place;
    Status status = read_tensor(reader, arena_size, &place);
    if (!status.ok()) return status;
    places->push_back(std::move(place));
  }
  return Status::Ok();
}

void write_names(DescriptionWriter* writer, const std::vector<std::string_view>& names) {
  writer->u32(static_cast<uint32_t>(names.size()));
  for (std::string_view name : names) writer->text(name);
}

void write_tensors(DescriptionWriter* writer, const std::vector<TensorPlace>& places) {
  writer->u32(static_cast<uint32_t>(places.size()));
  for (const TensorPlace& place : places) writer->tensor(place);
}

}  // namespace

void DescriptionWriter::u32(uint32_t value) { bytes_.append(reinterpret_cast<const char*>(&value), sizeof value); }

void DescriptionWriter::u64(uint64_t value) { bytes_.append(reinterpret_cast<const char*>(&value), sizeof value); }

void DescriptionWriter::text(std::string_view value) {
  u32(static_cast<uint32_t>(value.size()));
  bytes_.append(value);
}

void DescriptionWriter::tensor(const TensorPlace& place) {
  text(place.name);
  u32(static_cast<uint32_t>(place.dtype));
  u32(static_cast<uint32_t>(place.shape.size()));
  for (int64_t dim : place.shape) u64(static_cast<uint64_t>(dim));
  u64(place.offset);
  u64(place.nbytes);
}

std::string encode_batch(const BatchDescription& batch) {
  DescriptionWriter writer;
  writer.u64(batch.cancel_offset);
  writer.u32(static_cast<uint32_t>(batch.requests.size()));
  for (const RequestDescription& request : batch.requests) {
    writer.text(request.id);
    writer.text(request.parameters);
    writer.u64(request.correlation_id);
    writer.text(request.correlation_string);
    writer.u32(request.flags);
    write_names(&writer, request.requested_outputs);
    write_tensors(&writer, request.inputs);
  }
  return writer.bytes();
}

std::string encode_responses(const std::vector<ResponseDescription>& responses) {
  DescriptionWriter writer;
  writer.u32(static_cast<uint32_t>(responses.size()));
  for (const ResponseDescription& response : responses) {
    writer.u32(!response.ok ? 0 : response.rescheduled ? 2 : 1);  // its kind: error, response, rescheduled
    if (!response.ok) {
      writer.text(response.error);
      continue;
    }
    write_tensors(&writer, response.outputs);
  }
  return writer.bytes();
}

Status decode_batch(std::string_view bytes, size_t arena_size, BatchDescription* batch) {
  DescriptionReader reader(bytes);
  batch->cancel_offset = reader.u64();
  const uint32_t count = reader.u32();
  if (reader.failed()) return corrupt("truncated");
  if (batch->cancel_offset > arena_size || count > arena_size - batch->cancel_offset) {
    return corrupt("the cancellation flags lie outside the arena");
  }
  batch->requests.clear();
  for (uint32_t i = 0; i < count; ++i) {
    RequestDescription request;
    request.id = reader.text();
    request.parameters = reader.text();
    request.correlation_id = reader.u64();
    request.correlation_string = reader.text();
    request.flags = reader.u32();
    request.requested_outputs = read_names(&reader);
    Status status = read_tensors(&reader, arena_size, &request.inputs);
    if (!status.ok()) return status;
    batch->requests.push_back(std::move(request));
  }
  if (!reader.at_end()) return corrupt("bytes after the last request");
  return Status::Ok();
}

Status decode_responses(std::string_view bytes, size_t arena_size, std::vector<ResponseDescription>* responses) {
  DescriptionReader reader(bytes);
  const uint32_t count = reader.u32();
  if (reader.failed()) return corrupt("truncated");
  responses->clear();
  for (uint32_t i = 0; i < count; ++i) {
    ResponseDescription response;
    const uint32_t kind = reader.u32();
    response.ok = kind == 1 || kind == 2;
    response.rescheduled = kind == 2;
    if (!response.ok) {
      response.error = reader.text();
      if (reader.failed()) return corrupt("truncated");
      responses->push_back(std::move(response));
      continue;
    }
    Status status = read_tensors(&reader, arena_size, &response.outputs);
    if (!status.ok()) return status;
    responses->push_back(std::move(response));
  }
  if (!reader.at_end()) return corrupt("bytes after the last response");
  return Status::Ok();
}

std::string encode_call(const CallDescription& call) {
  DescriptionWriter writer;
  writer.text(call.model);
  writer.u64(static_cast<uint64_t>(call.version));
  writer.text(call.id);
  writer.u32(static_cast<uint32_t>(call.parameters.size()));
  for (const CallParameter& parameter : call.parameters) {
    writer.text(parameter.key);
    writer.u32(static_cast<uint32_t>(parameter.kind));
    if (parameter.kind == CallParameter::Kind::kString) {
      writer.text(parameter.text);
    } else {
      writer.u64(static_cast<uint64_t>(parameter.number));
    }
  }
  write_names(&writer, call.chain);
  write_names(&writer, call.requested_outputs);
  writer.u64(call.timeout_us);
  write_tensors(&writer, call.inputs);
  return writer.bytes();
}

std::string encode_call_answer(const CallAnswerDescription& answer) {
  DescriptionWriter writer;
  writer.u32(static_cast<uint32_t>(answer.code));
  writer.text(answer.error);
  write_tensors(&writer, answer.outputs);
  return writer.bytes();
}

Status decode_call(std::string_view bytes, size_t arena_size, CallDescription* call) {
  DescriptionReader reader(bytes);
  call->model = reader.text();
  call->version = static_cast<int64_t>(reader.u64());
  call->id = reader.text();
  const uint32_t parameters = reader.u32();
  if (reader.failed()) return corrupt("truncated");
  call->parameters.clear();
  for (uint32_t k = 0; k < parameters && !reader.failed(); ++k) {
    CallParameter parameter;
    parameter.key = reader.text();
    const uint32_t kind = reader.u32();
    if (kind == static_cast<uint32_t>(CallParameter::Kind::kString)) {
      parameter.text = reader.text();
    } else if (kind == static_cast<uint32_t>(CallParameter::Kind::kBool) ||
               kind == static_cast<uint32_t>(CallParameter::Kind::kInt64)) {
      parameter.number = static_cast<int64_t>(reader.u64());
    } else if (!reader.failed()) {
      return corrupt("parameter kind " + std::to_string(kind));
    }
    parameter.kind = static_cast<CallParameter::Kind>(kind);
    call->parameters.push_back(parameter);
  }
  call->chain = read_names(&reader);
  call->requested_outputs = read_names(&reader);
  call->timeout_us = reader.u64();
  if (reader.failed()) return corrupt("truncated");
  call->inputs.clear();
  Status status = read_tensors(&reader, arena_size, &call->inputs);
  if (!status.ok()) return status;
  if (!reader.at_end()) return corrupt("bytes after the call's last input");
  return Status::Ok();
}

Status decode_call_answer(std::string_view bytes, size_t arena_size, CallAnswerDescription* answer) {
  DescriptionReader reader(bytes);
  const uint32_t code = reader.u32();
  answer->error = reader.text();
  if (reader.failed()) return corrupt("truncated");
  if (code > static_cast<uint32_t>(StatusCode::kPermissionDenied))
    return corrupt("status code " + std::to_string(code));
  answer->code = static_cast<StatusCode>(code);
  answer->outputs.clear();
  Status status = read_tensors(&reader, arena_size, &answer->outputs);
  if (!status.ok()) return status;
  if (!reader.at_end()) return corrupt("bytes after the answer's last output");
  return Status::Ok();
}

}  // namespace inferd::worker
