#pragma once

// The reactors of the core's gRPC server (see grpc_server.h) and what they share. Each reactor
// owns itself, as grpc++'s callback API wants: created per call by the generic service and
// deleted once grpc is done with it (OnDone) and nothing in the core still answers to it.

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "inferd/grpc_inflight_budget.h"
#include "inferd/grpc_server.h"
#include "inferd/grpc_status.h"
#include "inferd/infer_request_parser.h"
#include "inferd/inference_request.h"
#include "inferd/request_observation.h"
#include "inferd/request_token.h"
#include "inferd/serving_snapshot.h"
#include "inferd/shared_memory.h"
#include "inferd/status.h"

namespace inferd {

// What every call of one server reaches. Shared by the calls: they may outlive the GrpcServer
// while the core finishes their requests.
struct TransportContext {
  explicit TransportContext(uint64_t max_inflight_bytes = 0)
      : inflight(std::make_shared<InflightBudget>(max_inflight_bytes)) {}

  ServingState state;
  FailureCounts failures;
  std::unique_ptr<grpc::GenericStub> backend;
  size_t max_stream_outstanding = 1024;
  uint64_t max_stream_pending_bytes = 0;  // per call, 0: no limit (GrpcServerOptions)
  // Bytes of the inference requests received and not yet answered, and of the streams' answers
  // waiting to be sent (see InflightBudget).
  const std::shared_ptr<InflightBudget> inflight;
  // Registered shared-memory regions (null: off), and whether TCP callers may name them.
  std::shared_ptr<SharedMemoryRegistry> shared_memory;
  bool shared_memory_on_tcp = false;
  // The connections the core accepted itself (ConnectionListener).
  const std::shared_ptr<ConnectionDirectory> connections = std::make_shared<ConnectionDirectory>();
  // Inferences the core ran while Python observes them, for Python to trace and log.
  const std::shared_ptr<ObservationQueue> observations = std::make_shared<ObservationQueue>(kObservationQueueCapacity);

  // Whether the call came over a Unix socket, and the peer's credentials there (the kernel's,
  // SO_PEERCRED; nullopt on TCP or when unknown).
  bool on_unix_socket(const grpc::ServerContextBase& context) const;
  std::optional<PeerCredentials> peer_credentials(const grpc::ServerContextBase& context) const;

  // The registry a request of this call may use: null when shared memory is off or the call came
  // over TCP without shared_memory_on_tcp.
  const SharedMemoryRegistry* shared_memory_for(const grpc::ServerContextBase& context) const;
  // The same for one parsed request, asked only when one of its tensors carries parameters (the
  // only way to name a region): the common request costs no look at the peer (a string copy).
  const SharedMemoryRegistry* shared_memory_for(const grpc::ServerContextBase& context,
                                                const ParsedInferRequest& request) const;

  // A token for one of the transport's requests, in its range (request_token.h). Thread-safe.
  uint64_t next_token() { return tokens_.next(); }

 private:
  RequestTokenCounter tokens_{kTransportTokenRange, 1};
};

// The metadata key the transport adds, with "1", to an inference it sends to Python because it
// sampled it for tracing: Python's sampler then records it whatever it would draw itself (a request
// that starts a trace gets its trace id there, so two draws would disagree). A caller's own is
// dropped.
inline constexpr std::string_view kTraceSampledKey = "inferd-trace-sampled";
// The metadata key the transport adds, with "1", to an inference it sends to Python when the
// client's listener may use shared memory (TransportContext::shared_memory_for); a caller's own
// is dropped.
inline constexpr std::string_view kSharedMemoryAllowedKey = "inferd-shared-memory";
// The metadata key the transport adds to a call it forwards from its Unix socket: "PID UID GID",
// the peer's credentials as the kernel recorded them (SO_PEERCRED), which the shared-memory calls
// check a region's object against. A caller's own is dropped.
inline constexpr std::string_view kPeerCredentialsKey = "inferd-peer-credentials";
// The metadata key the transport adds to an inference it routed and sends to Python (to observe
// it): the version its route chose. Python runs the request on that version instead of routing it
// again, so a weighted choice is drawn once. A caller's own is dropped.
inline constexpr std::string_view kRoutedVersionKey = "inferd-routed-version";

// Whether the snapshot's tracing rule for `model` (the name the request gives) samples this call's
// inference, by its traceparent; a sampled one takes a trace of the rule's budget.
bool sampled_for_tracing(const ServingSnapshot& snapshot, std::string_view model,
                         const grpc::ServerContextBase& context);

// The observation of an inference of this call that the core runs while Python observes it
// (sampled, or the snapshot observes every inference), begun when the request was received; null
// when nobody observes it. Copies the caller's metadata (not the transport's own headers).
std::unique_ptr<ObservedRequest> begin_observation(const ServingSnapshot& snapshot, const ModelRoute& route,
                                                   const grpc::ServerContextBase& context, std::string_view request_id,
                                                   bool sampled, Clock::time_point received);
// Sends an observation to Python with how its request was answered: `status`, the core's `timing`
// (moved from; null: it never reached a scheduler) and `answers` more answers sent. A status
// already set on the observation (a failure seen earlier) is kept. No-op for null. Never blocks.
void finish_observation(ObservationQueue& queue, std::unique_ptr<ObservedRequest> observed, const Status& status,
                        RequestTiming* timing, uint32_t answers);

// Counts a request the transport answers with an error against its model version; an INTERNAL
// one also gets its one log record at error level (model, version, request id, the caller's trace
// id when its traceparent has one, reason), as Python writes it for the requests it answers.
// `context`: the call's, or null once the call is finished (grpc frees it then: a late answer of a
// call cancelled at shutdown has no trace id).
// `protocol`: the transport's, for the failure counts ("grpc" or "http").
void record_failure(TransportContext& transport, const ModelRoute& route, const Status& status,
                    std::string_view request_id, const grpc::ServerContextBase* context,
                    std::string_view protocol = "grpc");

// Which call a method is.
enum class CallKind {
  kInfer,
  kStreamInfer,
  kServerLive,
  kServerReady,
  kModelReady,
  kModelMetadata,
  kModelConfig,
  kForwarded
};
CallKind call_kind(std::string_view method);

// The reactor for one call; deletes itself.
grpc::ServerGenericBidiReactor* create_call(grpc::GenericCallbackServerContext* context,
                                            std::shared_ptr<TransportContext> transport);
grpc::ServerGenericBidiReactor* create_stream_infer_call(grpc::GenericCallbackServerContext* context,
                                                         std::shared_ptr<TransportContext> transport);
grpc::ServerGenericBidiReactor* create_forwarded_call(grpc::GenericCallbackServerContext* context,
                                                      std::shared_ptr<TransportContext> transport);
// The unary calls create_call picks: ModelInfer (grpc_infer_call.cpp), and those the serving
// snapshot answers (kServerLive to kModelConfig; grpc_snapshot_call.cpp).
grpc::ServerGenericBidiReactor* create_infer_call(grpc::GenericCallbackServerContext* context,
                                                  std::shared_ptr<TransportContext> transport);
grpc::ServerGenericBidiReactor* create_snapshot_call(grpc::GenericCallbackServerContext* context,
                                                     std::shared_ptr<TransportContext> transport, CallKind kind);

// --- shared by the reactors -----------------------------------------------------------------

// Defined in grpc_messages.cpp (the messages), grpc_transport_context.cpp (TransportContext's
// questions, the deadlines, record_failure) and grpc_metadata.cpp (the metadata, sampling, observations).
// The status table (to_grpc_status, shown_message, over_budget) is grpc_status.h.

// A received message as one contiguous view, and what keeps it alive (a reference to grpc's own
// slice when the message came in one, else a joined copy). False if the buffer cannot be read.
struct ReceivedMessage {
  std::shared_ptr<const void> owner;
  std::string_view bytes;
};
bool receive(const grpc::ByteBuffer& buffer, ReceivedMessage* out);

// A message to send, from bytes (copied once into a grpc slice).
grpc::ByteBuffer message(std::string_view bytes);
// The serialized answer of a computed request, written straight into a grpc slice (and its
// shared-memory outputs into their slices); otherwise why it cannot be (InferResponseWriter::status).
// `final_response`: the `triton_final_response` parameter it carries, if any.
Status write_answer(const InferenceRequest& request, const std::vector<Tensor>& outputs, grpc::ByteBuffer* out,
                    std::optional<bool> final_response = std::nullopt);
// The empty response that carries a decoupled request's final flag alone (triton_final_response: true).
grpc::ByteBuffer empty_final_answer(const InferenceRequest& request);

// The call's deadline on the core's clock (max = none).
Clock::time_point core_deadline(const grpc::ServerContextBase& context);
// Whether the call's deadline has passed (give or take grpc's timer slack): a cancellation then
// is the deadline's, which the core answers itself.
bool deadline_passed(const grpc::ServerContextBase& context);

// One call to the backend with one message each way; `done` runs on a grpc thread with the
// status. Copies the caller's metadata and deadline.
struct BackendCall {
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
};
// Copies the caller's metadata (not the transport's own headers, nor kTraceSampledKey) and deadline.
void copy_client_metadata(const grpc::ServerContextBase& from, grpc::ClientContext* to);
// An inference forwarded to the backend: the caller's metadata and deadline, and the transport's
// marks on it - kTraceSampledKey when it sampled it, kRoutedVersionKey with `route`'s version (null:
// no route), kSharedMemoryAllowedKey when the call may name regions.
void copy_inference_metadata(const grpc::ServerContextBase& from, const TransportContext& transport,
                             const ModelRoute* route, bool sampled, grpc::ClientContext* to);
void copy_trailing_metadata(const grpc::ClientContext& from, grpc::ServerContextBase* to);

}  // namespace inferd
