// POST v2/models/{m}[/versions/{v}]/infer on the core's HTTP server: the body decoded into the
// gRPC transport's ParsedInferRequest (http_infer_codec.h), then the same path as gRPC's
// ModelInfer: route, build_inference_request, the version's scheduler, and the answer encoded as
// Triton's JSON with its binary section.

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "grpc_service.pb.h"
#include "http_routes.h"
#include "inferd/http_infer_codec.h"
#include "inferd/model_signature.h"
#include "inferd/version_routing.h"

namespace inferd {
namespace {

// The answer of one HTTP inference the core runs: written on the worker thread that completes
// it, sent by the connection. Holds what the request's tensors view (the decoded body) and the
// body's budget until the core lets the request go.
class HttpInferCall final : public CompletionSink {
 public:
  HttpInferCall(std::shared_ptr<HttpShared> shared, std::shared_ptr<const ModelRoute> route,
                std::shared_ptr<HttpInferRequest> decoded, HttpRequest http, std::shared_ptr<HttpResponder> responder)
      : shared_(std::move(shared)),
        route_(std::move(route)),
        decoded_(std::move(decoded)),
        http_(std::move(http)),
        responder_(std::move(responder)) {}

  void complete(Completion&& completion) override {
    Status status = completion.status;
    HttpAnswer answer;
    size_t json_length = 0;
    if (status.ok() && completion.request != nullptr) {
      status = encode_http_infer_response(*completion.request, completion.outputs, decoded_->format, &answer.body,
                                          &json_length);
    }
    if (!status.ok()) {
      record_failure(*shared_->transport, *route_, status, decoded_->parsed.id, nullptr);
      return responder_->answer(error_answer(status));
    }
    if (json_length != answer.body.size()) {
      answer.inference_header_length = json_length;
      answer.content_type = "application/octet-stream";
    }
    responder_->answer(std::move(answer));
  }

 private:
  const std::shared_ptr<HttpShared> shared_;
  const std::shared_ptr<const ModelRoute> route_;
  const std::shared_ptr<HttpInferRequest> decoded_;
  const HttpRequest http_;  // its reservation: the body's bytes, until the core lets the request go
  const std::shared_ptr<HttpResponder> responder_;
};

// Inference-Header-Content-Length: absent (the whole body is JSON), or a length within the body.
bool json_length_of(const HttpRequest& request, std::optional<size_t>* out, Status* refused) {
  const std::optional<std::string_view> header = request.header("inference-header-content-length");
  if (!header) return true;
  uint64_t value = 0;
  bool digits = !header->empty() && header->size() <= 19;
  for (char c : *header) {
    if (c < '0' || c > '9') {
      digits = false;
      break;
    }
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (!digits || value > request.body->size()) {
    *refused = Status::Error(StatusCode::kInvalidArgument, "Inference-Header-Content-Length '" +
                                                               std::string(header->substr(0, 32)) +
                                                               "' is not a length within the request body of " +
                                                               std::to_string(request.body->size()) + " bytes");
    return false;
  }
  *out = static_cast<size_t>(value);
  return true;
}

}  // namespace

void serve_unrouted_inference(const std::shared_ptr<HttpShared>& shared, const HttpEndpoint& endpoint,
                              HttpRequest request, std::shared_ptr<HttpResponder> responder) {
  // Python answers in its registry's words why there is no such model or version to run.
  inference::ModelInferRequest ask;
  ask.set_model_name(endpoint.model);
  ask.set_model_version(endpoint.version);
  forward_to_backend(
      shared, "/inference.GRPCInferenceService/ModelInfer", std::move(request), ask, std::move(responder),
      [](std::string_view) {
        return error_answer(Status::Error(StatusCode::kUnavailable, "the model became available meanwhile; retry"));
      });
}

uint64_t submit_http_inference(const std::shared_ptr<HttpShared>& shared,
                               const std::shared_ptr<const ModelRoute>& route,
                               const std::shared_ptr<HttpInferRequest>& decoded, bool unix_socket,
                               std::shared_ptr<CompletionSink> sink, std::shared_ptr<HttpResponder> responder) {
  const std::shared_ptr<RequestScheduler> scheduler = route->scheduler.lock();  // the snapshot owns it
  if (scheduler == nullptr) {
    responder->answer(error_answer(Status::Error(StatusCode::kUnavailable, "the model is being unloaded")));
    return 0;
  }
  auto core_request = std::make_unique<InferenceRequest>();
  const uint64_t token = shared->transport->next_token();
  core_request->token = token;
  Status status = build_inference_request(route->signature, decoded->parsed, decoded, core_request.get(),
                                          shared->shared_memory_for(unix_socket));
  if (status.ok()) {
    core_request->sink = std::move(sink);
    status = scheduler->submit(std::move(core_request));  // refused: still ours, and dropped here
  }
  if (!status.ok()) {
    record_failure(*shared->transport, *route, status, decoded->parsed.id, nullptr);
    responder->answer(error_answer(status));
    return 0;
  }
  return token;
}

void serve_infer_endpoint(const std::shared_ptr<HttpShared>& shared, const HttpEndpoint& endpoint, HttpRequest request,
                          std::shared_ptr<HttpResponder> responder) {
  if (endpoint.kind != HttpEndpointKind::kInfer) {
    return serve_generate_endpoint(shared, endpoint, std::move(request), std::move(responder));
  }
  std::optional<size_t> json_length;
  Status status;
  if (!json_length_of(request, &json_length, &status)) return responder->answer(error_answer(status));
  HttpDecodeLimits limits;
  limits.max_json_depth = shared->options.max_json_depth;
  std::shared_ptr<HttpInferRequest> decoded;
  status = decode_http_infer_request(endpoint.model, endpoint.version, request.body, json_length, limits, &decoded);
  if (!status.ok()) return responder->answer(error_answer(status));

  std::optional<std::string_view> routing;
  status = routing_key(decoded->parsed.parameters, &routing);
  if (!status.ok()) return responder->answer(error_answer(status));
  const std::shared_ptr<const ServingSnapshot> snapshot = shared->transport->state.current();
  std::shared_ptr<const ModelRoute> route =
      snapshot->find(decoded->parsed.model_name, decoded->parsed.model_version, routing);
  if (route == nullptr) return serve_unrouted_inference(shared, endpoint, std::move(request), std::move(responder));
  const bool unix_socket = request.unix_socket;
  auto call = std::make_shared<HttpInferCall>(shared, route, decoded, std::move(request), responder);
  submit_http_inference(shared, route, decoded, unix_socket, std::move(call), std::move(responder));
}

}  // namespace inferd
