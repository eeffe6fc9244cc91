// build_inference_request on inputs given as typed contents (InferTensorContents), decoded by
// typed_contents.cpp: every datatype, values out of range, the wrong field or count, malformed runs.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "inferd/model_signature.h"
#include "request_bytes.h"

namespace inferd {
namespace {

using namespace request_bytes;  // the request path's tests' helpers (request_bytes.h)

// --- typed contents, decoded against the model ---------------------------------------------------

struct TypedCase {
  const char* datatype;
  std::string contents;  // InferTensorContents
  std::string expected;  // the tensor's little-endian bytes
};

TEST(TypedContents, TypedContentsOfEveryDatatype) {
  float f[2] = {1.5f, -2.0f};
  double g[2] = {2.5, -1e300};
  uint32_t fb[2];
  uint64_t gb[2];
  std::memcpy(fb, f, sizeof f);
  std::memcpy(gb, g, sizeof g);
  const std::vector<TypedCase> cases = {
      {"BOOL", ld(1, varint(1) + varint(0)), std::string("\x01\x00", 2)},
      {"INT8", ld(2, svarint(-128) + varint(127)), std::string("\x80\x7f", 2)},
      {"INT16", ld(2, svarint(-32768) + varint(32767)), std::string("\x00\x80\xff\x7f", 4)},
      {"INT32", ld(2, svarint(-2) + varint(0x7fffffff)), le32(0xfffffffe) + le32(0x7fffffff)},
      {"INT64", ld(3, svarint(-3) + varint(uint64_t{1} << 40)),
       le64(static_cast<uint64_t>(-3)) + le64(uint64_t{1} << 40)},
      {"UINT8", ld(4, varint(0) + varint(255)), std::string("\x00\xff", 2)},
      {"UINT16", ld(4, varint(1) + varint(65535)), std::string("\x01\x00\xff\xff", 4)},
      {"UINT32", ld(4, varint(7) + varint(0xffffffff)), le32(7) + le32(0xffffffff)},
      {"UINT64", ld(5, varint(8) + varint(~uint64_t{0})), le64(8) + le64(~uint64_t{0})},
      {"FP32", ld(6, le32(fb[0]) + le32(fb[1])), le32(fb[0]) + le32(fb[1])},
      {"FP64", ld(7, le64(gb[0]) + le64(gb[1])), le64(gb[0]) + le64(gb[1])},
      {"BYTES", ld(8, "hi") + ld(8, ""), le32(2) + "hi" + le32(0)},
      // Unpacked values and a packed run split in two decode the same.
      {"INT32", vfield(2, 5) + ld(2, varint(6)), le32(5) + le32(6)},
      {"FP32", key(6, 5) + le32(fb[0]) + key(6, 5) + le32(fb[1]), le32(fb[0]) + le32(fb[1])},
      {"FP64", key(7, 1) + le64(gb[0]) + ld(7, le64(gb[1])), le64(gb[0]) + le64(gb[1])},
      {"BOOL", vfield(1, 1) + vfield(1, 0), std::string("\x01\x00", 2)},
  };
  const auto model = all_types_model();
  for (const TypedCase& c : cases) {
    SCOPED_TRACE(c.datatype);
    auto b = build(model, ld(1, "all_types") + ld(5, input(c.datatype, c.datatype, {1, 2}, ld(5, c.contents))));
    ASSERT_TRUE(b->status.ok()) << b->status.message;
    DataType dtype{};
    ASSERT_TRUE(datatype_from_name(c.datatype, &dtype));
    const Tensor& t = b->request.inputs.at(static_cast<size_t>(dtype) - 1);
    EXPECT_FALSE(t.absent);
    EXPECT_EQ(t.shape, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(bytes_of(t), c.expected);
    EXPECT_EQ(b->request.batch_size, 1);
  }
}

TEST(TypedContents, TypedContentsOutOfRangeAreRefused) {
  const auto model = all_types_model();
  const std::vector<std::pair<const char*, std::string>> cases = {
      {"INT8", ld(2, varint(128))},  {"INT8", ld(2, svarint(-129))},   {"INT16", ld(2, varint(32768))},
      {"UINT8", ld(4, varint(256))}, {"UINT16", ld(4, varint(65536))}, {"UINT16", vfield(4, 70000)},
  };
  for (const auto& [datatype, contents] : cases) {
    SCOPED_TRACE(datatype);
    auto b = build(model, ld(5, input(datatype, datatype, {1, 1}, ld(5, contents))));
    EXPECT_EQ(b->status.code, StatusCode::kInvalidArgument);
    EXPECT_NE(b->status.message.find("out of range"), std::string::npos) << b->status.message;
  }
}

TEST(TypedContents, TypedContentsMustMatchTheDatatypeAndCount) {
  const auto model = all_types_model();
  auto refused = [&](const std::string& in) { return !build(model, ld(5, in))->status.ok(); };
  EXPECT_TRUE(refused(input("INT32", "INT32", {1, 2}, ld(5, ld(3, varint(1) + varint(2))))));  // int64_contents
  EXPECT_TRUE(refused(input("INT32", "INT32", {1, 2}, ld(5, ld(2, varint(1))))));              // one value short
  EXPECT_TRUE(refused(input("FP32", "FP32", {1, 1}, ld(5, ld(6, "abc")))));                    // not 4 bytes a value
  EXPECT_TRUE(refused(input("FP32", "FP32", {1, 1}, ld(5, key(6, 1) + le64(0)))));             // fixed64 for fp32
  EXPECT_TRUE(refused(input("INT32", "INT32", {1, 1}, ld(5, ld(2, "\x80")))));                 // a varint cut off
  EXPECT_TRUE(refused(input("FP16", "FP16", {1, 1}, ld(5, ld(6, le32(0))))));                  // FP16: raw only
  EXPECT_TRUE(refused(input("BF16", "BF16", {1, 1}, ld(5, ""))));
  EXPECT_TRUE(refused(input("BYTES", "BYTES", {1, 1}, ld(5, ld(8, "\xff")))));     // not UTF-8
  EXPECT_TRUE(refused(input("INT32", "FP32", {1, 1}, ld(5, ld(6, le32(0))))));     // wrong datatype
  EXPECT_TRUE(refused(input("INT32", "INT33", {1, 1}, ld(5, ld(2, varint(0))))));  // unknown datatype
}

// A packed int_contents run holding one varint of eleven bytes is malformed, not one value and a
// half (found by the fuzzer: cpp/fuzz/corpus/crash-overlong-packed-varint).
TEST(TypedContents, OverlongPackedVarintIsRefused) {
  const auto model = all_types_model();
  auto b = build(model, ld(5, input("INT8", "INT8", {1, 1}, ld(5, ld(2, std::string(10, '\x80') + '\0')))));
  EXPECT_EQ(b->status.code, StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace inferd
