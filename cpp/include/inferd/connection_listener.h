#pragma once

// The core accepts the connections of its plaintext listeners (TCP without TLS, the Unix socket)
// itself and hands each to grpc (AddInsecureChannelFromFd), instead of letting grpc listen:
// - grpc 1.51's listener stops for good on the first accept4 that fails with EMFILE, and a burst
//   of short connections reaches the limit (18,569 of 20,000 descriptors in 10 s of churn); this
//   one keeps descriptors in reserve and pauses instead, so it always recovers;
// - a connection on the Unix socket carries its peer's credentials (SO_PEERCRED), which grpc
//   does not expose: the shared-memory calls check them against the region's object.
// TLS listeners stay grpc's (it has no TLS for a descriptor it did not accept).

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "inferd/peer_credentials.h"

namespace inferd {

// A connection the core accepted itself.
struct AcceptedConnection {
  bool unix_socket = false;
  std::optional<PeerCredentials> credentials;  // on the Unix socket
};

// The connections ConnectionListener accepted, by descriptor: grpc names the peer of a call on
// such a connection "fd:N". A descriptor's entry is replaced when the number is reused by a new
// connection (a closed connection starts no call). Thread-safe; never blocks but on its mutex.
class ConnectionDirectory {
 public:
  void accepted(int fd, AcceptedConnection connection);
  // The connection of a call whose grpc peer is `peer`; nullopt for a peer grpc accepted itself
  // ("ipv4:...", "ipv6:...", "unix:...") or a descriptor never seen.
  std::optional<AcceptedConnection> find(std::string_view peer) const;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<int, AcceptedConnection> by_fd_;  // guarded by mutex_
};

// Accepts on plaintext listeners and hands each connection's descriptor to a handler (which owns
// it from then on), recording it in a ConnectionDirectory first.
//
// Descriptors: POSIX gives a new descriptor the lowest free number, so one numbered within the
// reserve of RLIMIT_NOFILE (`reserve`, or a sixteenth of a limit under 16 * `reserve`, at least
// 16) means the process is near its limit; that connection is closed at
// once (the client sees it closed, nothing is read), as are the others waiting (64 at most), and
// accepting pauses 100 ms, as it does when accept4 fails with EMFILE or ENFILE. The rest of the process (model files,
// python workers, the backend's socket, health checks on open connections) keeps its descriptors, and accepting resumes
// by itself once connections close. A record says so, at most once every 10 s.
//
// Invariants: every address is bound and listening once the constructor returns (it throws
// std::runtime_error naming one it cannot bind); one accept thread between start() and stop();
// stop() joins it and closes the listening sockets; the handler is called on that thread only.
class ConnectionListener {
 public:
  using Handler = std::function<void(int fd)>;

  // `addresses`: "HOST:PORT" (port 0 picks one) or "unix:PATH".
  ConnectionListener(const std::vector<std::string>& addresses, std::shared_ptr<ConnectionDirectory> directory,
                     int reserve);
  ~ConnectionListener();
  ConnectionListener(const ConnectionListener&) = delete;
  ConnectionListener& operator=(const ConnectionListener&) = delete;

  // The bound port of each address, in order (0 for a Unix socket).
  const std::vector<int>& ports() const { return ports_; }
  // Starts accepting. Not thread-safe; once.
  void start(Handler handler);
  // Stops accepting and joins the thread; idempotent. Blocks until the thread is gone.
  void stop();
  // Connections refused near the descriptor limit, so far. Thread-safe.
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  struct Listening {
    int fd;
    bool unix_socket;
  };
  void run();
  // Accepts what `listening` has waiting (64 at most); false when accepting must pause (near the
  // limit).
  bool accept_all(const Listening& listening);
  void warn_paused(const char* reason);

  const std::shared_ptr<ConnectionDirectory> directory_;
  const int reserve_;
  std::vector<Listening> listening_;
  std::vector<int> ports_;
  int wake_fd_ = -1;  // eventfd: stop() writes it
  Handler handler_;
  std::thread thread_;
  std::atomic<uint64_t> refused_{0};
  int64_t last_warning_ms_ = -1'000'000;  // the accept thread's own
};

}  // namespace inferd
