// POST v2/models/{m}[/versions/{v}]/generate and generate_stream (Triton's generate extension):
// the request's JSON fields become the model's inputs (by name) and parameters (the rest, and
// `parameters`), written as the v2 infer request they stand for and decoded by the same codec, so
// the request is checked and batched as any inference; each answer is the infer answer with its
// outputs lifted to fields. generate_stream sends each response as a Server-Sent Event.

#include "http_generate.h"

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "http_json_parse.h"
#include "http_routes.h"
#include "inferd/http_infer_codec.h"
#include "inferd/model_signature.h"

namespace inferd {
namespace {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

Status invalid(std::string message) { return Status::Error(StatusCode::kInvalidArgument, std::move(message)); }

// The leaves of a JSON value (1 for a scalar) and how deep its arrays nest (0 for a scalar),
// walked without recursion: a value may nest as deep as the body allows.
void measure(const rapidjson::Value& value, size_t* leaves, size_t* depth) {
  *leaves = 0;
  *depth = 0;
  std::vector<std::pair<const rapidjson::Value*, size_t>> pending{{&value, 0}};
  while (!pending.empty()) {
    const auto [v, level] = pending.back();
    pending.pop_back();
    if (!v->IsArray()) {
      ++*leaves;
      continue;
    }
    *depth = std::max(*depth, level + 1);
    for (const rapidjson::Value& item : v->GetArray()) pending.emplace_back(&item, level + 1);
  }
}

// The shape an input of `dims` gets for `count` elements: its dims with a -1 taking what the
// others leave (1 for the rest), behind a batch of 1 when the model batches.
std::vector<int64_t> shape_for(const InputSignature& input, bool batched, size_t count) {
  std::vector<int64_t> shape;
  if (batched) shape.push_back(1);
  int64_t fixed = 1;
  for (int64_t d : input.dims)
    if (d >= 0) fixed *= d;
  if (input.dims.empty()) return shape.empty() ? std::vector<int64_t>{static_cast<int64_t>(count)} : shape;
  bool first_free = true;
  for (int64_t d : input.dims) {
    if (d >= 0) {
      shape.push_back(d);
    } else if (first_free && fixed > 0) {
      shape.push_back(static_cast<int64_t>(count) / fixed);
      first_free = false;
    } else {
      shape.push_back(1);
    }
  }
  return shape;
}

// Writes the leaves of nested arrays into `writer` in order (as the v2 request's flat `data`),
// without recursion.
void write_flat(const rapidjson::Value& value, JsonWriter* writer) {
  std::vector<std::pair<const rapidjson::Value*, rapidjson::SizeType>> stack{{&value, 0}};
  if (!value.IsArray()) {
    value.Accept(*writer);
    return;
  }
  while (!stack.empty()) {
    auto& [array, next] = stack.back();
    if (next == array->Size()) {
      stack.pop_back();
      continue;
    }
    const rapidjson::Value& item = (*array)[next++];
    if (item.IsArray()) {
      stack.emplace_back(&item, 0);
    } else {
      item.Accept(*writer);
    }
  }
}

}  // namespace

Status generate_to_infer_json(std::string* body, const ModelSignature& model, size_t max_depth, std::string* out) {
  rapidjson::Document document;
  if (Status parsed = parse_json_in_place(body->data(), body->size(), max_depth, &document); !parsed.ok()) {
    return parsed;
  }
  if (!document.IsObject()) return invalid("the generate request must be a JSON object");
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  writer.StartObject();
  writer.Key("inputs");
  writer.StartArray();
  std::vector<const rapidjson::Value::Member*> parameters;
  for (auto it = document.MemberBegin(); it != document.MemberEnd(); ++it) {
    const std::string_view name(it->name.GetString(), it->name.GetStringLength());
    if (name == "parameters" || name == "id") continue;
    const InputSignature* input = nullptr;
    for (const InputSignature& candidate : model.inputs)
      if (candidate.name == name) input = &candidate;
    if (input == nullptr) {
      parameters.push_back(&*it);  // not an input: a parameter, as Triton passes it
      continue;
    }
    size_t count = 0, depth = 0;
    measure(it->value, &count, &depth);
    if (depth + 2 > max_depth) {
      return invalid("input '" + std::string(name) + "' nests deeper than --http-max-json-depth (" +
                     std::to_string(max_depth) + ")");
    }
    writer.StartObject();
    writer.Key("name");
    writer.String(input->name.c_str(), static_cast<rapidjson::SizeType>(input->name.size()));
    writer.Key("datatype");
    writer.String(datatype_name(input->dtype));
    writer.Key("shape");
    writer.StartArray();
    for (int64_t d : shape_for(*input, model.max_batch_size > 0, count)) writer.Int64(d);
    writer.EndArray();
    writer.Key("data");
    writer.StartArray();
    write_flat(it->value, &writer);
    writer.EndArray();
    writer.EndObject();
  }
  writer.EndArray();
  if (document.HasMember("id") && document["id"].IsString()) {
    writer.Key("id");
    document["id"].Accept(writer);
  }
  const bool has_parameters = document.HasMember("parameters");
  if (has_parameters && !document["parameters"].IsObject()) return invalid("'parameters' must be a JSON object");
  if (has_parameters || !parameters.empty()) {
    writer.Key("parameters");
    writer.StartObject();
    for (const rapidjson::Value::Member* member : parameters) {
      if (!member->value.IsString() && !member->value.IsNumber() && !member->value.IsBool()) {
        return invalid("field '" + std::string(member->name.GetString()) +
                       "' is neither an input of the model nor a parameter (a string, number or bool)");
      }
      member->name.Accept(writer);
      member->value.Accept(writer);
    }
    if (has_parameters) {
      for (auto it = document["parameters"].MemberBegin(); it != document["parameters"].MemberEnd(); ++it) {
        if (!it->value.IsString() && !it->value.IsNumber() && !it->value.IsBool()) {
          return invalid("parameter '" + std::string(it->name.GetString()) + "' must be a string, number or bool");
        }
        it->name.Accept(writer);
        it->value.Accept(writer);
      }
    }
    writer.EndObject();
  }
  writer.EndObject();
  out->assign(buffer.GetString(), buffer.GetSize());
  return Status::Ok();
}

Status infer_answer_to_generate_json(const std::string& answer, std::string* out) {
  // The answer is the codec's own (encode_http_infer_response): it may write NaN, Infinity and
  // -Infinity, and its doubles are read back exactly (RapidJSON's default conversion reads some,
  // 1e-301 among them, one ULP off). Its full-precision conversion is undefined for a zero with a
  // large exponent ("0e-300"), which the codec's writer never writes (a zero is "0.0").
  constexpr unsigned kAnswerParse =
      rapidjson::kParseIterativeFlag | rapidjson::kParseNanAndInfFlag | rapidjson::kParseFullPrecisionFlag;
  rapidjson::Document document;
  document.Parse<kAnswerParse>(answer.data(), answer.size());
  if (document.HasParseError() || !document.IsObject()) {
    return Status::Error(StatusCode::kInternal, "cannot read the inference's answer");
  }
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>, rapidjson::CrtAllocator,
                    rapidjson::kWriteNanAndInfFlag>
      writer(buffer);
  writer.StartObject();
  for (const char* key : {"model_name", "model_version", "id"}) {
    if (!document.HasMember(key)) continue;
    writer.Key(key);
    document[key].Accept(writer);
  }
  if (document.HasMember("outputs") && document["outputs"].IsArray()) {
    for (const rapidjson::Value& output : document["outputs"].GetArray()) {
      if (!output.HasMember("name") || !output.HasMember("data")) continue;
      output["name"].Accept(writer);
      const rapidjson::Value& data = output["data"];
      if (data.IsArray() && data.Size() == 1) {
        data[0].Accept(writer);
      } else {
        data.Accept(writer);
      }
    }
  }
  writer.EndObject();
  out->assign(buffer.GetString(), buffer.GetSize());
  return Status::Ok();
}

namespace {

// The answers of one generate request the core runs. generate: one answer (a decoupled model's
// one response, or its completion's); generate_stream: an event per response, the first one
// opening the event stream, and an error after it as an error event.
//
// Invariants: events go to the responder in the order the core calls (respond() and complete()
// come from the one worker thread that executes the request); the responder hears exactly one
// answer, or start_events() .. end_events().
class HttpGenerateCall final : public CompletionSink {
 public:
  HttpGenerateCall(std::shared_ptr<HttpShared> shared, std::shared_ptr<const ModelRoute> route,
                   std::shared_ptr<HttpInferRequest> decoded, HttpRequest http,
                   std::shared_ptr<HttpResponder> responder, bool stream)
      : shared_(std::move(shared)),
        route_(std::move(route)),
        decoded_(std::move(decoded)),
        http_(std::move(http)),
        responder_(std::move(responder)),
        stream_(stream) {}

  bool streams_responses() const override { return true; }

  void respond(const InferenceRequest& request, RequestResult&& response) override {
    std::string event;
    Status status = response.status.ok() ? to_event(request, response.outputs, &event) : response.status;
    if (!stream_) {
      // generate takes one answer: the first response's, or its error; the model is then told to
      // stop (it sees the request cancelled), as nobody hears the rest.
      if (!answered_) {
        answered_ = true;
        responder_->answer(status.ok() ? json(std::move(event)) : error_answer(status));
        if (const std::shared_ptr<RequestScheduler> scheduler = route_->scheduler.lock())
          scheduler->cancel(request.token);
      }
      return;
    }
    open_events();
    responder_->event(status.ok() ? std::move(event) : http_error_body(status.message));
  }

  void complete(Completion&& completion) override {
    Status status = completion.status;
    std::string event;
    const bool has_answer = completion.respond && status.ok() && completion.request != nullptr;
    if (has_answer) status = to_event(*completion.request, completion.outputs, &event);
    if (!status.ok()) record_failure(*shared_->transport, *route_, status, decoded_->parsed.id, nullptr, "http");
    if (!stream_) {
      if (answered_) return;
      if (!status.ok()) return responder_->answer(error_answer(status));
      if (!has_answer) {
        return responder_->answer(
            error_answer(Status::Error(StatusCode::kInternal, "the model ended the request without a response")));
      }
      return responder_->answer(json(std::move(event)));
    }
    if (!events_open_ && !status.ok()) return responder_->answer(error_answer(status));  // before any event
    open_events();
    if (!status.ok()) {
      responder_->event(http_error_body(status.message));
    } else if (has_answer) {
      responder_->event(std::move(event));
    }
    responder_->end_events();
  }

 private:
  static HttpAnswer json(std::string body) {
    HttpAnswer answer;
    answer.body = std::move(body);
    return answer;
  }

  void open_events() {
    if (events_open_) return;
    events_open_ = true;
    responder_->start_events();
  }

  Status to_event(const InferenceRequest& request, const std::vector<Tensor>& outputs, std::string* event) const {
    std::string answer;
    size_t json_length = 0;
    HttpAnswerFormat as_json;  // every output as JSON data
    Status status = encode_http_infer_response(request, outputs, as_json, &answer, &json_length);
    if (status.ok()) status = infer_answer_to_generate_json(answer, event);
    return status;
  }

  const std::shared_ptr<HttpShared> shared_;
  const std::shared_ptr<const ModelRoute> route_;
  const std::shared_ptr<HttpInferRequest> decoded_;
  const HttpRequest http_;  // its reservation, until the core lets the request go
  const std::shared_ptr<HttpResponder> responder_;
  const bool stream_;
  bool answered_ = false;     // the worker thread's: generate answered already
  bool events_open_ = false;  // the worker thread's: start_events() called
};

}  // namespace

void serve_generate_endpoint(const std::shared_ptr<HttpShared>& shared, const HttpEndpoint& endpoint,
                             HttpRequest request, std::shared_ptr<HttpResponder> responder) {
  // Counted until this request is submitted: its version is not closed before (settle()).
  const ServingState::Reading reading = shared->transport->state.read();
  const std::shared_ptr<const ServingSnapshot>& snapshot = reading.snapshot();
  const std::shared_ptr<const ModelRoute> route = snapshot->find(endpoint.model, endpoint.version, std::nullopt);
  if (route == nullptr) {
    return serve_unrouted_inference(shared, endpoint, std::move(request), std::move(responder));
  }
  std::string infer_json;
  Status status =
      generate_to_infer_json(request.body.get(), *route->signature, shared->options.max_json_depth, &infer_json);
  if (!status.ok()) return responder->answer(error_answer(status));
  HttpDecodeLimits limits;
  limits.max_json_depth = shared->options.max_json_depth;
  std::shared_ptr<HttpInferRequest> decoded;
  status =
      decode_http_infer_request(endpoint.model, endpoint.version, std::make_shared<std::string>(std::move(infer_json)),
                                std::nullopt, limits, &decoded);
  if (!status.ok()) return responder->answer(error_answer(status));
  const bool stream = endpoint.kind == HttpEndpointKind::kGenerateStream;
  const bool unix_socket = request.unix_socket;
  auto call = std::make_shared<HttpGenerateCall>(shared, route, decoded, std::move(request), responder, stream);
  // A client that goes away (or stops reading its events) stops the generation: the model sees
  // the request cancelled. Set before the core can answer (answers are written on this strand).
  std::weak_ptr<RequestScheduler> scheduler = route->scheduler;
  auto token = std::make_shared<std::atomic<uint64_t>>(0);
  responder->when_gone([scheduler, token] {
    if (const std::shared_ptr<RequestScheduler> s = scheduler.lock(); s != nullptr && *token != 0) s->cancel(*token);
  });
  token->store(submit_http_inference(shared, route, decoded, unix_socket, std::move(call), responder));
}

}  // namespace inferd
