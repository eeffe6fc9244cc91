// Triton's generate extension as v2 infer messages (http_generate.h): a generate body becomes the
// infer request it stands for (inputs by name, shapes from the model's dims, parameters from the
// rest), refusals name what is wrong, nesting costs no recursion, and an infer answer becomes the
// generate answer.
#include "http_generate.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "inferd/http_infer_codec.h"

namespace inferd {
namespace {

InputSignature input(const std::string& name, DataType dtype, std::vector<int64_t> dims) {
  InputSignature in;
  in.name = name;
  in.dtype = dtype;
  in.dims = std::move(dims);
  return in;
}

// A text model: text_input BYTES [1], values FP32 [-1], grid INT32 [2, -1]; batching when
// `max_batch_size` > 0.
ModelSignature text_model(int max_batch_size = 0) {
  ModelSignature m;
  m.name = "llm";
  m.version = "1";
  m.max_batch_size = max_batch_size;
  m.inputs = {input("text_input", DataType::kBytes, {1}), input("values", DataType::kFp32, {-1}),
              input("grid", DataType::kInt32, {2, -1})};
  m.outputs = {OutputSignature{"text_output", DataType::kBytes, {1}, false}};
  return m;
}

// `body` (a copy: it is parsed in place) as the infer request it stands for, or its refusal.
std::string to_infer(std::string body, const ModelSignature& model = text_model(), size_t max_depth = 64) {
  std::string out;
  const Status status = generate_to_infer_json(&body, model, max_depth, &out);
  return status.ok() ? out : "<refused " + std::to_string(static_cast<int>(status.code)) + ": " + status.message + ">";
}

std::string refusal(const std::string& message) {
  return "<refused " + std::to_string(static_cast<int>(StatusCode::kInvalidArgument)) + ": " + message + ">";
}

// The start of a refusal whose message starts with `message`.
std::string refusal_starting(const std::string& message) {
  return "<refused " + std::to_string(static_cast<int>(StatusCode::kInvalidArgument)) + ": " + message;
}

// The codec takes what the translation writes (and so checks it as any infer request).
void expect_decodes(const std::string& infer_json, size_t inputs) {
  std::shared_ptr<HttpInferRequest> decoded;
  const Status status =
      decode_http_infer_request("llm", "", std::make_shared<std::string>(infer_json), std::nullopt, {}, &decoded);
  ASSERT_TRUE(status.ok()) << status.message << " in " << infer_json;
  EXPECT_EQ(decoded->parsed.inputs.size(), inputs);
}

TEST(HttpGenerateRequest, FieldsNamingInputsAreInputsAndTheRestParameters) {
  const std::string infer =
      to_infer(R"({"text_input":"hi","max_tokens":8,"stream":false,"parameters":{"temperature":0.5,"mode":"x"}})");
  EXPECT_EQ(infer, R"({"inputs":[{"name":"text_input","datatype":"BYTES","shape":[1],"data":["hi"]}],)"
                   R"("parameters":{"max_tokens":8,"stream":false,"temperature":0.5,"mode":"x"}})");
  expect_decodes(infer, 1);
}

TEST(HttpGenerateRequest, InputsKeepTheBodysOrderAndTheIdIsTheRequestsId) {
  const std::string infer = to_infer(R"({"values":[1.5,2],"id":"req-7","text_input":["a"]})");
  EXPECT_EQ(infer, R"({"inputs":[{"name":"values","datatype":"FP32","shape":[2],"data":[1.5,2]},)"
                   R"({"name":"text_input","datatype":"BYTES","shape":[1],"data":["a"]}],"id":"req-7"})");
  expect_decodes(infer, 2);
}

TEST(HttpGenerateRequest, ABodyWithoutParametersHasNone) {
  EXPECT_EQ(to_infer(R"({"text_input":"hi"})"),
            R"({"inputs":[{"name":"text_input","datatype":"BYTES","shape":[1],"data":["hi"]}]})");
  EXPECT_EQ(to_infer("{}"), R"({"inputs":[]})");
  // An empty 'parameters' object is written as such.
  EXPECT_EQ(to_infer(R"({"parameters":{}})"), R"({"inputs":[],"parameters":{}})");
}

TEST(HttpGenerateRequest, AMinusOneDimTakesTheElementCount) {
  EXPECT_EQ(to_infer(R"({"values":[1,2,3,4,5]})"),
            R"({"inputs":[{"name":"values","datatype":"FP32","shape":[5],"data":[1,2,3,4,5]}]})");
  EXPECT_EQ(to_infer(R"({"values":7})"), R"({"inputs":[{"name":"values","datatype":"FP32","shape":[1],"data":[7]}]})");
  EXPECT_EQ(to_infer(R"({"values":[]})"), R"({"inputs":[{"name":"values","datatype":"FP32","shape":[0],"data":[]}]})");
  // [2, -1]: the -1 takes what the fixed 2 leaves.
  const std::string grid = to_infer(R"({"grid":[[1,2,3],[4,5,6]]})");
  EXPECT_EQ(grid, R"({"inputs":[{"name":"grid","datatype":"INT32","shape":[2,3],"data":[1,2,3,4,5,6]}]})");
  expect_decodes(grid, 1);
}

TEST(HttpGenerateRequest, ABatchingModelGetsABatchOfOne) {
  const ModelSignature model = text_model(/*max_batch_size=*/8);
  const std::string infer = to_infer(R"({"text_input":"hi","values":[1,2,3],"grid":[1,2,3,4]})", model);
  EXPECT_EQ(infer, R"({"inputs":[{"name":"text_input","datatype":"BYTES","shape":[1,1],"data":["hi"]},)"
                   R"({"name":"values","datatype":"FP32","shape":[1,3],"data":[1,2,3]},)"
                   R"({"name":"grid","datatype":"INT32","shape":[1,2,2],"data":[1,2,3,4]}]})");
  expect_decodes(infer, 3);
}

TEST(HttpGenerateRequest, NestedArraysAreFlattenedInOrder) {
  EXPECT_EQ(to_infer(R"({"values":[[[1],[2]],[[3,4]],[],[[[5]]],6]})"),
            R"({"inputs":[{"name":"values","datatype":"FP32","shape":[6],"data":[1,2,3,4,5,6]}]})");
}

TEST(HttpGenerateRequest, ABodyThatIsNotAJsonObjectIsRefused) {
  for (const char* body : {"[1]", "\"text\"", "3", "null", "true"}) {
    SCOPED_TRACE(body);
    EXPECT_EQ(to_infer(body), refusal("the generate request must be a JSON object"));
  }
  // Not JSON at all: the parser says where.
  for (const char* body : {"", "{", "{\"a\":1", "{} {}", "{\"a\":1} x", "{\"a\":nul}"}) {
    SCOPED_TRACE(body);
    const std::string refused = to_infer(body);
    EXPECT_EQ(refused.rfind(refusal_starting("malformed JSON at byte "), 0), 0u) << refused;
  }
  EXPECT_EQ(to_infer("{\"a\":\"\xff\"}"), refusal("malformed JSON: the text is not UTF-8"));
  EXPECT_EQ(to_infer(std::string("{\"a\":1}\0", 8)), refusal("malformed JSON at byte 7: a NUL byte in the JSON"));
}

TEST(HttpGenerateRequest, AParameterThatIsNotAScalarIsRefusedNamingIt) {
  for (const char* value : {"[1]", "{}", "{\"a\":1}", "null"}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(to_infer(std::string(R"({"text_input":"hi","stop":)") + value + "}"),
              refusal("field 'stop' is neither an input of the model nor a parameter (a string, number or bool)"));
    EXPECT_EQ(to_infer(std::string(R"({"parameters":{"ok":1,"bad":)") + value + "}}"),
              refusal("parameter 'bad' must be a string, number or bool"));
  }
  for (const char* parameters : {"[]", "1", "\"x\"", "null", "true"}) {
    SCOPED_TRACE(parameters);
    EXPECT_EQ(to_infer(std::string(R"({"text_input":"hi","parameters":)") + parameters + "}"),
              refusal("'parameters' must be a JSON object"));
  }
}

// `depth` arrays nested around a 1: [[[...[1]...]]].
std::string nested_arrays(size_t depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }
// `depth` objects nested around a 1: {"a":{"a":...1...}}.
std::string nested_objects(size_t depth) {
  std::string out;
  for (size_t i = 0; i < depth; ++i) out += "{\"a\":";
  out += "1";
  out += std::string(depth, '}');
  return out;
}

TEST(HttpGenerateRequest, AnInputNestedPastTheDepthLimitIsRefused) {
  // The request's own structure takes two levels (the document, the data array).
  EXPECT_EQ(to_infer(R"({"values":)" + nested_arrays(62) + "}"),
            R"({"inputs":[{"name":"values","datatype":"FP32","shape":[1],"data":[1]}]})");
  EXPECT_EQ(to_infer(R"({"values":)" + nested_arrays(63) + "}"),
            refusal("input 'values' nests deeper than --http-max-json-depth (64)"));
  EXPECT_EQ(to_infer(R"({"values":)" + nested_arrays(9) + "}", text_model(), 10),
            refusal("input 'values' nests deeper than --http-max-json-depth (10)"));
  // Past the document's own limit the parse stops.
  EXPECT_EQ(to_infer(R"({"values":)" + nested_arrays(64) + "}"),
            refusal("the request's JSON nests arrays and objects deeper than 64 (--http-max-json-depth)"));
}

// 100,000 levels, wherever they are: a recursive walk over them would overflow the stack (and a
// server thread's).
TEST(HttpGenerateRequest, HundredThousandLevelsAreRefusedWithoutRecursion) {
  constexpr size_t kDeep = 100'000;
  const std::string too_deep =
      refusal("the request's JSON nests arrays and objects deeper than 64 (--http-max-json-depth)");
  for (const std::string& body :
       {R"({"values":)" + nested_arrays(kDeep) + "}", R"({"values":[1,)" + nested_arrays(kDeep) + "]}",
        R"({"values":)" + nested_objects(kDeep) + "}", R"({"values":[)" + nested_objects(kDeep) + "]}",
        R"({"stop":)" + nested_arrays(kDeep) + "}", R"({"parameters":{"p":)" + nested_arrays(kDeep) + "}}",
        R"({"parameters":)" + nested_objects(kDeep) + "}", R"({"id":)" + nested_arrays(kDeep) + "}",
        nested_arrays(kDeep), nested_objects(kDeep)}) {
    SCOPED_TRACE(body.substr(0, 30));
    EXPECT_EQ(to_infer(body), too_deep);
  }
}

std::string to_generate(const std::string& answer) {
  std::string out;
  const Status status = infer_answer_to_generate_json(answer, &out);
  return status.ok() ? out : "<failed " + std::to_string(static_cast<int>(status.code)) + ": " + status.message + ">";
}

TEST(HttpGenerateAnswer, OutputsBecomeFieldsAndOneElementAValue) {
  EXPECT_EQ(to_generate(R"({"model_name":"llm","model_version":"1","id":"req-7","parameters":{"x":1},)"
                        R"("outputs":[{"name":"text_output","datatype":"BYTES","shape":[1],"data":["hello"]},)"
                        R"({"name":"logits","datatype":"FP32","shape":[3],"data":[0.5,1.5,2.5]},)"
                        R"({"name":"empty","datatype":"FP32","shape":[0],"data":[]}]})"),
            R"({"model_name":"llm","model_version":"1","id":"req-7","text_output":"hello",)"
            R"("logits":[0.5,1.5,2.5],"empty":[]})");
}

TEST(HttpGenerateAnswer, WithoutAnIdThereIsNoneAndBinaryOutputsAreLeftOut) {
  EXPECT_EQ(
      to_generate(R"({"model_name":"llm","model_version":"1",)"
                  R"("outputs":[{"name":"raw","datatype":"FP32","shape":[2],)"
                  R"("parameters":{"binary_data_size":8}},{"name":"n","datatype":"INT64","shape":[1],"data":[3]}]})"),
      R"({"model_name":"llm","model_version":"1","n":3})");
  EXPECT_EQ(to_generate(R"({"model_name":"llm","model_version":"1"})"), R"({"model_name":"llm","model_version":"1"})");
}

// The answer's numbers come through exactly: a double read back is the double written (RapidJSON's
// default conversion reads 1e-301 one ULP off).
TEST(HttpGenerateAnswer, NumbersKeepEveryBit) {
  for (const char* number : {"1e-301", "3.4028234663852886e38", "0.1", "5e-324", "-2.2250738585072014e-308",
                             "1.7976931348623157e308", "9007199254740993", "-9223372036854775808"}) {
    SCOPED_TRACE(number);
    const std::string generated =
        to_generate(std::string(R"({"model_name":"m","model_version":"1",)") +
                    R"("outputs":[{"name":"x","datatype":"FP64","shape":[1],"data":[)" + number + "]}]}");
    const std::string prefix = R"({"model_name":"m","model_version":"1","x":)";
    ASSERT_EQ(generated.rfind(prefix, 0), 0u) << generated;
    const std::string written = generated.substr(prefix.size(), generated.size() - prefix.size() - 1);
    if (written.find_first_of(".eE") == std::string::npos &&
        std::string(number).find_first_of(".eE") == std::string::npos) {
      EXPECT_EQ(written, number);  // integers stay integers
    } else {
      EXPECT_EQ(std::strtod(written.c_str(), nullptr), std::strtod(number, nullptr)) << written;
    }
  }
}

// The infer answer writes NaN and infinities as NaN, Infinity and -Infinity (what Python's json
// reads); so does the generate answer.
TEST(HttpGenerateAnswer, NanAndInfinitiesComeThrough) {
  EXPECT_EQ(to_generate(R"({"model_name":"m","model_version":"1",)"
                        R"("outputs":[{"name":"x","datatype":"FP32","shape":[3],"data":[NaN,Infinity,-Infinity]},)"
                        R"({"name":"y","datatype":"FP32","shape":[1],"data":[NaN]}]})"),
            R"({"model_name":"m","model_version":"1","x":[NaN,Infinity,-Infinity],"y":NaN})");
}

TEST(HttpGenerateAnswer, AnAnswerThatIsNotAJsonObjectIsInternal) {
  for (const char* answer : {"", "[]", "{", "1"}) {
    SCOPED_TRACE(answer);
    EXPECT_EQ(to_generate(answer), "<failed " + std::to_string(static_cast<int>(StatusCode::kInternal)) +
                                       ": cannot read the inference's answer>");
  }
}

}  // namespace
}  // namespace inferd
