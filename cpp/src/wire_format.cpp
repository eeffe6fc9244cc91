#include "inferd/wire_format.h"

#include <cassert>

namespace inferd {

bool WireReader::read_varint(uint64_t* value) {
  uint64_t result = 0;
  // At most 10 bytes; the 10th may carry only the top bit of a 64-bit value.
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos_ == end_) return false;
    const auto byte = std::to_integer<uint8_t>(*pos_++);
    if (shift == 63 && byte > 1) return false;
    result |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) {
      *value = result;
      return true;
    }
  }
  return false;
}

bool WireReader::read_fixed32(uint32_t* value) {
  if (remaining() < 4) return false;
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | std::to_integer<uint32_t>(pos_[i]);
  pos_ += 4;
  *value = v;
  return true;
}

bool WireReader::read_fixed64(uint64_t* value) {
  if (remaining() < 8) return false;
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<uint64_t>(pos_[i]);
  pos_ += 8;
  *value = v;
  return true;
}

bool WireReader::read_tag(uint32_t* field, WireType* type) {
  uint64_t key = 0;
  if (!read_varint(&key) || key > 0xFFFFFFFFu) return false;
  const uint64_t number = key >> 3;
  const auto wire = static_cast<uint8_t>(key & 7);
  if (number == 0 || number > 0x1FFFFFFF) return false;  // protobuf's field numbers are 1..2^29-1
  if (wire != 0 && wire != 1 && wire != 2 && wire != 5) return false;
  *field = static_cast<uint32_t>(number);
  *type = static_cast<WireType>(wire);
  return true;
}

bool WireReader::read_bytes(std::string_view* value) {
  uint64_t size = 0;
  if (!read_varint(&size) || size > remaining()) return false;
  *value = std::string_view(reinterpret_cast<const char*>(pos_), static_cast<size_t>(size));
  pos_ += size;
  return true;
}

bool WireReader::skip(WireType type) {
  uint64_t ignored = 0;
  uint32_t ignored32 = 0;
  std::string_view ignored_bytes;
  switch (type) {
    case WireType::kVarint:
      return read_varint(&ignored);
    case WireType::kFixed64:
      return read_fixed64(&ignored);
    case WireType::kFixed32:
      return read_fixed32(&ignored32);
    case WireType::kLengthDelimited:
      return read_bytes(&ignored_bytes);
  }
  return false;
}

size_t varint_size(uint64_t value) {
  size_t size = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++size;
  }
  return size;
}

void WireWriter::varint(uint64_t value) {
  assert(remaining() >= varint_size(value));
  while (value >= 0x80) {
    *pos_++ = static_cast<std::byte>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  *pos_++ = static_cast<std::byte>(value);
}

void WireWriter::raw(const void* data, size_t size) {
  assert(remaining() >= size);
  if (size > 0) std::memcpy(pos_, data, size);
  pos_ += size;
}

}  // namespace inferd
