// Unary calls of the core's gRPC server: ModelInfer, and the calls answered from the serving
// snapshot. Each reads one request and answers it from the core, the snapshot or the backend.

#include "inferd/grpc_calls.h"

#include <grpc/slice.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "inferd/infer_request_parser.h"
#include "inferd/infer_response_writer.h"
#include "inferd/model_signature.h"
#include "inferd/structured_log.h"
#include "inferd/trace_sampling.h"
#include "inferd/wire_format.h"

namespace inferd {

// --- shared helpers -------------------------------------------------------------------------

int grpc_code(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return grpc::StatusCode::OK;
    case StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
    case StatusCode::kUnimplemented:
      return grpc::StatusCode::UNIMPLEMENTED;
    case StatusCode::kFailedPrecondition:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case StatusCode::kAlreadyExists:
      return grpc::StatusCode::ALREADY_EXISTS;
    case StatusCode::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
  }
  return grpc::StatusCode::INTERNAL;
}

std::string shown_message(std::string message) {
  if (message.size() <= kMaxStatusMessageBytes) return message;
  size_t cut = kMaxStatusMessageBytes - 3;                                             // room for the ellipsis
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  message.resize(cut);
  return message + "\u2026";
}

grpc::Status to_grpc_status(const Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(grpc_code(status.code)), shown_message(status.message));
}

bool receive(const grpc::ByteBuffer& buffer, ReceivedMessage* out) {
  grpc::Slice single;
  if (buffer.TrySingleSlice(&single).ok()) {
    auto held = std::make_shared<grpc::Slice>(std::move(single));
    out->bytes = std::string_view(reinterpret_cast<const char*>(held->begin()), held->size());
    out->owner = std::move(held);
    return true;
  }
  // Large messages arrive in several slices: the parser wants one view, so they are joined once.
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  auto joined = std::make_shared<std::string>();
  joined->reserve(buffer.Length());
  for (const grpc::Slice& s : slices) joined->append(reinterpret_cast<const char*>(s.begin()), s.size());
  out->bytes = *joined;
  out->owner = std::move(joined);
  return true;
}

grpc::Status over_budget(size_t request_bytes, const InflightBudget& budget) {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "the server holds too many request bytes to take this request's " +
                          std::to_string(request_bytes) + " (--max-inflight-bytes " + std::to_string(budget.limit()) +
                          "); retry later");
}

grpc::ByteBuffer message(std::string_view bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

namespace {

grpc::ByteBuffer written(const InferResponseWriter& writer) {
  grpc_slice raw = grpc_slice_malloc(writer.size());
  writer.write(reinterpret_cast<std::byte*>(GRPC_SLICE_START_PTR(raw)));
  grpc::Slice slice(raw, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

Status write_answer(const InferenceRequest& request, const std::vector<Tensor>& outputs, grpc::ByteBuffer* out,
                    std::optional<bool> final_response) {
  const InferResponseWriter writer(request, outputs, request.stream, final_response);
  if (!writer.status().ok()) {
    Status status = writer.status();
    if (status.code == StatusCode::kInternal) status.message = "cannot return outputs: " + status.message;
    return status;
  }
  *out = written(writer);
  return Status::Ok();
}

grpc::ByteBuffer empty_final_answer(const InferenceRequest& request) {
  return written(InferResponseWriter::empty_response(request, request.stream, /*final_response=*/true));
}

void record_failure(TransportContext& transport, const ModelRoute& route, const Status& status,
                    std::string_view request_id, const grpc::ServerContextBase* context) {
  transport.failures.count(route.model, route.version, status.code);
  if (status.code != StatusCode::kInternal || !core_logs(LogLevel::kError)) return;
  LogRecord record("request failed", LogLevel::kError);
  record.add("reason", status.message)
      .add("model", route.model)
      .add("version", route.version)
      .add("request_id", request_id)
      .add("code", "INTERNAL");
  if (context != nullptr) {
    const auto& metadata = context->client_metadata();
    if (const auto found = metadata.find("traceparent"); found != metadata.end()) {
      const std::string_view header(found->second.data(), found->second.size());
      if (parse_traceparent(header)) record.add("trace_id", header.substr(3, 32));  // version-TRACEID-...
    }
  }
  record.write();
}

bool deadline_passed(const grpc::ServerContextBase& context) {
  // grpc's timer may fire a little before the deadline as the system clock reads it (0.1 ms seen).
  constexpr std::chrono::milliseconds kTimerSlack{10};
  return context.deadline() <= std::chrono::system_clock::now() + kTimerSlack;
}

Clock::time_point core_deadline(const grpc::ServerContextBase& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  const auto left = deadline - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) return Clock::time_point::max();  // as good as none
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

namespace {

bool is_transport_header(std::string_view key) {
  return key.empty() || key[0] == ':' || key.rfind("grpc-", 0) == 0 || key == "user-agent" || key == "content-type" ||
         key == "te";
}

}  // namespace

bool TransportContext::on_unix_socket(const grpc::ServerContextBase& context) const {
  const std::string peer = context.peer();
  if (const std::optional<AcceptedConnection> accepted = connections->find(peer)) return accepted->unix_socket;
  return peer.rfind("unix", 0) == 0;
}

std::optional<PeerCredentials> TransportContext::peer_credentials(const grpc::ServerContextBase& context) const {
  const std::optional<AcceptedConnection> accepted = connections->find(context.peer());
  return accepted ? accepted->credentials : std::nullopt;
}

const SharedMemoryRegistry* TransportContext::shared_memory_for(const grpc::ServerContextBase& context) const {
  if (shared_memory == nullptr) return nullptr;
  if (!shared_memory_on_tcp && !on_unix_socket(context)) return nullptr;
  return shared_memory.get();
}

const SharedMemoryRegistry* TransportContext::shared_memory_for(const grpc::ServerContextBase& context,
                                                                const ParsedInferRequest& request) const {
  const auto has_parameters = [](const auto& tensor) { return !tensor.parameters.empty(); };
  if (std::none_of(request.inputs.begin(), request.inputs.end(), has_parameters) &&
      std::none_of(request.outputs.begin(), request.outputs.end(), has_parameters)) {
    return nullptr;
  }
  return shared_memory_for(context);
}

void copy_client_metadata(const grpc::ServerContextBase& from, grpc::ClientContext* to) {
  for (const auto& [key, value] : from.client_metadata()) {
    const std::string_view k(key.data(), key.size());
    if (is_transport_header(k) || k == kTraceSampledKey || k == kSharedMemoryAllowedKey || k == kPeerCredentialsKey ||
        k == kRoutedVersionKey) {
      continue;
    }
    to->AddMetadata(std::string(k), std::string(value.data(), value.size()));
  }
  to->set_deadline(from.deadline());
}

bool sent_to_python(const ServingSnapshot& snapshot, const grpc::ServerContextBase& context, bool* sampled) {
  *sampled = false;
  if (snapshot.forward_inference) return true;
  if (!snapshot.tracing.enabled) return false;
  std::string_view traceparent;
  const auto& metadata = context.client_metadata();
  if (const auto found = metadata.find("traceparent"); found != metadata.end()) {
    traceparent = std::string_view(found->second.data(), found->second.size());
  }
  *sampled = snapshot.tracing.traced(traceparent);
  return *sampled;
}

void copy_trailing_metadata(const grpc::ClientContext& from, grpc::ServerContextBase* to) {
  for (const auto& [key, value] : from.GetServerTrailingMetadata()) {
    const std::string_view k(key.data(), key.size());
    if (is_transport_header(k)) continue;
    to->AddTrailingMetadata(std::string(k), std::string(value.data(), value.size()));
  }
}

CallKind call_kind(std::string_view method) {
  constexpr std::string_view kService = "/inference.GRPCInferenceService/";
  if (method.substr(0, kService.size()) != kService) return CallKind::kForwarded;
  const std::string_view name = method.substr(kService.size());
  if (name == "ModelInfer") return CallKind::kInfer;
  if (name == "ModelStreamInfer") return CallKind::kStreamInfer;
  if (name == "ServerLive") return CallKind::kServerLive;
  if (name == "ServerReady") return CallKind::kServerReady;
  if (name == "ModelReady") return CallKind::kModelReady;
  if (name == "ModelMetadata") return CallKind::kModelMetadata;
  if (name == "ModelConfig") return CallKind::kModelConfig;
  return CallKind::kForwarded;
}

std::shared_ptr<const ModelRoute> ServingSnapshot::find(std::string_view name, std::string_view version) const {
  const auto model = models.find(name);
  if (model == models.end()) return nullptr;
  const auto route = model->second.find(version);
  return route == model->second.end() ? nullptr : route->second;
}

std::shared_ptr<const ModelRoute> ServingSnapshot::find(std::string_view name, std::string_view version,
                                                        std::optional<std::string_view> routing_key) const {
  if (!version.empty()) return find(name, version);
  const auto model = weighted.find(name);
  if (model == weighted.end()) return find(name, version);
  const WeightedChoice& choice = model->second.choice;
  return model->second.routes[routing_key ? choice.pick(*routing_key) : choice.pick_random()];
}

namespace {

// A call answered with one message. Reads the request, then handle() answers it - at once or
// later, from another thread - with answer(), fail() or forward().
// Invariants: the call is finished exactly once (finished_); the object lives until grpc is done
// with it (OnDone) and every answerer that took a reference (ref()) has let go.
class UnaryCall : public grpc::ServerGenericBidiReactor {
 public:
  UnaryCall(grpc::GenericCallbackServerContext* context, std::shared_ptr<TransportContext> transport)
      : context_(context), transport_(std::move(transport)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call carried no request message"));
      return;
    }
    ref();  // handle() may finish the call: this object outlives it whatever grpc does meanwhile
    handle();
    unref();
  }

  void OnCancel() override {
    std::shared_ptr<BackendCall> backend;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cancelled_ = true;
      backend = backend_;
    }
    if (backend) backend->context.TryCancel();
    cancelled();
    // A cancelled call must still be finished for grpc to let it go; a late answer is dropped.
    fail(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
  }

  void OnDone() override { unref(); }

 protected:
  virtual void handle() = 0;  // request_ holds the request
  virtual void cancelled() {}

  // Each finishes the call unless it is finished already. `trailing`: the backend's call whose
  // trailing metadata the client gets. Under finish_mutex_: the server context is valid until the
  // call is finished, and no other thread finishes it meanwhile.
  void answer(grpc::ByteBuffer&& response, const grpc::ClientContext* trailing = nullptr) {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    if (finished_) return;
    finished_ = true;
    if (trailing != nullptr) copy_trailing_metadata(*trailing, context_);
    response_ = std::move(response);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }

  void fail(const grpc::Status& status, const grpc::ClientContext* trailing = nullptr) {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    if (finished_) return;
    finished_ = true;
    if (trailing != nullptr) copy_trailing_metadata(*trailing, context_);
    Finish(status);
  }

  // Calls `use` with the server context, or with null once the call is finished (grpc frees the
  // context then); no other thread finishes the call meanwhile.
  template <typename Use>
  void with_context(Use&& use) {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    use(finished_ ? nullptr : static_cast<const grpc::ServerContextBase*>(context_));
  }

  // Hands the request, unparsed, to the backend, and its answer and status back to the client;
  // `route`: the one the transport chose (null: none), `sampled`: an inference the transport
  // sampled for tracing.
  void forward(const ModelRoute* route = nullptr, bool sampled = false) {
    auto call = std::make_shared<BackendCall>();
    copy_client_metadata(*context_, &call->context);
    if (sampled) call->context.AddMetadata(std::string(kTraceSampledKey), "1");
    if (route != nullptr) call->context.AddMetadata(std::string(kRoutedVersionKey), route->version);
    if (transport_->shared_memory_for(*context_) != nullptr) {
      call->context.AddMetadata(std::string(kSharedMemoryAllowedKey), "1");
    }
    call->request = request_;  // shares the slices
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancelled_) return;  // already finished CANCELLED
      backend_ = call;
    }
    ref();
    transport_->backend->UnaryCall(&call->context, context_->method(), grpc::StubOptions(), &call->request,
                                   &call->response, [this, call](grpc::Status status) {
                                     if (status.ok()) {
                                       answer(std::move(call->response), &call->context);
                                     } else {
                                       fail(status, &call->context);
                                     }
                                     unref();
                                   });
  }

  void ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  grpc::GenericCallbackServerContext* const context_;
  const std::shared_ptr<TransportContext> transport_;
  // The request's bytes in the in-flight budget (InferCall). Declared before the buffers, so
  // released once they are freed.
  ByteReservation reservation_;
  grpc::ByteBuffer request_;

 private:
  grpc::ByteBuffer response_;
  std::atomic<int> refs_{1};  // grpc's, released in OnDone
  std::mutex finish_mutex_;
  bool finished_ = false;  // guarded by finish_mutex_
  std::mutex mutex_;
  bool cancelled_ = false;                // guarded by mutex_
  std::shared_ptr<BackendCall> backend_;  // guarded by mutex_
};

// ModelInfer: received bytes -> parser -> the version's scheduler -> writer -> sent bytes. A
// request the snapshot has no route for (unknown or unready model, a version written otherwise)
// or that Python observes (sent_to_python: sampled for tracing, verbose logs) goes to the
// backend instead.
class InferCall final : public UnaryCall, public CompletionSink {
 public:
  using UnaryCall::UnaryCall;

  void complete(Completion&& completion) override {
    if (!completion.status.ok()) {
      count_failure(completion.status, completion.request ? completion.request->id : "");
      fail(to_grpc_status(completion.status));
      return;
    }
    grpc::ByteBuffer answer_bytes;
    const Status failed = write_answer(*completion.request, completion.outputs, &answer_bytes);
    if (!failed.ok()) {
      count_failure(failed, completion.request->id);
      fail(to_grpc_status(failed));
      return;
    }
    answer(std::move(answer_bytes));
  }

 private:
  void handle() override {
    // Held until this object goes: once the answer is sent and the core has let the request go.
    if (!transport_->inflight->reserve(request_.Length(), &reservation_)) {
      fail(over_budget(request_.Length(), *transport_->inflight));
      return;
    }
    ReceivedMessage received;
    if (!receive(request_, &received)) {
      fail(grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the request message"));
      return;
    }
    ParsedInferRequest parsed;
    Status status =
        parse_infer_request(reinterpret_cast<const std::byte*>(received.bytes.data()), received.bytes.size(), &parsed);
    if (!status.ok()) {
      fail(to_grpc_status(status));
      return;
    }
    std::optional<std::string_view> routing;
    status = routing_key(parsed.parameters, &routing);
    if (!status.ok()) {
      fail(to_grpc_status(status));
      return;
    }
    const std::shared_ptr<const ServingSnapshot> snapshot = transport_->state.current();
    std::shared_ptr<const ModelRoute> route = snapshot->find(parsed.model_name, parsed.model_version, routing);
    bool sampled;
    if (sent_to_python(*snapshot, *context_, &sampled)) {
      forward(route.get(), sampled);
      return;
    }
    if (route == nullptr) {
      forward();  // Python answers in the registry's words (unknown, not ready)
      return;
    }
    route_ = route;
    const std::shared_ptr<RequestScheduler> scheduler = route->scheduler.lock();  // the snapshot owns it
    auto request = std::make_unique<InferenceRequest>();
    request->token = transport_->next_token();
    request->deadline = core_deadline(*context_);
    status = build_inference_request(route->signature, parsed, received.owner, request.get(),
                                     transport_->shared_memory_for(*context_, parsed));
    if (!status.ok()) {
      count_failure(status, parsed.id);
      fail(to_grpc_status(status));
      return;
    }
    const uint64_t token = request->token;
    ref();  // released with the sink, when the core lets the request go
    request->sink = std::shared_ptr<CompletionSink>(
        static_cast<CompletionSink*>(this), [](CompletionSink* sink) { static_cast<InferCall*>(sink)->unref(); });
    status = scheduler->submit(std::move(request));
    if (!status.ok()) {
      request.reset();  // still ours: dropping it releases the sink
      count_failure(status, parsed.id);
      fail(to_grpc_status(status));
      return;
    }
    bool cancel_now;
    {
      std::lock_guard<std::mutex> lock(core_mutex_);
      token_ = token;
      cancel_now = core_cancelled_;
    }
    if (cancel_now) scheduler->cancel(token);
  }

  void cancelled() override {
    // A call cancelled because its deadline passed is left to the core, which holds the same
    // deadline and answers it DEADLINE_EXCEEDED at that instant (counted as what it is); cancelling
    // here would race the core and count a missed deadline as a client's cancellation.
    if (deadline_passed(*context_)) return;
    uint64_t token;
    {
      std::lock_guard<std::mutex> lock(core_mutex_);
      core_cancelled_ = true;
      token = token_;
    }
    if (token == 0) return;
    // Still queued: out it goes. Unless the model is gone, whose scheduler answered it in draining.
    if (const std::shared_ptr<RequestScheduler> scheduler = route_->scheduler.lock()) scheduler->cancel(token);
  }

  void count_failure(const Status& status, std::string_view request_id) {
    // The server context is valid until the call is finished: the core may answer a request after
    // its call was cancelled and finished (at shutdown), when the context is gone.
    with_context([&](const grpc::ServerContextBase* context) {
      record_failure(*transport_, *route_, status, request_id, context);
    });
  }

  std::shared_ptr<const ModelRoute> route_;  // set before the request is submitted, never after
  std::mutex core_mutex_;
  uint64_t token_ = 0;           // guarded by core_mutex_; set once the core holds the request
  bool core_cancelled_ = false;  // guarded by core_mutex_
};

// The calls the serving snapshot answers when it knows the answer; the others go to the backend.
class SnapshotCall final : public UnaryCall {
 public:
  SnapshotCall(grpc::GenericCallbackServerContext* context, std::shared_ptr<TransportContext> transport, CallKind kind)
      : UnaryCall(context, std::move(transport)), kind_(kind) {}

 private:
  static grpc::ByteBuffer bool_message(bool value) {
    return value ? message(std::string_view("\x08\x01", 2)) : message(std::string_view());
  }

  // ModelReadyRequest, ModelMetadataRequest and ModelConfigRequest: name = 1, version = 2.
  static bool read_name_version(std::string_view bytes, std::string_view* name, std::string_view* version) {
    WireReader reader(bytes);
    while (!reader.done()) {
      uint32_t field;
      WireType type;
      if (!reader.read_tag(&field, &type)) return false;
      if ((field == 1 || field == 2) && type == WireType::kLengthDelimited) {
        if (!reader.read_bytes(field == 1 ? name : version)) return false;
      } else if (!reader.skip(type)) {
        return false;
      }
    }
    return is_valid_utf8(*name) && is_valid_utf8(*version);
  }

  // ServerLiveRequest and ServerReadyRequest have no fields; unknown ones are skipped.
  static bool is_message(std::string_view bytes) {
    WireReader reader(bytes);
    while (!reader.done()) {
      uint32_t field;
      WireType type;
      if (!reader.read_tag(&field, &type) || !reader.skip(type)) return false;
    }
    return true;
  }

  void handle() override {
    const std::shared_ptr<const ServingSnapshot> snapshot = transport_->state.current();
    ReceivedMessage received;
    if (kind_ == CallKind::kServerLive || kind_ == CallKind::kServerReady) {
      if (!receive(request_, &received) || !is_message(received.bytes)) {
        return fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "the request of " + context_->method() + " is not a valid protobuf message"));
      }
      return answer(bool_message(kind_ == CallKind::kServerLive ? snapshot->live : snapshot->ready));
    }
    std::string_view name, version;
    if (!receive(request_, &received) || !read_name_version(received.bytes, &name, &version)) return forward();
    const std::shared_ptr<const ModelRoute> route = snapshot->find(name, version);
    if (route == nullptr) return forward();  // Python says why, in its words
    switch (kind_) {
      case CallKind::kModelReady:
        return answer(bool_message(snapshot->accepting));
      case CallKind::kModelMetadata:
        return answer(message(route->metadata_response));
      case CallKind::kModelConfig:
        return answer(message(route->config_response));
      default:
        return forward();
    }
  }

  const CallKind kind_;
};

}  // namespace

grpc::ServerGenericBidiReactor* create_call(grpc::GenericCallbackServerContext* context,
                                            std::shared_ptr<TransportContext> transport) {
  // Raw new: grpc's callback API takes a reactor that deletes itself (UnaryCall::unref).
  switch (const CallKind kind = call_kind(context->method())) {
    case CallKind::kInfer:
      return new InferCall(context, std::move(transport));
    case CallKind::kStreamInfer:
      return create_stream_infer_call(context, std::move(transport));
    case CallKind::kForwarded:
      return create_forwarded_call(context, std::move(transport));
    default:
      return new SnapshotCall(context, std::move(transport), kind);
  }
}

}  // namespace inferd
