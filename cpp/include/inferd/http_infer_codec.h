#pragma once

// Triton's HTTP/REST inference messages (KServe v2 JSON, with Triton's binary tensor extension),
// decoded into the ParsedInferRequest the gRPC transport's parser gives and encoded from a computed
// request. After decoding, an HTTP request is the gRPC request: build_inference_request checks both
// with the same rules and messages, and both batch in the same queues.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "inferd/infer_request_parser.h"
#include "inferd/inference_request.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// Bounds on what a decoded request may hold, checked while decoding, before any buffer is sized by
// what the request claims.
struct HttpDecodeLimits {
  // Objects and arrays nested in the JSON (the document itself is depth 1), checked while the
  // parse runs: past it the parse stops, so a body of 100,000 nested arrays costs 65 values. A
  // request's own structure needs 4 (an input's `parameters`), an input's `data` 3 plus its dims.
  // The walk over a `data` recurses at most this deep.
  size_t max_json_depth = 64;
};

// How the answer's outputs are written: binary (after the JSON, sized by `binary_data_size`) or
// as JSON `data`. From the request: `binary_data_output` (a request parameter) is every output's
// default, and a requested output's own `binary_data` parameter overrides it.
struct HttpAnswerFormat {
  bool binary_by_default = false;
  std::map<std::string, bool, std::less<>> by_output;  // output name -> binary_data, where given
  // Whether `output` is answered binary. Thread-safe (reads only).
  bool binary(std::string_view output) const;
};

// A decoded HTTP inference request. `parsed` views `body` (the JSON's strings are decoded in
// place) or `header_copy`, the binary section of `body`, and buffers owned here (JSON `data` converted to the
// tensor's raw bytes, little-endian; BYTES as 4-byte length-prefixed elements). Pass the whole
// object (shared) as build_inference_request's `owner`: it keeps every view alive. The HTTP-only
// parameters (`binary_data_output`, `binary_data_size`, `binary_data`) are taken out of `parsed`
// into `format` and the raw contents: the core never sees them.
struct HttpInferRequest {
  std::string model_name;     // from the URL path
  std::string model_version;  // from the URL path; "" = the model's policy
  std::shared_ptr<std::string> body;
  ParsedInferRequest parsed;
  HttpAnswerFormat format;
  std::vector<std::unique_ptr<std::string>> converted;  // JSON data as raw bytes, one per such input
  std::string header_copy;  // the JSON header, when a binary section follows it (parsed in place here)
};

// Decodes the body of `POST v2/models/{model}[/versions/{version}]/infer`: `json_length` is
// Inference-Header-Content-Length (nullopt: the whole body is JSON); the bytes after it are the
// binary section, which inputs with `binary_data_size` take in order. Checks what HTTP alone says:
// well-formed UTF-8 JSON within the depth, the fields' types, each input setting exactly one of
// `data`, `binary_data_size` and `shared_memory_region` (Triton's rule), `data` flat or nested as
// `shape` says with as many elements as it gives (counted before the raw buffer is sized), each
// value within its datatype (FP16 and BF16 only as binary), binary sizes that add up to the
// section exactly, ParseLimits' counts. A `json_length` of 0 (Triton's raw binary request: the
// body is the one input) is refused: it needs the model's signature. Everything the model decides
// (names, datatypes against the model, shapes, batch size, reserved parameters) is left to
// build_inference_request, as for gRPC. On success `*out` is set, null `body` reads as empty; on
// failure `*out` is untouched. INVALID_ARGUMENT with a message naming the field or tensor
// otherwise. Thread-safe; never blocks.
Status decode_http_infer_request(std::string model_name, std::string model_version, std::shared_ptr<std::string> body,
                                 std::optional<size_t> json_length, const HttpDecodeLimits& limits,
                                 std::shared_ptr<HttpInferRequest>* out);

// The answer of a computed request (`outputs`: every model output in model order, as
// Completion::outputs), written as Triton writes it:
//   {"model_name","model_version","id"(when the request had one),"parameters"(when there are),
//    "outputs":[{"name","datatype","shape", "data":[...] | "parameters":{"binary_data_size":N}}]}
// then each binary output's bytes in output order. `*json_length` is the JSON's size (the answer's
// Inference-Header-Content-Length when a binary section follows). Outputs in shared memory are
// written into their slices first, as InferResponseWriter does, and carry their shared-memory
// parameters instead of data. Requested outputs only, once each, in the request's order; the
// protocol's dims where the config reshapes (answer_outputs, shared with InferResponseWriter).
// `final_response`: the `triton_final_response` parameter (a decoupled model's streamed answers).
// JSON data: FP32 and FP64 shortest round-trip (NaN and infinities as NaN, Infinity, -Infinity,
// which Python's json and tritonclient read), integers exact, BOOL true/false, BYTES as strings.
// Errors as InferResponseWriter::status; INVALID_ARGUMENT for a BYTES output asked for as JSON
// whose elements are not UTF-8 text, and for FP16 or BF16 asked for as JSON (Triton refuses them
// too: "sending FP16 data via JSON is not supported"); INTERNAL for an output whose bytes do not
// hold its shape. `*out` is replaced on success only. Thread-safe for distinct requests; never
// blocks.
Status encode_http_infer_response(const InferenceRequest& request, const std::vector<Tensor>& outputs,
                                  const HttpAnswerFormat& format, std::string* out, size_t* json_length,
                                  std::optional<bool> final_response = std::nullopt);

// The JSON error body Triton answers with: {"error":"<message>"}. Never throws for any message
// (bytes that are not UTF-8 are replaced).
std::string http_error_body(std::string_view message);

}  // namespace inferd
