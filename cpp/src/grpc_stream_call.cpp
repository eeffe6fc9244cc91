// ModelStreamInfer on the core's gRPC server.

#include <cctype>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "grpc_pending_writes.h"
#include "inferd/grpc_calls.h"
#include "inferd/infer_request_parser.h"
#include "inferd/infer_response_writer.h"
#include "inferd/model_signature.h"

namespace inferd {
namespace {

constexpr char kModelInferMethod[] = "/inference.GRPCInferenceService/ModelInfer";

// A ModelStreamInferResponse wrapping a serialized ModelInferResponse (infer_response = 2), with
// `triton_final_response: true` added when the request asked for the flag (the backend's answer is
// the request's only one, and Python does not write the flag).
grpc::ByteBuffer stream_answer(const grpc::ByteBuffer& infer_response, bool wants_flag) {
  ReceivedMessage received;
  std::string bytes;
  if (receive(infer_response, &received)) bytes = std::string(received.bytes);
  if (wants_flag) bytes += final_response_parameter(true);
  std::string wrapped(length_delimited_size(2, bytes.size()), '\0');
  WireWriter writer(reinterpret_cast<std::byte*>(wrapped.data()), wrapped.size());
  writer.bytes_field(2, bytes);
  return message(wrapped);
}

// One ModelStreamInfer call. Each request read is answered as it completes, not in arrival order:
// a computed one with its ModelStreamInferResponse, a failed one with `error_message` and the
// request's id, and the stream goes on - unless the client sent `triton_grpc_error: true` (Triton's
// opt-in), which ends the call with the first error's status. A decoupled model's request
// (ModelSignature::decoupled) is answered with each of its responses as the model sends them
// (CompletionSink::respond; an error response is sent as an error answer and the request goes on),
// then its final one; a final flag without a response is sent as an empty response when the
// request asked for it (triton_enable_empty_final_response), else nothing is sent for it. A
// request with that parameter gets `triton_final_response` on each answer: false but on its last.
// A message that does not parse as a ModelInferRequest ends the call with INVALID_ARGUMENT once
// the requests read before it are answered and sent. Requests without a route, and every request
// but a decoupled model's while Python traces by a rule of its own (forward_inference), go one by
// one to the backend's ModelInfer. One that Python observes (sampled for tracing, verbose logs),
// a decoupled model's too, runs in the core, and its record goes to Python once it has ended
// (observed_, finish_observation), with the number of answers sent for it.
//
// Answers wait in writes_ (PendingWrites) until the client reads them. Their bytes are bounded per
// call (max_stream_pending_bytes; the first waiting answer always fits) and, with the requests'
// bytes, by the server's InflightBudget: an answer past either is not queued, and its request
// fails RESOURCE_EXHAUSTED instead (a decoupled request is cancelled in the core too, and its
// later responses are dropped), so a client that stops reading, or a decoupled model that sends
// faster than its client reads, holds a bounded amount of the server's memory.
//
// Invariants: one read and one write in flight at most; at most max_stream_outstanding requests
// read and not yet finally answered and sent (outstanding_ counts requests, not writes), beyond
// which reading waits (a client that sends without reading is held back by gRPC's flow control
// instead of being buffered); each write in writes_ holds its bytes of the InflightBudget until it
// is sent or dropped; the call finishes once the client has stopped sending and every answer is
// sent, or at the first failure of the stream itself; the object lives until grpc is done (OnDone)
// and every request it submitted or forwarded has come back.
class StreamInferCall final : public grpc::ServerGenericBidiReactor, public CompletionSink {
 public:
  StreamInferCall(grpc::GenericCallbackServerContext* context, std::shared_ptr<TransportContext> transport)
      : context_(context),
        transport_(std::move(transport)),
        writes_(transport_->max_stream_pending_bytes, transport_->inflight) {
    const auto& metadata = context_->client_metadata();
    const auto found = metadata.find("triton_grpc_error");
    if (found != metadata.end()) {
      std::string value(found->second.data(), found->second.size());
      for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      end_on_error_ = value == "true";
    }
    reading_ = true;
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::unique_lock<std::mutex> lock(mutex_);
      reading_ = false;
      reads_done_ = true;
      after_change(std::move(lock));
      return;
    }
    grpc::ByteBuffer request = std::move(incoming_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++outstanding_;
    }
    refs_.fetch_add(1, std::memory_order_relaxed);  // handle() may finish the call
    handle(request);
    std::unique_lock<std::mutex> lock(mutex_);
    reading_ = false;
    after_change(std::move(lock));
    unref();
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (writes_.pop_front()) --outstanding_;
    writing_ = false;
    if (!ok) {
      broken_ = true;  // the client is gone: nothing more can be sent
      outstanding_ -= writes_.clear();
    }
    after_change(std::move(lock));
  }

  void OnCancel() override {
    std::map<uint64_t, std::shared_ptr<const ModelRoute>> in_core;
    std::vector<std::shared_ptr<BackendCall>> forwarded;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      broken_ = true;
      in_core = in_core_;
      for (const auto& [call, id] : forwarded_) forwarded.push_back(call);
    }
    // Past the stream's deadline the core answers its queued requests DEADLINE_EXCEEDED itself (as
    // in InferCall::cancelled).
    if (!deadline_passed(*context_)) {
      for (const auto& [token, route] : in_core) {
        if (const std::shared_ptr<RequestScheduler> scheduler = route->scheduler.lock()) scheduler->cancel(token);
      }
    }
    for (const auto& call : forwarded) call->context.TryCancel();
    std::unique_lock<std::mutex> lock(mutex_);
    after_change(std::move(lock));
  }

  void OnDone() override { unref(); }

  // A call that held many answers frees them in small pieces, which glibc keeps in its arenas:
  // the backlog counts towards the budget's trim as one large release.
  ~StreamInferCall() override { transport_->inflight->released_elsewhere(writes_.peak_bytes()); }

  // A request the core computed or failed (on a core worker thread).
  void complete(Completion&& completion) override {
    std::shared_ptr<const ModelRoute> route;
    std::unique_ptr<ObservedRequest> observed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto found = in_core_.find(completion.token);
      if (found != in_core_.end()) {
        route = found->second;
        in_core_.erase(found);
      }
      observed = take_observation_locked(completion.token);
    }
    ObservationQueue& observations = *transport_->observations;
    if (completion.request && forget_overflowed(completion.request->token)) {
      finish_observation(observations, std::move(observed), Status::Ok(), &completion.timing, 0);
      std::unique_lock<std::mutex> lock(mutex_);
      answer_dropped_locked();  // its error answer went out when its responses overflowed
      after_change(std::move(lock));
      return;
    }
    const std::string id = completion.request ? completion.request->id : "";
    if (!completion.status.ok()) {
      finish_observation(observations, std::move(observed), completion.status, &completion.timing, 0);
      if (route != nullptr) count_failure(*route, completion.status, id);
      const std::optional<bool> flag = completion.request ? final_flag(*completion.request, true) : std::nullopt;
      return answer_error(to_grpc_status(completion.status), id, /*ends_request=*/true, flag);
    }
    const InferenceRequest& request = *completion.request;
    if (!completion.respond) {  // a decoupled request's final flag alone
      finish_observation(observations, std::move(observed), Status::Ok(), &completion.timing,
                         request.final_response_flag ? 1 : 0);
      // Small, and it ends the request: never refused.
      if (request.final_response_flag) {
        send(empty_final_answer(request), /*ends_request=*/true, /*bounded=*/false);
        return;
      }
      std::unique_lock<std::mutex> lock(mutex_);
      answer_dropped_locked();  // nothing to send: the request simply ends
      after_change(std::move(lock));
      return;
    }
    grpc::ByteBuffer bytes;
    const Status failed = write_answer(request, completion.outputs, &bytes, final_flag(request, true));
    if (!failed.ok()) {
      finish_observation(observations, std::move(observed), failed, &completion.timing, 0);
      if (route != nullptr) count_failure(*route, failed, id);
      return answer_error(to_grpc_status(failed), id, /*ends_request=*/true, final_flag(request, true));
    }
    if (!send(std::move(bytes), /*ends_request=*/true)) {
      const Status refused = Status::Error(StatusCode::kResourceExhausted, unsent_message());
      finish_observation(observations, std::move(observed), refused, &completion.timing, 0);
      if (route != nullptr) count_failure(*route, refused, id);
      answer_error(to_grpc_status(refused), id, /*ends_request=*/true, final_flag(request, true));
      return;
    }
    finish_observation(observations, std::move(observed), Status::Ok(), &completion.timing, 1);
  }

  // One response of a decoupled model's request before its final one (on a core worker thread).
  // A response that does not fit (see the class comment) fails the request: one error answer,
  // the request cancelled in the core, and its later responses and final answer dropped.
  bool streams_responses() const override { return true; }

  void respond(const InferenceRequest& request, RequestResult&& response) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (overflowed_.count(request.token) != 0) return;
      if (const auto found = observed_.find(request.token); found != observed_.end()) ++found->second->responses;
    }
    bool sent;
    if (!response.status.ok()) {
      sent = respond_error(to_grpc_status(response.status), request);
    } else {
      grpc::ByteBuffer bytes;
      const Status failed = write_answer(request, response.outputs, &bytes, final_flag(request, false));
      sent =
          failed.ok() ? send(std::move(bytes), /*ends_request=*/false) : respond_error(to_grpc_status(failed), request);
    }
    if (!sent) overflow(request);
  }

 private:
  std::string unsent_message() const {
    return "the stream's answers waiting to be sent passed their bound (" +
           std::to_string(transport_->max_stream_pending_bytes) + " bytes per call, --stream-max-pending-bytes, or " +
           std::to_string(transport_->inflight->limit()) +
           " bytes in all, --max-inflight-bytes): the client is not reading them fast enough";
  }

  // A decoupled request whose response did not fit: its error answer, the last the client hears of
  // it (with the final flag), then the core is told to stop it (the model sees it cancelled).
  void overflow(const InferenceRequest& request) {
    std::shared_ptr<const ModelRoute> route;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!overflowed_.insert(request.token).second) return;
      const auto found = in_core_.find(request.token);
      if (found != in_core_.end()) route = found->second;
    }
    const Status refused = Status::Error(StatusCode::kResourceExhausted, unsent_message());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (const auto found = observed_.find(request.token); found != observed_.end()) found->second->status = refused;
    }
    if (route != nullptr) count_failure(*route, refused, request.id);
    answer_error(to_grpc_status(refused), request.id, /*ends_request=*/false, final_flag(request, true));
    if (route != nullptr) {
      if (const std::shared_ptr<RequestScheduler> scheduler = route->scheduler.lock()) scheduler->cancel(request.token);
    }
  }

  // True once, when `token` overflowed (its final completion then ends it without an answer).
  bool forget_overflowed(uint64_t token) {
    std::lock_guard<std::mutex> lock(mutex_);
    return overflowed_.erase(token) != 0;
  }

  void handle(const grpc::ByteBuffer& request) {
    const Clock::time_point received_at = Clock::now();
    ReceivedMessage received;
    if (!receive(request, &received)) {
      return answer_error(grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the request message"), "",
                          /*ends_request=*/true);
    }
    ParsedInferRequest parsed;
    Status status =
        parse_infer_request(reinterpret_cast<const std::byte*>(received.bytes.data()), received.bytes.size(), &parsed);
    if (!status.ok()) return end_malformed(to_grpc_status(status));
    // Held until the core or the backend lets the request go (its answer is then on its way).
    auto reservation = std::make_shared<ByteReservation>();
    if (!transport_->inflight->reserve(request.Length(), reservation.get())) {
      return answer_error(over_budget(request.Length(), *transport_->inflight), std::string(parsed.id),
                          /*ends_request=*/true);
    }
    const WireParameter* flag = find_parameter(parsed.parameters, "triton_enable_empty_final_response");
    const bool wants_flag = flag != nullptr && flag->kind == WireParameter::Kind::kBool && flag->bool_value;
    std::optional<std::string_view> routing;
    status = routing_key(parsed.parameters, &routing);
    if (!status.ok()) return answer_error(to_grpc_status(status), std::string(parsed.id), /*ends_request=*/true);
    // Counted until this request is submitted: its version is not closed before (settle()).
    const ServingState::Reading reading = transport_->state.read();
    const std::shared_ptr<const ServingSnapshot>& snapshot = reading.snapshot();
    const std::shared_ptr<const ModelRoute> route = snapshot->find(parsed.model_name, parsed.model_version, routing);
    // A decoupled model's requests stay in the core even when Python traces by its own rule (its
    // path answers once per request).
    const bool decoupled = route != nullptr && route->signature != nullptr && route->signature->decoupled;
    if (snapshot->forward_inference && !decoupled) {
      return forward(request, std::string(parsed.id), route.get(), false, wants_flag, std::move(reservation));
    }
    const bool sampled = sampled_for_tracing(*snapshot, parsed.model_name, *context_);
    if (route == nullptr) {
      return forward(request, std::string(parsed.id), nullptr, sampled, wants_flag, std::move(reservation));
    }
    std::unique_ptr<ObservedRequest> observed =
        begin_observation(*snapshot, *route, *context_, parsed.id, sampled, received_at);
    if (observed != nullptr) observed->streamed = true;
    run_in_core(parsed, received, route, wants_flag, std::move(reservation), std::move(observed));
  }

  // Builds one request of the stream against `route`'s signature and hands it to its scheduler;
  // every outcome but the core's answer is answered here.
  void run_in_core(const ParsedInferRequest& parsed, const ReceivedMessage& received,
                   const std::shared_ptr<const ModelRoute>& route, bool wants_flag,
                   std::shared_ptr<ByteReservation> reservation, std::unique_ptr<ObservedRequest> observed) {
    const std::shared_ptr<RequestScheduler> scheduler = route->scheduler.lock();  // the snapshot owns it
    auto inference = std::make_unique<InferenceRequest>();
    inference->token = transport_->next_token();
    inference->stream = true;
    inference->deadline = core_deadline(*context_);
    Status status = build_inference_request(route->signature, parsed, received.owner, inference.get(),
                                            transport_->shared_memory_for(*context_, parsed));
    if (!status.ok()) {
      finish_observation(*transport_->observations, std::move(observed), status, nullptr, 0);
      count_failure(*route, status, parsed.id);
      return answer_error(to_grpc_status(status), std::string(parsed.id), /*ends_request=*/true);
    }
    inference->final_response_flag = wants_flag;
    const uint64_t token = inference->token;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_core_.emplace(token, route);
      if (observed != nullptr) observed_.emplace(token, std::move(observed));
    }
    refs_.fetch_add(1, std::memory_order_relaxed);  // released with the sink
    inference->sink = std::shared_ptr<CompletionSink>(
        static_cast<CompletionSink*>(this),
        [reservation = std::move(reservation)](CompletionSink* sink) { static_cast<StreamInferCall*>(sink)->unref(); });
    status = scheduler->submit(std::move(inference));
    if (!status.ok()) {
      const std::string id = inference->id;
      inference.reset();  // still ours: dropping it releases the sink
      {
        std::lock_guard<std::mutex> lock(mutex_);
        in_core_.erase(token);
        observed = take_observation_locked(token);
      }
      finish_observation(*transport_->observations, std::move(observed), status, nullptr, 0);
      count_failure(*route, status, id);
      return answer_error(to_grpc_status(status), id, /*ends_request=*/true);
    }
  }

  // The `triton_final_response` a response of `request` carries, if it asked for the flag.
  // A decoupled model's responses always carry it, as Triton's do: clients read it to know a
  // request's last response (the empty final response still needs the request's opt-in).
  static std::optional<bool> final_flag(const InferenceRequest& request, bool last) {
    const bool decoupled = request.signature != nullptr && request.signature->decoupled;
    return request.final_response_flag || decoupled ? std::optional<bool>(last) : std::nullopt;
  }

  // One request to the backend's ModelInfer; `route`: the one the transport chose (null: none);
  // `sampled`: the transport sampled it for tracing; `wants_flag`: its answer carries
  // triton_final_response (true: it is the only one).
  void forward(const grpc::ByteBuffer& request, std::string id, const ModelRoute* route, bool sampled, bool wants_flag,
               std::shared_ptr<ByteReservation> reservation) {
    auto call = std::make_shared<BackendCall>();
    copy_inference_metadata(*context_, *transport_, route, sampled, &call->context);
    call->request = request;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (broken_) return answer_dropped_locked();
      forwarded_.emplace(call, id);
    }
    refs_.fetch_add(1, std::memory_order_relaxed);
    transport_->backend->UnaryCall(
        &call->context, kModelInferMethod, grpc::StubOptions(), &call->request, &call->response,
        [this, call, id = std::move(id), wants_flag, reservation = std::move(reservation)](grpc::Status status) {
          {
            std::lock_guard<std::mutex> lock(mutex_);
            forwarded_.erase(call);
          }
          if (status.ok()) {
            if (!send(stream_answer(call->response, wants_flag), /*ends_request=*/true)) {
              answer_error(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, unsent_message()), id,
                           /*ends_request=*/true, wants_flag ? std::optional<bool>(true) : std::nullopt);
            }
          } else {
            answer_error(status, id, /*ends_request=*/true, wants_flag ? std::optional<bool>(true) : std::nullopt);
          }
          unref();
        });
  }

  // A message that is not a ModelInferRequest: no request id to answer it by, and nothing after it
  // can be trusted to line up, so reading stops; the requests accepted before it are answered and
  // sent, then the call ends with its status.
  void end_malformed(const grpc::Status& status) {
    std::unique_lock<std::mutex> lock(mutex_);
    answer_dropped_locked();
    reads_done_ = true;
    if (!malformed_status_) malformed_status_ = std::make_unique<grpc::Status>(status);
    after_change(std::move(lock));
  }

  // One request failed (`ends_request`), or one of a decoupled request's responses is an error:
  // its error answer (with `final_response`, see final_flag), or the end of the call with
  // `triton_grpc_error`. Not bounded (see send): a request's error answer is small and ends it.
  void answer_error(const grpc::Status& status, const std::string& id, bool ends_request,
                    std::optional<bool> final_response = std::nullopt) {
    if (end_on_error_) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (ends_request) answer_dropped_locked();
      if (!final_status_) final_status_ = std::make_unique<grpc::Status>(status);
      after_change(std::move(lock));
      return;
    }
    send(message(stream_error_response(status.error_message(), id, final_response)), ends_request, /*bounded=*/false);
  }

  // One of a decoupled request's responses is an error: as answer_error, but bounded like any
  // response (a model may send errors in a loop); false when it did not fit.
  bool respond_error(const grpc::Status& status, const InferenceRequest& request) {
    if (end_on_error_) {
      answer_error(status, request.id, /*ends_request=*/false);
      return true;
    }
    return send(message(stream_error_response(status.error_message(), request.id, final_flag(request, false))),
                /*ends_request=*/false);
  }

  // Queues one answer; each is sent after the one before it. `ends_request`: the request's last.
  // `bounded`: false when the answer does not fit (per call, or in the server's budget; see the
  // class comment), and nothing is queued; the refusals that tell of it are not bounded (one per
  // request at most, and small). An answer to a call that is gone is dropped (true).
  bool send(grpc::ByteBuffer&& bytes, bool ends_request, bool bounded = true) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (broken_ || final_status_ || finished_) {
      if (ends_request) answer_dropped_locked();
      after_change(std::move(lock));
      return true;
    }
    if (!writes_.push(std::move(bytes), ends_request, bounded)) return false;
    after_change(std::move(lock));
    return true;
  }

  void answer_dropped_locked() { --outstanding_; }

  // After any change of the state: starts the next write or read, or finishes the call. The ops
  // are started after the lock is released; the flags set under it keep them one at a time.
  void after_change(std::unique_lock<std::mutex> lock) {
    const bool stopping = broken_ || final_status_ != nullptr;
    grpc::ByteBuffer* write = nullptr;
    bool read = false;
    bool finish = false;
    grpc::Status status = grpc::Status::OK;
    if (!finished_ && !writing_) {
      if (!stopping && !writes_.empty()) {
        writing_ = true;
        write = writes_.front();  // stays put while others are queued
      } else if (stopping || (reads_done_ && outstanding_ == 0)) {
        finished_ = true;
        finish = true;
        if (final_status_) {
          status = *final_status_;
        } else if (broken_) {
          status = grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
        } else if (malformed_status_) {
          status = *malformed_status_;
        }
      }
    }
    if (!finished_ && !stopping && !reading_ && !reads_done_ && outstanding_ < transport_->max_stream_outstanding) {
      reading_ = true;
      read = true;
    }
    lock.unlock();
    if (write != nullptr) StartWrite(write);
    if (read) StartRead(&incoming_);
    if (finish) Finish(status);
  }

  // The call's context is valid until the call is finished (Finish is called under mutex_ after
  // finished_ is set): the core may answer a request after the call was cancelled and finished.
  void count_failure(const ModelRoute& route, const Status& status, std::string_view id) {
    std::lock_guard<std::mutex> lock(mutex_);
    record_failure(*transport_, route, status, id, finished_ ? nullptr : context_);
  }

  void unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // The observation of a request the core holds, taken out (null when unobserved). mutex_ held.
  std::unique_ptr<ObservedRequest> take_observation_locked(uint64_t token) {
    const auto found = observed_.find(token);
    if (found == observed_.end()) return nullptr;
    std::unique_ptr<ObservedRequest> observed = std::move(found->second);
    observed_.erase(found);
    return observed;
  }

  grpc::GenericCallbackServerContext* const context_;
  const std::shared_ptr<TransportContext> transport_;
  bool end_on_error_ = false;
  grpc::ByteBuffer incoming_;  // the read in flight
  std::atomic<int> refs_{1};   // grpc's, released in OnDone

  std::mutex mutex_;
  bool reading_ = false;                            // a read is in flight, or OnReadDone is handling one
  bool reads_done_ = false;                         // the client has stopped sending
  bool writing_ = false;                            // writes_.front() is being sent
  bool broken_ = false;                             // cancelled, or a write failed: the client gets nothing more
  bool finished_ = false;                           // Finish was called
  std::unique_ptr<grpc::Status> final_status_;      // the first error, with triton_grpc_error
  std::unique_ptr<grpc::Status> malformed_status_;  // a message did not parse: reads_done_, ends with it
  size_t outstanding_ = 0;                          // requests read and not yet answered and sent
  PendingWrites writes_;                            // answers waiting to be sent; front() in flight
  std::set<uint64_t> overflowed_;                   // decoupled requests failed for a response that did not fit
  std::map<uint64_t, std::shared_ptr<const ModelRoute>> in_core_;  // token -> where it waits
  std::map<uint64_t, std::unique_ptr<ObservedRequest>> observed_;  // token -> its record, if Python observes it
  std::map<std::shared_ptr<BackendCall>, std::string> forwarded_;
};

}  // namespace

grpc::ServerGenericBidiReactor* create_stream_infer_call(grpc::GenericCallbackServerContext* context,
                                                         std::shared_ptr<TransportContext> transport) {
  return new StreamInferCall(context, std::move(transport));  // deletes itself (unref)
}

}  // namespace inferd
