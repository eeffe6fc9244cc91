// The metadata of the core's gRPC calls: what a call forwarded to the backend carries each way,
// and whether an inference goes to Python (its traceparent, by the snapshot's tracing).

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

}  // namespace inferd
