#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "inferd/connection_listener.h"
#include "inferd/grpc_access.h"
#include "inferd/request_observation.h"
#include "inferd/serving_snapshot.h"
#include "inferd/shared_memory.h"
#include "inferd/status.h"

namespace grpc {
class Channel;
class Server;
}  // namespace grpc

namespace inferd {

struct TransportContext;

struct GrpcServerOptions {
  // Where clients connect: "HOST:PORT" (TCP; port 0 picks one) or "unix:PATH".
  std::vector<std::string> addresses;
  // The Python gRPC server ("unix:PATH") that answers every call the core does not.
  std::string backend_address;
  int max_message_bytes = -1;      // send and receive; -1 = gRPC's default
  int keepalive_time_ms = 0;       // server pings on idle connections; 0 = gRPC's default (2 h)
  int keepalive_timeout_ms = 0;    // 0 = gRPC's default (20 s)
  int max_concurrent_streams = 0;  // per connection; 0 = unlimited
  // Closes a connection that has had no call for this long (GRPC_ARG_MAX_CONNECTION_IDLE_MS): idle
  // clients cannot hold file descriptors for good. 0 = never.
  int max_connection_idle_ms = 0;
  // A TLS connection whose handshake has not finished by then, or by max_connection_idle_ms when
  // that is shorter, is closed (grpc's default is 120 s, which let stalled handshakes hold
  // descriptors whatever the idle limit said). 0 = grpc's.
  int handshake_timeout_ms = 10'000;
  // Triton's TLS settings, on TCP addresses; Unix sockets stay plaintext (local, guarded by the
  // file's permissions). use_ssl needs the server's certificate (chain) and key (PEM); use_ssl_mutual
  // (which implies use_ssl) also needs root_cert_pem: clients must present a certificate it signed.
  bool use_ssl = false;
  bool use_ssl_mutual = false;
  std::string server_cert_pem, server_key_pem, root_cert_pem;
  // Restricted protocols and where control calls are answered (see AccessPolicy).
  AccessOptions access;
  // Streamed requests a ModelStreamInfer call may have unanswered or unsent before the core stops
  // reading more from it: a client that sends without reading is held back, not buffered.
  size_t max_stream_outstanding = 1024;
  // Bytes of answers a ModelStreamInfer call may hold waiting to be sent (a client that does not
  // read, a decoupled model that sends faster than it reads); past it the answer's request fails
  // RESOURCE_EXHAUSTED. The first waiting answer always fits. 0 = no limit per call.
  uint64_t max_stream_pending_bytes = uint64_t{64} << 20;
  // Bytes of inference requests received and not yet answered, and of answers waiting to be sent
  // on streams, all calls together; a request that would take them past it is answered
  // RESOURCE_EXHAUSTED at once, and so is a streamed answer's request. 0 = no limit.
  uint64_t max_inflight_bytes = 0;
  // The regions clients registered (null: shared memory is off). Requests naming a region are
  // served on the Unix socket, and on TCP too only with shared_memory_on_tcp; so are the
  // shared-memory RPCs (AccessPolicy).
  std::shared_ptr<SharedMemoryRegistry> shared_memory;
  bool shared_memory_on_tcp = false;
  // Descriptors the plaintext listeners keep free for the rest of the process (see
  // ConnectionListener): a connection that would take one of the last this many is closed.
  int reserved_descriptors = 128;
};

// Counts of inference requests that failed on a known model version, by (model, version, status,
// protocol: "grpc" or "http"): what the transports answered themselves (Python counts what it
// answers).
class FailureCounts {
 public:
  void count(const std::string& model, const std::string& version, StatusCode code, const std::string& protocol);
  // (model, version, code, protocol, count) for each key counted.
  std::vector<std::tuple<std::string, std::string, int, std::string, uint64_t>> snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::tuple<std::string, std::string, int, std::string>, uint64_t> counts_;  // guarded by mutex_
};

// The core's gRPC server (grpc++ callback API). Every call arrives through one generic service:
// ModelInfer and ModelStreamInfer run in C++ (parse, schedule, write, on the routes of the
// ServingSnapshot); ServerLive/Ready, ModelReady, ModelMetadata and ModelConfig are answered from
// the snapshot when it knows the answer; every other call, and every call the snapshot cannot
// answer, is forwarded unparsed to the backend (inferd's Python gRPC server on a private Unix
// socket) with its metadata and deadline, and its answer and status come back unchanged.
//
// Every call passes the AccessPolicy before its reactor is made; a refused call is answered with
// the policy's status and reaches neither the core nor the backend. The plaintext listeners (TCP
// without TLS, Unix sockets) are the core's own ConnectionListener, which hands each connection to
// grpc; TLS listeners are grpc's.
//
// Invariants: every call gets exactly one status; a request submitted to a scheduler is answered
// by its completion or, when the client has gone, dropped after the core's answer; shutdown()
// returns once no call is left.
class GrpcServer {
 public:
  // Binds every address and starts serving. Throws std::runtime_error naming an address it could
  // not bind or a TLS setting it could not use, std::invalid_argument for a restricted protocol
  // AccessPolicy refuses.
  explicit GrpcServer(GrpcServerOptions options);
  // Shuts down with no grace if shutdown() was not called.
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // The bound port of each address, in order (0 for a Unix socket).
  const std::vector<int>& ports() const { return ports_; }
  ServingState& state();
  FailureCounts& failures();
  // The inferences the core ran while Python observes them (see ServingSnapshot::tracing).
  std::shared_ptr<ObservationQueue> observations() const;
  // What its calls share (the HTTP server serves from the same: HttpServer).
  std::shared_ptr<TransportContext> transport() const { return transport_; }

  // Stops accepting calls, lets the ones in flight finish for `grace_s` seconds, cancels the rest
  // and waits for them and for their calls to the backend. Blocks; idempotent.
  void shutdown(double grace_s);

 private:
  class Service;
  const GrpcServerOptions options_;
  std::shared_ptr<TransportContext> transport_;     // shared with the calls, which may outlive the server
  std::shared_ptr<grpc::Channel> backend_channel_;  // also the stub's and each backend call's
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ConnectionListener> listener_;  // the plaintext addresses; stopped before server_
  std::vector<int> ports_;
  std::mutex shutdown_mutex_;
  bool shut_down_ = false;  // guarded by shutdown_mutex_
};

}  // namespace inferd
