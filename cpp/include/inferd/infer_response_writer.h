#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/model_signature.h"
#include "inferd/tensor.h"

namespace inferd {

// Writes the ModelInferResponse of a computed request, byte for byte what protobuf's serializer
// writes for the same message: model_name, model_version, id, then each requested output's
// name, datatype and shape (in the protocol's dims when the config reshapes it), then the raw
// output contents. Each output's bytes are copied once, straight from the scattered output into
// the response. With `stream`, the response is wrapped as ModelStreamInferResponse.infer_response.
//
// Outputs the request asked for in shared memory (InferenceRequest::shared_memory_outputs) are
// copied into their slices by the constructor, and the response carries their name, datatype,
// shape and shared-memory parameters as the request gave them (shared_memory_region,
// shared_memory_byte_size, shared_memory_offset; map entries in key order) with an empty
// raw_output_contents entry (as Triton's: tritonclient counts entries by output position).
//
// With `final_response` (a streamed response of a request with final_response_flag), the response
// carries the parameter `triton_final_response` (bool) in ModelInferResponse.parameters: true on a
// request's last response, false on the others. The empty form (empty_response) carries only the
// model name, version, id and that parameter: a decoupled request's final flag sent on its own.
//
// Usage: construct, check status(), allocate size() bytes, write() into them. The request and
// outputs must outlive the writer. Not thread-safe; never blocks.
class InferResponseWriter {
 public:
  // `request` must carry a signature (it came through build_inference_request); `outputs` are every
  // model output, in model order.
  InferResponseWriter(const InferenceRequest& request, const std::vector<Tensor>& outputs, bool stream,
                      std::optional<bool> final_response = std::nullopt);
  // The response without outputs, carrying `final_response` (see above).
  static InferResponseWriter empty_response(const InferenceRequest& request, bool stream, bool final_response);

  // OK, or why these outputs cannot be answered: INTERNAL for an output whose element count does
  // not fit its reshaped dims; INVALID_ARGUMENT for a shared-memory slice too small for its output
  // or one that could not be written (the client shrank its object). The request then fails.
  const Status& status() const { return status_; }
  size_t size() const { return total_size_; }
  // Bytes of output data to copy: callers release locks (the GIL) around write() when it is large.
  size_t data_bytes() const { return data_bytes_; }
  // Writes exactly size() bytes at `out`.
  void write(std::byte* out) const;

 private:
  struct Output {
    const OutputSignature* spec;
    const Tensor* tensor;
    std::vector<int64_t> shape;               // as the protocol shows it
    size_t shape_bytes;                       // packed shape payload
    size_t message_bytes;                     // the InferOutputTensor message
    const SharedMemoryOutput* shared_memory;  // written into the client's slice: no raw contents here
    size_t parameters_bytes;                  // the shared-memory parameters' map entries
  };
  struct Empty {};
  InferResponseWriter(const InferenceRequest& request, Empty, bool stream, bool final_response);
  // Sizes the whole message once outputs_ is filled.
  void size_message();

  const InferenceRequest& request_;
  const ModelSignature& model_;
  bool stream_;
  std::optional<bool> final_response_;
  std::vector<Output> outputs_;
  size_t message_size_ = 0;  // the ModelInferResponse
  size_t total_size_ = 0;    // with the stream wrapper, if any
  size_t data_bytes_ = 0;
  Status status_;
};

// A ModelStreamInferResponse that reports one failed request: `error_message` and an
// infer_response carrying only the request's `id` (Triton's way of saying which request failed),
// and `triton_final_response` when given (a request with final_response_flag: true when the error
// ends it, false for a decoupled model's error response after which it goes on).
std::string stream_error_response(std::string_view message, std::string_view id,
                                  std::optional<bool> final_response = std::nullopt);

// The ModelInferResponse field `parameters { "triton_final_response": bool }`, serialized: appended
// to a serialized ModelInferResponse, it adds the flag (protobuf reads map entries in any place).
std::string final_response_parameter(bool last);

}  // namespace inferd
