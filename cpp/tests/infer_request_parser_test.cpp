// parse_infer_request on hand-built wire bytes: the wire format alone, before any model is
// consulted (what the values mean: model_signature_test.cpp, typed_contents_test.cpp).
#include "inferd/infer_request_parser.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferd/wire_format.h"
#include "request_bytes.h"

namespace inferd {
namespace {

using namespace request_bytes;  // the request path's tests' helpers (request_bytes.h)

// Unknown fields of every wire type.
const std::string kUnknown = vfield(99, 7) + key(100, 1) + le64(1) + key(101, 5) + le32(2) + ld(102, "later");

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

}  // namespace
}  // namespace inferd
