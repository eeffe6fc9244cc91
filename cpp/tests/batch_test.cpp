#include "inferd/batch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace inferd {
namespace {

std::unique_ptr<InferenceRequest> request_with_rows(int64_t rows, float first) {
  auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(rows * 2));
  std::iota(values->begin(), values->end(), first);
  auto r = std::make_unique<InferenceRequest>();
  r->batch_size = rows;
  r->inputs.push_back(Tensor{DataType::kFp32, {rows, 2}, reinterpret_cast<const std::byte*>(values->data()),
                             values->size() * sizeof(float), values});
  return r;
}

TEST(Batch, OneRequestPassesThroughWithoutCopy) {
  PinnedBufferPool pool(1 << 20, /*use_cuda=*/false);
  std::vector<std::unique_ptr<InferenceRequest>> batch;
  batch.push_back(request_with_rows(3, 0));
  auto inputs = gather_inputs(batch, &pool);
  ASSERT_EQ(inputs.size(), 1u);
  EXPECT_EQ(inputs[0].data, batch[0]->inputs[0].data);
}

TEST(Batch, GatherConcatenatesAlongDimZeroAndScatterSplitsBack) {
  PinnedBufferPool pool(1 << 20, /*use_cuda=*/false);
  std::vector<std::unique_ptr<InferenceRequest>> batch;
  batch.push_back(request_with_rows(1, 0));
  batch.push_back(request_with_rows(2, 100));
  auto inputs = gather_inputs(batch, &pool);
  ASSERT_EQ(inputs.size(), 1u);
  EXPECT_EQ(inputs[0].shape, (std::vector<int64_t>{3, 2}));
  const auto* f = reinterpret_cast<const float*>(inputs[0].data);
  EXPECT_EQ(std::vector<float>(f, f + 6), (std::vector<float>{0, 1, 100, 101, 102, 103}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(inputs[0].data) % 4096, 0u);

  std::vector<std::vector<Tensor>> parts;
  ASSERT_TRUE(scatter_outputs(inputs, {1, 2}, &parts).ok());
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1][0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(parts[1][0].data, inputs[0].data + 8);  // a view into the batch output
  EXPECT_EQ(parts[1][0].byte_size, 16u);
  EXPECT_EQ(parts[1][0].owner, inputs[0].owner);
}

TEST(Batch, ScatterRejectsAnOutputWithTheWrongRowCount) {
  std::vector<float> v(4);
  std::vector<Tensor> outputs{Tensor{DataType::kFp32, {2, 2}, reinterpret_cast<const std::byte*>(v.data()), 16, nullptr}};
  std::vector<std::vector<Tensor>> parts;
  EXPECT_EQ(scatter_outputs(outputs, {1, 2}, &parts).code, StatusCode::kInternal);
}

TEST(Batch, ScatterSplitsBytesByElements) {
  // Rows of one element each: "a", "bcd", "" .
  std::vector<std::byte> buf;
  for (std::string s : {"a", "bcd", ""}) {
    const auto n = static_cast<uint32_t>(s.size());
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<std::byte>((n >> (8 * i)) & 0xFF));
    for (char c : s) buf.push_back(static_cast<std::byte>(c));
  }
  std::vector<Tensor> outputs{Tensor{DataType::kBytes, {3, 1}, buf.data(), buf.size(), nullptr}};
  std::vector<std::vector<Tensor>> parts;
  ASSERT_TRUE(scatter_outputs(outputs, {2, 1}, &parts).ok());
  EXPECT_EQ(parts[0][0].byte_size, 5u + 7u);
  EXPECT_EQ(parts[1][0].byte_size, 4u);
  EXPECT_TRUE(validate_tensor(parts[0][0]).ok());
  EXPECT_TRUE(validate_tensor(parts[1][0]).ok());
}

}  // namespace
}  // namespace inferd
