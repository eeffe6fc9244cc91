#include "inferd/http_server.h"

#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "http_shared.h"
#include "inferd/grpc_server.h"
#include "inferd/http_infer_codec.h"

namespace inferd {

bool HttpShared::add(HttpConnection* connection, std::weak_ptr<HttpConnection> handle) {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  connections_.emplace(connection, std::move(handle));
  return true;
}

void HttpShared::remove(HttpConnection* connection) {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  connections_.erase(connection);
}

std::vector<std::shared_ptr<HttpConnection>> HttpShared::open_connections() const {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  std::vector<std::shared_ptr<HttpConnection>> open;
  for (const auto& [raw, handle] : connections_)
    if (std::shared_ptr<HttpConnection> connection = handle.lock()) open.push_back(std::move(connection));
  return open;
}

size_t HttpShared::connection_count() const {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  return connections_.size();
}

namespace {

void check_tls(const HttpServerOptions& options) {
  const bool ssl = options.use_ssl || options.use_ssl_mutual;
  if (ssl && (options.server_cert_pem.empty() || options.server_key_pem.empty())) {
    throw std::runtime_error("TLS on HTTP (--http-use-ssl) needs the server's certificate and key");
  }
  if (options.use_ssl_mutual && options.root_cert_pem.empty()) {
    throw std::runtime_error("mutual TLS on HTTP needs the clients' CA (root certificate)");
  }
}

boost::asio::ssl::context tls_context(const HttpServerOptions& options) {
  namespace ssl = boost::asio::ssl;
  ssl::context context(ssl::context::tls_server);
  context.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                      ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  try {
    context.use_certificate_chain(boost::asio::buffer(options.server_cert_pem));
    context.use_private_key(boost::asio::buffer(options.server_key_pem), ssl::context::pem);
    if (options.use_ssl_mutual) {
      context.add_certificate_authority(boost::asio::buffer(options.root_cert_pem));
      context.set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    }
  } catch (const boost::system::system_error& e) {
    throw std::runtime_error(std::string("cannot use the TLS certificate or key for HTTP: ") + e.what());
  }
  return context;
}

// Answers a connection past max_connections without reading it: 429 naming the limit, then closed.
void refuse_connection(int fd, const AcceptedConnection& accepted, bool tls, size_t limit) {
  if (!tls || accepted.unix_socket) {
    const std::string body = http_error_body("the server has --http-max-connections (" + std::to_string(limit) +
                                             ") connections open; retry later");
    const std::string answer =
        "HTTP/1.1 429 Too Many Requests\r\nServer: inferd\r\nContent-Type: "
        "application/json\r\nConnection: close\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    [[maybe_unused]] const ssize_t sent = ::send(fd, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  ::close(fd);
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, GrpcServer& grpc) {
  check_tls(options);
  shared_ = std::make_shared<HttpShared>(std::move(options), grpc.transport());
  const HttpServerOptions& o = shared_->options;
  const bool tls = o.use_ssl || o.use_ssl_mutual;
  if (tls) shared_->tls.emplace(tls_context(o));
  auto directory = std::make_shared<ConnectionDirectory>();
  try {
    shared_->listener = std::make_unique<ConnectionListener>(o.addresses, directory, o.reserved_descriptors);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("cannot serve HTTP on ") + e.what());
  }
  ports_ = shared_->listener->ports();
  shared_->work.emplace(boost::asio::make_work_guard(shared_->io));
  const int threads = std::max(1, o.threads);
  for (int i = 0; i < threads; ++i) {
    // The thread holds the context by reference only: shutdown() joins it before anything goes.
    shared_->threads.emplace_back([io = &shared_->io] {
      pthread_setname_np(pthread_self(), "inferd-http");  // what top and the benchmarks show
      io->run();
    });
  }
  std::weak_ptr<HttpShared> weak = shared_;
  shared_->listener->start([weak, directory, tls](int fd) {
    const std::shared_ptr<HttpShared> shared = weak.lock();
    const std::optional<AcceptedConnection> accepted = directory->find("fd:" + std::to_string(fd));
    if (shared == nullptr || !accepted || shared->closing()) {
      ::close(fd);
      return;
    }
    if (shared->connection_count() >= shared->options.max_connections) {
      return refuse_connection(fd, *accepted, tls, shared->options.max_connections);
    }
    serve_http_connection(shared, fd, *accepted);
  });
}

HttpServer::~HttpServer() { shutdown(0); }

size_t HttpServer::connections() const { return shared_->connection_count(); }

void HttpServer::shutdown(double grace_s) {
  std::lock_guard<std::mutex> lock(shutdown_mutex_);
  if (shut_down_) return;
  shut_down_ = true;
  shared_->listener->stop();
  shared_->begin_closing();
  for (const auto& connection : shared_->open_connections()) connection->close_when_idle();
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s < 0 ? 0 : grace_s);
  while (shared_->connection_count() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (const auto& connection : shared_->open_connections()) connection->close_now();
  shared_->close();       // the core's late answers are dropped from now on
  shared_->work.reset();  // run() returns once the closes have run and no operation is left
  for (std::thread& thread : shared_->threads) thread.join();
  shared_->threads.clear();
}

}  // namespace inferd
