// The response writer's bytes, against bytes computed by hand and those protobuf's serializer
// writes for the same messages.
#include "inferd/infer_response_writer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "request_bytes.h"

namespace inferd {
namespace {

using namespace request_bytes;  // the request path's tests' helpers (request_bytes.h)

TEST(InferResponseWriter, MatchesHandComputedBytes) {
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

TEST(InferResponseWriter, RefusesOutputsItCannotShow) {
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

TEST(InferResponseWriter, LeavesEmptyStringsOutButKeepsEmptyContents) {
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
TEST(InferResponseWriter, AddsTheFinalResponseFlagAndWritesTheEmptyResponseAsProtobufDoes) {
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

TEST(InferResponseWriter, StreamErrorResponseBytes) {
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
