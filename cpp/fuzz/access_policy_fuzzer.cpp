// libFuzzer target for the access policy (cpp/src/grpc_access.cpp), the check every call passes
// before anything reads it: the method path (:path, the client's bytes), the peer (TCP or the
// Unix socket) and the metadata, with duplicates, are all fuzzed. Built by -DINFERD_FUZZ=ON with
// clang, ASan and UBSan; run by `make fuzz` and `make fuzz-ci` beside infer_request_fuzzer.
//
// The oracle below is written out again on purpose, not taken from the policy: the harness aborts
// when a call is let through whose path is not exactly a served method (issue 25: a NUL after the
// name passed every rule), when a restricted group is let through without its header carrying the
// secret every time it is given, when a control or shared-memory call is let through on TCP, or
// when a refusal's message holds a byte that is not printable ASCII.

#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "inferd/grpc_access.h"

namespace {

using inferd::AccessOptions;
using inferd::AccessPolicy;
using inferd::RestrictedProtocol;

struct Expected {
  std::string_view path;
  std::string_view group;
  bool control;
};

constexpr std::string_view kService = "/inference.GRPCInferenceService/";
constexpr std::array<Expected, 24> kServed{{
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
    {"/grpc.health.v1.Health/Check", "health", false},
    {"/grpc.health.v1.Health/Watch", "health", false},
    {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "metadata", false},
    {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "metadata", false},
}};

const Expected* expected_of(std::string_view path) {
  for (const Expected& e : kServed) {
    const bool inference = e.path[0] != '/';
    if (inference ? path.size() == kService.size() + e.path.size() && path.substr(0, kService.size()) == kService &&
                        path.substr(kService.size()) == e.path
                  : path == e.path) {
      return &e;
    }
  }
  return nullptr;
}

constexpr std::string_view kHeader = "triton-grpc-protocol-admin";
constexpr std::string_view kSecret = "s3cret";

[[noreturn]] void fail(const char* what, std::string_view path) {
  std::fprintf(stderr, "access policy invariant broken: %s (path of %zu bytes)\n", what, path.size());
  std::abort();
}

const AccessPolicy& policy() {
  static const AccessPolicy p(
      AccessOptions{{RestrictedProtocol{{"model-repository", "inference"}, "admin", "s3cret"}}});
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  const bool on_tcp = input.ConsumeBool();
  // Metadata: up to 4 pairs, the key mostly the restricted header (so duplicates are common), the
  // value mostly the secret or a near miss of it.
  std::vector<std::pair<std::string, std::string>> pairs;
  const int count = input.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < count; ++i) {
    std::string key = input.ConsumeBool() ? std::string(kHeader) : input.ConsumeRandomLengthString(40);
    std::string value = input.ConsumeBool() ? std::string(kSecret) : input.ConsumeRandomLengthString(16);
    pairs.emplace_back(std::move(key), std::move(value));
  }
  const std::string path = input.ConsumeRemainingBytesAsString();
  std::multimap<grpc::string_ref, grpc::string_ref> metadata;
  for (const auto& [key, value] : pairs) metadata.emplace(grpc::string_ref(key), grpc::string_ref(value));

  const grpc::Status status = policy().check(path, on_tcp ? "ipv4:127.0.0.1:5000" : "unix:", metadata);
  const Expected* served = expected_of(path);
  for (const char c : status.error_message()) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
      fail("a refusal's message holds a byte that is not printable ASCII", path);
    }
  }
  if (served == nullptr) {
    if (status.error_code() != grpc::StatusCode::UNIMPLEMENTED)
      fail("a path that is not served was not UNIMPLEMENTED", path);
    return 0;
  }
  if (AccessPolicy::group_of(path) != served->group) fail("a served method's group differs from Triton's", path);
  if (!status.ok()) return 0;
  const bool restricted = served->group == "model-repository" || served->group == "inference";
  if (restricted) {
    bool given = false;
    for (const auto& [key, value] : pairs) {
      if (key != kHeader) continue;
      given = true;
      if (value != kSecret) fail("a restricted call was let through with a wrong copy of its header", path);
    }
    if (!given) fail("a restricted call was let through without its header", path);
  }
  if (on_tcp && served->group == "shared-memory") fail("a shared-memory call was let through on TCP", path);
  if (on_tcp && served->control && !restricted) fail("an unprotected control call was let through on TCP", path);
  return 0;
}
