// ModelInfer on the core's gRPC server: one request run in the core, or forwarded to Python.

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

#include "grpc_unary_call.h"
#include "inferd/grpc_calls.h"
#include "inferd/infer_request_parser.h"
#include "inferd/model_signature.h"
#include "inferd/version_routing.h"

namespace inferd {
namespace {

// ModelInfer: received bytes -> parser -> the version's scheduler -> writer -> sent bytes. A
// request the snapshot has no route for (unknown or unready model, a version written otherwise),
// or every request while Python traces by a rule of its own (forward_inference), goes to the
// backend instead. One that Python observes (sampled for tracing, verbose logs) runs here too, and
// its record goes to Python once it is answered (begin_observation, report).
class InferCall final : public UnaryCall, public CompletionSink {
 public:
  using UnaryCall::UnaryCall;

  void complete(Completion&& completion) override {
    Status status = completion.status;
    grpc::ByteBuffer answer_bytes;
    if (status.ok()) status = write_answer(*completion.request, completion.outputs, &answer_bytes);
    report(status, &completion.timing);
    if (!status.ok()) {
      count_failure(status, completion.request ? completion.request->id : "");
      fail(to_grpc_status(status));
      return;
    }
    answer(std::move(answer_bytes));
  }

 private:
  void handle() override {
    const Clock::time_point received_at = Clock::now();
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
    // Counted until this request is submitted: its version is not closed before (settle()).
    const ServingState::Reading reading = transport_->state.read();
    const std::shared_ptr<const ServingSnapshot>& snapshot = reading.snapshot();
    std::shared_ptr<const ModelRoute> route = snapshot->find(parsed.model_name, parsed.model_version, routing);
    if (snapshot->forward_inference) {
      forward(route.get());  // Python samples and traces it by its own rule
      return;
    }
    const bool sampled = sampled_for_tracing(*snapshot, parsed.model_name, *context_);
    if (route == nullptr) {
      forward(nullptr, sampled);  // Python answers in the registry's words (unknown, not ready)
      return;
    }
    route_ = route;
    observation_ = begin_observation(*snapshot, *route, *context_, parsed.id, sampled, received_at);
    run_in_core(parsed, received);
  }

  // Builds the request against route_'s signature and hands it to its scheduler; every outcome
  // but the core's answer is answered here.
  void run_in_core(const ParsedInferRequest& parsed, const ReceivedMessage& received) {
    const std::shared_ptr<RequestScheduler> scheduler = route_->scheduler.lock();  // the snapshot owns it
    auto request = std::make_unique<InferenceRequest>();
    request->token = transport_->next_token();
    request->deadline = core_deadline(*context_);
    Status status = build_inference_request(route_->signature, parsed, received.owner, request.get(),
                                            transport_->shared_memory_for(*context_, parsed));
    if (!status.ok()) {
      report(status, nullptr);
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
      report(status, nullptr);
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

  // An observed request's record goes to Python with what it was answered, before the answer (so
  // that its span is on its way by the time the client has the answer). Called once: from
  // handle() before the core holds the request, or from complete() after.
  void report(const Status& status, RequestTiming* timing) {
    finish_observation(*transport_->observations, std::move(observation_), status, timing, status.ok() ? 1 : 0);
  }

  std::shared_ptr<const ModelRoute> route_;  // set before the request is submitted, never after
  // Set before the request is submitted, then used by the one thread that answers it.
  std::unique_ptr<ObservedRequest> observation_;
  std::mutex core_mutex_;
  uint64_t token_ = 0;           // guarded by core_mutex_; set once the core holds the request
  bool core_cancelled_ = false;  // guarded by core_mutex_
};

}  // namespace

grpc::ServerGenericBidiReactor* create_infer_call(grpc::GenericCallbackServerContext* context,
                                                  std::shared_ptr<TransportContext> transport) {
  // Raw new: grpc's callback API takes a reactor that deletes itself (UnaryCall::unref).
  return new InferCall(context, std::move(transport));
}

}  // namespace inferd
