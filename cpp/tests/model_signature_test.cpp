// build_inference_request on hand-built requests: raw contents, shapes and reshapes, batch sizes,
// requested outputs, the request's parameters (typed contents: typed_contents_test.cpp).
#include "inferd/model_signature.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "request_bytes.h"

namespace inferd {
namespace {

using namespace request_bytes;  // the request path's tests' helpers (request_bytes.h)

// A reshape with a variable dim on both sides ([-1] -> [-1, 2], which the repository accepts):
// 3 elements cannot take [1, -1, 2], and must not become a [1, 1, 2] tensor over 12 bytes (the
// fuzz harness's reproducer: cpp/fuzz/corpus/crash-reshape-element-count).
TEST(BuildInferenceRequest, ReshapeMustKeepTheElementCount) {
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

TEST(BuildInferenceRequest, RawInputsAreViewsOfTheRequest) {
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

TEST(BuildInferenceRequest, RawBytesWithATruncatedLengthPrefixIsRefused) {
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
TEST(BuildInferenceRequest, ContentsBeyondTheShapeAreRefusedWithoutWalkingTheRest) {
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
TEST(BuildInferenceRequest, AnOutputRequestedTwiceIsRefused) {
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

TEST(BuildInferenceRequest, BatchSizeMismatchIsRefused) {
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
TEST(BuildInferenceRequest, ARequestAskingForASequenceIsRefusedNamingTheParameter) {
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
    EXPECT_EQ(refused->status.message.find("request parameter '" + name + "': the model has no sequence batching"), 0u)
        << refused->status.message;
  }
  auto stateless = build(model, inputs + parameter(4, "sequence_id", vfield(2, 0)) +
                                    parameter(4, "sequence_start", vfield(1, 0)) + parameter(4, "sequence_end", ""));
  EXPECT_TRUE(stateless->status.ok()) << stateless->status.message;
}

// Issue 17: a python model's requests keep their own parameters, as JSON (request.parameters());
// those the server reads itself are left out, and other models' requests keep none.
TEST(BuildInferenceRequest, RequestsOfAModelThatKeepsParametersCarryThemAsJson) {
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

}  // namespace
}  // namespace inferd
