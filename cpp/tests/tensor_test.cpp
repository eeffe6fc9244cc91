#include "inferd/tensor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace inferd {
namespace {

std::vector<std::byte> serialize(const std::vector<std::string>& items) {
  std::vector<std::byte> out;
  for (const auto& s : items) {
    const auto n = static_cast<uint32_t>(s.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::byte>((n >> (8 * i)) & 0xFF));
    for (char c : s) out.push_back(static_cast<std::byte>(c));
  }
  return out;
}

TEST(Tensor, FixedWidthSizeMustMatchShape) {
  std::vector<float> data(6);
  Tensor t{DataType::kFp32, {2, 3}, reinterpret_cast<const std::byte*>(data.data()), 24, nullptr};
  EXPECT_TRUE(validate_tensor(t).ok());
  t.byte_size = 20;
  EXPECT_EQ(validate_tensor(t).code, StatusCode::kInvalidArgument);
  t.shape = {2, -3};
  EXPECT_EQ(validate_tensor(t).code, StatusCode::kInvalidArgument);
}

TEST(Tensor, BytesElementsAreCountedAndBoundsChecked) {
  auto buf = serialize({"a", "", "hello"});
  Tensor t{DataType::kBytes, {3}, buf.data(), buf.size(), nullptr};
  EXPECT_TRUE(validate_tensor(t).ok());
  t.shape = {2};
  EXPECT_FALSE(validate_tensor(t).ok());
  t.shape = {3};
  t.byte_size -= 1;  // last element truncated
  EXPECT_FALSE(validate_tensor(t).ok());
  std::vector<std::byte> huge = {std::byte{0xFF}, std::byte{0xFF}, std::byte{0xFF}, std::byte{0x7F}};
  Tensor lie{DataType::kBytes, {1}, huge.data(), huge.size(), nullptr};
  EXPECT_FALSE(validate_tensor(lie).ok());
}

TEST(Tensor, ElementSizes) {
  EXPECT_EQ(element_size(DataType::kBool), 1u);
  EXPECT_EQ(element_size(DataType::kBf16), 2u);
  EXPECT_EQ(element_size(DataType::kFp64), 8u);
  EXPECT_EQ(element_size(DataType::kBytes), 0u);
  EXPECT_EQ(element_count({}), 1);
  EXPECT_EQ(element_count({4, 0}), 0);
  EXPECT_EQ(element_count({1LL << 40, 1LL << 40}), -1);
}

}  // namespace
}  // namespace inferd
