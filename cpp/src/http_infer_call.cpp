// POST v2/models/{m}[/versions/{v}]/infer on the core's HTTP server: the body decoded into the
// gRPC transport's ParsedInferRequest (http_infer_codec.h), then the same path as gRPC's
// ModelInfer: route, build_inference_request, the version's scheduler, and the answer encoded as
// Triton's JSON with its binary section.

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "grpc_service.pb.h"
#include "http_routes.h"
#include "inferd/http_infer_codec.h"
#include "inferd/model_signature.h"
#include "inferd/request_observation.h"
#include "inferd/version_routing.h"

namespace inferd {
namespace {

// The answer of one HTTP inference the core runs: written on the worker thread that completes
// it, sent by the connection. Holds what the request's tensors view (the decoded body) and the
// body's budget until the core lets the request go.
class HttpInferCall final : public CompletionSink {
 public:
  HttpInferCall(std::shared_ptr<HttpShared> shared, std::shared_ptr<const ModelRoute> route,
                std::shared_ptr<HttpInferRequest> decoded, HttpRequest http, std::shared_ptr<HttpResponder> responder,
                std::unique_ptr<ObservedRequest> observation)
      : shared_(std::move(shared)),
        route_(std::move(route)),
        decoded_(std::move(decoded)),
        http_(std::move(http)),
        responder_(std::move(responder)),
        observation_(std::move(observation)) {}

  // The record of a request the core refused before it ran (the call is then dropped).
  void refused(const Status& status) { report(status, nullptr); }

  void complete(Completion&& completion) override {
    Status status = completion.status;
    HttpAnswer answer;
    size_t json_length = 0;
    if (status.ok() && completion.request != nullptr) {
      status = encode_http_infer_response(*completion.request, completion.outputs, decoded_->format, &answer.body,
                                          &json_length);
    }
    report(status, &completion.timing);
    if (!status.ok()) {
      record_failure(*shared_->transport, *route_, status, decoded_->parsed.id, nullptr, "http");
      return responder_->answer(error_answer(status));
    }
    answer.compressible = true;
    if (json_length != answer.body.size()) {
      answer.inference_header_length = json_length;
      answer.content_type = "application/octet-stream";
    }
    responder_->answer(std::move(answer));
  }

 private:
  // An observed request's record goes to Python before its answer (see grpc_infer_call.cpp).
  void report(const Status& status, RequestTiming* timing) {
    finish_observation(*shared_->transport->observations, std::move(observation_), status, timing, status.ok() ? 1 : 0);
  }

  const std::shared_ptr<HttpShared> shared_;
  const std::shared_ptr<const ModelRoute> route_;
  const std::shared_ptr<HttpInferRequest> decoded_;
  const HttpRequest http_;  // its reservation: the body's bytes, until the core lets the request go
  const std::shared_ptr<HttpResponder> responder_;
  std::unique_ptr<ObservedRequest> observation_;  // null unless Python observes it; sent once
};

// Headers that are HTTP's own, not the caller's metadata: an observed request's record carries
// the others (traceparent among them), as a gRPC call's carries its metadata.
bool is_http_header(std::string_view name) {
  static const std::array<std::string_view, 12> kOwn{"host",
                                                     "connection",
                                                     "content-length",
                                                     "content-type",
                                                     "content-encoding",
                                                     "accept-encoding",
                                                     "transfer-encoding",
                                                     "expect",
                                                     "user-agent",
                                                     "accept",
                                                     "keep-alive",
                                                     "inference-header-content-length"};
  return std::find(kOwn.begin(), kOwn.end(), name) != kOwn.end();
}

// The observation of an HTTP inference (see begin_observation): null when nobody observes it.
std::unique_ptr<ObservedRequest> begin_http_observation(const ServingSnapshot& snapshot, const ModelRoute& route,
                                                        const HttpRequest& request, std::string_view id,
                                                        Clock::time_point received) {
  const std::optional<std::string_view> traceparent = request.header("traceparent");
  const TraceSampling& tracing = snapshot.tracing_for(route.model);
  const bool sampled = tracing.enabled && tracing.traced(traceparent.value_or(""));
  if (!sampled && !snapshot.observe_inference) return nullptr;
  auto observed = std::make_unique<ObservedRequest>();
  observed->model = route.model;
  observed->version = route.version;
  observed->id = std::string(id);
  observed->sampled = sampled;
  observed->received = received;
  for (const auto& [name, value] : request.headers)
    if (!is_http_header(name)) observed->metadata.emplace_back(name, value);
  return observed;
}

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
                               std::shared_ptr<CompletionSink> sink, std::shared_ptr<HttpResponder> responder,
                               Status* refusal) {
  const std::shared_ptr<RequestScheduler> scheduler = route->scheduler.lock();  // the snapshot owns it
  if (scheduler == nullptr) {
    const Status gone = Status::Error(StatusCode::kUnavailable, "the model is being unloaded");
    if (refusal != nullptr) *refusal = gone;
    responder->answer(error_answer(gone));
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
    record_failure(*shared->transport, *route, status, decoded->parsed.id, nullptr, "http");
    if (refusal != nullptr) *refusal = status;
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
  const Clock::time_point received_at = Clock::now();
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
  // Counted until this request is submitted: its version is not closed before (settle()).
  const ServingState::Reading reading = shared->transport->state.read();
  const std::shared_ptr<const ServingSnapshot>& snapshot = reading.snapshot();
  std::shared_ptr<const ModelRoute> route =
      snapshot->find(decoded->parsed.model_name, decoded->parsed.model_version, routing);
  if (route == nullptr) return serve_unrouted_inference(shared, endpoint, std::move(request), std::move(responder));
  // Traced by the snapshot's sampler, as gRPC's are (a sampler only Python can apply,
  // forward_inference, is not applied to HTTP: such requests run untraced).
  std::unique_ptr<ObservedRequest> observation =
      begin_http_observation(*snapshot, *route, request, decoded->parsed.id, received_at);
  const bool unix_socket = request.unix_socket;
  auto call =
      std::make_shared<HttpInferCall>(shared, route, decoded, std::move(request), responder, std::move(observation));
  Status refusal;
  if (submit_http_inference(shared, route, decoded, unix_socket, call, std::move(responder), &refusal) == 0) {
    call->refused(refusal);
  }
}

}  // namespace inferd
