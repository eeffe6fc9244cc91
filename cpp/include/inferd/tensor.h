#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "inferd/status.h"

namespace inferd {

struct SharedMemorySlice;

// Element types, numbered as inference.DataType in model_config.proto so that both sides of the
// binding agree without a table. kBytes travels serialized: each element is a 4-byte little-endian
// length followed by that many bytes, exactly as on the wire.
enum class DataType : int {
  kBool = 1,
  kUint8 = 2,
  kUint16 = 3,
  kUint32 = 4,
  kUint64 = 5,
  kInt8 = 6,
  kInt16 = 7,
  kInt32 = 8,
  kInt64 = 9,
  kFp16 = 10,
  kFp32 = 11,
  kFp64 = 12,
  kBytes = 13,
  kBf16 = 14,
};

// Bytes per element, or 0 for kBytes (variable) and for values outside the enum.
size_t element_size(DataType dtype);
bool is_valid_datatype(int code);

// Product of the dims; -1 when a dim is negative or the product overflows int64.
int64_t element_count(const std::vector<int64_t>& shape);

// A read-only, row-major, contiguous tensor: a view of `byte_size` bytes at `data`, kept alive by
// `owner` (a host buffer of the core, or an object of the caller's language whose deleter knows how
// to release it). Copying a Tensor copies the view and shares the owner; it never copies data.
// An `absent` tensor stands for an optional input the request left out: no shape, no data; it
// batches only with other requests that left the same input out.
struct Tensor {
  DataType dtype = DataType::kFp32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t byte_size = 0;
  std::shared_ptr<const void> owner;
  bool absent = false;
  // Set when `data` is a client's shared memory (shared_memory.h): then it is read only through
  // copy_from_slice, never directly (the client may shrink the object under us), so it is
  // copied into a batch buffer even for a batch of one.
  std::shared_ptr<const SharedMemorySlice> client_memory = nullptr;

  static Tensor Absent(DataType dtype) {
    Tensor t;
    t.dtype = dtype;
    t.absent = true;
    return t;
  }
};

// Checks that the bytes match the shape: size for fixed-width types; for kBytes, that the buffer
// holds exactly element_count(shape) length-prefixed elements. Thread-safe (reads only).
Status validate_tensor(const Tensor& tensor);

// Byte offsets of each element of a serialized kBytes buffer: offsets[i] is where element i's
// length prefix starts and offsets[n] == size. Returns false if the buffer is malformed.
bool bytes_element_offsets(const std::byte* data, size_t size, std::vector<size_t>* offsets);

}  // namespace inferd
