// The HTTP endpoints that are not inferences: answered from the serving snapshot when it knows
// the answer (health, model readiness, metadata and config, as the gRPC port does), otherwise sent
// to Python as the gRPC call they are and its answer written as Triton's JSON.

#include <google/protobuf/util/json_util.h>
#include <grpcpp/generic/generic_stub.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "grpc_service.pb.h"
#include "http_json_parse.h"
#include "http_routes.h"
#include "inferd/grpc_status.h"
#include "inferd/http_infer_codec.h"
#include "model_config.pb.h"

namespace inferd {
namespace {

namespace pb = google::protobuf;
using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

// --- protobuf messages as Triton's JSON -------------------------------------------------------

std::string base64(const std::string& bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t chunk =
        (static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16) |
        (i + 1 < bytes.size() ? static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 : 0) |
        (i + 2 < bytes.size() ? static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 2])) : 0);
    out.push_back(kAlphabet[(chunk >> 18) & 63]);
    out.push_back(kAlphabet[(chunk >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? kAlphabet[(chunk >> 6) & 63] : '=');
    out.push_back(i + 2 < bytes.size() ? kAlphabet[chunk & 63] : '=');
  }
  return out;
}

bool unbase64(std::string_view text, std::string* out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  out->clear();
  uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    if (c == '=') break;
    const int v = value(c);
    if (v < 0) return false;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out->push_back(static_cast<char>((bits >> count) & 0xFF));
    }
  }
  return true;
}

void write_message(const pb::Message& message, JsonWriter* writer);

// One value of `field` (index `index` when repeated): numbers as JSON numbers (Triton writes its
// counts so), enums by name, bytes as base64.
void write_value(const pb::Message& message, const pb::FieldDescriptor* field, int index, JsonWriter* writer) {
  const pb::Reflection* r = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      writer->Int(repeated ? r->GetRepeatedInt32(message, field, index) : r->GetInt32(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_INT64:
      writer->Int64(repeated ? r->GetRepeatedInt64(message, field, index) : r->GetInt64(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      writer->Uint(repeated ? r->GetRepeatedUInt32(message, field, index) : r->GetUInt32(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      writer->Uint64(repeated ? r->GetRepeatedUInt64(message, field, index) : r->GetUInt64(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      writer->Double(repeated ? r->GetRepeatedDouble(message, field, index) : r->GetDouble(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      writer->Double(repeated ? r->GetRepeatedFloat(message, field, index) : r->GetFloat(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      writer->Bool(repeated ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumValueDescriptor* e =
          repeated ? r->GetRepeatedEnum(message, field, index) : r->GetEnum(message, field);
      writer->String(e->name().c_str(), static_cast<rapidjson::SizeType>(e->name().size()));
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& value = repeated ? r->GetRepeatedStringReference(message, field, index, &scratch)
                                          : r->GetStringReference(message, field, &scratch);
      const std::string shown = field->type() == pb::FieldDescriptor::TYPE_BYTES ? base64(value) : value;
      writer->String(shown.data(), static_cast<rapidjson::SizeType>(shown.size()));
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      write_message(repeated ? r->GetRepeatedMessage(message, field, index) : r->GetMessage(message, field), writer);
      break;
  }
}

// A map entry's key as the JSON key it becomes.
std::string map_key(const pb::Message& entry) {
  const pb::FieldDescriptor* key = entry.GetDescriptor()->map_key();
  const pb::Reflection* r = entry.GetReflection();
  switch (key->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_STRING:
      return r->GetString(entry, key);
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return std::to_string(r->GetInt64(entry, key));
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return std::to_string(r->GetUInt64(entry, key));
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return std::to_string(r->GetInt32(entry, key));
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return std::to_string(r->GetUInt32(entry, key));
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(entry, key) ? "true" : "false";
    default:
      return "";
  }
}

// Every field, defaults included (Triton writes zero counts), by its proto name; maps as objects;
// a oneof only by the member that is set.
void write_message(const pb::Message& message, JsonWriter* writer) {
  const pb::Descriptor* d = message.GetDescriptor();
  const pb::Reflection* r = message.GetReflection();
  writer->StartObject();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* field = d->field(i);
    if (field->real_containing_oneof() != nullptr && !r->HasField(message, field)) continue;
    writer->Key(field->name().c_str(), static_cast<rapidjson::SizeType>(field->name().size()));
    if (field->is_map()) {
      writer->StartObject();
      for (int j = 0; j < r->FieldSize(message, field); ++j) {
        const pb::Message& entry = r->GetRepeatedMessage(message, field, j);
        const std::string key = map_key(entry);
        writer->Key(key.c_str(), static_cast<rapidjson::SizeType>(key.size()));
        write_value(entry, entry.GetDescriptor()->map_value(), -1, writer);
      }
      writer->EndObject();
    } else if (field->is_repeated()) {
      writer->StartArray();
      for (int j = 0; j < r->FieldSize(message, field); ++j) write_value(message, field, j, writer);
      writer->EndArray();
    } else {
      write_value(message, field, -1, writer);
    }
  }
  writer->EndObject();
}

std::string to_json(const pb::Message& message) {
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  write_message(message, &writer);
  return std::string(buffer.GetString(), buffer.GetSize());
}

// Each value of a repeated message field, as a JSON array of objects (Triton's index and
// shared-memory status answer arrays, not the messages around them).
template <class Items>
std::string to_json_array(const Items& items) {
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  writer.StartArray();
  for (const auto& item : items) write_message(item, &writer);
  writer.EndArray();
  return std::string(buffer.GetString(), buffer.GetSize());
}

template <class Map>
std::string map_values_json(const Map& map) {
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  writer.StartArray();
  for (const auto& [key, value] : map) write_message(value, &writer);
  writer.EndArray();
  return std::string(buffer.GetString(), buffer.GetSize());
}

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

// Triton's trace settings answer: trace_level as a list, every other setting as its one string.
std::string trace_settings_json(const inference::TraceSettingResponse& response) {
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  writer.StartObject();
  std::map<std::string, const inference::TraceSettingResponse::SettingValue*> sorted;
  for (const auto& [key, value] : response.settings()) sorted[key] = &value;
  for (const auto& [key, value] : sorted) {
    writer.Key(key.c_str(), static_cast<rapidjson::SizeType>(key.size()));
    if (key == "trace_level" || value->value_size() != 1) {
      writer.StartArray();
      for (const std::string& v : value->value()) writer.String(v.c_str(), static_cast<rapidjson::SizeType>(v.size()));
      writer.EndArray();
    } else {
      writer.String(value->value(0).c_str(), static_cast<rapidjson::SizeType>(value->value(0).size()));
    }
  }
  writer.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
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

std::string log_settings_json(const inference::LogSettingsResponse& response) {
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  writer.StartObject();
  std::map<std::string, const inference::LogSettingsResponse::SettingValue*> sorted;
  for (const auto& [key, value] : response.settings()) sorted[key] = &value;
  for (const auto& [key, value] : sorted) {
    writer.Key(key.c_str(), static_cast<rapidjson::SizeType>(key.size()));
    switch (value->parameter_choice_case()) {
      case inference::LogSettingsResponse::SettingValue::kBoolParam:
        writer.Bool(value->bool_param());
        break;
      case inference::LogSettingsResponse::SettingValue::kUint32Param:
        writer.Uint(value->uint32_param());
        break;
      case inference::LogSettingsResponse::SettingValue::kStringParam:
        writer.String(value->string_param().c_str(), static_cast<rapidjson::SizeType>(value->string_param().size()));
        break;
      default:
        writer.Null();
    }
  }
  writer.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
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

HttpAnswer metadata_answer(const inference::ModelMetadataResponse& response) { return json_answer(to_json(response)); }

// protobuf's JSON mapping writes 64-bit integers as strings; Triton's config has them as numbers
// (its ModelConfigToJson fixes each int64 field of ModelConfig: dims, reshape, versions, delays,
// timeouts, ...). Walks `object` (a `d` as protobuf wrote it) and turns every such string into
// its number.
void int64_strings_to_numbers(const pb::Descriptor* d, rapidjson::Value* object) {
  auto number = [](const pb::FieldDescriptor* field, rapidjson::Value* v) {
    if (!v->IsString()) return;
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64) {
      v->SetInt64(std::strtoll(v->GetString(), nullptr, 10));
    } else {
      v->SetUint64(std::strtoull(v->GetString(), nullptr, 10));
    }
  };
  auto is_64 = [](const pb::FieldDescriptor* field) {
    return field->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64 ||
           field->cpp_type() == pb::FieldDescriptor::CPPTYPE_UINT64;
  };
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* field = d->field(i);
    auto member = object->FindMember(field->name().c_str());
    if (member == object->MemberEnd()) continue;
    rapidjson::Value& v = member->value;
    if (field->is_map()) {
      const pb::FieldDescriptor* value_field = field->message_type()->map_value();
      if (!v.IsObject()) continue;
      for (auto& entry : v.GetObject()) {
        if (is_64(value_field)) number(value_field, &entry.value);
        if (value_field->message_type() != nullptr && entry.value.IsObject()) {
          int64_strings_to_numbers(value_field->message_type(), &entry.value);
        }
      }
    } else if (field->is_repeated() && v.IsArray()) {
      for (auto& item : v.GetArray()) {
        if (is_64(field)) number(field, &item);
        if (field->message_type() != nullptr && item.IsObject()) int64_strings_to_numbers(field->message_type(), &item);
      }
    } else if (is_64(field)) {
      number(field, &v);
    } else if (field->message_type() != nullptr && v.IsObject()) {
      int64_strings_to_numbers(field->message_type(), &v);
    }
  }
}

HttpAnswer config_answer(const inference::ModelConfigResponse& response) {
  // Triton's ModelConfigToJson: protobuf's JSON mapping under the proto's own field names, every
  // primitive field printed (defaults included), 64-bit integers as numbers.
  std::string json;
  pb::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!pb::util::MessageToJsonString(response.config(), &json, options).ok()) {
    return error_answer(Status::Error(StatusCode::kInternal, "cannot write the model's config as JSON"));
  }
  rapidjson::Document document;
  if (document.Parse(json.data(), json.size()).HasParseError() || !document.IsObject()) {
    return error_answer(Status::Error(StatusCode::kInternal, "cannot write the model's config as JSON"));
  }
  int64_strings_to_numbers(response.config().GetDescriptor(), &document);
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  document.Accept(writer);
  return json_answer(std::string(buffer.GetString(), buffer.GetSize()));
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
              [](const inference::ServerMetadataResponse& r) { return json_answer(to_json(r)); }));
    case HttpEndpointKind::kModelStatistics: {
      inference::ModelStatisticsRequest ask;
      ask.set_name(endpoint.model);
      ask.set_version(endpoint.version);
      return forward_to_backend(
          shared, endpoint.grpc_method, std::move(request), ask, std::move(responder),
          parsed<inference::ModelStatisticsResponse>(
              [](const inference::ModelStatisticsResponse& r) { return json_answer(to_json(r)); }));
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
              [](const inference::RepositoryIndexResponse& r) { return json_answer(to_json_array(r.models())); }));
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
