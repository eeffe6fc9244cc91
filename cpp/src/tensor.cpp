#include "inferd/tensor.h"

#include <cstring>
#include <limits>
#include <string>

namespace inferd {

size_t element_size(DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
    case DataType::kUint8:
    case DataType::kInt8:
      return 1;
    case DataType::kUint16:
    case DataType::kInt16:
    case DataType::kFp16:
    case DataType::kBf16:
      return 2;
    case DataType::kUint32:
    case DataType::kInt32:
    case DataType::kFp32:
      return 4;
    case DataType::kUint64:
    case DataType::kInt64:
    case DataType::kFp64:
      return 8;
    case DataType::kBytes:
      return 0;
  }
  return 0;
}

bool is_valid_datatype(int code) { return code >= 1 && code <= 14; }

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return -1;
    if (dim != 0 && count > std::numeric_limits<int64_t>::max() / dim) return -1;
    count *= dim;
  }
  return count;
}

bool bytes_element_offsets(const std::byte* data, size_t size, std::vector<size_t>* offsets) {
  offsets->clear();
  size_t pos = 0;
  while (pos < size) {
    if (size - pos < 4) return false;
    uint32_t len = 0;
    // Little-endian length prefix, read byte by byte so the host's byte order does not matter.
    for (int i = 3; i >= 0; --i) len = (len << 8) | std::to_integer<uint32_t>(data[pos + i]);
    offsets->push_back(pos);
    if (size - pos - 4 < len) return false;
    pos += 4 + static_cast<size_t>(len);
  }
  offsets->push_back(pos);
  return true;
}

Status validate_tensor(const Tensor& tensor) {
  if (tensor.absent) {
    if (!tensor.shape.empty() || tensor.byte_size != 0) {
      return Status::Error(StatusCode::kInvalidArgument, "an absent tensor has a shape or data");
    }
    return Status::Ok();
  }
  const int64_t count = element_count(tensor.shape);
  if (count < 0)
    return Status::Error(StatusCode::kInvalidArgument, "tensor shape has a negative or too large dimension");
  if (tensor.byte_size > 0 && tensor.data == nullptr) {
    return Status::Error(StatusCode::kInvalidArgument, "tensor has a size but no data");
  }
  if (tensor.dtype == DataType::kBytes) {
    std::vector<size_t> offsets;
    if (!bytes_element_offsets(tensor.data, tensor.byte_size, &offsets)) {
      return Status::Error(StatusCode::kInvalidArgument, "BYTES tensor has a truncated length prefix or element");
    }
    if (static_cast<int64_t>(offsets.size() - 1) != count) {
      return Status::Error(StatusCode::kInvalidArgument, "BYTES tensor holds " + std::to_string(offsets.size() - 1) +
                                                             " elements, shape needs " + std::to_string(count));
    }
    return Status::Ok();
  }
  const size_t want = static_cast<size_t>(count) * element_size(tensor.dtype);
  if (tensor.byte_size != want) {
    return Status::Error(StatusCode::kInvalidArgument, "tensor has " + std::to_string(tensor.byte_size) +
                                                           " bytes, shape and datatype need " + std::to_string(want));
  }
  return Status::Ok();
}

}  // namespace inferd
