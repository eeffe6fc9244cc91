#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd::worker {

// What an execute or a result slot points at (worker_ring.h): a batch's or its answers'
// description, written in the arena beside the tensors it names. Little-endian fixed-width
// integers and length-prefixed strings; no JSON on the way. Decoding checks every count and length
// against the bytes it was given and every tensor against the arena's size; the strings it yields
// are views of those bytes (the caller copies the description out of shared memory first, so the
// other side cannot change it while it is read).

// Where a tensor lies in an arena.
struct TensorPlace {
  std::string_view name;
  DataType dtype = DataType::kFp32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

struct RequestDescription {
  std::string_view id;
  std::string_view parameters;  // a JSON object
  std::vector<std::string_view> requested_outputs;
  std::vector<TensorPlace> inputs;  // the inputs the request has, in model input order
};

// An execute's batch. `cancel_offset`: one byte per request in the inputs arena, 1 once the server
// saw it cancelled or past its deadline (the server writes them while the batch runs).
struct BatchDescription {
  uint64_t cancel_offset = 0;
  std::vector<RequestDescription> requests;
};

struct ResponseDescription {
  bool ok = true;
  std::string_view error;            // when !ok
  std::vector<TensorPlace> outputs;  // when ok
};

// Appends a description, field by field.
class DescriptionWriter {
 public:
  void u32(uint32_t value);
  void u64(uint64_t value);
  void text(std::string_view value);
  void tensor(const TensorPlace& place);
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

std::string encode_batch(const BatchDescription& batch);
std::string encode_responses(const std::vector<ResponseDescription>& responses);

// `arena_size`: every tensor must lie within [0, arena_size). INTERNAL names what is wrong.
Status decode_batch(std::string_view bytes, size_t arena_size, BatchDescription* batch);
Status decode_responses(std::string_view bytes, size_t arena_size, std::vector<ResponseDescription>* responses);

// Bytes between tensors: each starts on a cache line.
constexpr size_t kTensorAlignment = 64;
inline size_t aligned(size_t bytes) { return (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment; }

}  // namespace inferd::worker
