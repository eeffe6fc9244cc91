// The metadata of the core's gRPC calls: what a call forwarded to the backend carries each way,
// whether an inference is sampled for tracing (its traceparent, by the snapshot's rule), and what
// an observed inference's record keeps of it.

#include <memory>
#include <string>
#include <string_view>

#include "inferd/grpc_calls.h"

namespace inferd {

namespace {

bool is_transport_header(std::string_view key) {
  return key.empty() || key[0] == ':' || key.rfind("grpc-", 0) == 0 || key == "user-agent" || key == "content-type" ||
         key == "te";
}

}  // namespace

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

void copy_inference_metadata(const grpc::ServerContextBase& from, const TransportContext& transport,
                             const ModelRoute* route, bool sampled, grpc::ClientContext* to) {
  copy_client_metadata(from, to);
  if (sampled) to->AddMetadata(std::string(kTraceSampledKey), "1");
  if (route != nullptr) to->AddMetadata(std::string(kRoutedVersionKey), route->version);
  if (transport.shared_memory_for(from) != nullptr) to->AddMetadata(std::string(kSharedMemoryAllowedKey), "1");
}

bool sampled_for_tracing(const ServingSnapshot& snapshot, std::string_view model,
                         const grpc::ServerContextBase& context) {
  const TraceSampling& tracing = snapshot.tracing_for(model);
  if (!tracing.enabled) return false;
  std::string_view traceparent;
  const auto& metadata = context.client_metadata();
  if (const auto found = metadata.find("traceparent"); found != metadata.end()) {
    traceparent = std::string_view(found->second.data(), found->second.size());
  }
  return tracing.traced(traceparent);
}

std::unique_ptr<ObservedRequest> begin_observation(const ServingSnapshot& snapshot, const ModelRoute& route,
                                                   const grpc::ServerContextBase& context, std::string_view request_id,
                                                   bool sampled, Clock::time_point received) {
  if (!sampled && !snapshot.observe_inference) return nullptr;
  auto observed = std::make_unique<ObservedRequest>();
  observed->model = route.model;
  observed->version = route.version;
  observed->id = std::string(request_id);
  observed->sampled = sampled;
  observed->received = received;
  for (const auto& [key, value] : context.client_metadata()) {
    const std::string_view k(key.data(), key.size());
    if (is_transport_header(k)) continue;
    observed->metadata.emplace_back(std::string(k), std::string(value.data(), value.size()));
  }
  return observed;
}

void finish_observation(ObservationQueue& queue, std::unique_ptr<ObservedRequest> observed, const Status& status,
                        RequestTiming* timing, uint32_t answers) {
  if (observed == nullptr) return;
  observed->answered = Clock::now();
  if (observed->status.ok()) observed->status = status;
  observed->responses += answers;
  if (timing != nullptr) observed->timing = std::move(*timing);
  queue.push(std::move(*observed));  // a full queue drops it: observing never holds a request
}

void copy_trailing_metadata(const grpc::ClientContext& from, grpc::ServerContextBase* to) {
  for (const auto& [key, value] : from.GetServerTrailingMetadata()) {
    const std::string_view k(key.data(), key.size());
    if (is_transport_header(k)) continue;
    to->AddTrailingMetadata(std::string(k), std::string(value.data(), value.size()));
  }
}

}  // namespace inferd
