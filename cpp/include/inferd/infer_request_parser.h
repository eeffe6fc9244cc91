#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "inferd/status.h"
#include "inferd/wire_format.h"

namespace inferd {

// inference.InferParameter: a oneof of five kinds (kNone: no value set).
struct WireParameter {
  enum class Kind : uint8_t { kNone, kBool, kInt64, kString, kDouble, kUint64 };
  std::string_view key;
  Kind kind = Kind::kNone;
  bool bool_value = false;
  int64_t int64_value = 0;
  uint64_t uint64_value = 0;
  double double_value = 0;
  std::string_view string_value;
};

// A stretch of one InferTensorContents field as it came. `packed`: `bytes` is the payload of a
// packed run of scalars (fields 1-7, length-delimited). Otherwise `bytes` holds consecutive whole
// occurrences of `field` - key and value each, `type` being the values' wire type - as unpacked
// scalars and bytes_contents elements come: merging them keeps one chunk per stretch, not one per
// element.
struct ContentsChunk {
  uint32_t field = 0;
  WireType type = WireType::kVarint;
  bool packed = false;
  std::string_view bytes;
};

// What one request may hold, so that parsing it costs a bounded amount of memory beyond the bytes
// received, however they are arranged (each bound is far above what a real request uses).
struct ParseLimits {
  static constexpr size_t kTensors = 4096;          // inputs, requested outputs and raw contents, each
  static constexpr size_t kParameters = 4096;       // parameter entries, all maps together
  static constexpr size_t kDims = 65536;            // shape dims, all inputs together
  static constexpr size_t kContentsChunks = 65536;  // contents stretches, all inputs together
};

// ModelInferRequest.InferInputTensor, its strings and contents viewing the request's bytes.
struct WireInput {
  std::string_view name;
  std::string_view datatype;
  std::vector<int64_t> shape;
  std::vector<WireParameter> parameters;
  bool has_contents = false;  // the contents message was present, even if empty
  std::vector<ContentsChunk> contents;
};

// ModelInferRequest.InferRequestedOutputTensor.
struct WireOutput {
  std::string_view name;
  std::vector<WireParameter> parameters;
};

// A ModelInferRequest as the wire gave it: every string and tensor is a view of the serialized
// bytes, which must outlive it. Repeated singular fields follow protobuf's rules (the last scalar
// wins; a message given twice is merged); map keys given twice keep the last value (see find()).
struct ParsedInferRequest {
  std::string_view model_name;
  std::string_view model_version;
  std::string_view id;
  std::vector<WireParameter> parameters;
  std::vector<WireInput> inputs;
  std::vector<WireOutput> outputs;
  std::vector<std::string_view> raw_input_contents;
};

// The last parameter named `key`, or null.
const WireParameter* find_parameter(const std::vector<WireParameter>& parameters, std::string_view key);

// Parses the serialized ModelInferRequest in [data, data + size) into `out` (views of those bytes).
// Checks only the wire format: every length within its enclosing message, varints terminated,
// strings valid UTF-8 (proto3's rule for `string` fields), no groups; unknown fields are skipped.
// What the values mean is checked later, against the model (see build_inference_request). Nothing
// is sized by a length before that length has been compared with the bytes that remain, so a
// client's claims cannot make it allocate more than a small multiple of the bytes it sent.
// Thread-safe (no shared state); never blocks. INVALID_ARGUMENT with the field's name on failure.
Status parse_infer_request(const std::byte* data, size_t size, ParsedInferRequest* out);

// True when `text` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view text);

}  // namespace inferd
