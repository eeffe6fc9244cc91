#pragma once

// Which calls the core's gRPC server lets through (see grpc_server.h): Triton's restricted
// protocols, and the control calls kept on the Unix socket.

#include <grpcpp/support/status.h>
#include <grpcpp/support/string_ref.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace inferd {

// Triton's --grpc-restricted-protocol=<groups>:<key>=<value>: a call of one of `groups` must carry
// the metadata `triton-grpc-protocol-<key>: <value>`.
struct RestrictedProtocol {
  std::vector<std::string> groups;  // Triton's names: health, metadata, inference, ...
  std::string key;
  std::string value;
};

struct AccessOptions {
  std::vector<RestrictedProtocol> restricted;
  // The control calls (is_control_method) are answered on TCP too; otherwise only on the Unix
  // socket, or on TCP where their group is restricted (the header then protects them).
  bool control_on_tcp = false;
  // The shared-memory group (its RPCs; requests naming regions are the transport's check) is
  // answered on TCP too; otherwise only on the Unix socket, whatever control_on_tcp says: a
  // region is the client's memory, so its client must be on this machine (--shared-memory-listeners).
  bool shared_memory_on_tcp = false;
};

// The one check every call of the server passes before its reactor is made: the method must be
// one the server serves, spelled exactly (else UNIMPLEMENTED: nothing forwards a path the table
// does not know), the call's group (Triton's API groups; every method of
// inference.GRPCInferenceService, grpc.health.v1.Health and server reflection has one) must be
// open or the call must carry the group's header, once or always with the same value, and a
// control call on TCP must have been opened there by the operator.
//
// Invariants: fixed at construction (check() reads it from any thread without a lock); a group
// is restricted by at most one rule; every rule's key is a valid lowercase metadata key and its
// value non-empty and printable ASCII (the constructor throws std::invalid_argument otherwise);
// the header's value is compared in time that depends on the expected value's length only.
class AccessPolicy {
 public:
  explicit AccessPolicy(AccessOptions options);

  // OK when the call may go on; else the status to refuse it with. `peer`: grpc's peer string
  // ("unix:..." on the Unix socket, "ipv4:..."/"ipv6:..." on TCP).
  grpc::Status check(std::string_view method, std::string_view peer,
                     const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

  // Triton's group of a method ("/package.Service/Method", exactly); "" for a method the server
  // does not serve.
  static std::string_view group_of(std::string_view method);
  // Calls that change the server's state for everyone (load, unload, log and trace settings,
  // shared-memory registration).
  static bool is_control_method(std::string_view method);

 private:
  struct Rule {
    std::string header;  // "triton-grpc-protocol-<key>"
    std::string value;
  };
  std::map<std::string, Rule, std::less<>> rules_;  // by group
  bool control_on_tcp_;
  bool shared_memory_on_tcp_;
};

}  // namespace inferd
