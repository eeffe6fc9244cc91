#include "inferd/connection_listener.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "inferd/structured_log.h"

namespace inferd {
namespace {

constexpr std::string_view kUnixPrefix = "unix:";
constexpr std::string_view kFdPrefix = "fd:";
constexpr int kPauseMs = 100;
constexpr int64_t kWarningEveryMs = 10'000;

std::runtime_error bind_error(const std::string& address, const std::string& what, int error) {
  return std::runtime_error(address + ": " + std::strerror(error) + " (" + what + ")");
}

int listen_unix(const std::string& address) {
  const std::string path = address.substr(kUnixPrefix.size());
  sockaddr_un name{};
  name.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(name.sun_path)) {
    throw std::runtime_error(address + ": a Unix socket path of 1 to " + std::to_string(sizeof(name.sun_path) - 1) +
                             " bytes");
  }
  std::memcpy(name.sun_path, path.data(), path.size());
  struct stat existing{};
  // A socket file left by an earlier server is replaced, as grpc does; any other file is not.
  if (::lstat(path.c_str(), &existing) == 0 && S_ISSOCK(existing.st_mode)) ::unlink(path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw bind_error(address, "socket", errno);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&name), sizeof(name)) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    ::close(fd);
    throw bind_error(address, "bind", error);
  }
  return fd;
}

// Every address HOST resolves to, on one port (the first bound picks it when PORT is 0): as
// grpc, "localhost" listens on 127.0.0.1 and ::1, and "[::]" on both families.
std::vector<int> listen_tcp(const std::string& address, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error(address + ": expected HOST:PORT");
  std::string host = address.substr(0, colon);
  const std::string service = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    throw std::runtime_error(address + ": " + ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> results(found, &::freeaddrinfo);
  std::vector<int> fds;
  int first_error = 0;
  *port = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // never SO_REUSEPORT: a taken port fails
    sockaddr_storage bound{};
    std::memcpy(&bound, a->ai_addr, a->ai_addrlen);
    if (a->ai_family == AF_INET6) {
      auto* v6 = reinterpret_cast<sockaddr_in6*>(&bound);
      const int v6only = IN6_IS_ADDR_UNSPECIFIED(&v6->sin6_addr) ? 0 : 1;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
      if (*port != 0) v6->sin6_port = htons(static_cast<uint16_t>(*port));
    } else if (a->ai_family == AF_INET && *port != 0) {
      reinterpret_cast<sockaddr_in*>(&bound)->sin_port = htons(static_cast<uint16_t>(*port));
    }
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&bound), a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      if (first_error == 0) first_error = errno;
      ::close(fd);
      // With "[::]" dual-stack first, the IPv4 wildcard on the same port is already served.
      if (first_error == EADDRINUSE && !fds.empty()) first_error = 0;
      continue;
    }
    if (*port == 0) {
      sockaddr_storage name{};
      socklen_t length = sizeof(name);
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&name), &length);
      *port = ntohs(name.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&name)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&name)->sin_port);
    }
    fds.push_back(fd);
  }
  if (fds.empty() || first_error != 0) {
    for (const int fd : fds) ::close(fd);
    throw bind_error(address, "bind", first_error == 0 ? EADDRNOTAVAIL : first_error);
  }
  return fds;
}

// A sixteenth of a small limit, `reserve` of a large one (at least 16).
rlim_t reserve_for_limit(rlim_t limit, int reserve) {
  return std::clamp<rlim_t>(limit / 16, 16, static_cast<rlim_t>(std::max(reserve, 16)));
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void ConnectionDirectory::accepted(int fd, AcceptedConnection connection) {
  std::lock_guard<std::mutex> lock(mutex_);
  by_fd_[fd] = connection;
}

std::optional<AcceptedConnection> ConnectionDirectory::find(std::string_view peer) const {
  if (peer.substr(0, kFdPrefix.size()) != kFdPrefix) return std::nullopt;
  int fd = 0;
  for (const char c : peer.substr(kFdPrefix.size())) {
    if (c < '0' || c > '9' || fd > 100'000'000) return std::nullopt;
    fd = fd * 10 + (c - '0');
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = by_fd_.find(fd);
  if (found == by_fd_.end()) return std::nullopt;
  return found->second;
}

ConnectionListener::ConnectionListener(const std::vector<std::string>& addresses,
                                       std::shared_ptr<ConnectionDirectory> directory, int reserve)
    : directory_(std::move(directory)), reserve_(reserve) {
  try {
    for (const std::string& address : addresses) {
      if (address.rfind(std::string(kUnixPrefix), 0) == 0) {
        listening_.push_back({listen_unix(address), true});
        ports_.push_back(0);
        continue;
      }
      int port = 0;
      for (const int fd : listen_tcp(address, &port)) listening_.push_back({fd, false});
      ports_.push_back(port);
    }
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  } catch (...) {
    for (const Listening& l : listening_) ::close(l.fd);
    throw;
  }
}

ConnectionListener::~ConnectionListener() {
  stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void ConnectionListener::start(Handler handler) {
  handler_ = std::move(handler);
  thread_ = std::thread([this] { run(); });
}

void ConnectionListener::stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = ::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  // Closed here, not at destruction: a client connecting after the stop is refused, not left
  // waiting in a backlog nobody accepts from.
  for (Listening& l : listening_) {
    if (l.fd >= 0) ::close(l.fd);
    l.fd = -1;
  }
}

void ConnectionListener::run() {
  std::vector<pollfd> polled;
  polled.push_back({wake_fd_, POLLIN, 0});
  for (const Listening& l : listening_) polled.push_back({l.fd, POLLIN, 0});
  bool paused = false;
  while (true) {
    // While paused only the wake-up is watched, for kPauseMs: the listeners stay readable.
    const int ready = ::poll(polled.data(), paused ? 1 : polled.size(), paused ? kPauseMs : -1);
    if (ready < 0 && errno != EINTR) return;
    if (polled[0].revents != 0) return;  // stop()
    paused = false;
    for (size_t i = 1; i < polled.size() && !paused; ++i) {
      if (polled[i].revents != 0) paused = !accept_all(listening_[i - 1]);
    }
  }
}

bool ConnectionListener::accept_all(const Listening& listening) {
  bool near_limit = false;
  for (int accepted = 0; accepted < 64; ++accepted) {
    const int fd = ::accept4(listening.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return !near_limit;
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO || errno == EPERM) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        warn_paused(std::strerror(errno));
        return false;
      }
      warn_paused(std::strerror(errno));  // not expected: pause rather than spin on it
      return false;
    }
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
        static_cast<rlim_t>(fd) + reserve_for_limit(limit.rlim_cur, reserve_) >= limit.rlim_cur) {
      // Closed at once rather than left in the backlog: the client learns now, and may go elsewhere.
      ::close(fd);
      refused_.fetch_add(1, std::memory_order_relaxed);
      warn_paused("near the open-files limit (RLIMIT_NOFILE)");
      near_limit = true;
      continue;
    }
    AcceptedConnection connection;
    connection.unix_socket = listening.unix_socket;
    if (listening.unix_socket) {
      ucred peer{};
      socklen_t length = sizeof(peer);
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0) {
        connection.credentials = PeerCredentials{peer.pid, peer.uid, peer.gid};
      }
    } else {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    directory_->accepted(fd, connection);
    handler_(fd);
  }
  return !near_limit;
}

void ConnectionListener::warn_paused(const char* reason) {
  const int64_t now = now_ms();
  if (now - last_warning_ms_ < kWarningEveryMs) return;
  last_warning_ms_ = now;
  if (!core_logs(LogLevel::kWarning)) return;
  LogRecord("accepting connections paused", LogLevel::kWarning)
      .add("reason", reason)
      .add("refused_so_far", std::to_string(refused()))
      .add("resumes", "by itself, once connections close")
      .write();
}

}  // namespace inferd
