#include "inferd/grpc_server.h"

#include <grpc/grpc.h>
#include <grpc/support/log.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_posix.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "inferd/grpc_calls.h"

namespace inferd {

void FailureCounts::count(const std::string& model, const std::string& version, StatusCode code,
                          const std::string& protocol) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counts_[{model, version, static_cast<int>(code), protocol}];
}

std::vector<std::tuple<std::string, std::string, int, std::string, uint64_t>> FailureCounts::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::tuple<std::string, std::string, int, std::string, uint64_t>> out;
  for (const auto& [key, count] : counts_)
    out.emplace_back(std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key), count);
  return out;
}

namespace {

// A call the access policy refused: answered with its status at once, its messages never read.
// Deletes itself when grpc is done with it.
class RefusedCall final : public grpc::ServerGenericBidiReactor {
 public:
  explicit RefusedCall(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

// The one service: every call, whatever its method, passes the access policy, then gets the
// reactor create_call picks.
class GrpcServer::Service final : public grpc::CallbackGenericService {
 public:
  Service(std::shared_ptr<TransportContext> transport, AccessOptions access)
      : transport_(std::move(transport)), access_(std::move(access)) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    // A connection the core accepted is "fd:N" to grpc: the policy reads "unix:" for the socket.
    const grpc::Status allowed =
        access_.check(context->method(), transport_->on_unix_socket(*context) ? "unix:" : context->peer(),
                      context->client_metadata());
    // Raw new: grpc's callback API takes a reactor that deletes itself.
    if (!allowed.ok()) return new RefusedCall(allowed);
    return create_call(context, transport_);
  }

 private:
  const std::shared_ptr<TransportContext> transport_;
  const AccessPolicy access_;
};

namespace {

bool is_unix(const std::string& address) { return address.rfind("unix:", 0) == 0; }

// grpc tells why it could not bind a port only in its log (BuildAndStart just returns no server),
// as a multi-line record on stderr. While a server starts, this keeps grpc's log records instead,
// so that the start-up error can carry the reason in one line; a server that starts writes them to
// the log after all (replay). The log function is process-wide: one capture at a time.
// Invariants: grpc's default log function is back once release() or the destructor has run.
class StartupLogCapture {
 public:
  struct Record {
    std::string file;
    int line;
    gpr_log_severity severity;
    std::string message;
  };

  StartupLogCapture() : lock_(capture_mutex()) {
    kept().clear();
    gpr_set_log_function(&keep);
  }
  ~StartupLogCapture() { gpr_set_log_function(nullptr); }  // nullptr: grpc's default
  StartupLogCapture(const StartupLogCapture&) = delete;
  StartupLogCapture& operator=(const StartupLogCapture&) = delete;

  // Restores grpc's log function and returns the records kept.
  std::vector<Record> release() {
    gpr_set_log_function(nullptr);
    std::lock_guard<std::mutex> lock(kept_mutex());
    return std::move(kept());
  }

  // The operating system's reason in grpc's records (e.g. "Address already in use"), or "".
  static std::string os_error(const std::vector<Record>& records) {
    static const std::string key = "os_error:\"";
    for (const Record& r : records) {
      const size_t at = r.message.find(key);
      const size_t end = at == std::string::npos ? at : r.message.find('"', at + key.size());
      if (end != std::string::npos) return r.message.substr(at + key.size(), end - at - key.size());
    }
    return "";
  }

  static void replay(const std::vector<Record>& records) {
    for (const Record& r : records) gpr_log_message(r.file.c_str(), r.line, r.severity, r.message.c_str());
  }

 private:
  static std::mutex& capture_mutex() {
    static std::mutex m;
    return m;
  }
  static std::mutex& kept_mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<Record>& kept() {  // guarded by kept_mutex()
    static std::vector<Record> records;
    return records;
  }
  static void keep(gpr_log_func_args* args) {
    std::lock_guard<std::mutex> lock(kept_mutex());
    kept().push_back({args->file == nullptr ? "" : args->file, args->line, args->severity,
                      args->message == nullptr ? "" : args->message});
  }
  std::lock_guard<std::mutex> lock_;
};

std::shared_ptr<grpc::ServerCredentials> credentials(const GrpcServerOptions& options, const std::string& address) {
  if (is_unix(address) || !(options.use_ssl || options.use_ssl_mutual)) return grpc::InsecureServerCredentials();
  // As Triton: mutual TLS requires and verifies a client certificate; plain TLS asks for none.
  grpc::SslServerCredentialsOptions ssl(options.use_ssl_mutual
                                            ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                            : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_root_certs = options.root_cert_pem;
  ssl.pem_key_cert_pairs.push_back({options.server_key_pem, options.server_cert_pem});
  return grpc::SslServerCredentials(ssl);
}

// Settings that would serve something other than what the operator asked for are refused.
void check_tls(const GrpcServerOptions& options) {
  const bool ssl = options.use_ssl || options.use_ssl_mutual;
  if (ssl && (options.server_cert_pem.empty() || options.server_key_pem.empty())) {
    throw std::runtime_error("TLS (--grpc-use-ssl) needs --grpc-server-cert and --grpc-server-key");
  }
  if (options.use_ssl_mutual && options.root_cert_pem.empty()) {
    throw std::runtime_error("mutual TLS (--grpc-use-ssl-mutual) needs --grpc-root-cert, the clients' CA");
  }
  if (!ssl && !(options.server_cert_pem.empty() && options.server_key_pem.empty() && options.root_cert_pem.empty())) {
    throw std::runtime_error(
        "a TLS certificate or key is given but TLS is off: add --grpc-use-ssl (or --grpc-use-ssl-mutual)");
  }
}

}  // namespace

GrpcServer::GrpcServer(GrpcServerOptions options) : options_(std::move(options)) {
  check_tls(options_);
  grpc::ChannelArguments backend_args;
  backend_args.SetMaxReceiveMessageSize(-1);  // the caller's limits were applied on the way in
  backend_args.SetMaxSendMessageSize(-1);
  transport_ = std::make_shared<TransportContext>(options_.max_inflight_bytes);
  backend_channel_ =
      grpc::CreateCustomChannel(options_.backend_address, grpc::InsecureChannelCredentials(), backend_args);
  transport_->backend = std::make_unique<grpc::GenericStub>(backend_channel_);
  transport_->max_stream_outstanding = std::max<size_t>(1, options_.max_stream_outstanding);  // 0 would never read
  transport_->max_stream_pending_bytes = options_.max_stream_pending_bytes;
  transport_->shared_memory = options_.shared_memory;
  transport_->shared_memory_on_tcp = options_.shared_memory_on_tcp;
  AccessOptions access = options_.access;
  access.shared_memory_on_tcp = options_.shared_memory_on_tcp;
  service_ = std::make_unique<Service>(transport_, std::move(access));

  grpc::ServerBuilder builder;
  ports_.assign(options_.addresses.size(), 0);  // sized before: the builder writes through pointers
  const bool tls = options_.use_ssl || options_.use_ssl_mutual;
  std::vector<std::string> plaintext;  // the listener's, in order
  for (size_t i = 0; i < options_.addresses.size(); ++i) {
    if (tls && !is_unix(options_.addresses[i])) {
      builder.AddListeningPort(options_.addresses[i], credentials(options_, options_.addresses[i]), &ports_[i]);
    } else {
      plaintext.push_back(options_.addresses[i]);
    }
  }
  try {
    listener_ = std::make_unique<ConnectionListener>(plaintext, transport_->connections, options_.reserved_descriptors);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("cannot serve gRPC on ") + e.what());
  }
  for (size_t i = 0, next = 0; i < options_.addresses.size(); ++i) {
    if (!(tls && !is_unix(options_.addresses[i]))) ports_[i] = listener_->ports()[next++];
  }
  // A handshake gets no longer than an idle connection would be kept.
  int handshake_ms = options_.handshake_timeout_ms;
  if (options_.max_connection_idle_ms > 0 && (handshake_ms <= 0 || options_.max_connection_idle_ms < handshake_ms)) {
    handshake_ms = options_.max_connection_idle_ms;
  }
  if (tls && handshake_ms > 0) builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, handshake_ms);
  if (options_.max_message_bytes >= 0) {
    builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
    builder.SetMaxSendMessageSize(options_.max_message_bytes);
  }
  if (options_.keepalive_time_ms > 0)
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options_.keepalive_time_ms);
  if (options_.keepalive_timeout_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options_.keepalive_timeout_ms);
  }
  if (options_.max_connection_idle_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, options_.max_connection_idle_ms);
  }
  if (options_.max_concurrent_streams > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options_.max_concurrent_streams);
  }
  // A second server on a port already taken must fail, not share it: grpc sets SO_REUSEPORT by default.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterCallbackGenericService(service_.get());
  std::vector<StartupLogCapture::Record> startup_log;
  {
    StartupLogCapture capture;
    server_ = builder.BuildAndStart();
    startup_log = capture.release();
  }
  std::string failed;
  for (size_t i = 0; i < options_.addresses.size(); ++i) {
    if (ports_[i] == 0 && !is_unix(options_.addresses[i]))
      failed += (failed.empty() ? "" : ", ") + options_.addresses[i];
  }
  if (!server_ || !failed.empty()) {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    std::string all;
    for (const std::string& a : options_.addresses) all += (all.empty() ? "" : ", ") + a;
    const std::string reason = StartupLogCapture::os_error(startup_log);
    throw std::runtime_error(
        "cannot serve gRPC on " + (failed.empty() ? all : failed) +
        (reason.empty() ? " (address in use, not permitted, or an unusable TLS certificate or key)" : ": " + reason));
  }
  StartupLogCapture::replay(startup_log);
  // grpc serves each accepted connection as if it had accepted it (its channel arguments apply).
  listener_->start([server = server_.get()](int fd) { grpc::AddInsecureChannelFromFd(server, fd); });
}

GrpcServer::~GrpcServer() { shutdown(0); }

ServingState& GrpcServer::state() { return transport_->state; }
FailureCounts& GrpcServer::failures() { return transport_->failures; }
std::shared_ptr<ObservationQueue> GrpcServer::observations() const { return transport_->observations; }

void GrpcServer::shutdown(double grace_s) {
  std::lock_guard<std::mutex> lock(shutdown_mutex_);
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  listener_->stop();  // no connection is handed to a server shutting down
  const auto grace = std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::duration<double>(grace_s < 0 ? 0 : grace_s));
  server_->Shutdown(std::chrono::system_clock::now() + grace);  // returns once every call is done
  server_->Wait();
  // A call to the backend can outlive its caller's side: a forwarded call's backend side ends
  // after relaying the status, and each backend call's ClientContext holds the channel. Destroyed
  // last on a gRPC callback thread, the channel would release gRPC's callback completion queue
  // there, which joins its own thread and frees itself twice (grpc/grpc#32584). So the backend
  // calls end first (cancelled with their callers; 5 s at most), then the stub goes (no call can
  // start one now), and this server's reference is the channel's last.
  const auto released = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (backend_channel_.use_count() > 2 && std::chrono::steady_clock::now() < released) {  // this and the stub
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  transport_->backend.reset();
}

}  // namespace inferd
