// The HTTP/REST inference codec: JSON and binary requests decoded into what the gRPC parser gives
// (and, through build_inference_request, into the same core request with the same refusals), and
// answers encoded as Triton writes them.
#include "inferd/http_infer_codec.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "inferd/model_signature.h"
#include "request_bytes.h"

namespace inferd {
namespace {

using namespace request_bytes;  // the request path's tests' helpers (request_bytes.h)

std::string raw(const std::string_view v) { return std::string(v); }

template <typename T>
std::string le(T value) {
  std::string out(sizeof value, '\0');
  std::memcpy(out.data(), &value, sizeof value);
  return out;
}

std::string bytes_element(const std::string& s) { return le32(static_cast<uint32_t>(s.size())) + s; }

// Decodes `body` for model "m" (no version), header length `json_length`.
Status decode(const std::string& body, std::shared_ptr<HttpInferRequest>* out,
              std::optional<size_t> json_length = std::nullopt, HttpDecodeLimits limits = {}) {
  return decode_http_infer_request("m", "", std::make_shared<std::string>(body), json_length, limits, out);
}

// The message of decoding `body`, which must fail with INVALID_ARGUMENT.
std::string refusal(const std::string& body, std::optional<size_t> json_length = std::nullopt) {
  std::shared_ptr<HttpInferRequest> out;
  const Status status = decode(body, &out, json_length);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument) << body;
  EXPECT_EQ(out, nullptr);
  return status.message;
}

// A body with one input of `datatype`, `shape` and `data` (JSON text).
std::string one_input(const std::string& datatype, const std::string& shape, const std::string& data) {
  return R"({"inputs":[{"name":"x","datatype":")" + datatype + R"(","shape":)" + shape + R"(,"data":)" + data + "}]}";
}

// The raw bytes the one input of `body` decodes to.
std::string decoded_bytes(const std::string& body) {
  std::shared_ptr<HttpInferRequest> out;
  const Status status = decode(body, &out);
  EXPECT_TRUE(status.ok()) << status.message << " for " << body;
  if (!status.ok()) return "";
  EXPECT_EQ(out->parsed.raw_input_contents.size(), 1u);
  return raw(out->parsed.raw_input_contents.at(0));
}

TEST(HttpDecode, EveryJsonDatatypeBecomesItsRawLittleEndianBytes) {
  EXPECT_EQ(decoded_bytes(one_input("BOOL", "[3]", "[true,false,true]")), std::string("\x01\x00\x01", 3));
  EXPECT_EQ(decoded_bytes(one_input("UINT8", "[2]", "[0,255]")), std::string("\x00\xff", 2));
  EXPECT_EQ(decoded_bytes(one_input("UINT16", "[2]", "[1,65535]")), le<uint16_t>(1) + le<uint16_t>(65535));
  EXPECT_EQ(decoded_bytes(one_input("UINT32", "[1]", "[4294967295]")), le<uint32_t>(4294967295u));
  EXPECT_EQ(decoded_bytes(one_input("UINT64", "[1]", "[18446744073709551615]")),
            le<uint64_t>(std::numeric_limits<uint64_t>::max()));
  EXPECT_EQ(decoded_bytes(one_input("INT8", "[2]", "[-128,127]")), le<int8_t>(-128) + le<int8_t>(127));
  EXPECT_EQ(decoded_bytes(one_input("INT16", "[2]", "[-32768,32767]")), le<int16_t>(-32768) + le<int16_t>(32767));
  EXPECT_EQ(decoded_bytes(one_input("INT32", "[2]", "[-2147483648,7]")),
            le<int32_t>(std::numeric_limits<int32_t>::min()) + le<int32_t>(7));
  EXPECT_EQ(decoded_bytes(one_input("INT64", "[2]", "[-9223372036854775808,9223372036854775807]")),
            le<int64_t>(std::numeric_limits<int64_t>::min()) + le<int64_t>(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(decoded_bytes(one_input("FP32", "[3]", "[0.1,-2,3e38]")), le(0.1f) + le(-2.0f) + le(3e38f));
  EXPECT_EQ(decoded_bytes(one_input("FP64", "[2]", "[0.1,1e-300]")), le(0.1) + le(1e-300));
  EXPECT_EQ(decoded_bytes(one_input("BYTES", "[3]", R"(["ab","",  "\u00e9\n"])")),
            bytes_element("ab") + bytes_element("") + bytes_element("\xc3\xa9\n"));
}

TEST(HttpDecode, DataMayBeFlatOrNestedAsTheShape) {
  const std::string expected =
      le<int32_t>(1) + le<int32_t>(2) + le<int32_t>(3) + le<int32_t>(4) + le<int32_t>(5) + le<int32_t>(6);
  EXPECT_EQ(decoded_bytes(one_input("INT32", "[2,3]", "[1,2,3,4,5,6]")), expected);
  EXPECT_EQ(decoded_bytes(one_input("INT32", "[2,3]", "[[1,2,3],[4,5,6]]")), expected);
  EXPECT_EQ(decoded_bytes(one_input("INT32", "[1,2,3]", "[[[1,2,3],[4,5,6]]]")), expected);
  EXPECT_EQ(decoded_bytes(one_input("BYTES", "[1,2]", R"([["a","b"]])")), bytes_element("a") + bytes_element("b"));
  // A shape without dims: the value itself, or a flat array of one.
  EXPECT_EQ(decoded_bytes(one_input("INT32", "[]", "7")), le<int32_t>(7));
  EXPECT_EQ(decoded_bytes(one_input("INT32", "[]", "[7]")), le<int32_t>(7));
  // No elements, flat or nested.
  EXPECT_EQ(decoded_bytes(one_input("FP32", "[0,3]", "[]")), "");
  EXPECT_EQ(decoded_bytes(one_input("FP32", "[2,0]", "[[],[]]")), "");
}

TEST(HttpDecode, DataMustHoldWhatTheShapeSays) {
  EXPECT_EQ(refusal(one_input("INT32", "[4]", "[1,2,3]")), "input 'x': 'data' holds 3 elements, its shape [4] holds 4");
  EXPECT_EQ(refusal(one_input("INT32", "[2,2]", "[1,2,3,4,5]")),
            "input 'x': 'data' holds 5 elements, its shape [2, 2] holds 4");
  // A shape claiming far more than the body holds: refused on the count, nothing sized by it.
  EXPECT_EQ(refusal(one_input("INT64", "[1000000000000,1000000]", "[1]")),
            "input 'x': 'data' holds 1 elements, its shape [1000000000000, 1000000] holds 1000000000000000000");
  EXPECT_EQ(refusal(one_input("INT32", "[2,2]", "[[1,2],[3]]")),
            "input 'x': 'data' has 1 elements at depth 2, its shape [2, 2] says 2 (give 'data' flat or nested as "
            "the shape)");
  EXPECT_EQ(refusal(one_input("INT32", "[3,1]", "[[1],2,[3]]")), "input 'x': 'data' is not nested as its shape [3, 1]");
  EXPECT_EQ(refusal(one_input("INT32", "[1]", "[[[1]]]")), "input 'x': 'data' nests deeper than its shape [1]");
  EXPECT_EQ(refusal(one_input("INT32", "[2]", "7")), "input 'x': 'data' is not nested as its shape [2]");
  EXPECT_EQ(refusal(one_input("INT32", "[-1]", "[1]")), "input 'x': shape [-1] has no element count");
  EXPECT_EQ(refusal(one_input("INT32", "[1]", R"([{"a":1}])")), "input 'x': 'data' nests deeper than its shape [1]");
}

TEST(HttpDecode, ValuesMustFitTheirDatatype) {
  EXPECT_EQ(refusal(one_input("UINT8", "[2]", "[1,256]")), "input 'x': element 1 of 'data' is out of range for UINT8");
  EXPECT_EQ(refusal(one_input("UINT32", "[1]", "[-1]")), "input 'x': element 0 of 'data' is out of range for UINT32");
  EXPECT_EQ(refusal(one_input("INT8", "[1]", "[-129]")), "input 'x': element 0 of 'data' is out of range for INT8");
  EXPECT_EQ(refusal(one_input("INT64", "[1]", "[9223372036854775808]")),
            "input 'x': element 0 of 'data' is out of range for INT64");
  EXPECT_EQ(refusal(one_input("UINT64", "[1]", "[18446744073709551616]")),
            "input 'x': element 0 of 'data' must be an integer for UINT64, got a number");
  EXPECT_EQ(refusal(one_input("INT32", "[1]", "[1.5]")),
            "input 'x': element 0 of 'data' must be an integer for INT32, got a number");
  EXPECT_EQ(refusal(one_input("INT32", "[1]", R"(["1"])")),
            "input 'x': element 0 of 'data' must be an integer for INT32, got a string");
  EXPECT_EQ(refusal(one_input("FP32", "[1]", "[1e39]")), "input 'x': element 0 of 'data' is out of range for FP32");
  EXPECT_EQ(refusal(one_input("FP64", "[1]", "[true]")),
            "input 'x': element 0 of 'data' must be a number for FP64, got a bool");
  EXPECT_EQ(refusal(one_input("BOOL", "[1]", "[1]")),
            "input 'x': element 0 of 'data' must be true or false for BOOL, got a number");
  EXPECT_EQ(refusal(one_input("BYTES", "[1]", "[1]")),
            "input 'x': element 0 of 'data' must be a string for BYTES, got a number");
  EXPECT_EQ(refusal(one_input("BYTES", "[2]", R"(["a",null])")),
            "input 'x': element 1 of 'data' must be a string for BYTES, got null");
  EXPECT_EQ(refusal(one_input("FP16", "[1]", "[1.0]")),
            "input 'x': FP16 data cannot travel as JSON; send it in binary (the 'binary_data_size' parameter)");
  EXPECT_EQ(refusal(one_input("BF16", "[1]", "[1.0]")),
            "input 'x': BF16 data cannot travel as JSON; send it in binary (the 'binary_data_size' parameter)");
  EXPECT_EQ(refusal(one_input("FP8", "[1]", "[1.0]")), "input 'x': unknown datatype 'FP8'");
  // Numbers JSON cannot hold at all are the parser's.
  EXPECT_EQ(refusal(one_input("FP64", "[1]", "[1e400]")),
            "malformed JSON at byte 61: Number too big to be stored in double.");
  EXPECT_EQ(refusal(one_input("FP64", "[1]", "[NaN]")), "malformed JSON at byte 61: Invalid value.");
  EXPECT_EQ(refusal(one_input("FP64", "[1]", "[1.8e308]")),
            "malformed JSON at byte 61: a number beyond what a double holds (too large or too small)");
  EXPECT_EQ(refusal(one_input("FP64", "[1]", "[1e-400]")),
            "malformed JSON at byte 61: a number beyond what a double holds (too large or too small)");
  // Zero with any exponent is zero (RapidJSON's own conversion is undefined behaviour there).
  EXPECT_EQ(decoded_bytes(one_input("FP64", "[2]", "[0e-300,-0.0]")), le(0.0) + le(-0.0));
  EXPECT_EQ(decoded_bytes(one_input("FP64", "[1]", "[5e-324]")), le(5e-324));
  EXPECT_EQ(decoded_bytes(one_input("INT64", "[1]", "[-0]")), le<int64_t>(0));
}

TEST(HttpDecode, RefusesMalformedAndTooDeepJsonNamingTheLimit) {
  EXPECT_EQ(refusal(R"({"inputs":[)"), "malformed JSON at byte 11: Invalid value.");
  EXPECT_EQ(refusal(""), "malformed JSON at byte 0: The document is empty.");
  EXPECT_EQ(refusal("{} {}"), "malformed JSON at byte 3: The document root must not be followed by other values.");
  EXPECT_EQ(refusal("{\"id\":\"\xff\"}"), "malformed JSON: the text is not UTF-8");
  // Ending inside a multi-byte sequence (RapidJSON's own check would read past the end).
  EXPECT_EQ(refusal("{\"id\":\"\xf4"), "malformed JSON: the text is not UTF-8");
  EXPECT_EQ(refusal(std::string("{\"id\":\"a\"}\0{", 12)), "malformed JSON at byte 10: a NUL byte in the JSON");
  EXPECT_EQ(refusal(R"({"id":"\udc00"})"),
            "malformed JSON at byte 14: a string's escapes decode to text that is not UTF-8 (a lone surrogate)");
  EXPECT_EQ(refusal(R"({"\ud800x":1})"), "malformed JSON at byte 2: The surrogate pair in string is invalid.");
  EXPECT_EQ(refusal("[]"), "the request must be a JSON object, got an array");

  // 100,000 nested arrays: refused at depth 65, where the parse stops.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(refusal(deep), "the request's JSON nests arrays and objects deeper than 64 (--http-max-json-depth)");
  // The limit is the caller's: an input's `data` sits at depth 3 (request, inputs, input) and
  // nests as many arrays more as it has dims.
  const std::string nested = one_input("INT32", "[1,1,1]", "[[[1]]]");
  std::shared_ptr<HttpInferRequest> out;
  HttpDecodeLimits limits;
  limits.max_json_depth = 6;
  EXPECT_TRUE(decode(nested, &out, std::nullopt, limits).ok());
  limits.max_json_depth = 5;
  EXPECT_EQ(decode(nested, &out, std::nullopt, limits).message,
            "the request's JSON nests arrays and objects deeper than 5 (--http-max-json-depth)");
}

TEST(HttpDecode, RefusesFieldsOfTheWrongType) {
  EXPECT_EQ(refusal(R"({"id":1})"), "the request: 'id' must be a string, got a number");
  EXPECT_EQ(refusal(R"({"inputs":{}})"), "the request's 'inputs' must be an array, got an object");
  EXPECT_EQ(refusal(R"({"outputs":[1]})"), "outputs[0] must be an object, got a number");
  EXPECT_EQ(refusal(R"({"outputs":[{}]})"), "outputs[0]: 'name' is missing");
  EXPECT_EQ(refusal(R"({"inputs":[1]})"), "inputs[0] must be an object, got a number");
  EXPECT_EQ(refusal(R"({"inputs":[{"datatype":"FP32"}]})"), "inputs[0]: 'name' is missing");
  EXPECT_EQ(refusal(R"({"inputs":[{"name":"x","shape":[1],"data":[1]}]})"), "input 'x': 'datatype' is missing");
  EXPECT_EQ(refusal(R"({"inputs":[{"name":"x","datatype":"FP32","data":[1]}]})"), "input 'x': 'shape' is missing");
  EXPECT_EQ(refusal(one_input("FP32", "[1.5]", "[1]")), "input 'x': 'shape' must hold integers (int64), got a number");
  EXPECT_EQ(refusal(one_input("FP32", "2", "[1]")), "input 'x': 'shape' must be an array, got a number");
  EXPECT_EQ(refusal(R"({"inputs":[],"inputs":[]})"), "the request: 'inputs' is given twice");
  EXPECT_EQ(refusal(R"({"parameters":[]})"), "the request: 'parameters' must be an object, got an array");
  EXPECT_EQ(refusal(R"({"parameters":{"k":[1]}})"),
            "the request: parameter 'k' must be a bool, a number or a string, got an array");
  EXPECT_EQ(refusal(R"({"parameters":{"binary_data_output":1}})"),
            "request parameter 'binary_data_output' must be a bool");
  EXPECT_EQ(refusal(R"({"outputs":[{"name":"y","parameters":{"binary_data":"yes"}}]})"),
            "output 'y': parameter 'binary_data' must be a bool");
  EXPECT_EQ(refusal(R"({"outputs":[{"name":"y","parameters":{"binary_data":true,"shared_memory_region":"r",)"
                    R"("shared_memory_byte_size":4}}]})"),
            "output 'y': an output cannot set both 'shared_memory_region' and 'binary_data'");
  // Exactly one of data, binary_data_size and shared_memory_region (Triton's rule).
  EXPECT_EQ(refusal(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1]}]})"),
            "input 'x': an input must set exactly one of 'data', 'binary_data_size' in 'parameters' and "
            "'shared_memory_region' in 'parameters', but none is set");
  EXPECT_EQ(refusal(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],)"
                    R"("parameters":{"binary_data_size":4}}]})"),
            "input 'x': an input must set exactly one of 'data', 'binary_data_size' in 'parameters' and "
            "'shared_memory_region' in 'parameters', but sets 'data' 'binary_data_size'");
}

TEST(HttpDecode, RespectsTheParseLimitsCounts) {
  std::string inputs;
  for (size_t i = 0; i <= ParseLimits::kTensors; ++i) inputs += std::string(i ? "," : "") + "1";
  EXPECT_EQ(refusal(R"({"inputs":[)" + inputs + "]}"), "the request has more than 4096 inputs");
  EXPECT_EQ(refusal(R"({"outputs":[)" + inputs + "]}"), "the request has more than 4096 outputs");
  std::string parameters;
  for (size_t i = 0; i <= ParseLimits::kParameters; ++i) {
    parameters += std::string(i ? "," : "") + "\"p" + std::to_string(i) + "\":1";
  }
  EXPECT_EQ(refusal(R"({"parameters":{)" + parameters + "}}"),
            "the request has more than 4096 parameters, all maps together");
  std::string dims;
  for (size_t i = 0; i <= ParseLimits::kDims; ++i) dims += std::string(i ? "," : "") + "1";
  EXPECT_EQ(refusal(one_input("INT32", "[" + dims + "]", "[1]")),
            "the request's shapes have more than 65536 dims, all inputs together");
}

// The body tritonclient.http sends for `inputs` with binary data and no outputs requested
// (_get_inference_request): binary_data_output in the request's parameters, the inputs'
// binary_data_size, the tensors after the JSON in input order.
TEST(HttpDecode, TakesBinaryInputsFromTheBinarySectionInOrder) {
  const std::string a = le(1.5f) + le(2.5f);
  const std::string b = bytes_element("hi");
  const std::string json =
      R"({"id":"7","inputs":[{"name":"A","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}},)"
      R"({"name":"J","shape":[1],"datatype":"INT32","data":[5]},)"
      R"({"name":"S","shape":[1],"datatype":"FP32","parameters":{"shared_memory_region":"r","shared_memory_byte_size":4}},)"
      R"({"name":"B","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":6}}],)"
      R"("parameters":{"binary_data_output":true,"priority":2}})";
  std::shared_ptr<HttpInferRequest> out;
  const Status status = decode(json + a + b, &out, json.size());
  ASSERT_TRUE(status.ok()) << status.message;
  const ParsedInferRequest& parsed = out->parsed;
  EXPECT_EQ(parsed.model_name, "m");
  EXPECT_EQ(parsed.id, "7");
  ASSERT_EQ(parsed.inputs.size(), 4u);
  // One raw entry per input not in shared memory, in input order.
  ASSERT_EQ(parsed.raw_input_contents.size(), 3u);
  EXPECT_EQ(raw(parsed.raw_input_contents[0]), a);
  EXPECT_EQ(raw(parsed.raw_input_contents[1]), le<int32_t>(5));
  EXPECT_EQ(raw(parsed.raw_input_contents[2]), b);
  // The HTTP-only parameters are gone; the others stay.
  EXPECT_TRUE(parsed.inputs[0].parameters.empty());
  EXPECT_EQ(parsed.inputs[2].parameters.size(), 2u);
  ASSERT_EQ(parsed.parameters.size(), 1u);
  EXPECT_EQ(parsed.parameters[0].key, "priority");
  EXPECT_TRUE(out->format.binary_by_default);
  EXPECT_TRUE(out->format.binary("anything"));

  // The sizes must add up to the binary section exactly.
  EXPECT_EQ(refusal(json + a + b + "x", json.size()),
            "the binary section (after Inference-Header-Content-Length) has 15 bytes, the inputs' binary_data_size "
            "add up to 14");
  EXPECT_EQ(refusal(json + a + "x", json.size()),
            "input 'B': binary_data_size 6 is more than the 1 bytes left in the binary section (after "
            "Inference-Header-Content-Length)");
  EXPECT_EQ(refusal(json),
            "input 'A': binary_data_size 8 is more than the 0 bytes left in the binary section (after "
            "Inference-Header-Content-Length)");
  EXPECT_EQ(refusal(one_input("INT32", "[1]", "[1]") + "abcd", one_input("INT32", "[1]", "[1]").size()),
            "the binary section (after Inference-Header-Content-Length) has 4 bytes, the inputs' binary_data_size "
            "add up to 0");
  EXPECT_EQ(refusal(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":-4}}]})"),
            "input 'x': parameter 'binary_data_size' must be a non-negative integer");
  // A header length that lies.
  EXPECT_EQ(refusal(json, json.size() + 1), "Inference-Header-Content-Length " + std::to_string(json.size() + 1) +
                                                " is more than the body's " + std::to_string(json.size()) + " bytes");
  EXPECT_EQ(refusal(json, json.size() - 1), "malformed JSON at byte " + std::to_string(json.size() - 1) +
                                                ": Missing a comma or '}' after an object member.");
  EXPECT_EQ(refusal(json + a + b, 0),
            "Inference-Header-Content-Length 0 (a body of one raw input, without JSON) is not supported; send the "
            "JSON header first and give its length");
}

TEST(HttpDecode, MapsParameterValuesAndTakesOutTheHttpOnlyOnes) {
  std::shared_ptr<HttpInferRequest> out;
  const Status status =
      decode(R"({"parameters":{"b":false,"i":-3,"u":18446744073709551615,"d":0.5,"s":"t","binary_data_output":false},)"
             R"("outputs":[{"name":"y","parameters":{"binary_data":true,"k":1}},{"name":"z"}]})",
             &out);
  ASSERT_TRUE(status.ok()) << status.message;
  const std::vector<WireParameter>& p = out->parsed.parameters;
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[0].kind, WireParameter::Kind::kBool);
  EXPECT_FALSE(p[0].bool_value);
  EXPECT_EQ(p[1].kind, WireParameter::Kind::kInt64);
  EXPECT_EQ(p[1].int64_value, -3);
  EXPECT_EQ(p[2].kind, WireParameter::Kind::kUint64);
  EXPECT_EQ(p[2].uint64_value, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(p[3].kind, WireParameter::Kind::kDouble);
  EXPECT_EQ(p[3].double_value, 0.5);
  EXPECT_EQ(p[4].kind, WireParameter::Kind::kString);
  EXPECT_EQ(p[4].string_value, "t");
  ASSERT_EQ(out->parsed.outputs.size(), 2u);
  EXPECT_EQ(out->parsed.outputs[0].name, "y");
  ASSERT_EQ(out->parsed.outputs[0].parameters.size(), 1u);
  EXPECT_EQ(out->parsed.outputs[0].parameters[0].key, "k");
  EXPECT_FALSE(out->format.binary_by_default);
  EXPECT_TRUE(out->format.binary("y"));
  EXPECT_FALSE(out->format.binary("z"));
  EXPECT_TRUE(out->parsed.raw_input_contents.empty());
}

// --- HTTP and gRPC give the same core request -------------------------------------------------

// Two inputs A and B (INT32 [-1, 2]), max_batch_size 4, outputs X and Y; A in model order first.
struct BothProtocols {
  std::shared_ptr<HttpInferRequest> http;
  InferenceRequest from_http;
  Status http_status;
  std::unique_ptr<Built> grpc;
};

BothProtocols build_both(const std::shared_ptr<const ModelSignature>& model, const std::string& json,
                         const std::string& grpc_bytes) {
  BothProtocols both;
  both.http_status = decode(json, &both.http);
  if (both.http_status.ok()) {
    both.http_status = build_inference_request(model, both.http->parsed, both.http, &both.from_http);
  }
  both.grpc = build(model, grpc_bytes);
  return both;
}

void expect_same_request(const InferenceRequest& a, const InferenceRequest& b) {
  ASSERT_EQ(a.inputs.size(), b.inputs.size());
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    EXPECT_EQ(a.inputs[i].dtype, b.inputs[i].dtype);
    EXPECT_EQ(a.inputs[i].shape, b.inputs[i].shape);
    EXPECT_EQ(a.inputs[i].absent, b.inputs[i].absent);
    EXPECT_EQ(bytes_of(a.inputs[i]), bytes_of(b.inputs[i]));
  }
  EXPECT_EQ(a.batch_size, b.batch_size);
  EXPECT_EQ(a.priority, b.priority);
  EXPECT_EQ(a.timeout_us, b.timeout_us);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.requested_outputs, b.requested_outputs);
  EXPECT_EQ(a.parameters_json, b.parameters_json);
  EXPECT_EQ(a.checked, b.checked);
}

std::string int_parameter(const std::string& name, uint64_t value) { return parameter(4, name, vfield(2, value)); }

TEST(HttpAndGrpc, GiveTheSameInferenceRequest) {
  auto model = std::make_shared<ModelSignature>(*batching_model());
  model->keeps_parameters = true;
  // B nested as JSON, A binary; outputs Y then X; priority and a custom parameter.
  const std::string a = le<int32_t>(1) + le<int32_t>(2) + le<int32_t>(3) + le<int32_t>(4);
  const std::string json = R"({"id":"r1","parameters":{"priority":1,"tag":"t"},"inputs":[)"
                           R"({"name":"B","datatype":"INT32","shape":[2,2],"data":[[5,6],[7,8]]},)"
                           R"({"name":"A","datatype":"INT32","shape":[2,2],"parameters":{"binary_data_size":16}}],)"
                           R"("outputs":[{"name":"Y","parameters":{"binary_data":false}},{"name":"X"}]})";
  const std::string b = le<int32_t>(5) + le<int32_t>(6) + le<int32_t>(7) + le<int32_t>(8);
  const std::string grpc = ld(3, "r1") + int_parameter("priority", 1) + parameter(4, "tag", ld(3, "t")) +
                           ld(5, input("B", "INT32", {2, 2})) + ld(5, input("A", "INT32", {2, 2})) + ld(6, ld(1, "Y")) +
                           ld(6, ld(1, "X")) + ld(7, b) + ld(7, a);
  BothProtocols both;
  both.http_status = decode(json + a, &both.http, json.size());
  ASSERT_TRUE(both.http_status.ok()) << both.http_status.message;
  both.http_status = build_inference_request(model, both.http->parsed, both.http, &both.from_http);
  ASSERT_TRUE(both.http_status.ok()) << both.http_status.message;
  both.grpc = build(model, grpc);
  ASSERT_TRUE(both.grpc->status.ok()) << both.grpc->status.message;
  expect_same_request(both.from_http, both.grpc->request);
  EXPECT_EQ(both.from_http.parameters_json, R"({"tag":"t"})");
  EXPECT_EQ(both.from_http.requested_outputs, (std::vector<uint32_t>{1, 0}));
  // The binary input is a view of the body, kept alive by the decoded request.
  EXPECT_EQ(both.from_http.inputs[0].owner, both.http);
}

TEST(HttpAndGrpc, RefuseTheSameBadRequestsWithTheSameMessages) {
  const auto model = batching_model();
  const std::string four = le<int32_t>(1) + le<int32_t>(2) + le<int32_t>(3) + le<int32_t>(4);
  struct Case {
    const char* what;
    std::string json;
    std::string grpc;
  };
  const auto a_input = [](const std::string& name, const std::string& datatype, const std::string& shape,
                          const std::string& data) {
    return R"({"name":")" + name + R"(","datatype":")" + datatype + R"(","shape":)" + shape + R"(,"data":)" + data +
           "}";
  };
  const std::string good_b = a_input("B", "INT32", "[2,2]", "[1,2,3,4]");
  const std::string grpc_b = ld(5, input("B", "INT32", {2, 2}));
  const std::vector<Case> cases = {
      {"unknown input", R"({"inputs":[)" + a_input("C", "INT32", "[2,2]", "[1,2,3,4]") + "," + good_b + "]}",
       ld(5, input("C", "INT32", {2, 2})) + grpc_b + ld(7, four) + ld(7, four)},
      {"missing input", R"({"inputs":[)" + good_b + "]}", grpc_b + ld(7, four)},
      {"wrong datatype", R"({"inputs":[)" + a_input("A", "FP32", "[2,2]", "[1,2,3,4]") + "," + good_b + "]}",
       ld(5, input("A", "FP32", {2, 2})) + grpc_b + ld(7, le(1.0f) + le(2.0f) + le(3.0f) + le(4.0f)) + ld(7, four)},
      {"wrong shape", R"({"inputs":[)" + a_input("A", "INT32", "[1,4]", "[1,2,3,4]") + "," + good_b + "]}",
       ld(5, input("A", "INT32", {1, 4})) + grpc_b + ld(7, four) + ld(7, four)},
      {"batch too large",
       R"({"inputs":[)" + a_input("A", "INT32", "[5,2]", "[1,2,3,4,5,6,7,8,9,10]") + "," + good_b + "]}",
       ld(5, input("A", "INT32", {5, 2})) + grpc_b + ld(7, four + four + le<int32_t>(9) + le<int32_t>(10)) +
           ld(7, four)},
      {"batch sizes differ", R"({"inputs":[)" + a_input("A", "INT32", "[1,2]", "[1,2]") + "," + good_b + "]}",
       ld(5, input("A", "INT32", {1, 2})) + grpc_b + ld(7, le<int32_t>(1) + le<int32_t>(2)) + ld(7, four)},
      {"given twice", R"({"inputs":[)" + good_b + "," + good_b + "]}", grpc_b + grpc_b + ld(7, four) + ld(7, four)},
      {"unknown output",
       R"({"inputs":[)" + a_input("A", "INT32", "[2,2]", "[1,2,3,4]") + "," + good_b + R"(],"outputs":[{"name":"Z"}]})",
       ld(5, input("A", "INT32", {2, 2})) + grpc_b + ld(6, ld(1, "Z")) + ld(7, four) + ld(7, four)},
      {"negative priority",
       R"({"parameters":{"priority":-1},"inputs":[)" + a_input("A", "INT32", "[2,2]", "[1,2,3,4]") + "," + good_b +
           "]}",
       int_parameter("priority", static_cast<uint64_t>(-1)) + ld(5, input("A", "INT32", {2, 2})) + grpc_b +
           ld(7, four) + ld(7, four)},
      {"a sequence",
       R"({"parameters":{"sequence_start":true},"inputs":[)" + a_input("A", "INT32", "[2,2]", "[1,2,3,4]") + "," +
           good_b + "]}",
       parameter(4, "sequence_start", vfield(1, 1)) + ld(5, input("A", "INT32", {2, 2})) + grpc_b + ld(7, four) +
           ld(7, four)},
      {"no inputs", "{}", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const BothProtocols both = build_both(model, c.json, c.grpc);
    EXPECT_FALSE(both.http_status.ok());
    EXPECT_FALSE(both.grpc->status.ok());
    EXPECT_EQ(both.http_status.code, both.grpc->status.code);
    EXPECT_EQ(both.http_status.message, both.grpc->status.message);
  }
}

// --- Answers -----------------------------------------------------------------------------------

struct Answer {
  Status status;
  std::string body;
  size_t json_length = 0;
  std::string json() const { return body.substr(0, json_length); }
  std::string binary() const { return body.substr(json_length); }
};

Answer encode(const InferenceRequest& request, const std::vector<Tensor>& outputs, const HttpAnswerFormat& format,
              std::optional<bool> final_response = std::nullopt) {
  Answer a;
  a.status = encode_http_infer_response(request, outputs, format, &a.body, &a.json_length, final_response);
  return a;
}

Tensor tensor_of(DataType dtype, std::vector<int64_t> shape, const std::string& bytes) {
  return Tensor{dtype, std::move(shape), reinterpret_cast<const std::byte*>(bytes.data()), bytes.size(), nullptr};
}

TEST(HttpEncode, WritesEveryJsonDatatypeAsTritonDoes) {
  struct Case {
    DataType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
    std::string data;
  };
  const std::vector<Case> cases = {
      {DataType::kBool, {3}, std::string("\x01\x00\x02", 3), "[true,false,true]"},
      {DataType::kUint8, {2}, std::string("\x00\xff", 2), "[0,255]"},
      {DataType::kUint16, {1}, le<uint16_t>(65535), "[65535]"},
      {DataType::kUint32, {1}, le<uint32_t>(4294967295u), "[4294967295]"},
      {DataType::kUint64, {1}, le<uint64_t>(std::numeric_limits<uint64_t>::max()), "[18446744073709551615]"},
      {DataType::kInt8, {2}, le<int8_t>(-128) + le<int8_t>(1), "[-128,1]"},
      {DataType::kInt16, {1}, le<int16_t>(-32768), "[-32768]"},
      {DataType::kInt32, {2, 1}, le<int32_t>(-7) + le<int32_t>(8), "[-7,8]"},
      {DataType::kInt64, {1}, le<int64_t>(std::numeric_limits<int64_t>::min()), "[-9223372036854775808]"},
      // Shortest round-trip: 0.1f is 0.1, not 0.10000000149011612.
      {DataType::kFp32, {4}, le(0.1f) + le(-2.0f) + le(3.4028235e38f) + le(1e-45f), "[0.1,-2,3.4028235e+38,1e-45]"},
      {DataType::kFp64, {2}, le(0.1) + le(1e300), "[0.1,1e+300]"},
      {DataType::kFp32, {3}, le(std::nanf("")) + le(INFINITY) + le(-INFINITY), "[NaN,Infinity,-Infinity]"},
      {DataType::kBytes, {2}, bytes_element("a\"\\") + bytes_element("\xc3\xa9"), "[\"a\\\"\\\\\",\"\xc3\xa9\"]"},
      {DataType::kBytes, {0}, "", "[]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.data);
    auto model = std::make_shared<ModelSignature>();
    model->name = "m";
    model->version = "2";
    model->outputs = {OutputSignature{"y", c.dtype, {-1}, false}};
    InferenceRequest request;
    request.signature = model;
    const Answer answer = encode(request, {tensor_of(c.dtype, c.shape, c.bytes)}, HttpAnswerFormat{});
    ASSERT_TRUE(answer.status.ok()) << answer.status.message;
    std::string shape;
    for (int64_t d : c.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    EXPECT_EQ(answer.body, std::string(R"({"model_name":"m","model_version":"2","outputs":[{"name":"y","datatype":")") +
                               datatype_name(c.dtype) + R"(","shape":[)" + shape + R"(],"data":)" + c.data + "}]}");
    EXPECT_EQ(answer.json_length, answer.body.size());
  }
}

TEST(HttpEncode, JsonNumbersRoundTripExactly) {
  auto model = std::make_shared<ModelSignature>();
  model->name = "m";
  model->outputs = {OutputSignature{"f", DataType::kFp32, {-1}, false},
                    OutputSignature{"d", DataType::kFp64, {-1}, false}};
  InferenceRequest request;
  request.signature = model;
  std::string floats, doubles;
  const std::vector<float> fs = {1.0f / 3, 16777217.0f, 1.17549435e-38f, -0.0f, 123456.789f};
  const std::vector<double> ds = {1.0 / 3, 5e-324, 2.2250738585072014e-308, 9007199254740993.0};
  for (float f : fs) floats += le(f);
  for (double d : ds) doubles += le(d);
  const Answer answer = encode(
      request, {tensor_of(DataType::kFp32, {5}, floats), tensor_of(DataType::kFp64, {4}, doubles)}, HttpAnswerFormat{});
  ASSERT_TRUE(answer.status.ok()) << answer.status.message;
  // Decoding the answer's data as an input gives back the same bytes.
  const size_t f_data = answer.body.find("\"data\":") + 7;
  const std::string f_json = answer.body.substr(f_data, answer.body.find(']', f_data) + 1 - f_data);
  EXPECT_EQ(decoded_bytes(one_input("FP32", "[5]", f_json)), floats) << f_json;
  const size_t d_data = answer.body.find("\"data\":", f_data) + 7;
  const std::string d_json = answer.body.substr(d_data, answer.body.find(']', d_data) + 1 - d_data);
  EXPECT_EQ(decoded_bytes(one_input("FP64", "[4]", d_json)), doubles) << d_json;
}

// Two outputs, y (INT32 [2]) and z (FP16 [-1] reshaped); the request asks for them by name.
struct TwoOutputs {
  std::shared_ptr<ModelSignature> model = std::make_shared<ModelSignature>();
  InferenceRequest request;
  // The scattered outputs may be views into one batch buffer at any offset: unaligned here.
  std::string batch = "." + le<int32_t>(1) + le<int32_t>(2) + std::string("\x00\x3c\x00\x40\x00\x42", 6);
  std::vector<Tensor> outputs;
  TwoOutputs() {
    model->name = "m";
    model->version = "1";
    model->outputs = {OutputSignature{"y", DataType::kInt32, {2}, false},
                      OutputSignature{"z", DataType::kFp16, {-1}, /*has_reshape=*/true}};
    request.signature = model;
    request.id = "req";
    const auto* base = reinterpret_cast<const std::byte*>(batch.data());
    outputs = {Tensor{DataType::kInt32, {2}, base + 1, 8, nullptr},
               Tensor{DataType::kFp16, {3, 1}, base + 9, 6, nullptr}};
  }
};

TEST(HttpEncode, WritesBinaryOutputsAfterTheJsonInOrder) {
  TwoOutputs t;
  HttpAnswerFormat format;
  format.binary_by_default = true;
  format.by_output["y"] = false;
  const Answer answer = encode(t.request, t.outputs, format, /*final_response=*/true);
  ASSERT_TRUE(answer.status.ok()) << answer.status.message;
  // z in the protocol's dims [3] (the model answered [3, 1]).
  EXPECT_EQ(answer.json(), R"({"model_name":"m","model_version":"1","id":"req","parameters":)"
                           R"({"triton_final_response":true},"outputs":[)"
                           R"({"name":"y","datatype":"INT32","shape":[2],"data":[1,2]},)"
                           R"({"name":"z","datatype":"FP16","shape":[3],"parameters":{"binary_data_size":6}}]})");
  EXPECT_EQ(answer.binary(), t.batch.substr(9));

  // Requested outputs only, in request order; both binary.
  t.request.requested_outputs = {1, 0};
  format.by_output.clear();
  const Answer both = encode(t.request, t.outputs, format);
  ASSERT_TRUE(both.status.ok()) << both.status.message;
  EXPECT_EQ(both.json(), R"({"model_name":"m","model_version":"1","id":"req","outputs":[)"
                         R"({"name":"z","datatype":"FP16","shape":[3],"parameters":{"binary_data_size":6}},)"
                         R"({"name":"y","datatype":"INT32","shape":[2],"parameters":{"binary_data_size":8}}]})");
  EXPECT_EQ(both.binary(), t.batch.substr(9) + t.batch.substr(1, 8));
  t.request.requested_outputs = {0};
  EXPECT_EQ(encode(t.request, t.outputs, format).binary(), t.batch.substr(1, 8));
}

TEST(HttpEncode, RefusesWhatItCannotWrite) {
  TwoOutputs t;
  // FP16 asked for as JSON: refused, as Triton does.
  Answer answer = encode(t.request, t.outputs, HttpAnswerFormat{});
  EXPECT_EQ(answer.status.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(answer.status.message,
            "sending FP16 data via JSON is not supported; ask for output 'z' of model 'm' in binary (the "
            "'binary_data' parameter)");
  // Elements that do not fit the reshaped dims: INTERNAL, as InferResponseWriter.
  t.model->outputs[1].dims = {2};
  answer = encode(t.request, t.outputs, HttpAnswerFormat{});
  EXPECT_EQ(answer.status.code, StatusCode::kInternal);
  EXPECT_EQ(answer.status.message, "output 'z' of model 'm' cannot be shown in its dims (reshape)");
  t.request.requested_outputs = {2};
  EXPECT_EQ(encode(t.request, t.outputs, HttpAnswerFormat{}).status.message,
            "model 'm' gave fewer outputs than its signature lists");

  // BYTES that are not UTF-8, asked for as JSON; and bytes that do not hold the shape.
  auto model = std::make_shared<ModelSignature>();
  model->name = "m";
  model->outputs = {OutputSignature{"s", DataType::kBytes, {-1}, false}};
  InferenceRequest request;
  request.signature = model;
  const std::string bad = bytes_element("ok") + bytes_element("\xff");
  answer = encode(request, {tensor_of(DataType::kBytes, {2}, bad)}, HttpAnswerFormat{});
  EXPECT_EQ(answer.status.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(answer.status.message,
            "output 's' of model 'm' element 1 is not UTF-8 text, which JSON cannot carry; ask for the output in "
            "binary (the 'binary_data' parameter)");
  HttpAnswerFormat binary;
  binary.binary_by_default = true;
  EXPECT_TRUE(encode(request, {tensor_of(DataType::kBytes, {2}, bad)}, binary).status.ok());
  for (const auto& [shape, bytes] :
       std::vector<std::pair<std::vector<int64_t>, std::string>>{{{3}, bytes_element("ok") + bytes_element("b")},
                                                                 {{1}, bad},
                                                                 {{1}, "\x05"},
                                                                 {{1}, le32(9) + "a"},
                                                                 {{1}, ""}}) {
    answer = encode(request, {tensor_of(DataType::kBytes, shape, bytes)}, HttpAnswerFormat{});
    EXPECT_EQ(answer.status.code, StatusCode::kInternal) << bytes.size();
  }
  model->outputs[0].dtype = DataType::kInt32;
  answer = encode(request, {tensor_of(DataType::kInt32, {2}, "12345")}, HttpAnswerFormat{});
  EXPECT_EQ(answer.status.code, StatusCode::kInternal);
  EXPECT_EQ(answer.status.message, "output 's' of model 'm' holds 5 bytes, which do not fit its shape");
}

// A client's POSIX shared-memory object, mapped by the test as the client would; removed at the end.
class ClientObject {
 public:
  explicit ClientObject(size_t size) : name_("/inferd-http-codec-test-" + std::to_string(getpid())), size_(size) {
    fd_ = shm_open(name_.c_str(), O_CREAT | O_RDWR, 0600);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(size)), 0);
    void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(map, MAP_FAILED);
    bytes_ = static_cast<char*>(map);
  }
  ~ClientObject() {
    munmap(bytes_, size_);
    close(fd_);
    shm_unlink(name_.c_str());
  }
  ClientObject(const ClientObject&) = delete;
  ClientObject& operator=(const ClientObject&) = delete;
  const std::string& name() const { return name_; }
  const char* bytes() const { return bytes_; }

 private:
  std::string name_;
  size_t size_;
  int fd_ = -1;
  char* bytes_ = nullptr;
};

TEST(HttpEncode, WritesSharedMemoryOutputsIntoTheirSlicesAndNamesThem) {
  ClientObject object(4096);
  SharedMemoryRegistry registry;
  ASSERT_TRUE(registry.register_system("out", object.name(), 0, 4096).ok());
  const auto model = batching_model();
  const std::string json =
      R"({"inputs":[{"name":"A","datatype":"INT32","shape":[1,2],"data":[1,2]},)"
      R"({"name":"B","datatype":"INT32","shape":[1,2],"data":[3,4]}],)"
      R"("outputs":[{"name":"Y","parameters":{"shared_memory_region":"out","shared_memory_byte_size":8,)"
      R"("shared_memory_offset":16}},{"name":"X","parameters":{"binary_data":true}}]})";
  std::shared_ptr<HttpInferRequest> http;
  ASSERT_TRUE(decode(json, &http).ok());
  InferenceRequest request;
  const Status built = build_inference_request(model, http->parsed, http, &request, &registry);
  ASSERT_TRUE(built.ok()) << built.message;
  const std::string x = le<int32_t>(10) + le<int32_t>(20);
  const std::string y = le<int32_t>(30) + le<int32_t>(40);
  const std::vector<Tensor> outputs = {tensor_of(DataType::kInt32, {1, 2}, x), tensor_of(DataType::kInt32, {1, 2}, y)};
  const Answer answer = encode(request, outputs, http->format);
  ASSERT_TRUE(answer.status.ok()) << answer.status.message;
  EXPECT_EQ(answer.json(), R"({"model_name":"pair","model_version":"","outputs":[)"
                           R"({"name":"Y","datatype":"INT32","shape":[1,2],"parameters":{"shared_memory_region":"out",)"
                           R"("shared_memory_byte_size":8,"shared_memory_offset":16}},)"
                           R"({"name":"X","datatype":"INT32","shape":[1,2],"parameters":{"binary_data_size":8}}]})");
  EXPECT_EQ(answer.binary(), x);
  EXPECT_EQ(std::string(object.bytes() + 16, 8), y);

  // A slice too small for its output: InferResponseWriter's refusal, in its words.
  const std::vector<Tensor> larger = {tensor_of(DataType::kInt32, {1, 2}, x),
                                      tensor_of(DataType::kInt32, {1, 4}, y + y)};
  EXPECT_EQ(encode(request, larger, http->format).status.message,
            "shared memory size specified with the request for output 'Y' (8 bytes) should be at least 16 bytes to "
            "hold the results");
}

TEST(HttpErrorBody, EscapesTheMessageAndReplacesBytesThatAreNotUtf8) {
  EXPECT_EQ(http_error_body("plain"), R"({"error":"plain"})");
  EXPECT_EQ(http_error_body("a \"quote\", a \\ and a\nnewline\x01"),
            R"({"error":"a \"quote\", a \\ and a\nnewline\u0001"})");
  EXPECT_EQ(http_error_body("caf\xc3\xa9 \xff\xc3 end"), "{\"error\":\"caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd end\"}");
  EXPECT_EQ(http_error_body(std::string("nul\0in", 6)), R"({"error":"nul\u0000in"})");
  EXPECT_EQ(http_error_body("\xed\xa0\x80"), "{\"error\":\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"}");  // a surrogate
}

}  // namespace
}  // namespace inferd
