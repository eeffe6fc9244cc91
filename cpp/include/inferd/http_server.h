#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "inferd/grpc_access.h"

namespace inferd {

class GrpcServer;
struct HttpShared;

struct HttpServerOptions {
  // Where clients connect: "HOST:PORT" (TCP; port 0 picks one) or "unix:PATH".
  std::vector<std::string> addresses;
  int threads = 2;  // serving connections (parsing, JSON, compression); the core computes elsewhere
  // A request's line and headers must arrive within this of its first byte (slow-loris), and each
  // read of its body must progress within it.
  int header_timeout_ms = 10'000;
  // A keep-alive connection with no request for this long is closed.
  int idle_timeout_ms = 60'000;
  // Connections open at once; one past it is answered 429 and closed before anything is read.
  size_t max_connections = 1024;
  uint32_t max_header_bytes = 64 * 1024;                      // request line and headers
  uint64_t max_body_bytes = (uint64_t{1} << 31) - 1;          // as received (compressed or not)
  uint64_t max_decompressed_bytes = (uint64_t{1} << 31) - 1;  // a gzip or deflate body, inflated
  size_t max_json_depth = 64;
  uint64_t max_chunks = 65'536;  // of one chunked body
  // TLS on TCP addresses, with the gRPC port's settings (Unix sockets stay plaintext): use_ssl
  // needs the server's certificate (chain) and key (PEM); use_ssl_mutual also root_cert_pem, the
  // CA that must have signed each client's certificate.
  bool use_ssl = false;
  bool use_ssl_mutual = false;
  std::string server_cert_pem, server_key_pem, root_cert_pem;
  // Where control calls are answered: as on the gRPC port (AccessPolicy); shared memory follows
  // the gRPC server's shared_memory_on_tcp.
  AccessOptions access;
  // Descriptors kept free for the rest of the process (ConnectionListener).
  int reserved_descriptors = 128;
};

// The core's HTTP/1.1 server: Triton's HTTP/REST API (KServe v2 with Triton's extensions) on
// Boost.Beast. It shares the gRPC server's TransportContext: the same serving snapshot and
// schedulers (an HTTP inference is decoded into the same core request and batches with gRPC's),
// the same in-flight byte budget, failure counts, shared-memory registry and token range, and the
// same backend channel to Python for the calls Python answers (sent as the gRPC calls they are).
//
// Connections are accepted by the core's ConnectionListener (descriptor reserve, peer credentials
// on the Unix socket) and served on `threads` threads, each connection on its own strand. Every
// request passes the same AccessPolicy as a gRPC call of the same method.
//
// Invariants: every request that was read gets exactly one answer unless its connection closed
// first; a request the core accepted is answered by it (or dropped after its answer once the
// connection is gone); shutdown() returns once every thread is joined, after which late answers
// of the core are dropped. The GrpcServer must outlive nothing here: what is shared is held.
class HttpServer {
 public:
  // Binds every address and starts serving. Throws std::runtime_error naming an address it could
  // not bind or a TLS setting it could not use.
  HttpServer(HttpServerOptions options, GrpcServer& grpc);
  ~HttpServer();  // shutdown(0) if not called
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port of each address, in order (0 for a Unix socket).
  const std::vector<int>& ports() const { return ports_; }
  // Connections open now. Thread-safe.
  size_t connections() const;

  // Stops accepting, lets requests in flight be answered for `grace_s` seconds, then closes every
  // connection and joins the threads. Blocks; idempotent.
  void shutdown(double grace_s);

 private:
  std::shared_ptr<HttpShared> shared_;
  std::vector<int> ports_;
  std::mutex shutdown_mutex_;
  bool shut_down_ = false;  // guarded by shutdown_mutex_
};

}  // namespace inferd
