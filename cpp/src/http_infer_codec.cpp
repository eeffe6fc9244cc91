// Placeholder until the codec lands (issue 27): every request is refused.
#include "inferd/http_infer_codec.h"

namespace inferd {

bool HttpAnswerFormat::binary(std::string_view output) const {
  auto it = binary.find(output);
  return it == binary.end() ? binary_by_default : it->second;
}

Status decode_http_infer_request(std::string, std::string, std::shared_ptr<std::string>, std::optional<size_t>,
                                 const HttpDecodeLimits&, std::shared_ptr<HttpInferRequest>*) {
  return Status::Error(StatusCode::kUnimplemented, "not yet");
}

Status encode_http_infer_response(const InferenceRequest&, const std::vector<Tensor>&, const HttpAnswerFormat&,
                                  std::string*, size_t*, std::optional<bool>) {
  return Status::Error(StatusCode::kUnimplemented, "not yet");
}

std::string http_error_body(std::string_view message) { return "{\"error\":\"" + std::string(message) + "\"}"; }

}  // namespace inferd
