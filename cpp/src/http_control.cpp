// The HTTP endpoints that are not inferences: answered from the serving snapshot when it knows
// the answer (health, model readiness, metadata and config, as the gRPC port does), otherwise sent
// to Python as the gRPC call they are and its answer written as Triton's JSON.

#include <grpcpp/generic/generic_stub.h>
#include <rapidjson/document.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "grpc_service.pb.h"
#include "http_json_messages.h"
#include "http_json_parse.h"
#include "http_routes.h"
#include "inferd/grpc_status.h"
#include "inferd/http_infer_codec.h"
#include "model_config.pb.h"

namespace inferd {
namespace {

namespace pb = google::protobuf;

HttpAnswer json_answer(std::string body) {
  HttpAnswer answer;
  answer.body = std::move(body);
  return answer;
}

// --- request bodies ---------------------------------------------------------------------------

// The body as a JSON object (parsed in place, within --http-max-json-depth); an empty body is an
// empty object. false with the answer to send.
bool parse_object(HttpRequest& request, size_t max_depth, rapidjson::Document* document, HttpAnswer* refused) {
  std::string& body = *request.body;
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) {
    document->SetObject();
    return true;
  }
  Status status = parse_json_in_place(body.data(), body.size(), max_depth, document);
  if (status.ok() && !document->IsObject()) {
    status = Status::Error(StatusCode::kInvalidArgument, "the request body must be a JSON object");
  }
  if (!status.ok()) {
    *refused = error_answer(status);
    return false;
  }
  return true;
}

Status invalid(std::string message) { return Status::Error(StatusCode::kInvalidArgument, std::move(message)); }

// `parameters` of a repository load or unload: Triton's `config` (a JSON string), `file:<path>`
// (base64 content) and plain bool, int and string values.
Status repository_parameters(const rapidjson::Value& body,
                             pb::Map<std::string, inference::ModelRepositoryParameter>* out) {
  if (!body.HasMember("parameters")) return Status::Ok();
  const rapidjson::Value& parameters = body["parameters"];
  if (!parameters.IsObject()) return invalid("'parameters' must be a JSON object");
  for (auto it = parameters.MemberBegin(); it != parameters.MemberEnd(); ++it) {
    const std::string key(it->name.GetString(), it->name.GetStringLength());
    inference::ModelRepositoryParameter& value = (*out)[key];
    const rapidjson::Value& v = it->value;
    if (key.rfind("file:", 0) == 0) {
      std::string bytes;
      if (!v.IsString() || !unbase64(std::string_view(v.GetString(), v.GetStringLength()), &bytes)) {
        return invalid("parameter '" + key + "' must be the file's content in base64");
      }
      value.set_bytes_param(std::move(bytes));
    } else if (v.IsBool()) {
      value.set_bool_param(v.GetBool());
    } else if (v.IsInt64()) {
      value.set_int64_param(v.GetInt64());
    } else if (v.IsString()) {
      value.set_string_param(std::string(v.GetString(), v.GetStringLength()));
    } else {
      return invalid("parameter '" + key + "' must be a bool, an integer or a string");
    }
  }
  return Status::Ok();
}

Status read_uint64(const rapidjson::Value& body, const char* name, bool required, uint64_t* out) {
  if (!body.HasMember(name)) return required ? invalid(std::string("'") + name + "' is required") : Status::Ok();
  if (!body[name].IsUint64()) return invalid(std::string("'") + name + "' must be a non-negative integer");
  *out = body[name].GetUint64();
  return Status::Ok();
}

// Trace settings: each value a string, a list of strings, or null (clear a model's own).
Status trace_settings(const rapidjson::Value& body, inference::TraceSettingRequest* out) {
  for (auto it = body.MemberBegin(); it != body.MemberEnd(); ++it) {
    const std::string key(it->name.GetString(), it->name.GetStringLength());
    auto& value = (*out->mutable_settings())[key];
    const rapidjson::Value& v = it->value;
    if (v.IsNull()) continue;  // no values: back to the global setting
    if (v.IsString()) {
      value.add_value(std::string(v.GetString(), v.GetStringLength()));
    } else if (v.IsArray()) {
      for (const rapidjson::Value& item : v.GetArray()) {
        if (!item.IsString()) return invalid("trace setting '" + key + "' must be strings");
        value.add_value(std::string(item.GetString(), item.GetStringLength()));
      }
    } else if (v.IsNumber()) {
      value.add_value(v.IsInt64() ? std::to_string(v.GetInt64()) : std::to_string(v.GetDouble()));
    } else {
      return invalid("trace setting '" + key + "' must be a string, a list of strings or null");
    }
  }
  return Status::Ok();
}

Status log_settings(const rapidjson::Value& body, inference::LogSettingsRequest* out) {
  for (auto it = body.MemberBegin(); it != body.MemberEnd(); ++it) {
    const std::string key(it->name.GetString(), it->name.GetStringLength());
    auto& value = (*out->mutable_settings())[key];
    const rapidjson::Value& v = it->value;
    if (v.IsBool()) {
      value.set_bool_param(v.GetBool());
    } else if (v.IsUint()) {
      value.set_uint32_param(v.GetUint());
    } else if (v.IsString()) {
      value.set_string_param(std::string(v.GetString(), v.GetStringLength()));
    } else {
      return invalid("log setting '" + key + "' must be a bool, a non-negative integer or a string");
    }
  }
  return Status::Ok();
}

template <class Response>
std::function<HttpAnswer(std::string_view)> parsed(std::function<HttpAnswer(const Response&)> write) {
  return [write = std::move(write)](std::string_view bytes) {
    Response response;
    if (!response.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return error_answer(Status::Error(StatusCode::kInternal, "the server's answer is not a valid message"));
    }
    return write(response);
  };
}

HttpAnswer metadata_answer(const inference::ModelMetadataResponse& response) {
  return json_answer(message_json(response));
}

HttpAnswer config_answer(const inference::ModelConfigResponse& response) {
  std::string json;
  if (!config_json(response.config(), &json)) {
    return error_answer(Status::Error(StatusCode::kInternal, "cannot write the model's config as JSON"));
  }
  return json_answer(std::move(json));
}

// Health and readiness: the status says it (200, or 400 as Triton), and the body says it to
// KServe's v2 REST clients, which read {"live": ...} / {"ready": ...} (tritonclient ignores it).
HttpAnswer health_answer(const char* key, bool value) {
  HttpAnswer answer;
  answer.status = value ? 200 : 400;
  answer.body = std::string("{\"") + key + "\":" + (value ? "true" : "false") + "}";
  return answer;
}
HttpAnswer ready_answer(bool ready) { return health_answer("ready", ready); }

}  // namespace

namespace {

// One gRPC call to the backend for an HTTP request (see forward_to_backend).
struct BackendHttpCall {
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  std::shared_ptr<HttpResponder> responder;
  std::function<HttpAnswer(std::string_view)> answer;
  HttpRequest http;  // kept until answered: its body's bytes stay counted in the budget
};

}  // namespace

void forward_to_backend(const std::shared_ptr<HttpShared>& shared, std::string_view grpc_method, HttpRequest http,
                        const pb::Message& request, std::shared_ptr<HttpResponder> responder,
                        std::function<HttpAnswer(std::string_view)> answer) {
  grpc::GenericStub* backend = shared->transport->backend.get();
  if (backend == nullptr) {
    return responder->answer(error_answer(Status::Error(StatusCode::kUnavailable, "the server is shutting down")));
  }
  auto call = std::make_shared<BackendHttpCall>();
  call->request = message(request.SerializeAsString());
  call->responder = std::move(responder);
  call->answer = std::move(answer);
  if (http.credentials) {
    call->context.AddMetadata(std::string(kPeerCredentialsKey), std::to_string(http.credentials->pid) + " " +
                                                                    std::to_string(http.credentials->uid) + " " +
                                                                    std::to_string(http.credentials->gid));
  }
  if (std::optional<std::string_view> traceparent = http.header("traceparent")) {
    call->context.AddMetadata("traceparent", std::string(*traceparent));
  }
  call->http = std::move(http);
  backend->UnaryCall(&call->context, std::string(grpc_method), grpc::StubOptions(), &call->request, &call->response,
                     [call](const grpc::Status& status) {
                       if (!status.ok()) {
                         return call->responder->answer(error_answer(
                             Status::Error(core_status_of_grpc(status.error_code()), status.error_message())));
                       }
                       ReceivedMessage received;
                       if (!receive(call->response, &received)) {
                         return call->responder->answer(
                             error_answer(Status::Error(StatusCode::kInternal, "cannot read the server's answer")));
                       }
                       call->responder->answer(call->answer(received.bytes));
                     });
}

void serve_snapshot_endpoint(const std::shared_ptr<HttpShared>& shared, const HttpEndpoint& endpoint,
                             HttpRequest request, std::shared_ptr<HttpResponder> responder) {
  const std::shared_ptr<const ServingSnapshot> snapshot = shared->transport->state.current();
  switch (endpoint.kind) {
    case HttpEndpointKind::kServerLive:
      return responder->answer(health_answer("live", snapshot->live));
    case HttpEndpointKind::kServerReady:
      return responder->answer(ready_answer(snapshot->ready));
    default:
      break;
  }
  const std::shared_ptr<const ModelRoute> route = snapshot->find(endpoint.model, endpoint.version);
  if (route != nullptr) {
    switch (endpoint.kind) {
      case HttpEndpointKind::kModelReady:
        return responder->answer(ready_answer(snapshot->accepting));
      case HttpEndpointKind::kModelMetadata:
        return responder->answer(parsed<inference::ModelMetadataResponse>(metadata_answer)(route->metadata_response));
      case HttpEndpointKind::kModelConfig:
        return responder->answer(parsed<inference::ModelConfigResponse>(config_answer)(route->config_response));
      default:
        break;
    }
  }
  // Python answers what the snapshot does not know, in its registry's words.
  switch (endpoint.kind) {
    case HttpEndpointKind::kModelReady: {
      inference::ModelReadyRequest ask;
      ask.set_name(endpoint.model);
      ask.set_version(endpoint.version);
      return forward_to_backend(shared, endpoint.grpc_method, std::move(request), ask, std::move(responder),
                                parsed<inference::ModelReadyResponse>(
                                    [](const inference::ModelReadyResponse& r) { return ready_answer(r.ready()); }));
    }
    case HttpEndpointKind::kModelMetadata: {
      inference::ModelMetadataRequest ask;
      ask.set_name(endpoint.model);
      ask.set_version(endpoint.version);
      return forward_to_backend(shared, endpoint.grpc_method, std::move(request), ask, std::move(responder),
                                parsed<inference::ModelMetadataResponse>(metadata_answer));
    }
    default: {
      inference::ModelConfigRequest ask;
      ask.set_name(endpoint.model);
      ask.set_version(endpoint.version);
      return forward_to_backend(shared, endpoint.grpc_method, std::move(request), ask, std::move(responder),
                                parsed<inference::ModelConfigResponse>(config_answer));
    }
  }
}

void serve_forwarded_endpoint(const std::shared_ptr<HttpShared>& shared, const HttpEndpoint& endpoint,
                              HttpRequest request, std::shared_ptr<HttpResponder> responder) {
  rapidjson::Document body;
  HttpAnswer refused;
  if (request.method == HttpMethod::kPost && !parse_object(request, shared->options.max_json_depth, &body, &refused)) {
    return responder->answer(std::move(refused));
  }
  auto refuse = [&](const Status& status) { responder->answer(error_answer(status)); };
  auto empty_ok = [](std::string_view) { return HttpAnswer::empty(200); };
  switch (endpoint.kind) {
    case HttpEndpointKind::kServerMetadata:
      return forward_to_backend(
          shared, endpoint.grpc_method, std::move(request), inference::ServerMetadataRequest(), std::move(responder),
          parsed<inference::ServerMetadataResponse>(
              [](const inference::ServerMetadataResponse& r) { return json_answer(message_json(r)); }));
    case HttpEndpointKind::kModelStatistics: {
      inference::ModelStatisticsRequest ask;
      ask.set_name(endpoint.model);
      ask.set_version(endpoint.version);
      return forward_to_backend(
          shared, endpoint.grpc_method, std::move(request), ask, std::move(responder),
          parsed<inference::ModelStatisticsResponse>(
              [](const inference::ModelStatisticsResponse& r) { return json_answer(message_json(r)); }));
    }
    case HttpEndpointKind::kRepositoryIndex: {
      inference::RepositoryIndexRequest ask;
      if (body.HasMember("ready")) {
        if (!body["ready"].IsBool()) return refuse(invalid("'ready' must be a bool"));
        ask.set_ready(body["ready"].GetBool());
      }
      return forward_to_backend(
          shared, endpoint.grpc_method, std::move(request), ask, std::move(responder),
          parsed<inference::RepositoryIndexResponse>(
              [](const inference::RepositoryIndexResponse& r) { return json_answer(message_array_json(r.models())); }));
    }
    case HttpEndpointKind::kRepositoryLoad: {
      inference::RepositoryModelLoadRequest ask;
      ask.set_model_name(endpoint.model);
      if (Status s = repository_parameters(body, ask.mutable_parameters()); !s.ok()) return refuse(s);
      return forward_to_backend(shared, endpoint.grpc_method, std::move(request), ask, std::move(responder), empty_ok);
    }
    case HttpEndpointKind::kRepositoryUnload: {
      inference::RepositoryModelUnloadRequest ask;
      ask.set_model_name(endpoint.model);
      if (Status s = repository_parameters(body, ask.mutable_parameters()); !s.ok()) return refuse(s);
      return forward_to_backend(shared, endpoint.grpc_method, std::move(request), ask, std::move(responder), empty_ok);
    }
    case HttpEndpointKind::kTraceSetting: {
      inference::TraceSettingRequest ask;
      ask.set_model_name(endpoint.model);
      if (request.method == HttpMethod::kPost) {
        if (Status s = trace_settings(body, &ask); !s.ok()) return refuse(s);
      }
      return forward_to_backend(shared, endpoint.grpc_method, std::move(request), ask, std::move(responder),
                                parsed<inference::TraceSettingResponse>([](const inference::TraceSettingResponse& r) {
                                  return json_answer(trace_settings_json(r));
                                }));
    }
    case HttpEndpointKind::kLogSettings: {
      inference::LogSettingsRequest ask;
      if (request.method == HttpMethod::kPost) {
        if (Status s = log_settings(body, &ask); !s.ok()) return refuse(s);
      }
      return forward_to_backend(shared, endpoint.grpc_method, std::move(request), ask, std::move(responder),
                                parsed<inference::LogSettingsResponse>([](const inference::LogSettingsResponse& r) {
                                  return json_answer(log_settings_json(r));
                                }));
    }
    case HttpEndpointKind::kSystemSharedMemoryStatus: {
      inference::SystemSharedMemoryStatusRequest ask;
      ask.set_name(endpoint.region);
      return forward_to_backend(
          shared, endpoint.grpc_method, std::move(request), ask, std::move(responder),
          parsed<inference::SystemSharedMemoryStatusResponse>([](const inference::SystemSharedMemoryStatusResponse& r) {
            return json_answer(map_values_json(r.regions()));
          }));
    }
    case HttpEndpointKind::kSystemSharedMemoryRegister: {
      inference::SystemSharedMemoryRegisterRequest ask;
      ask.set_name(endpoint.region);
      if (!body.HasMember("key") || !body["key"].IsString()) return refuse(invalid("'key' must be a string"));
      ask.set_key(std::string(body["key"].GetString(), body["key"].GetStringLength()));
      uint64_t offset = 0, byte_size = 0;
      if (Status s = read_uint64(body, "offset", false, &offset); !s.ok()) return refuse(s);
      if (Status s = read_uint64(body, "byte_size", true, &byte_size); !s.ok()) return refuse(s);
      ask.set_offset(offset);
      ask.set_byte_size(byte_size);
      return forward_to_backend(shared, endpoint.grpc_method, std::move(request), ask, std::move(responder), empty_ok);
    }
    case HttpEndpointKind::kSystemSharedMemoryUnregister: {
      inference::SystemSharedMemoryUnregisterRequest ask;
      ask.set_name(endpoint.region);
      return forward_to_backend(shared, endpoint.grpc_method, std::move(request), ask, std::move(responder), empty_ok);
    }
    case HttpEndpointKind::kCudaSharedMemoryStatus: {
      inference::CudaSharedMemoryStatusRequest ask;
      ask.set_name(endpoint.region);
      return forward_to_backend(
          shared, endpoint.grpc_method, std::move(request), ask, std::move(responder),
          parsed<inference::CudaSharedMemoryStatusResponse>([](const inference::CudaSharedMemoryStatusResponse& r) {
            return json_answer(map_values_json(r.regions()));
          }));
    }
    case HttpEndpointKind::kCudaSharedMemoryRegister: {
      inference::CudaSharedMemoryRegisterRequest ask;
      ask.set_name(endpoint.region);
      std::string handle;
      if (!body.HasMember("raw_handle") || !body["raw_handle"].IsObject() || !body["raw_handle"].HasMember("b64") ||
          !body["raw_handle"]["b64"].IsString() ||
          !unbase64(
              std::string_view(body["raw_handle"]["b64"].GetString(), body["raw_handle"]["b64"].GetStringLength()),
              &handle)) {
        return refuse(invalid("'raw_handle' must be {\"b64\": <the cudaIpcMemHandle_t in base64>}"));
      }
      ask.set_raw_handle(std::move(handle));
      uint64_t device = 0, byte_size = 0;
      if (Status s = read_uint64(body, "device_id", false, &device); !s.ok()) return refuse(s);
      if (Status s = read_uint64(body, "byte_size", true, &byte_size); !s.ok()) return refuse(s);
      ask.set_device_id(static_cast<int64_t>(device));
      ask.set_byte_size(byte_size);
      return forward_to_backend(shared, endpoint.grpc_method, std::move(request), ask, std::move(responder), empty_ok);
    }
    case HttpEndpointKind::kCudaSharedMemoryUnregister: {
      inference::CudaSharedMemoryUnregisterRequest ask;
      ask.set_name(endpoint.region);
      return forward_to_backend(shared, endpoint.grpc_method, std::move(request), ask, std::move(responder), empty_ok);
    }
    default:
      return refuse(Status::Error(StatusCode::kInternal, "no handler for this endpoint"));
  }
}

}  // namespace inferd
