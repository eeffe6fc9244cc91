#pragma once

// Requests by hand, for the request path's tests (infer_request_parser_test.cpp,
// typed_contents_test.cpp, model_signature_test.cpp, infer_response_writer_test.cpp): the wire
// bytes of a ModelInferRequest written field by field, as protobuf's serializer would and as it
// never would, and the models they are built against.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "inferd/infer_request_parser.h"
#include "inferd/model_signature.h"

namespace inferd::request_bytes {

// --- wire bytes by hand ------------------------------------------------------------------------

inline std::string varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
  return out;
}
inline std::string key(uint32_t field, int wire_type) {
  return varint((uint64_t{field} << 3) | static_cast<uint64_t>(wire_type));
}
inline std::string ld(uint32_t field, const std::string& payload) {
  return key(field, 2) + varint(payload.size()) + payload;
}
inline std::string vfield(uint32_t field, uint64_t v) { return key(field, 0) + varint(v); }
inline std::string le32(uint32_t v) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}
inline std::string le64(uint64_t v) { return le32(static_cast<uint32_t>(v)) + le32(static_cast<uint32_t>(v >> 32)); }
// A negative int32/int64 as protobuf writes it: sign-extended to ten bytes.
inline std::string svarint(int64_t v) { return varint(static_cast<uint64_t>(v)); }

// ModelInferRequest.InferInputTensor: name, datatype, packed shape, then `rest`.
inline std::string input(const std::string& name, const std::string& datatype, const std::vector<int64_t>& shape,
                         const std::string& rest = "") {
  std::string packed;
  for (int64_t d : shape) packed += svarint(d);
  return ld(1, name) + ld(2, datatype) + ld(3, packed) + rest;
}
// A map<string, InferParameter> entry.
inline std::string parameter(uint32_t field, const std::string& name, const std::string& value) {
  return ld(field, ld(1, name) + ld(2, value));
}

// --- requests built against a model -----------------------------------------------------------

inline std::string bytes_of(const Tensor& t) { return std::string(reinterpret_cast<const char*>(t.data), t.byte_size); }

// A request's bytes, parsed, and built against `model`.
struct Built {
  std::shared_ptr<std::string> bytes;
  ParsedInferRequest parsed;
  InferenceRequest request;
  Status status;
};
inline std::unique_ptr<Built> build(const std::shared_ptr<const ModelSignature>& model, const std::string& bytes) {
  auto b = std::make_unique<Built>();
  b->bytes = std::make_shared<std::string>(bytes);
  b->status = parse_infer_request(reinterpret_cast<const std::byte*>(b->bytes->data()), b->bytes->size(), &b->parsed);
  if (b->status.ok()) b->status = build_inference_request(model, b->parsed, b->bytes, &b->request);
  return b;
}

inline InputSignature input_spec(const std::string& name, DataType dtype, std::vector<int64_t> dims) {
  InputSignature s;
  s.name = name;
  s.dtype = dtype;
  s.dims = std::move(dims);
  return s;
}

// Every datatype as an optional input named after it, dims [-1], max_batch_size 8.
inline std::shared_ptr<const ModelSignature> all_types_model() {
  auto m = std::make_shared<ModelSignature>();
  m->name = "all_types";
  m->max_batch_size = 8;
  for (int code = 1; code <= 14; ++code) {
    const auto dtype = static_cast<DataType>(code);
    InputSignature s = input_spec(datatype_name(dtype), dtype, {-1});
    s.optional = true;
    s.utf8 = dtype == DataType::kBytes;
    m->inputs.push_back(s);
  }
  return m;
}

// Two INT32 inputs [-1, 2], max_batch_size 4, two outputs.
inline std::shared_ptr<const ModelSignature> batching_model() {
  auto m = std::make_shared<ModelSignature>();
  m->name = "pair";
  m->max_batch_size = 4;
  m->inputs = {input_spec("A", DataType::kInt32, {2}), input_spec("B", DataType::kInt32, {2})};
  m->outputs = {OutputSignature{"X", DataType::kInt32, {2}, false}, OutputSignature{"Y", DataType::kInt32, {2}, false}};
  return m;
}

}  // namespace inferd::request_bytes
