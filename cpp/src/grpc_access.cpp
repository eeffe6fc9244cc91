#include "inferd/grpc_access.h"

#include <array>
#include <stdexcept>
#include <utility>

namespace inferd {
namespace {

constexpr std::string_view kInferenceService = "/inference.GRPCInferenceService/";
constexpr std::string_view kHeaderPrefix = "triton-grpc-protocol-";

struct ServedMethod {
  std::string_view path;  // "/package.Service/Method", as HTTP/2's :path carries it
  std::string_view group;
  bool control;
};

// Every method the server answers, with Triton's group (server src/grpc/grpc_server.cc). A path
// that is not here exactly is refused before anything reads it: grpcio on the backend matches a
// method only up to a NUL byte, so a near-miss forwarded there would reach a method whose rule it
// never passed.
constexpr std::array<ServedMethod, 24> kServedMethods{{
    {"/inference.GRPCInferenceService/ServerLive", "health", false},
    {"/inference.GRPCInferenceService/ServerReady", "health", false},
    {"/inference.GRPCInferenceService/ModelReady", "health", false},
    {"/inference.GRPCInferenceService/ServerMetadata", "metadata", false},
    {"/inference.GRPCInferenceService/ModelMetadata", "metadata", false},
    {"/inference.GRPCInferenceService/ModelInfer", "inference", false},
    {"/inference.GRPCInferenceService/ModelStreamInfer", "inference", false},
    {"/inference.GRPCInferenceService/ModelConfig", "model-config", false},
    {"/inference.GRPCInferenceService/ModelStatistics", "statistics", false},
    {"/inference.GRPCInferenceService/RepositoryIndex", "model-repository", false},
    {"/inference.GRPCInferenceService/RepositoryModelLoad", "model-repository", true},
    {"/inference.GRPCInferenceService/RepositoryModelUnload", "model-repository", true},
    {"/inference.GRPCInferenceService/SystemSharedMemoryStatus", "shared-memory", false},
    {"/inference.GRPCInferenceService/SystemSharedMemoryRegister", "shared-memory", true},
    {"/inference.GRPCInferenceService/SystemSharedMemoryUnregister", "shared-memory", true},
    {"/inference.GRPCInferenceService/CudaSharedMemoryStatus", "shared-memory", false},
    {"/inference.GRPCInferenceService/CudaSharedMemoryRegister", "shared-memory", true},
    {"/inference.GRPCInferenceService/CudaSharedMemoryUnregister", "shared-memory", true},
    {"/inference.GRPCInferenceService/TraceSetting", "trace", true},
    {"/inference.GRPCInferenceService/LogSettings", "logging", true},
    {"/grpc.health.v1.Health/Check", "health", false},
    {"/grpc.health.v1.Health/Watch", "health", false},
    // Reflection describes the services, as ServerMetadata and ModelMetadata describe the server.
    {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "metadata", false},
    {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "metadata", false},
}};

constexpr std::array<std::string_view, 9> kGroups{"health",        "metadata",     "inference",
                                                  "shared-memory", "model-config", "model-repository",
                                                  "statistics",    "trace",        "logging"};

const ServedMethod* find_method(std::string_view path) {
  for (const ServedMethod& m : kServedMethods) {
    if (m.path == path) return &m;
  }
  return nullptr;
}

// The method as a log line or status message may show it: printable ASCII, the rest as \xNN,
// cut at 128 bytes (a path is the client's bytes).
std::string printable(std::string_view path) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const char c : path.substr(0, 128)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && byte != '\\') {
      out += c;
    } else {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    }
  }
  if (path.size() > 128) out += "...";
  return out;
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

// The header is present and every value it is given equals `expected`: a second copy of the
// header with another value is refused, whichever of the two a lookup would find first.
bool carries_exactly(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata, const std::string& header,
                     std::string_view expected) {
  const auto [first, last] = metadata.equal_range(grpc::string_ref(header));
  if (first == last) return false;
  bool all_equal = true;
  for (auto it = first; it != last; ++it) {
    all_equal = equal_in_constant_time(std::string_view(it->second.data(), it->second.size()), expected) && all_equal;
  }
  return all_equal;
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
  const ServedMethod* m = find_method(method);
  return m == nullptr ? "" : m->group;
}

bool AccessPolicy::is_control_method(std::string_view method) {
  const ServedMethod* m = find_method(method);
  return m != nullptr && m->control;
}

grpc::Status AccessPolicy::check(std::string_view method, std::string_view peer,
                                 const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  const std::string_view group = group_of(method);
  if (group.empty()) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "unknown method '" + printable(method) + "'");
  }
  const auto rule = rules_.find(group);
  const bool restricted = rule != rules_.end();
  if (restricted && !carries_exactly(metadata, rule->second.header, rule->second.value)) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "This protocol is restricted, expecting header '" + rule->second.header + "'");
  }
  const bool on_tcp = !starts_with(peer, "unix");
  if (group == "shared-memory") {
    if (on_tcp && !shared_memory_on_tcp_) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          std::string(method.substr(kInferenceService.size())) +
                              " is answered only on the Unix sockets (--grpc-unix-socket, --http-unix-socket): a "
                              "region is the client's "
                              "memory; start the server with --shared-memory-listeners all to answer it on TCP");
    }
    return grpc::Status::OK;
  }
  if (!restricted && !control_on_tcp_ && is_control_method(method) && on_tcp) {
    const std::string_view name = method.substr(kInferenceService.size());
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        std::string(name) +
            " is answered only on the Unix sockets (--grpc-unix-socket, --http-unix-socket); to answer it on TCP, "
            "start the server with --grpc-control-on-tcp, or protect its group '" +
            std::string(group) + "' with --grpc-restricted-protocol");
  }
  return grpc::Status::OK;
}

}  // namespace inferd
