#pragma once

// Triton's HTTP/REST paths, each as the gRPC method it is: the access policy and the status
// table are the gRPC port's, and a call Python answers travels to it as that method.

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "http_exchange.h"
#include "http_shared.h"
#include "inferd/http_infer_codec.h"
#include "inferd/status.h"

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace inferd {

enum class HttpEndpointKind {
  kServerLive,
  kServerReady,
  kServerMetadata,
  kModelReady,
  kModelMetadata,
  kModelConfig,
  kModelStatistics,
  kInfer,
  kGenerate,
  kGenerateStream,
  kRepositoryIndex,
  kRepositoryLoad,
  kRepositoryUnload,
  kTraceSetting,
  kLogSettings,
  kSystemSharedMemoryStatus,
  kSystemSharedMemoryRegister,
  kSystemSharedMemoryUnregister,
  kCudaSharedMemoryStatus,
  kCudaSharedMemoryRegister,
  kCudaSharedMemoryUnregister,
};

// One request's endpoint and the names its path carries (percent-decoded).
struct HttpEndpoint {
  HttpEndpointKind kind = HttpEndpointKind::kServerLive;
  std::string model;             // "" where the path names none
  std::string version;           // "" = the model's policy
  std::string region;            // a shared-memory region; "" = all
  std::string_view grpc_method;  // "/inference.GRPCInferenceService/..."
};

// The endpoint of `method` and `target` (its query, if any, is ignored). 404 for a path Triton
// does not serve, 405 for a method its path does not take; `*message` says which.
bool parse_endpoint(HttpMethod method, std::string_view target, HttpEndpoint* out, unsigned* status,
                    std::string* message);

// The HTTP status of a core status (the HTTP transport's one table): Triton's (500 INTERNAL,
// 404 NOT_FOUND, 503 UNAVAILABLE, 501 UNIMPLEMENTED, 400 for the rest), with 429 for
// RESOURCE_EXHAUSTED (retry later) and 403 for PERMISSION_DENIED (not on this listener).
unsigned http_status(StatusCode code);
// The core status of a gRPC status code (a forwarded call's answer), as grpc_status.cpp maps them.
StatusCode core_status_of_grpc(int grpc_code);
// {"error": message} with the status `code` maps to; the message cut as the gRPC port's.
HttpAnswer error_answer(const Status& status);

// Answers one request (routes it, checks access, runs its endpoint). The responder is answered
// exactly once.
void handle_http_request(const std::shared_ptr<HttpShared>& shared, HttpRequest request,
                         std::shared_ptr<HttpResponder> responder);

// Sends `request` to Python (the backend) as a call of `grpc_method` with the HTTP request's
// marks (the peer's credentials on the Unix socket, its traceparent); `answer` turns the response
// bytes into the HTTP answer, and a failed call is answered with its status by the HTTP table.
// Holds `http` (and so its budget) until answered. Never blocks.
void forward_to_backend(const std::shared_ptr<HttpShared>& shared, std::string_view grpc_method, HttpRequest http,
                        const google::protobuf::Message& request, std::shared_ptr<HttpResponder> responder,
                        std::function<HttpAnswer(std::string_view)> answer);

// The endpoints (http_control.cpp, http_infer_call.cpp).
void serve_snapshot_endpoint(const std::shared_ptr<HttpShared>& shared, const HttpEndpoint& endpoint,
                             HttpRequest request, std::shared_ptr<HttpResponder> responder);
void serve_forwarded_endpoint(const std::shared_ptr<HttpShared>& shared, const HttpEndpoint& endpoint,
                              HttpRequest request, std::shared_ptr<HttpResponder> responder);
void serve_infer_endpoint(const std::shared_ptr<HttpShared>& shared, const HttpEndpoint& endpoint, HttpRequest request,
                          std::shared_ptr<HttpResponder> responder);
void serve_generate_endpoint(const std::shared_ptr<HttpShared>& shared, const HttpEndpoint& endpoint,
                             HttpRequest request, std::shared_ptr<HttpResponder> responder);

// Shared by the inference endpoints (http_infer_call.cpp). A request the snapshot has no route
// for: Python answers why (unknown model or version, not ready), in its registry's words.
void serve_unrouted_inference(const std::shared_ptr<HttpShared>& shared, const HttpEndpoint& endpoint,
                              HttpRequest request, std::shared_ptr<HttpResponder> responder);
// Builds `decoded` against the route's model and hands it to its scheduler with `sink`: its
// token, or 0 when it was refused, which is answered here (and counted as the version's failure).
// `unix_socket`: the request's connection, which decides whether it may name shared memory.
// `refusal`, when given, receives why it was refused.
uint64_t submit_http_inference(const std::shared_ptr<HttpShared>& shared,
                               const std::shared_ptr<const ModelRoute>& route,
                               const std::shared_ptr<HttpInferRequest>& decoded, bool unix_socket,
                               std::shared_ptr<CompletionSink> sink, std::shared_ptr<HttpResponder> responder,
                               Status* refusal = nullptr);

}  // namespace inferd
