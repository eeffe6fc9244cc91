#pragma once

// What every connection and endpoint of one HttpServer reaches (see http_server.h). Held by
// shared_ptr: connections and the core's answers may outlive the HttpServer object.

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "inferd/connection_listener.h"
#include "inferd/grpc_access.h"
#include "inferd/grpc_calls.h"
#include "inferd/http_server.h"

namespace inferd {

// A connection, as the server sees it to close it at shutdown.
class HttpConnection {
 public:
  virtual ~HttpConnection() = default;
  // Closes the connection once its request in flight (if any) is answered; at once when idle.
  // Thread-safe.
  virtual void close_when_idle() = 0;
  // Closes it now. Thread-safe.
  virtual void close_now() = 0;
};

// Invariants: `io` runs on `threads` until shutdown; after `closed` is set nothing more is
// posted to it (post() drops the handler), so the core's late answers never reach a stopped
// context. Connections register while open, under connections_mutex.
struct HttpShared {
  HttpShared(HttpServerOptions options_in, std::shared_ptr<TransportContext> transport_in)
      : options(std::move(options_in)),
        transport(std::move(transport_in)),
        access(access_options(options, *transport)) {}

  const HttpServerOptions options;
  const std::shared_ptr<TransportContext> transport;
  const AccessPolicy access;
  boost::asio::io_context io;
  // Keeps `threads` running while no connection has work; reset at shutdown, so that run()
  // returns once every handler already posted (the connections' closes among them) has run.
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::optional<boost::asio::ssl::context> tls;  // set when use_ssl or use_ssl_mutual
  std::vector<std::thread> threads;
  std::unique_ptr<ConnectionListener> listener;

  // Runs `handler` on `executor` (a connection's strand) unless the server has shut down.
  template <class Executor, class Handler>
  void post(const Executor& executor, Handler&& handler) {
    std::lock_guard<std::mutex> lock(post_mutex_);
    if (closed_) return;
    boost::asio::post(executor, std::forward<Handler>(handler));
  }
  // After this, post() drops every handler.
  void close() {
    std::lock_guard<std::mutex> lock(post_mutex_);
    closed_ = true;
  }
  bool closing() const { return closing_.load(std::memory_order_acquire); }
  void begin_closing() { closing_.store(true, std::memory_order_release); }

  // The open connections. `add` refuses past max_connections.
  bool add(HttpConnection* connection, std::weak_ptr<HttpConnection> handle);
  void remove(HttpConnection* connection);
  std::vector<std::shared_ptr<HttpConnection>> open_connections() const;
  size_t connection_count() const;

  // The shared-memory registry a request on this connection may use (null: none).
  const SharedMemoryRegistry* shared_memory_for(bool unix_socket) const {
    if (!unix_socket && !transport->shared_memory_on_tcp) return nullptr;
    return transport->shared_memory.get();
  }

 private:
  static AccessOptions access_options(const HttpServerOptions& options, const TransportContext& transport) {
    AccessOptions access = options.access;
    access.shared_memory_on_tcp = transport.shared_memory_on_tcp;
    return access;
  }

  std::mutex post_mutex_;
  bool closed_ = false;  // guarded by post_mutex_
  std::atomic<bool> closing_{false};
  mutable std::mutex connections_mutex_;
  std::unordered_map<HttpConnection*, std::weak_ptr<HttpConnection>> connections_;  // guarded by connections_mutex_
};

// Serves the connection on descriptor `fd`, which it owns from now on (http_session.cpp): TCP or
// Unix socket as `accepted` says, TLS when the shared context has it and the socket is TCP.
void serve_http_connection(const std::shared_ptr<HttpShared>& shared, int fd, const AcceptedConnection& accepted);

}  // namespace inferd
