#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace inferd {

// The protobuf wire format, as far as inferd's messages need it: varints, fixed 32/64-bit values
// and length-delimited fields (https://protobuf.dev/programming-guides/encoding/). Groups (wire
// types 3 and 4) are refused: no message of the protocol has them.
enum class WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// A bounds-checked cursor over one message's bytes. Every read checks the bytes left before it
// touches them, and a length is compared with what is left before anything is sized by it: a
// reader never reads past `end` and never allocates. Not thread-safe (a cursor); never blocks.
// The viewed bytes must outlive the reader and every view it returns.
class WireReader {
 public:
  WireReader(const std::byte* data, size_t size) : pos_(data), end_(data + size) {}
  explicit WireReader(std::string_view bytes)
      : WireReader(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()) {}

  bool done() const { return pos_ == end_; }
  size_t remaining() const { return static_cast<size_t>(end_ - pos_); }

  // Each returns false (and leaves the reader in an unspecified position) on malformed input.
  bool read_varint(uint64_t* value);
  bool read_fixed32(uint32_t* value);
  bool read_fixed64(uint64_t* value);
  // A field's key. Refuses field number 0 and wire types other than the four above.
  bool read_tag(uint32_t* field, WireType* type);
  // A length-delimited payload, as a view of the reader's bytes.
  bool read_bytes(std::string_view* value);
  // Skips one value of `type` (for fields inferd does not know: protobuf's forward compatibility).
  bool skip(WireType type);

 private:
  const std::byte* pos_;
  const std::byte* end_;
};

// Sizes of the encoded forms, for writing a message into a buffer of exactly the right size.
size_t varint_size(uint64_t value);
inline size_t tag_size(uint32_t field) { return varint_size(static_cast<uint64_t>(field) << 3); }
// A length-delimited field (tag, length, payload) with a payload of `size` bytes.
inline size_t length_delimited_size(uint32_t field, size_t size) { return tag_size(field) + varint_size(size) + size; }

// Writes into a buffer the caller sized with the functions above. Not thread-safe; never blocks.
// Writing past the end is a programming error: checked with assert in debug builds.
class WireWriter {
 public:
  WireWriter(std::byte* data, size_t size) : pos_(data), end_(data + size) {}

  void varint(uint64_t value);
  void tag(uint32_t field, WireType type) { varint((static_cast<uint64_t>(field) << 3) | static_cast<uint8_t>(type)); }
  // Tag and length of a length-delimited field whose payload the caller writes next.
  void length_prefix(uint32_t field, size_t size) {
    tag(field, WireType::kLengthDelimited);
    varint(size);
  }
  void raw(const void* data, size_t size);
  // A whole length-delimited field.
  void bytes_field(uint32_t field, std::string_view value) {
    length_prefix(field, value.size());
    raw(value.data(), value.size());
  }
  // What is left to write; 0 once the message is complete.
  size_t remaining() const { return static_cast<size_t>(end_ - pos_); }

 private:
  std::byte* pos_;
  std::byte* end_;
};

}  // namespace inferd
