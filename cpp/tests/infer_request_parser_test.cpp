// The request path on hand-built wire bytes: parse_infer_request (the wire format),
// build_inference_request (what the values mean, against a model) and the response writer.
#include "inferd/infer_request_parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferd/infer_response_writer.h"
#include "inferd/model_signature.h"
#include "inferd/wire_format.h"

namespace inferd {
namespace {

// --- wire bytes by hand ------------------------------------------------------------------------

std::string varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
  return out;
}
std::string key(uint32_t field, int wire_type) {
  return varint((uint64_t{field} << 3) | static_cast<uint64_t>(wire_type));
}
std::string ld(uint32_t field, const std::string& payload) { return key(field, 2) + varint(payload.size()) + payload; }
std::string vfield(uint32_t field, uint64_t v) { return key(field, 0) + varint(v); }
std::string le32(uint32_t v) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}
std::string le64(uint64_t v) { return le32(static_cast<uint32_t>(v)) + le32(static_cast<uint32_t>(v >> 32)); }
// A negative int32/int64 as protobuf writes it: sign-extended to ten bytes.
std::string svarint(int64_t v) { return varint(static_cast<uint64_t>(v)); }

// Unknown fields of every wire type.
const std::string kUnknown = vfield(99, 7) + key(100, 1) + le64(1) + key(101, 5) + le32(2) + ld(102, "later");

// ModelInferRequest.InferInputTensor: name, datatype, packed shape, then `rest`.
std::string input(const std::string& name, const std::string& datatype, const std::vector<int64_t>& shape,
                  const std::string& rest = "") {
  std::string packed;
  for (int64_t d : shape) packed += svarint(d);
  return ld(1, name) + ld(2, datatype) + ld(3, packed) + rest;
}
// A map<string, InferParameter> entry.
std::string parameter(uint32_t field, const std::string& name, const std::string& value) {
  return ld(field, ld(1, name) + ld(2, value));
}

// A request's bytes and what parse_infer_request made of them (views of those bytes: on the heap,
// so that they never move).
struct Parsed {
  std::string bytes;
  ParsedInferRequest request;
  Status status;
};
std::unique_ptr<Parsed> parse(std::string bytes) {
  auto p = std::make_unique<Parsed>();
  p->bytes = std::move(bytes);
  p->status = parse_infer_request(reinterpret_cast<const std::byte*>(p->bytes.data()), p->bytes.size(), &p->request);
  return p;
}
bool parses(std::string bytes) { return parse(std::move(bytes))->status.ok(); }

std::string bytes_of(const Tensor& t) { return std::string(reinterpret_cast<const char*>(t.data), t.byte_size); }

// A request's bytes, parsed, and built against `model`.
struct Built {
  std::shared_ptr<std::string> bytes;
  ParsedInferRequest parsed;
  InferenceRequest request;
  Status status;
};
std::unique_ptr<Built> build(const std::shared_ptr<const ModelSignature>& model, const std::string& bytes) {
  auto b = std::make_unique<Built>();
  b->bytes = std::make_shared<std::string>(bytes);
  b->status = parse_infer_request(reinterpret_cast<const std::byte*>(b->bytes->data()), b->bytes->size(), &b->parsed);
  if (b->status.ok()) b->status = build_inference_request(model, b->parsed, b->bytes, &b->request);
  return b;
}

InputSignature input_spec(const std::string& name, DataType dtype, std::vector<int64_t> dims) {
  InputSignature s;
  s.name = name;
  s.dtype = dtype;
  s.dims = std::move(dims);
  return s;
}

// Every datatype as an optional input named after it, dims [-1], max_batch_size 8.
std::shared_ptr<const ModelSignature> all_types_model() {
  auto m = std::make_shared<ModelSignature>();
  m->name = "all_types";
  m->max_batch_size = 8;
  for (int code = 1; code <= 14; ++code) {
    const auto dtype = static_cast<DataType>(code);
    InputSignature s = input_spec(datatype_name(dtype), dtype, {-1});
    s.optional = true;
    s.utf8 = dtype == DataType::kBytes;
    m->inputs.push_back(s);
  }
  return m;
}

// Two INT32 inputs [-1, 2], max_batch_size 4, two outputs.
std::shared_ptr<const ModelSignature> batching_model() {
  auto m = std::make_shared<ModelSignature>();
  m->name = "pair";
  m->max_batch_size = 4;
  m->inputs = {input_spec("A", DataType::kInt32, {2}), input_spec("B", DataType::kInt32, {2})};
  m->outputs = {OutputSignature{"X", DataType::kInt32, {2}, false}, OutputSignature{"Y", DataType::kInt32, {2}, false}};
  return m;
}

// --- the wire format ---------------------------------------------------------------------------

TEST(InferRequestParser, EmptyMessageIsAnEmptyRequest) {
  auto p = parse("");
  ASSERT_TRUE(p->status.ok());
  EXPECT_TRUE(p->request.model_name.empty());
  EXPECT_TRUE(p->request.inputs.empty());
}

TEST(InferRequestParser, TruncatedVarintIsRefused) {
  EXPECT_FALSE(parses("\x80"));                             // a key cut off
  EXPECT_FALSE(parses(key(20, 0) + "\x80\x80"));            // a value cut off
  EXPECT_FALSE(parses(ld(1, "m") + key(20, 0)));            // a key and no value
  EXPECT_FALSE(parses(ld(5, ld(1, "x") + ld(3, "\x80"))));  // a packed shape ending mid-varint
  // Eleven bytes, or a tenth byte above 1: no 64-bit value.
  EXPECT_FALSE(parses(key(20, 0) + std::string(10, '\xff') + "\x01"));
  EXPECT_FALSE(parses(key(20, 0) + std::string(9, '\xff') + "\x02"));
  EXPECT_TRUE(parses(key(20, 0) + std::string(9, '\xff') + "\x01"));
}

TEST(InferRequestParser, WireReaderReadsWithinItsBytes) {
  // The readers view these strings, which must outlive them.
  const std::string ten_bytes = std::string(9, '\xff') + "\x01";
  const std::string seven_bytes = "\x01\x02\x03\x04\x05\x06\x07";
  const std::string fixed_bytes = le32(0x04030201) + le64(0x0807060504030201);
  uint64_t v = 0;
  WireReader ten(ten_bytes);
  EXPECT_TRUE(ten.read_varint(&v));
  EXPECT_EQ(v, ~uint64_t{0});
  EXPECT_TRUE(ten.done());
  uint32_t v32 = 0;
  WireReader short32(std::string_view(seven_bytes).substr(0, 3));
  EXPECT_FALSE(short32.read_fixed32(&v32));
  WireReader short64(seven_bytes);
  EXPECT_FALSE(short64.read_fixed64(&v));
  WireReader fixed(fixed_bytes);
  ASSERT_TRUE(fixed.read_fixed32(&v32));
  EXPECT_EQ(v32, 0x04030201u);
  ASSERT_TRUE(fixed.read_fixed64(&v));
  EXPECT_EQ(v, 0x0807060504030201u);
}

TEST(InferRequestParser, LengthPastTheEndIsRefused) {
  EXPECT_FALSE(parses(key(1, 2) + varint(10) + "abc"));
  EXPECT_FALSE(parses(key(7, 2) + varint(~uint64_t{0} >> 1)));  // a length no buffer has
  // Within the whole request but past the end of the input message that holds it.
  const std::string inner = ld(1, "x") + key(2, 2) + varint(5);
  EXPECT_FALSE(parses(ld(5, inner) + "FP32!"));
  EXPECT_FALSE(parses(key(20, 1) + "1234567"));  // a fixed64 cut off
  EXPECT_FALSE(parses(key(20, 5) + "123"));      // a fixed32 cut off
}

TEST(InferRequestParser, GroupsAndUnknownWireTypesAreRefused) {
  EXPECT_FALSE(parses(key(20, 3) + key(20, 4)));  // start group, end group
  EXPECT_FALSE(parses(key(20, 4)));
  EXPECT_FALSE(parses(ld(5, key(20, 3) + key(20, 4))));  // inside an input
  EXPECT_FALSE(parses(key(20, 6) + "x"));
  EXPECT_FALSE(parses(key(20, 7) + "x"));
}

TEST(InferRequestParser, FieldNumberZeroIsRefused) {
  EXPECT_FALSE(parses(key(0, 0) + varint(1)));
  EXPECT_FALSE(parses(key(0, 2) + varint(0)));
  EXPECT_FALSE(parses(ld(5, key(0, 0) + varint(1))));
  // A key past 32 bits.
  EXPECT_FALSE(parses(varint(uint64_t{1} << 35) + varint(1)));
}

TEST(InferRequestParser, ShapePackedUnpackedOrBoth) {
  auto shape = [](const std::string& input) {
    auto p = parse(ld(5, input));
    EXPECT_TRUE(p->status.ok()) << p->status.message;
    return p->status.ok() ? p->request.inputs.at(0).shape : std::vector<int64_t>{};
  };
  EXPECT_EQ(shape(ld(1, "x") + ld(3, varint(2) + varint(3))), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(shape(ld(1, "x") + vfield(3, 2) + vfield(3, 3)), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(shape(vfield(3, 2) + ld(3, varint(3) + svarint(-1)) + vfield(3, 4)), (std::vector<int64_t>{2, 3, -1, 4}));
  // The wrong wire type for shape.
  EXPECT_FALSE(parses(ld(5, key(3, 5) + le32(2))));
}

TEST(InferRequestParser, StringFieldsMustBeUtf8) {
  EXPECT_TRUE(parses(ld(1, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80")));
  for (const std::string bad :
       {"\xc3\x28", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xff", "ab\xe2\x82"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(is_valid_utf8(bad));
    EXPECT_FALSE(parses(ld(1, bad)));                       // model_name
    EXPECT_FALSE(parses(ld(3, bad)));                       // id
    EXPECT_FALSE(parses(ld(5, ld(2, bad))));                // an input's datatype
    EXPECT_FALSE(parses(ld(6, ld(1, bad))));                // an output's name
    EXPECT_FALSE(parses(parameter(4, bad, vfield(1, 1))));  // a parameter's key
    EXPECT_FALSE(parses(parameter(4, "k", ld(3, bad))));    // a string parameter
  }
  // bytes fields are not text.
  EXPECT_TRUE(parses(ld(7, "\xff\xfe")));
  EXPECT_TRUE(parses(ld(5, ld(5, ld(8, "\xff")))));
}

TEST(InferRequestParser, UnknownFieldsAreSkippedAtEveryLevel) {
  const std::string value = vfield(2, 5) + kUnknown;
  const std::string request = kUnknown + ld(1, "m") + kUnknown +
                              ld(5, input("x", "INT64", {1}, ld(5, ld(3, varint(9)) + kUnknown) + kUnknown)) +
                              parameter(4, "p", value) + ld(4, ld(1, "q") + ld(2, vfield(1, 1)) + kUnknown) +
                              ld(6, ld(1, "y") + kUnknown) + kUnknown;
  auto p = parse(request);
  ASSERT_TRUE(p->status.ok()) << p->status.message;
  const ParsedInferRequest& parsed = p->request;
  EXPECT_EQ(parsed.model_name, "m");
  ASSERT_EQ(parsed.inputs.size(), 1u);
  EXPECT_EQ(parsed.inputs[0].name, "x");
  EXPECT_EQ(parsed.inputs[0].shape, std::vector<int64_t>{1});
  ASSERT_EQ(parsed.inputs[0].contents.size(), 1u);  // the unknown contents field is not kept
  ASSERT_EQ(parsed.parameters.size(), 2u);
  EXPECT_EQ(find_parameter(parsed.parameters, "p")->int64_value, 5);
  EXPECT_TRUE(find_parameter(parsed.parameters, "q")->bool_value);
  ASSERT_EQ(parsed.outputs.size(), 1u);
  EXPECT_EQ(parsed.outputs[0].name, "y");
}

TEST(InferRequestParser, TheLastOfTwoIdsWins) {
  auto p = parse(ld(3, "first") + ld(1, "m") + ld(3, "second"));
  ASSERT_TRUE(p->status.ok());
  EXPECT_EQ(p->request.id, "second");
}

TEST(InferRequestParser, MapKeyGivenTwiceFindsTheLast) {
  auto p = parse(parameter(4, "priority", vfield(2, 1)) + parameter(4, "other", ld(3, "s")) +
                 parameter(4, "priority", vfield(5, 2)));
  ASSERT_TRUE(p->status.ok());
  const WireParameter* priority = find_parameter(p->request.parameters, "priority");
  ASSERT_NE(priority, nullptr);
  EXPECT_EQ(priority->kind, WireParameter::Kind::kUint64);
  EXPECT_EQ(priority->uint64_value, 2u);
  EXPECT_EQ(find_parameter(p->request.parameters, "missing"), nullptr);
}

TEST(InferRequestParser, ParameterKindsAndTheLastOneofMember) {
  double d = 0.25;
  uint64_t bits = 0;
  std::memcpy(&bits, &d, sizeof d);
  auto p = parse(parameter(4, "b", vfield(1, 1)) + parameter(4, "i", vfield(2, static_cast<uint64_t>(-7))) +
                 parameter(4, "s", ld(3, "text")) + parameter(4, "d", key(4, 1) + le64(bits)) +
                 parameter(4, "u", vfield(5, ~uint64_t{0})) + parameter(4, "both", vfield(1, 1) + ld(3, "won")) +
                 parameter(4, "none", ""));
  ASSERT_TRUE(p->status.ok());
  const ParsedInferRequest& parsed = p->request;
  EXPECT_TRUE(find_parameter(parsed.parameters, "b")->bool_value);
  EXPECT_EQ(find_parameter(parsed.parameters, "i")->int64_value, -7);
  EXPECT_EQ(find_parameter(parsed.parameters, "s")->string_value, "text");
  EXPECT_EQ(find_parameter(parsed.parameters, "d")->double_value, 0.25);
  EXPECT_EQ(find_parameter(parsed.parameters, "u")->uint64_value, ~uint64_t{0});
  EXPECT_EQ(find_parameter(parsed.parameters, "both")->kind, WireParameter::Kind::kString);
  EXPECT_EQ(find_parameter(parsed.parameters, "none")->kind, WireParameter::Kind::kNone);
  // The wrong wire type for a member.
  EXPECT_FALSE(parses(parameter(4, "d", vfield(4, 1))));
  EXPECT_FALSE(parses(parameter(4, "b", key(1, 5) + le32(1))));
}

// --- typed contents, decoded against the model ---------------------------------------------------

struct TypedCase {
  const char* datatype;
  std::string contents;  // InferTensorContents
  std::string expected;  // the tensor's little-endian bytes
};

TEST(InferRequestParser, TypedContentsOfEveryDatatype) {
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

TEST(InferRequestParser, TypedContentsOutOfRangeAreRefused) {
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

TEST(InferRequestParser, TypedContentsMustMatchTheDatatypeAndCount) {
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
TEST(InferRequestParser, OverlongPackedVarintIsRefused) {
  const auto model = all_types_model();
  auto b = build(model, ld(5, input("INT8", "INT8", {1, 1}, ld(5, ld(2, std::string(10, '\x80') + '\0')))));
  EXPECT_EQ(b->status.code, StatusCode::kInvalidArgument);
}

// A reshape with a variable dim on both sides ([-1] -> [-1, 2], which the repository accepts):
// 3 elements cannot take [1, -1, 2], and must not become a [1, 1, 2] tensor over 12 bytes (the
// fuzz harness's reproducer: cpp/fuzz/corpus/crash-reshape-element-count).
TEST(InferRequestParser, ReshapeMustKeepTheElementCount) {
  auto model = std::make_shared<ModelSignature>();
  model->name = "r";
  model->max_batch_size = 4;
  InputSignature x = input_spec("x", DataType::kFp32, {-1});
  x.has_reshape = true;
  x.reshape = {-1, 2};
  model->inputs = {x};
  auto odd = build(model, ld(5, input("x", "FP32", {1, 3})) + ld(7, std::string(12, '\0')));
  EXPECT_EQ(odd->status.code, StatusCode::kInvalidArgument);
  auto even = build(model, ld(5, input("x", "FP32", {1, 4})) + ld(7, std::string(16, '\0')));
  ASSERT_TRUE(even->status.ok()) << even->status.message;
  EXPECT_EQ(even->request.inputs.at(0).shape, (std::vector<int64_t>{1, 2, 2}));
}

// --- raw contents, batch sizes -------------------------------------------------------------------

TEST(InferRequestParser, RawInputsAreViewsOfTheRequest) {
  const auto model = all_types_model();
  auto b = build(model, ld(5, input("FP16", "FP16", {2, 1})) + ld(5, input("BF16", "BF16", {2, 1})) +
                            ld(7, std::string("\x00\x3c\x00\xc0", 4)) + ld(7, std::string("\x80\x3f\x40\xc0", 4)));
  ASSERT_TRUE(b->status.ok()) << b->status.message;
  const Tensor& fp16 = b->request.inputs.at(static_cast<size_t>(DataType::kFp16) - 1);
  EXPECT_EQ(bytes_of(fp16), std::string("\x00\x3c\x00\xc0", 4));
  EXPECT_GE(fp16.data, reinterpret_cast<const std::byte*>(b->bytes->data()));
  EXPECT_LT(fp16.data, reinterpret_cast<const std::byte*>(b->bytes->data() + b->bytes->size()));
  EXPECT_EQ(fp16.owner, b->bytes);
  EXPECT_EQ(b->request.batch_size, 2);
  EXPECT_TRUE(b->request.inputs.at(0).absent);  // BOOL was left out
}

TEST(InferRequestParser, RawBytesWithATruncatedLengthPrefixIsRefused) {
  const auto model = all_types_model();
  auto cut_prefix = build(model, ld(5, input("BYTES", "BYTES", {1, 2})) + ld(7, le32(1) + "a" + "\x01\x00"));
  EXPECT_EQ(cut_prefix->status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(cut_prefix->status.message.find("length prefix is cut off"), std::string::npos)
      << cut_prefix->status.message;
  auto long_claim = build(model, ld(5, input("BYTES", "BYTES", {1, 1})) + ld(7, le32(0xffffffff) + "abc"));
  EXPECT_EQ(long_claim->status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(long_claim->status.message.find("claims"), std::string::npos) << long_claim->status.message;
  auto ok = build(model, ld(5, input("BYTES", "BYTES", {1, 2})) + ld(7, le32(1) + "a" + le32(0)));
  EXPECT_TRUE(ok->status.ok()) << ok->status.message;
}

// Issue 13, item 1: contents holding more values than the shape claims are refused once one
// value too many is seen, before the rest is walked: what follows it here (malformed, and in a
// flood hundreds of megabytes) is never read, so the answer names the count, not the damage.
TEST(InferRequestParser, ContentsBeyondTheShapeAreRefusedWithoutWalkingTheRest) {
  const auto model = all_types_model();
  const std::string cut = "\x01\x00";  // a length prefix cut off
  auto raw = build(model, ld(5, input("BYTES", "BYTES", {1, 1})) + ld(7, le32(0) + le32(0) + cut));
  EXPECT_EQ(raw->status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(raw->status.message.find("more BYTES elements than shape [1, 1] holds (1)"), std::string::npos)
      << raw->status.message;
  auto packed = build(model, ld(5, input("INT64", "INT64", {1, 1}, ld(5, ld(3, varint(1) + varint(2) + "\x80")))));
  EXPECT_EQ(packed->status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(packed->status.message.find("more values in int64_contents than shape [1, 1] holds"), std::string::npos)
      << packed->status.message;
  auto elements = build(model, ld(5, input("BYTES", "BYTES", {1, 1}, ld(5, ld(8, "") + ld(8, "") + ld(8, "\xff")))));
  EXPECT_EQ(elements->status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(elements->status.message.find("more values in bytes_contents"), std::string::npos)
      << elements->status.message;
  // A packed run of fixed-width values is counted from its length: 2^40 values are claimed, 4 sent.
  auto claim = build(model, ld(5, input("FP32", "FP32", {1, int64_t{1} << 40}, ld(5, ld(6, std::string(16, '\0'))))));
  EXPECT_EQ(claim->status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(claim->status.message.find("4 values in fp32_contents"), std::string::npos) << claim->status.message;
}

// Issue 13, small ones: an output requested twice is refused naming it, as Triton does, instead
// of being computed and returned twice.
TEST(InferRequestParser, AnOutputRequestedTwiceIsRefused) {
  const auto model = batching_model();
  const std::string inputs = ld(5, input("A", "INT32", {1, 2})) + ld(5, input("B", "INT32", {1, 2})) +
                             ld(7, le32(1) + le32(2)) + ld(7, le32(3) + le32(4));
  auto twice = build(model, inputs + ld(6, ld(1, "X")) + ld(6, ld(1, "Y")) + ld(6, ld(1, "X")));
  EXPECT_EQ(twice->status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(twice->status.message.find("output 'X' already exists in request"), std::string::npos)
      << twice->status.message;
  auto both = build(model, inputs + ld(6, ld(1, "X")) + ld(6, ld(1, "Y")));
  EXPECT_TRUE(both->status.ok()) << both->status.message;
}

TEST(InferRequestParser, BatchSizeMismatchIsRefused) {
  const auto model = batching_model();
  const std::string two = ld(2, varint(1) + varint(2) + varint(3) + varint(4));
  const std::string one = ld(2, varint(1) + varint(2));
  auto mismatch =
      build(model, ld(5, input("A", "INT32", {2, 2}, ld(5, two))) + ld(5, input("B", "INT32", {1, 2}, ld(5, one))));
  EXPECT_EQ(mismatch->status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch->status.message.find("batch size"), std::string::npos) << mismatch->status.message;
  auto too_many = build(model, ld(5, input("A", "INT32", {5, 2}, ld(5, two + two + one))) +
                                   ld(5, input("B", "INT32", {5, 2}, ld(5, two + two + one))));
  EXPECT_NE(too_many->status.message.find("max_batch_size"), std::string::npos) << too_many->status.message;
  auto ok =
      build(model, ld(5, input("A", "INT32", {2, 2}, ld(5, two))) + ld(5, input("B", "INT32", {2, 2}, ld(5, two))) +
                       ld(6, ld(1, "Y")) + parameter(4, "priority", vfield(2, 3)));
  ASSERT_TRUE(ok->status.ok()) << ok->status.message;
  EXPECT_EQ(ok->request.batch_size, 2);
  EXPECT_EQ(ok->request.priority, 3u);
  EXPECT_EQ(ok->request.requested_outputs, std::vector<uint32_t>{1});
}

// Issue 25, item 9: a request that asks for a sequence is refused, naming the parameter, until
// sequence batching exists; what a stateless client sends (id 0 or "", false flags) is served.
TEST(InferRequestParser, ARequestAskingForASequenceIsRefusedNamingTheParameter) {
  const auto model = batching_model();
  const std::string two = ld(2, varint(1) + varint(2) + varint(3) + varint(4));
  const std::string inputs =
      ld(5, input("A", "INT32", {2, 2}, ld(5, two))) + ld(5, input("B", "INT32", {2, 2}, ld(5, two)));
  const std::vector<std::pair<std::string, std::string>> asking = {
      {"sequence_id", parameter(4, "sequence_id", vfield(2, 42))},
      {"sequence_id", parameter(4, "sequence_id", vfield(5, 7))},
      {"sequence_id", parameter(4, "sequence_id", ld(3, "session-a"))},
      {"sequence_start", parameter(4, "sequence_start", vfield(1, 1))},
      {"sequence_end", parameter(4, "sequence_end", vfield(1, 1))},
  };
  for (const auto& [name, parameters] : asking) {
    auto refused = build(model, inputs + parameters);
    EXPECT_EQ(refused->status.code, StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(refused->status.message.find("request parameter '" + name + "': sequences are not supported yet"), 0u)
        << refused->status.message;
  }
  auto stateless = build(model, inputs + parameter(4, "sequence_id", vfield(2, 0)) +
                                    parameter(4, "sequence_start", vfield(1, 0)) + parameter(4, "sequence_end", ""));
  EXPECT_TRUE(stateless->status.ok()) << stateless->status.message;
}

// Issue 17: a python model's requests keep their own parameters, as JSON (request.parameters());
// those the server reads itself are left out, and other models' requests keep none.
TEST(InferRequestParser, RequestsOfAModelThatKeepsParametersCarryThemAsJson) {
  auto keeping = std::make_shared<ModelSignature>(*batching_model());
  keeping->keeps_parameters = true;
  const std::string two = ld(2, varint(1) + varint(2) + varint(3) + varint(4));
  const std::string inputs =
      ld(5, input("A", "INT32", {2, 2}, ld(5, two))) + ld(5, input("B", "INT32", {2, 2}, ld(5, two)));
  const auto bits = [](double value) {
    uint64_t out;
    std::memcpy(&out, &value, sizeof out);
    return out;
  };
  const std::string parameters = parameter(4, "temperature", key(4, 1) + le64(bits(0.5))) +
                                 parameter(4, "greedy", vfield(1, 1)) + parameter(4, "top_k", vfield(2, 40)) +
                                 parameter(4, "seed", vfield(5, 7)) + parameter(4, "stop", ld(3, "say \"end\"\n")) +
                                 parameter(4, "priority", vfield(2, 3)) +
                                 parameter(4, "triton_enable_empty_final_response", vfield(1, 1)) +
                                 parameter(4, "nan", key(4, 1) + le64(bits(std::nan(""))));
  auto kept = build(keeping, inputs + parameters);
  ASSERT_TRUE(kept->status.ok()) << kept->status.message;
  EXPECT_EQ(kept->request.parameters_json,
            R"({"temperature":0.5,"greedy":true,"top_k":40,"seed":7,"stop":"say \"end\"\n","nan":null})");
  EXPECT_EQ(kept->request.priority, 3u);
  auto none = build(keeping, inputs);
  EXPECT_EQ(none->request.parameters_json, "{}");
  auto plain = build(batching_model(), inputs + parameters);
  ASSERT_TRUE(plain->status.ok()) << plain->status.message;
  EXPECT_TRUE(plain->request.parameters_json.empty());
}

// --- the response writer -------------------------------------------------------------------------

TEST(InferRequestParser, WriterMatchesHandComputedBytes) {
  auto model = std::make_shared<ModelSignature>();
  model->name = "m";
  model->version = "1";
  model->outputs = {OutputSignature{"y", DataType::kInt32, {2}, false},
                    OutputSignature{"z", DataType::kFp32, {-1}, /*has_reshape=*/true}};
  InferenceRequest request;
  request.signature = model;
  request.id = "r";
  const std::string y_data = le32(1) + le32(2);
  const std::string z_data = le32(0) + le32(0) + le32(0);
  std::vector<Tensor> outputs(2);
  outputs[0] = Tensor{DataType::kInt32, {2}, reinterpret_cast<const std::byte*>(y_data.data()), y_data.size(), nullptr};
  // The model answers z as [3, 1]; the protocol's dims are [-1]: the writer reshapes it back to [3].
  outputs[1] =
      Tensor{DataType::kFp32, {3, 1}, reinterpret_cast<const std::byte*>(z_data.data()), z_data.size(), nullptr};

  // model_name, model_version, id; outputs y and z (name, datatype, packed shape); raw contents.
  const std::string y_meta = std::string("\x0a\x01y\x12\x05INT32\x1a\x01\x02", 13);
  const std::string z_meta = std::string(
      "\x0a\x01z\x12\x04"
      "FP32\x1a\x01\x03",
      12);
  const std::string expected = std::string(
                                   "\x0a\x01m\x12\x01"
                                   "1\x1a\x01r",
                                   9) +
                               "\x2a\x0d" + y_meta + "\x2a\x0c" + z_meta + "\x32\x08" + y_data + "\x32\x0c" + z_data;
  ASSERT_EQ(expected.size(), 9u + 2 + 13 + 2 + 12 + 2 + 8 + 2 + 12);
  auto written = [&](bool stream) {
    const InferResponseWriter writer(request, outputs, stream);
    EXPECT_TRUE(writer.status().ok()) << writer.status().message;
    std::string out(writer.size(), '\xAA');
    writer.write(reinterpret_cast<std::byte*>(out.data()));
    EXPECT_EQ(writer.data_bytes(), request.requested_outputs.empty() ? 20u : 8u);
    return out;
  };
  EXPECT_EQ(written(false), expected);
  EXPECT_EQ(written(true), std::string("\x12") + static_cast<char>(expected.size()) + expected);

  // Requested outputs: only those, in request order.
  request.requested_outputs = {0};
  EXPECT_EQ(written(false), std::string("\x0a\x01m\x12\x01"
                                        "1\x1a\x01r",
                                        9) +
                                "\x2a\x0d" + y_meta + "\x32\x08" + y_data);
}

TEST(InferRequestParser, WriterRefusesOutputsItCannotShow) {
  auto model = std::make_shared<ModelSignature>();
  model->name = "m";
  model->outputs = {OutputSignature{"z", DataType::kFp32, {2}, /*has_reshape=*/true}};
  InferenceRequest request;
  request.signature = model;
  const std::string data(12, '\0');
  std::vector<Tensor> outputs(1);
  outputs[0] = Tensor{DataType::kFp32, {3, 1}, reinterpret_cast<const std::byte*>(data.data()), data.size(), nullptr};
  EXPECT_FALSE(InferResponseWriter(request, outputs, false).status().ok());  // 3 elements in dims [2]
  outputs[0].shape = {2, 1};
  outputs[0].byte_size = 8;
  EXPECT_TRUE(InferResponseWriter(request, outputs, false).status().ok());
  request.requested_outputs = {1};  // past the model's outputs
  EXPECT_FALSE(InferResponseWriter(request, outputs, false).status().ok());
}

TEST(InferRequestParser, WriterLeavesEmptyStringsOutButKeepsEmptyContents) {
  auto model = std::make_shared<ModelSignature>();
  model->name = "m";
  model->outputs = {OutputSignature{"e", DataType::kBytes, {-1}, false}};
  InferenceRequest request;
  request.signature = model;
  std::vector<Tensor> outputs(1);
  outputs[0].dtype = DataType::kBytes;
  outputs[0].shape = {0};
  const InferResponseWriter writer(request, outputs, false);
  std::string out(writer.size(), '\0');
  writer.write(reinterpret_cast<std::byte*>(out.data()));
  // The shape [0] is one packed varint, 0; the empty contents are an empty bytes element.
  EXPECT_EQ(out, std::string("\x0a\x01m\x2a\x0d\x0a\x01"
                             "e\x12\x05"
                             "BYTES\x1a\x01\x00\x32\x00",
                             20));
}

// The final-response flag and the empty response, against the bytes protobuf's serializer writes
// for the same messages (tritonclient's grpc_service_pb2, SerializeToString): the parameters map
// (field 4) sits between the id and the outputs, its bool written even when false.
TEST(InferRequestParser, WriterAddsTheFinalResponseFlagAndWritesTheEmptyResponseAsProtobufDoes) {
  auto model = std::make_shared<ModelSignature>();
  model->name = "m";
  model->version = "1";
  model->outputs = {OutputSignature{"y", DataType::kInt32, {2}, false}};
  InferenceRequest request;
  request.signature = model;
  request.id = "r";
  const std::string y_data = le32(1) + le32(2);
  std::vector<Tensor> outputs(1);
  outputs[0] = Tensor{DataType::kInt32, {2}, reinterpret_cast<const std::byte*>(y_data.data()), y_data.size(), nullptr};
  auto bytes = [](const InferResponseWriter& writer) {
    EXPECT_TRUE(writer.status().ok()) << writer.status().message;
    std::string out(writer.size(), '\xAA');
    writer.write(reinterpret_cast<std::byte*>(out.data()));
    return out;
  };
  const std::string header(
      "\x0a\x01m\x12\x01"
      "1\x1a\x01r",
      9);
  auto flag = [](bool last) {
    return std::string("\x22\x1b\x0a\x15triton_final_response\x12\x02\x08", 28) + (last ? '\x01' : '\x00');
  };
  const std::string y_output = std::string("\x2a\x0d\x0a\x01y\x12\x05INT32\x1a\x01\x02", 15) + "\x32\x08" + y_data;

  EXPECT_EQ(bytes(InferResponseWriter(request, outputs, false, false)), header + flag(false) + y_output);
  EXPECT_EQ(bytes(InferResponseWriter(request, outputs, false, true)), header + flag(true) + y_output);
  EXPECT_EQ(bytes(InferResponseWriter(request, outputs, false)), header + y_output);  // no flag asked for
  const std::string streamed = header + flag(false) + y_output;
  EXPECT_EQ(bytes(InferResponseWriter(request, outputs, true, false)),
            std::string("\x12") + static_cast<char>(streamed.size()) + streamed);

  // The empty response: name, version, id and the flag; no outputs even though the model has one.
  EXPECT_EQ(bytes(InferResponseWriter::empty_response(request, false, true)), header + flag(true));
  EXPECT_EQ(bytes(InferResponseWriter::empty_response(request, true, true)),
            std::string("\x12\x26") + header + flag(true));
  request.requested_outputs = {0};
  EXPECT_EQ(bytes(InferResponseWriter::empty_response(request, false, true)), header + flag(true));
}

TEST(InferRequestParser, StreamErrorResponseBytes) {
  EXPECT_EQ(stream_error_response("bad", "r"), std::string("\x0a\x03"
                                                           "bad\x12\x03\x1a\x01r",
                                                           10));
  EXPECT_EQ(stream_error_response("bad", ""), std::string("\x0a\x03"
                                                          "bad\x12\x00",
                                                          7));
  // With the final flag (as protobuf writes it: id, then the parameters map).
  const std::string flag("\x22\x1b\x0a\x15triton_final_response\x12\x02\x08", 28);
  EXPECT_EQ(stream_error_response("bad", "r", false), std::string("\x0a\x03"
                                                                  "bad\x12\x20\x1a\x01r",
                                                                  10) +
                                                          flag + '\x00');
  EXPECT_EQ(stream_error_response("bad", "r", true), std::string("\x0a\x03"
                                                                 "bad\x12\x20\x1a\x01r",
                                                                 10) +
                                                         flag + '\x01');
}

}  // namespace
}  // namespace inferd
