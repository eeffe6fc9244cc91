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
  // A stateful model's request: its sequence (pb_utils' correlation_id(): the string id when it
  // has one, else the number) and flags() (Triton's: 1 sequence start, 2 sequence end).
  uint64_t correlation_id = 0;
  std::string_view correlation_string;
  uint32_t flags = 0;
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
  // An iterative model's request the model gave back for another step
  // (set_release_flags(RESCHEDULE), no response): ok, no outputs.
  bool rescheduled = false;
  std::string_view error;            // when !ok
  std::vector<TensorPlace> outputs;  // when ok
};

// A request parameter of a call: Triton's python backend allows bool, int and str values.
struct CallParameter {
  enum class Kind : uint32_t { kBool = 1, kInt64 = 2, kString = 3 };
  std::string_view key;
  Kind kind = Kind::kString;
  int64_t number = 0;  // kBool (0 or 1) and kInt64
  std::string_view text;
};

// A model-to-model call (InferenceRequest.exec) as the worker sends it (MessageKind::kCall).
struct CallDescription {
  std::string_view model;
  int64_t version = -1;  // -1: the version the server routes a request naming none to
  std::string_view id;
  std::vector<CallParameter> parameters;
  // The models whose calls led to the calling batch's requests, first caller first (the caller
  // itself is not in it): a call to one of them, or to the caller, would wait on itself.
  std::vector<std::string_view> chain;
  std::vector<std::string_view> requested_outputs;  // empty: every output
  uint64_t timeout_us = 0;                          // 0: none of the model's own
  std::vector<TensorPlace> inputs;
};

// A call's answer (MessageKind::kCallResult): its outputs, or its failure with the status code.
struct CallAnswerDescription {
  StatusCode code = StatusCode::kOk;
  std::string_view error;
  std::vector<TensorPlace> outputs;
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
std::string encode_call(const CallDescription& call);
std::string encode_call_answer(const CallAnswerDescription& answer);

// `arena_size`: every tensor must lie within [0, arena_size). INTERNAL names what is wrong.
Status decode_batch(std::string_view bytes, size_t arena_size, BatchDescription* batch);
Status decode_responses(std::string_view bytes, size_t arena_size, std::vector<ResponseDescription>* responses);
Status decode_call(std::string_view bytes, size_t arena_size, CallDescription* call);
Status decode_call_answer(std::string_view bytes, size_t arena_size, CallAnswerDescription* answer);

// Bytes between tensors: each starts on a cache line.
constexpr size_t kTensorAlignment = 64;
inline size_t aligned(size_t bytes) { return (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment; }

}  // namespace inferd::worker
