// The native ONNX Runtime executor, with the library and model named by the environment:
// INFERD_TEST_ORT_LIBRARY (a libonnxruntime.so, e.g. the onnxruntime wheel's, set by `make
// test-cpp`) and INFERD_TEST_ORT_MODEL (cpp/tests/data/onnxruntime_test_model.onnx; see the
// script beside it for what it computes). Without them the tests that need ORT skip, saying why.
#include "inferd/onnxruntime_executor.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "inferd/onnxruntime_library.h"

namespace inferd {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// Loads the library named by the environment, or says why the test cannot run.
#define REQUIRE_ONNXRUNTIME()                                                                     \
  do {                                                                                            \
    if (env("INFERD_TEST_ORT_LIBRARY").empty() || env("INFERD_TEST_ORT_MODEL").empty()) {         \
      GTEST_SKIP() << "INFERD_TEST_ORT_LIBRARY and INFERD_TEST_ORT_MODEL are not both set (make " \
                      "test-cpp sets them from .venv's onnxruntime wheel)";                       \
    }                                                                                             \
    const OnnxRuntimeLibrary* library = nullptr;                                                  \
    Status loaded = OnnxRuntimeLibrary::Load(env("INFERD_TEST_ORT_LIBRARY"), &library);           \
    ASSERT_TRUE(loaded.ok()) << loaded.message;                                                   \
  } while (false)

template <typename T>
Tensor make_tensor(DataType dtype, std::vector<int64_t> shape, std::vector<T> values) {
  auto storage = std::make_shared<std::vector<T>>(std::move(values));
  Tensor tensor;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  tensor.data = reinterpret_cast<const std::byte*>(storage->data());
  tensor.byte_size = storage->size() * sizeof(T);
  tensor.owner = std::move(storage);
  return tensor;
}

std::vector<uint8_t> serialize(const std::vector<std::string>& elements) {
  std::vector<uint8_t> out;
  for (const std::string& element : elements) {
    const auto size = static_cast<uint32_t>(element.size());
    for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<uint8_t>(size >> shift));
    out.insert(out.end(), element.begin(), element.end());
  }
  return out;
}

std::vector<std::string> deserialize(const Tensor& tensor) {
  std::vector<size_t> offsets;
  EXPECT_TRUE(bytes_element_offsets(tensor.data, tensor.byte_size, &offsets));
  std::vector<std::string> out;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    out.emplace_back(reinterpret_cast<const char*>(tensor.data) + offsets[i] + 4, offsets[i + 1] - offsets[i] - 4);
  }
  return out;
}

template <typename T>
std::vector<T> values_of(const Tensor& tensor) {
  const auto* data = reinterpret_cast<const T*>(tensor.data);
  return std::vector<T>(data, data + tensor.byte_size / sizeof(T));
}

OnnxRuntimeExecutorOptions model_options() {
  OnnxRuntimeExecutorOptions options;
  options.model_path = env("INFERD_TEST_ORT_MODEL");
  options.input_names = {"X", "Y", "S", "H"};
  options.output_names = {"Z", "S_OUT", "H_OUT"};
  options.output_types = {DataType::kFp32, DataType::kBytes, DataType::kFp16};
  options.intra_op_threads = 1;  // all of ORT's work on the calling thread
  options.inter_op_threads = 1;
  return options;
}

std::unique_ptr<OnnxRuntimeExecutor> make_executor() {
  std::unique_ptr<OnnxRuntimeExecutor> executor;
  Status status = OnnxRuntimeExecutor::Create(model_options(), &executor);
  EXPECT_TRUE(status.ok()) << status.message;
  return executor;
}

// Batch of two rows; Y left out unless given.
std::vector<Tensor> model_inputs(int64_t rows, const std::vector<std::string>& strings) {
  std::vector<float> x(static_cast<size_t>(rows) * 4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  std::vector<uint16_t> h(static_cast<size_t>(rows) * 2, 0x3C00);  // 1.0 in FP16
  return {make_tensor<float>(DataType::kFp32, {rows, 4}, x), Tensor::Absent(DataType::kFp32),
          make_tensor<uint8_t>(DataType::kBytes, {rows}, serialize(strings)),
          make_tensor<uint16_t>(DataType::kFp16, {rows, 2}, h)};
}

// Before any test loads a library (tests run in declaration order within one process).
// ORT's own text for a Reshape it cannot do (onnxruntime 1.x, Python and C API alike).
TEST(OnnxRuntimeExecutor, MessagesLeaveOutOrtsSourceLocations) {
  const std::string reshape =
      "Non-zero status code returned while running Reshape node. Name:'' Status Message: "
      "/onnxruntime_src/onnxruntime/core/providers/cpu/tensor/reshape_helper.h:91 "
      "onnxruntime::ReshapeHelper::ReshapeHelper(const onnxruntime::TensorShape&, onnxruntime::TensorShapeVector&, "
      "bool) input_shape_size == requested_shape_size was false. The input tensor cannot be reshaped to the "
      "requested shape. Input shape:{3}, requested shape:{2}\n";
  EXPECT_EQ(without_source_locations(reshape),
            "Non-zero status code returned while running Reshape node. Name:'' Status Message: "
            "input_shape_size == requested_shape_size was false. The input tensor cannot be reshaped to the "
            "requested shape. Input shape:{3}, requested shape:{2}");
  // A location without a function after it, a relative one, and text that only looks alike.
  EXPECT_EQ(without_source_locations("C:\\ort\\x.cc:12 failed; a.cc:3 too; ratio 1.5:2 and /models/m:1 stay"),
            "failed; too; ratio 1.5:2 and /models/m:1 stay");
  EXPECT_EQ(without_source_locations("indices element out of data bounds, idx=77"),
            "indices element out of data bounds, idx=77");
}

TEST(OnnxRuntimeExecutor, CreateWithoutTheLibrarySaysSo) {
  if (OnnxRuntimeLibrary::Loaded() != nullptr) GTEST_SKIP() << "a library is already loaded in this process";
  std::unique_ptr<OnnxRuntimeExecutor> executor;
  OnnxRuntimeExecutorOptions options;
  options.model_path = "/models/m.onnx";
  Status status = OnnxRuntimeExecutor::Create(options, &executor);
  EXPECT_EQ(status.code, StatusCode::kUnavailable);
  EXPECT_NE(status.message.find("/models/m.onnx"), std::string::npos) << status.message;
  EXPECT_NE(status.message.find("not loaded"), std::string::npos) << status.message;
  EXPECT_EQ(executor, nullptr);
}

TEST(OnnxRuntimeLibrary, MissingLibraryNamesThePath) {
  if (OnnxRuntimeLibrary::Loaded() != nullptr) GTEST_SKIP() << "a library is already loaded in this process";
  const OnnxRuntimeLibrary* library = nullptr;
  Status status = OnnxRuntimeLibrary::Load("/nonexistent/libonnxruntime.so.1", &library);
  EXPECT_EQ(status.code, StatusCode::kUnavailable);
  EXPECT_NE(status.message.find("/nonexistent/libonnxruntime.so.1"), std::string::npos) << status.message;
  EXPECT_EQ(library, nullptr);
}

TEST(OnnxRuntimeLibrary, LibraryWithoutOrtGetApiBaseIsRefused) {
  if (OnnxRuntimeLibrary::Loaded() != nullptr) GTEST_SKIP() << "a library is already loaded in this process";
  const OnnxRuntimeLibrary* library = nullptr;
  Status status = OnnxRuntimeLibrary::Load("libm.so.6", &library);
  EXPECT_EQ(status.code, StatusCode::kUnavailable);
  EXPECT_NE(status.message.find("OrtGetApiBase"), std::string::npos) << status.message;
  EXPECT_EQ(OnnxRuntimeLibrary::Loaded(), nullptr);  // a failed load leaves nothing behind
}

TEST(OnnxRuntimeLibrary, LoadsOnceAndRefusesAnotherPath) {
  REQUIRE_ONNXRUNTIME();
  const OnnxRuntimeLibrary* first = OnnxRuntimeLibrary::Loaded();
  ASSERT_NE(first, nullptr);
  EXPECT_FALSE(first->version().empty());
  const OnnxRuntimeLibrary* again = nullptr;
  ASSERT_TRUE(OnnxRuntimeLibrary::Load(env("INFERD_TEST_ORT_LIBRARY"), &again).ok());
  EXPECT_EQ(again, first);
  Status other = OnnxRuntimeLibrary::Load("libm.so.6", &again);
  EXPECT_EQ(other.code, StatusCode::kInvalidArgument);
  EXPECT_NE(other.message.find(first->path()), std::string::npos) << other.message;
}

TEST(OnnxRuntimeExecutor, ComputesEveryOutputAndTheInitializerStandsInForAnAbsentInput) {
  REQUIRE_ONNXRUNTIME();
  std::unique_ptr<OnnxRuntimeExecutor> executor = make_executor();
  ASSERT_NE(executor, nullptr);
  EXPECT_EQ(executor->input_types(),
            (std::vector<DataType>{DataType::kFp32, DataType::kFp32, DataType::kBytes, DataType::kFp16}));
  // Any bytes: an embedded NUL, invalid UTF-8, an empty element.
  const std::vector<std::string> strings = {std::string("a\0b", 3), "\xff\xfe", ""};
  std::vector<Tensor> outputs;
  Status status = executor->execute(model_inputs(3, strings), &outputs);
  ASSERT_TRUE(status.ok()) << status.message;
  ASSERT_EQ(outputs.size(), 3u);
  executor.reset();  // the outputs own ORT's values: they outlive the session

  EXPECT_EQ(outputs[0].dtype, DataType::kFp32);
  EXPECT_EQ(outputs[0].shape, (std::vector<int64_t>{3, 4}));
  std::vector<float> expected;
  for (int i = 0; i < 12; ++i) expected.push_back(static_cast<float>(i + 1 + i % 4));  // X + [1 2 3 4]
  EXPECT_EQ(values_of<float>(outputs[0]), expected);
  EXPECT_EQ(outputs[1].dtype, DataType::kBytes);
  EXPECT_EQ(outputs[1].shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(deserialize(outputs[1]), strings);
  EXPECT_EQ(outputs[2].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(values_of<uint16_t>(outputs[2]), std::vector<uint16_t>(6, 0x3C00));
  for (const Tensor& output : outputs) EXPECT_TRUE(validate_tensor(output).ok());
}

TEST(OnnxRuntimeExecutor, FeedsAGivenOptionalInput) {
  REQUIRE_ONNXRUNTIME();
  std::unique_ptr<OnnxRuntimeExecutor> executor = make_executor();
  ASSERT_NE(executor, nullptr);
  std::vector<Tensor> inputs = model_inputs(1, {"s"});
  inputs[1] = make_tensor<float>(DataType::kFp32, {4}, {10, 10, 10, 10});
  std::vector<Tensor> outputs;
  ASSERT_TRUE(executor->execute(inputs, &outputs).ok());
  EXPECT_EQ(values_of<float>(outputs[0]), (std::vector<float>{10, 11, 12, 13}));
}

TEST(OnnxRuntimeExecutor, EmptyBatchAndMisalignedInput) {
  REQUIRE_ONNXRUNTIME();
  std::unique_ptr<OnnxRuntimeExecutor> executor = make_executor();
  ASSERT_NE(executor, nullptr);
  std::vector<Tensor> outputs;
  std::vector<Tensor> empty = model_inputs(0, {});
  empty[0].data = nullptr;  // zero elements need no memory
  Status status = executor->execute(empty, &outputs);
  ASSERT_TRUE(status.ok()) << status.message;
  EXPECT_EQ(outputs[0].shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(outputs[0].byte_size, 0u);

  // X one byte into a buffer: not aligned for floats.
  std::vector<Tensor> inputs = model_inputs(1, {"s"});
  auto shifted = std::make_shared<std::vector<std::byte>>(17);
  std::memcpy(shifted->data() + 1, inputs[0].data, 16);
  inputs[0].data = shifted->data() + 1;
  inputs[0].owner = shifted;
  status = executor->execute(inputs, &outputs);
  ASSERT_TRUE(status.ok()) << status.message;
  EXPECT_EQ(values_of<float>(outputs[0]), (std::vector<float>{1, 3, 5, 7}));
}

TEST(OnnxRuntimeExecutor, InputOfTheWrongTypeFailsTheBatch) {
  REQUIRE_ONNXRUNTIME();
  std::unique_ptr<OnnxRuntimeExecutor> executor = make_executor();
  ASSERT_NE(executor, nullptr);
  std::vector<Tensor> inputs = model_inputs(1, {"s"});
  inputs[0] = make_tensor<int32_t>(DataType::kInt32, {1, 4}, {1, 2, 3, 4});
  std::vector<Tensor> outputs;
  Status status = executor->execute(inputs, &outputs);
  EXPECT_EQ(status.code, StatusCode::kInternal);
  EXPECT_NE(status.message.find("'X' is INT32, the model takes FP32"), std::string::npos) << status.message;
  // A shape ORT refuses (X must have 4 columns) is a status, not an exception; INTERNAL, since the
  // core has checked every request of a batch before it gets here.
  inputs = model_inputs(1, {"s"});
  inputs[0] = make_tensor<float>(DataType::kFp32, {2, 2}, {1, 2, 3, 4});
  status = executor->execute(inputs, &outputs);
  EXPECT_EQ(status.code, StatusCode::kInternal) << status.message;
  EXPECT_NE(status.message.find("ONNX Runtime"), std::string::npos) << status.message;
}

TEST(OnnxRuntimeExecutor, OptionsThatDoNotMatchTheModelFailCreate) {
  REQUIRE_ONNXRUNTIME();
  std::unique_ptr<OnnxRuntimeExecutor> executor;
  OnnxRuntimeExecutorOptions options = model_options();
  options.output_types[0] = DataType::kInt32;
  Status status = OnnxRuntimeExecutor::Create(options, &executor);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("output 'Z' is FP32, declared INT32"), std::string::npos) << status.message;

  options = model_options();
  options.input_names[0] = "NOPE";
  status = OnnxRuntimeExecutor::Create(options, &executor);
  EXPECT_NE(status.message.find("no input 'NOPE' (its inputs: H, S, X, Y)"), std::string::npos) << status.message;

  options = model_options();
  options.model_path = "/nonexistent/model.onnx";
  status = OnnxRuntimeExecutor::Create(options, &executor);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("/nonexistent/model.onnx: ONNX Runtime cannot load it"), std::string::npos)
      << status.message;
  EXPECT_EQ(executor, nullptr);
}

}  // namespace
}  // namespace inferd
