#include "inferd/grpc_access.h"

#include <array>
#include <stdexcept>
#include <utility>

namespace inferd {
namespace {

constexpr std::string_view kInferenceService = "/inference.GRPCInferenceService/";
constexpr std::string_view kHeaderPrefix = "triton-grpc-protocol-";

struct MethodGroup {
  std::string_view method;  // the name within inference.GRPCInferenceService
  std::string_view group;
  bool control;
};

// As Triton groups them (server src/grpc/grpc_server.cc).
constexpr std::array<MethodGroup, 20> kInferenceMethods{{
    {"ServerLive", "health", false},
    {"ServerReady", "health", false},
    {"ModelReady", "health", false},
    {"ServerMetadata", "metadata", false},
    {"ModelMetadata", "metadata", false},
    {"ModelInfer", "inference", false},
    {"ModelStreamInfer", "inference", false},
    {"ModelConfig", "model-config", false},
    {"ModelStatistics", "statistics", false},
    {"RepositoryIndex", "model-repository", false},
    {"RepositoryModelLoad", "model-repository", true},
    {"RepositoryModelUnload", "model-repository", true},
    {"SystemSharedMemoryStatus", "shared-memory", false},
    {"SystemSharedMemoryRegister", "shared-memory", true},
    {"SystemSharedMemoryUnregister", "shared-memory", true},
    {"CudaSharedMemoryStatus", "shared-memory", false},
    {"CudaSharedMemoryRegister", "shared-memory", true},
    {"CudaSharedMemoryUnregister", "shared-memory", true},
    {"TraceSetting", "trace", true},
    {"LogSettings", "logging", true},
}};

constexpr std::array<std::string_view, 9> kGroups{"health",        "metadata",     "inference",
                                                  "shared-memory", "model-config", "model-repository",
                                                  "statistics",    "trace",        "logging"};

const MethodGroup* find_inference_method(std::string_view method) {
  if (method.substr(0, kInferenceService.size()) != kInferenceService) return nullptr;
  const std::string_view name = method.substr(kInferenceService.size());
  for (const MethodGroup& m : kInferenceMethods) {
    if (m.method == name) return &m;
  }
  return nullptr;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// Compares every byte of `expected` whatever `given` holds: the time tells the length of the
// expected value at most, not how much of it a guess got right.
bool equal_in_constant_time(std::string_view given, std::string_view expected) {
  volatile unsigned char difference = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    difference = difference | static_cast<unsigned char>(g ^ static_cast<unsigned char>(expected[i]));
  }
  return difference == 0;
}

std::string header_key(std::string key) {
  if (key.empty()) throw std::invalid_argument("a restricted protocol needs a header key");
  for (char& c : key) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    const bool valid = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!valid) throw std::invalid_argument("a restricted protocol's header key has a character gRPC refuses: " + key);
  }
  return std::string(kHeaderPrefix) + key;
}

void check_value(const std::string& value, const std::string& header) {
  if (value.empty()) throw std::invalid_argument("the restricted protocol's value of '" + header + "' is empty");
  for (const char c : value) {
    if (c < 0x20 || c > 0x7e) {
      throw std::invalid_argument("the restricted protocol's value of '" + header +
                                  "' has a character a gRPC header cannot carry (printable ASCII only)");
    }
  }
}

}  // namespace

AccessPolicy::AccessPolicy(AccessOptions options)
    : control_on_tcp_(options.control_on_tcp), shared_memory_on_tcp_(options.shared_memory_on_tcp) {
  for (RestrictedProtocol& protocol : options.restricted) {
    if (protocol.groups.empty()) throw std::invalid_argument("a restricted protocol names no API group");
    Rule rule{header_key(std::move(protocol.key)), std::move(protocol.value)};
    check_value(rule.value, rule.header);
    for (const std::string& group : protocol.groups) {
      bool known = false;
      for (const std::string_view g : kGroups) known = known || g == group;
      if (!known) {
        throw std::invalid_argument("unknown API group '" + group +
                                    "' (health, metadata, inference, shared-memory, model-config, "
                                    "model-repository, statistics, trace, logging)");
      }
      if (!rules_.emplace(group, rule).second) {
        throw std::invalid_argument("the API group '" + group + "' is restricted twice");
      }
    }
  }
}

std::string_view AccessPolicy::group_of(std::string_view method) {
  if (const MethodGroup* m = find_inference_method(method)) return m->group;
  if (starts_with(method, "/grpc.health.v1.Health/")) return "health";
  // Reflection describes the services, as ServerMetadata and ModelMetadata describe the server.
  if (starts_with(method, "/grpc.reflection.v1alpha.ServerReflection/") ||
      starts_with(method, "/grpc.reflection.v1.ServerReflection/")) {
    return "metadata";
  }
  return "";
}

bool AccessPolicy::is_control_method(std::string_view method) {
  const MethodGroup* m = find_inference_method(method);
  return m != nullptr && m->control;
}

grpc::Status AccessPolicy::check(std::string_view method, std::string_view peer,
                                 const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  const std::string_view group = group_of(method);
  const auto rule = rules_.find(group);
  const bool restricted = rule != rules_.end();
  if (restricted) {
    const auto found = metadata.find(grpc::string_ref(rule->second.header));
    if (found == metadata.end() ||
        !equal_in_constant_time(std::string_view(found->second.data(), found->second.size()), rule->second.value)) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "This protocol is restricted, expecting header '" + rule->second.header + "'");
    }
  }
  const bool on_tcp = !starts_with(peer, "unix");
  if (group == "shared-memory") {
    if (on_tcp && !shared_memory_on_tcp_) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          std::string(method.substr(kInferenceService.size())) +
                              " is answered only on the Unix socket (--grpc-unix-socket): a region is the client's "
                              "memory; start the server with --shared-memory-listeners all to answer it on TCP");
    }
    return grpc::Status::OK;
  }
  if (!restricted && !control_on_tcp_ && is_control_method(method) && on_tcp) {
    const std::string_view name = method.substr(kInferenceService.size());
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        std::string(name) +
                            " is answered only on the Unix socket (--grpc-unix-socket); to answer it on TCP, "
                            "start the server with --grpc-control-on-tcp, or protect its group '" +
                            std::string(group) + "' with --grpc-restricted-protocol");
  }
  return grpc::Status::OK;
}

}  // namespace inferd
