#pragma once

// INT32 tensors by hand and back, for the tests of stateful models (sequence_state_test.cpp,
// iterative_steps_test.cpp).

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "inferd/tensor.h"

namespace inferd::int_tensors {

// An INT32 tensor of `shape` holding `values`, which it owns.
inline Tensor int_tensor(std::vector<int64_t> shape, std::vector<int32_t> values) {
  auto owned = std::make_shared<std::vector<int32_t>>(std::move(values));
  return Tensor{DataType::kInt32, std::move(shape), reinterpret_cast<const std::byte*>(owned->data()),
                owned->size() * sizeof(int32_t), owned};
}

// An INT32 tensor's values.
inline std::vector<int32_t> ints(const Tensor& tensor) {
  std::vector<int32_t> out(tensor.byte_size / sizeof(int32_t));
  std::memcpy(out.data(), tensor.data, tensor.byte_size);
  return out;
}

}  // namespace inferd::int_tensors
