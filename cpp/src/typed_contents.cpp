#include "inferd/typed_contents.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "inferd/datatype_names.h"
#include "request_messages.h"

namespace inferd {
namespace {

using request_messages::invalid;
using request_messages::quoted;
using request_messages::shape_text;

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

// Stores one typed value, `raw` as the wire gave it, as element `index` of `data` in `dtype`'s
// little-endian form; INVALID_ARGUMENT when it does not fit a narrow integer type.
Status store_value(DataType dtype, uint64_t raw, const std::string& where, std::byte* data, size_t index) {
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
        return invalid(where + ": int_contents does not fit " + datatype_name(dtype) + ": value " + std::to_string(v) +
                       " is out of range");
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
        return invalid(where + ": uint_contents does not fit " + datatype_name(dtype) + ": value " + std::to_string(v) +
                       " is out of range");
      }
      if (dtype == DataType::kUint8) store<uint8_t>(data, index, static_cast<uint8_t>(v));
      if (dtype == DataType::kUint16) store<uint16_t>(data, index, static_cast<uint16_t>(v));
      if (dtype == DataType::kUint32) store<uint32_t>(data, index, v);
      break;
    }
    case DataType::kFp16:
    case DataType::kBf16:
    case DataType::kBytes:
      break;  // no scalar values: FP16 and BF16 have no field, BYTES elements are decode_values'
  }
  return Status::Ok();
}

// Decodes the typed values of `field` into `out` (count * element size bytes, or BYTES' serialized
// form), sized by count_values over the same chunks.
Status decode_values(const std::vector<ContentsChunk>& chunks, uint32_t field, DataType dtype, const std::string& where,
                     std::vector<std::byte>* out) {
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
  size_t index = 0;
  auto scalar = [&](uint64_t raw) { return (status = store_value(dtype, raw, where, out->data(), index++)).ok(); };
  for (const ContentsChunk& chunk : chunks) {
    if (chunk.field == field && !for_each_value(chunk, scalar, element) && status.ok()) {
      status = invalid(where + ": " + contents_field_name(field) + " is malformed");  // not after counting
    }
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

}  // namespace

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

Status typed_contents(const WireInput& input, DataType dtype, const std::string& where, int64_t elements,
                      const std::vector<int64_t>& shape, std::vector<std::byte>* buffer) {
  const uint32_t field = contents_field(dtype);
  if (field == 0) {
    return invalid("input " + quoted(input.name) + ": " + datatype_name(dtype) +
                   " has no typed contents field; send it in raw_input_contents");
  }
  for (const ContentsChunk& chunk : input.contents) {
    if (chunk.field != field) {
      return invalid(where + ": " + datatype_name(dtype) + " takes its typed contents in " +
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
  const size_t size = dtype == DataType::kBytes ? element_bytes + 4 * static_cast<size_t>(count)
                                                : static_cast<size_t>(count) * element_size(dtype);
  buffer->resize(size);
  return decode_values(input.contents, field, dtype, where, buffer);
}

}  // namespace inferd
