#include "inferd/batch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace inferd {
namespace {

// A request whose one FP32 input has `rows` rows of `width` values counting up from `first`.
std::unique_ptr<InferenceRequest> request_with_rows(int64_t rows, float first, int64_t width = 2) {
  auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(rows * width));
  std::iota(values->begin(), values->end(), first);
  auto r = std::make_unique<InferenceRequest>();
  r->batch_size = rows;
  r->inputs.push_back(Tensor{DataType::kFp32,
                             {rows, width},
                             reinterpret_cast<const std::byte*>(values->data()),
                             values->size() * sizeof(float),
                             values});
  return r;
}

std::vector<float> floats(const Tensor& t) {
  const auto* f = reinterpret_cast<const float*>(t.data);
  return std::vector<float>(f, f + t.byte_size / sizeof(float));
}

class Batch : public ::testing::Test {
 protected:
  PinnedBufferPool pool{1 << 20, /*use_cuda=*/false};
  Padding no_padding;
};

TEST_F(Batch, OneRequestPassesThroughWithoutCopy) {
  RequestBatch batch;
  batch.push_back(request_with_rows(3, 0));
  auto inputs = gather_inputs(batch, &pool, no_padding);
  ASSERT_EQ(inputs.size(), 1u);
  EXPECT_EQ(inputs[0].data, batch[0]->inputs[0].data);
}

TEST_F(Batch, AnInputAbsentFromEveryRequestStaysAbsent) {
  RequestBatch batch;
  batch.push_back(request_with_rows(1, 0));
  batch.push_back(request_with_rows(2, 100));
  for (auto& r : batch) r->inputs.push_back(Tensor::Absent(DataType::kInt64));
  auto inputs = gather_inputs(batch, &pool, no_padding);
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_EQ(inputs[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_TRUE(inputs[1].absent);
  EXPECT_EQ(inputs[1].dtype, DataType::kInt64);
  EXPECT_TRUE(validate_tensor(inputs[1]).ok());
}

TEST_F(Batch, GatherConcatenatesAlongDimZeroAndScatterSplitsBack) {
  RequestBatch batch;
  batch.push_back(request_with_rows(1, 0));
  batch.push_back(request_with_rows(2, 100));
  auto inputs = gather_inputs(batch, &pool, no_padding);
  ASSERT_EQ(inputs.size(), 1u);
  EXPECT_EQ(inputs[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(floats(inputs[0]), (std::vector<float>{0, 1, 100, 101, 102, 103}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(inputs[0].data) % 4096, 0u);

  std::vector<std::vector<Tensor>> parts;
  ASSERT_TRUE(scatter_outputs(inputs, batch, no_padding, &pool, &parts).ok());
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1][0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(parts[1][0].data, inputs[0].data + 8);  // a view into the batch output
  EXPECT_EQ(parts[1][0].byte_size, 16u);
  EXPECT_EQ(parts[1][0].owner, inputs[0].owner);
}

TEST_F(Batch, ScatterRejectsAnOutputWithTheWrongRowCount) {
  RequestBatch batch;
  batch.push_back(request_with_rows(1, 0));
  batch.push_back(request_with_rows(2, 0));
  std::vector<float> v(4);
  std::vector<Tensor> outputs{
      Tensor{DataType::kFp32, {2, 2}, reinterpret_cast<const std::byte*>(v.data()), 16, nullptr}};
  std::vector<std::vector<Tensor>> parts;
  EXPECT_EQ(scatter_outputs(outputs, batch, no_padding, &pool, &parts).code, StatusCode::kInternal);
}

TEST_F(Batch, ScatterSplitsBytesByElements) {
  RequestBatch batch;
  batch.push_back(request_with_rows(2, 0));
  batch.push_back(request_with_rows(1, 0));
  // Rows of one element each: "a", "bcd", "" .
  std::vector<std::byte> buf;
  for (std::string s : {"a", "bcd", ""}) {
    const auto n = static_cast<uint32_t>(s.size());
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<std::byte>((n >> (8 * i)) & 0xFF));
    for (char c : s) buf.push_back(static_cast<std::byte>(c));
  }
  std::vector<Tensor> outputs{Tensor{DataType::kBytes, {3, 1}, buf.data(), buf.size(), nullptr}};
  std::vector<std::vector<Tensor>> parts;
  ASSERT_TRUE(scatter_outputs(outputs, batch, no_padding, &pool, &parts).ok());
  EXPECT_EQ(parts[0][0].byte_size, 5u + 7u);
  EXPECT_EQ(parts[1][0].byte_size, 4u);
  EXPECT_TRUE(validate_tensor(parts[0][0]).ok());
  EXPECT_TRUE(validate_tensor(parts[1][0]).ok());
}

TEST_F(Batch, PaddedInputsAreFilledToTheLongestAndOutputsSlicedBack) {
  Padding padding;
  padding.inputs = {true};
  padding.value = -1;
  padding.reference_input = 0;
  padding.outputs = {{{1, 1}}};  // output dim 1 follows input dim 1
  RequestBatch batch;
  batch.push_back(request_with_rows(1, 0, /*width=*/2));   // [0 1]
  batch.push_back(request_with_rows(2, 10, /*width=*/3));  // [10 11 12] [13 14 15]
  auto inputs = gather_inputs(batch, &pool, padding);
  ASSERT_EQ(inputs[0].shape, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(floats(inputs[0]), (std::vector<float>{0, 1, -1, 10, 11, 12, 13, 14, 15}));

  // An "identity" model's output is the padded batch: each request gets its own width back.
  std::vector<std::vector<Tensor>> parts;
  ASSERT_TRUE(scatter_outputs(inputs, batch, padding, &pool, &parts).ok());
  EXPECT_EQ(parts[0][0].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(floats(parts[0][0]), (std::vector<float>{0, 1}));
  EXPECT_EQ(parts[1][0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(floats(parts[1][0]), (std::vector<float>{10, 11, 12, 13, 14, 15}));
}

TEST_F(Batch, EqualShapesNeedNoPadding) {
  Padding padding;
  padding.inputs = {true};
  padding.reference_input = 0;
  RequestBatch batch;
  batch.push_back(request_with_rows(1, 0, 3));
  batch.push_back(request_with_rows(1, 5, 3));
  auto inputs = gather_inputs(batch, &pool, padding);
  EXPECT_EQ(floats(inputs[0]), (std::vector<float>{0, 1, 2, 5, 6, 7}));
}

}  // namespace
}  // namespace inferd
