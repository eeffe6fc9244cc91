// What a call asks of its transport and its server context: its peer's socket and credentials,
// the shared-memory registry it may use, its deadline on the core's clock, and the record of a
// request it fails.

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "inferd/grpc_calls.h"
#include "inferd/structured_log.h"
#include "inferd/trace_sampling.h"

namespace inferd {

void record_failure(TransportContext& transport, const ModelRoute& route, const Status& status,
                    std::string_view request_id, const grpc::ServerContextBase* context, std::string_view protocol) {
  transport.failures.count(route.model, route.version, status.code, std::string(protocol));
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

}  // namespace inferd
