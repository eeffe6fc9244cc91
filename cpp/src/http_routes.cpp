// Triton's HTTP/REST paths -> endpoints, the access check every request passes, and the HTTP
// transport's status table.

#include "http_routes.h"

#include <map>
#include <string>
#include <vector>

#include "inferd/grpc_status.h"
#include "inferd/http_infer_codec.h"

namespace inferd {
namespace {

constexpr std::string_view kService = "/inference.GRPCInferenceService/";

std::string method_path(std::string_view name) { return std::string(kService) + std::string(name); }

// The gRPC method of each endpoint, spelled as the access policy's table spells it.
std::string_view grpc_method_of(HttpEndpointKind kind) {
  static const std::map<HttpEndpointKind, std::string> methods{
      {HttpEndpointKind::kServerLive, method_path("ServerLive")},
      {HttpEndpointKind::kServerReady, method_path("ServerReady")},
      {HttpEndpointKind::kServerMetadata, method_path("ServerMetadata")},
      {HttpEndpointKind::kModelReady, method_path("ModelReady")},
      {HttpEndpointKind::kModelMetadata, method_path("ModelMetadata")},
      {HttpEndpointKind::kModelConfig, method_path("ModelConfig")},
      {HttpEndpointKind::kModelStatistics, method_path("ModelStatistics")},
      {HttpEndpointKind::kInfer, method_path("ModelInfer")},
      {HttpEndpointKind::kGenerate, method_path("ModelInfer")},
      {HttpEndpointKind::kGenerateStream, method_path("ModelStreamInfer")},
      {HttpEndpointKind::kRepositoryIndex, method_path("RepositoryIndex")},
      {HttpEndpointKind::kRepositoryLoad, method_path("RepositoryModelLoad")},
      {HttpEndpointKind::kRepositoryUnload, method_path("RepositoryModelUnload")},
      {HttpEndpointKind::kTraceSetting, method_path("TraceSetting")},
      {HttpEndpointKind::kLogSettings, method_path("LogSettings")},
      {HttpEndpointKind::kSystemSharedMemoryStatus, method_path("SystemSharedMemoryStatus")},
      {HttpEndpointKind::kSystemSharedMemoryRegister, method_path("SystemSharedMemoryRegister")},
      {HttpEndpointKind::kSystemSharedMemoryUnregister, method_path("SystemSharedMemoryUnregister")},
      {HttpEndpointKind::kCudaSharedMemoryStatus, method_path("CudaSharedMemoryStatus")},
      {HttpEndpointKind::kCudaSharedMemoryRegister, method_path("CudaSharedMemoryRegister")},
      {HttpEndpointKind::kCudaSharedMemoryUnregister, method_path("CudaSharedMemoryUnregister")},
  };
  return methods.at(kind);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A path segment, percent-decoded; false for a malformed escape.
bool decode_segment(std::string_view segment, std::string* out) {
  out->clear();
  out->reserve(segment.size());
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] != '%') {
      out->push_back(segment[i]);
      continue;
    }
    if (i + 2 >= segment.size()) return false;
    const int high = hex_value(segment[i + 1]), low = hex_value(segment[i + 2]);
    if (high < 0 || low < 0) return false;
    out->push_back(static_cast<char>(high * 16 + low));
    i += 2;
  }
  return true;
}

struct Route {
  HttpEndpointKind kind;
  HttpMethod method;  // kOther: GET and POST
};

}  // namespace

bool parse_endpoint(HttpMethod method, std::string_view target, HttpEndpoint* out, unsigned* status,
                    std::string* message) {
  const std::string_view path = target.substr(0, target.find('?'));
  std::vector<std::string> parts;
  size_t at = 0;
  bool malformed = path.empty() || path[0] != '/';
  while (!malformed && at < path.size()) {
    const size_t next = path.find('/', at + 1);
    const std::string_view raw =
        path.substr(at + 1, next == std::string_view::npos ? std::string_view::npos : next - at - 1);
    std::string decoded;
    if (!decode_segment(raw, &decoded)) malformed = true;
    parts.push_back(std::move(decoded));
    if (next == std::string_view::npos) break;
    at = next;
  }
  auto not_found = [&] {
    *status = 404;
    *message = "no endpoint at '" + shown_message(std::string(path)) + "' (Triton's HTTP API is under /v2)";
    return false;
  };
  if (malformed || parts.empty() || parts[0] != "v2") return not_found();
  const size_t n = parts.size();
  std::optional<Route> route;
  HttpEndpoint endpoint;
  auto is = [&](size_t i, std::string_view word) { return i < n && parts[i] == word; };
  if (n == 1) {
    route = Route{HttpEndpointKind::kServerMetadata, HttpMethod::kGet};
  } else if (n == 3 && is(1, "health") && is(2, "live")) {
    route = Route{HttpEndpointKind::kServerLive, HttpMethod::kGet};
  } else if (n == 3 && is(1, "health") && is(2, "ready")) {
    route = Route{HttpEndpointKind::kServerReady, HttpMethod::kGet};
  } else if (n == 3 && is(1, "models") && is(2, "stats")) {
    route = Route{HttpEndpointKind::kModelStatistics, HttpMethod::kGet};
  } else if (n >= 3 && is(1, "models") && !parts[2].empty()) {
    endpoint.model = parts[2];
    size_t next = 3;
    if (is(3, "versions") && n >= 5 && !parts[4].empty()) {  // an empty version is no version
      endpoint.version = parts[4];
      next = 5;
    }
    const size_t rest = n - next;
    if (rest == 0) {
      route = Route{HttpEndpointKind::kModelMetadata, HttpMethod::kGet};
    } else if (rest == 1) {
      static const std::map<std::string, Route, std::less<>> model_routes{
          {"ready", {HttpEndpointKind::kModelReady, HttpMethod::kGet}},
          {"config", {HttpEndpointKind::kModelConfig, HttpMethod::kGet}},
          {"stats", {HttpEndpointKind::kModelStatistics, HttpMethod::kGet}},
          {"infer", {HttpEndpointKind::kInfer, HttpMethod::kPost}},
          {"generate", {HttpEndpointKind::kGenerate, HttpMethod::kPost}},
          {"generate_stream", {HttpEndpointKind::kGenerateStream, HttpMethod::kPost}},
      };
      if (auto it = model_routes.find(parts[next]); it != model_routes.end()) route = it->second;
    } else if (rest == 2 && is(next, "trace") && is(next + 1, "setting") && endpoint.version.empty()) {
      route = Route{HttpEndpointKind::kTraceSetting, HttpMethod::kOther};
    }
  } else if (n == 3 && is(1, "repository") && is(2, "index")) {
    route = Route{HttpEndpointKind::kRepositoryIndex, HttpMethod::kPost};
  } else if (n == 5 && is(1, "repository") && is(2, "models") && !parts[3].empty() &&
             (is(4, "load") || is(4, "unload"))) {
    endpoint.model = parts[3];
    route = Route{is(4, "load") ? HttpEndpointKind::kRepositoryLoad : HttpEndpointKind::kRepositoryUnload,
                  HttpMethod::kPost};
  } else if (n == 3 && is(1, "trace") && is(2, "setting")) {
    route = Route{HttpEndpointKind::kTraceSetting, HttpMethod::kOther};
  } else if (n == 2 && is(1, "logging")) {
    route = Route{HttpEndpointKind::kLogSettings, HttpMethod::kOther};
  } else if (n >= 3 && (is(1, "systemsharedmemory") || is(1, "cudasharedmemory"))) {
    const bool system = is(1, "systemsharedmemory");
    size_t next = 2;
    if (is(2, "region") && n >= 4 && !parts[3].empty()) {  // "region//unregister" is not all of them
      endpoint.region = parts[3];
      next = 4;
    }
    if (n == next + 1) {
      if (is(next, "status")) {
        route = Route{system ? HttpEndpointKind::kSystemSharedMemoryStatus : HttpEndpointKind::kCudaSharedMemoryStatus,
                      HttpMethod::kGet};
      } else if (is(next, "register") && !endpoint.region.empty()) {
        route =
            Route{system ? HttpEndpointKind::kSystemSharedMemoryRegister : HttpEndpointKind::kCudaSharedMemoryRegister,
                  HttpMethod::kPost};
      } else if (is(next, "unregister")) {
        route = Route{
            system ? HttpEndpointKind::kSystemSharedMemoryUnregister : HttpEndpointKind::kCudaSharedMemoryUnregister,
            HttpMethod::kPost};
      }
    }
  }
  if (!route) return not_found();
  if (method == HttpMethod::kOther || (route->method != HttpMethod::kOther && route->method != method)) {
    *status = 405;
    *message = "'" + shown_message(std::string(path)) + "' takes " +
               (route->method == HttpMethod::kOther ? "GET and POST"
                : route->method == HttpMethod::kGet ? "GET"
                                                    : "POST");
    return false;
  }
  endpoint.kind = route->kind;
  endpoint.grpc_method = grpc_method_of(route->kind);
  *out = std::move(endpoint);
  return true;
}

unsigned http_status(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kInternal:
      return 500;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kUnimplemented:
      return 501;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kInvalidArgument:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kCancelled:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAlreadyExists:
      return 400;
  }
  return 500;
}

StatusCode core_status_of_grpc(int code) {
  for (int c = static_cast<int>(StatusCode::kOk); c <= static_cast<int>(StatusCode::kPermissionDenied); ++c) {
    if (grpc_code(static_cast<StatusCode>(c)) == code) return static_cast<StatusCode>(c);
  }
  return StatusCode::kInternal;  // UNKNOWN, DATA_LOSS, ...: the server failed
}

HttpAnswer error_answer(const Status& status) {
  HttpAnswer answer;
  answer.status = http_status(status.code);
  answer.body = http_error_body(shown_message(status.message));
  return answer;
}

void handle_http_request(const std::shared_ptr<HttpShared>& shared, HttpRequest request,
                         std::shared_ptr<HttpResponder> responder) {
  HttpEndpoint endpoint;
  unsigned status = 0;
  std::string message;
  if (!parse_endpoint(request.method, request.target, &endpoint, &status, &message)) {
    HttpAnswer answer;
    answer.status = status;
    answer.body = http_error_body(message);
    return responder->answer(std::move(answer));
  }
  // The gRPC port's rule for the same method; HTTP headers stand in for its metadata.
  std::multimap<grpc::string_ref, grpc::string_ref> metadata;
  for (const auto& [name, value] : request.headers) metadata.emplace(name, value);
  const grpc::Status allowed =
      shared->access.check(endpoint.grpc_method, request.unix_socket ? "unix:" : "ipv4:", metadata);
  if (!allowed.ok()) {
    return responder->answer(
        error_answer(Status::Error(core_status_of_grpc(allowed.error_code()), allowed.error_message())));
  }
  switch (endpoint.kind) {
    case HttpEndpointKind::kInfer:
    case HttpEndpointKind::kGenerate:
    case HttpEndpointKind::kGenerateStream:
      return serve_infer_endpoint(shared, endpoint, std::move(request), std::move(responder));
    case HttpEndpointKind::kServerLive:
    case HttpEndpointKind::kServerReady:
    case HttpEndpointKind::kModelReady:
    case HttpEndpointKind::kModelMetadata:
    case HttpEndpointKind::kModelConfig:
      return serve_snapshot_endpoint(shared, endpoint, std::move(request), std::move(responder));
    default:
      return serve_forwarded_endpoint(shared, endpoint, std::move(request), std::move(responder));
  }
}

}  // namespace inferd
