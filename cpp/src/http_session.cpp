// One HTTP/1.1 connection of the core's HTTP server: Beast reads each request (its parser, within
// the server's limits), the endpoint answers it (http_routes.h), and the answer is written back on
// the connection's strand; keep-alive connections then read the next request.

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "http_encoding.h"
#include "http_exchange.h"
#include "http_routes.h"
#include "http_shared.h"
#include "inferd/http_infer_codec.h"

namespace inferd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using unix_protocol = asio::local::stream_protocol;

using TcpStream = beast::tcp_stream;
using UnixStream = beast::basic_stream<unix_protocol>;
using TlsStream = asio::ssl::stream<beast::tcp_stream>;

template <class Stream>
constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

// The error a chunked body's chunk-header callback sets past max_chunks.
const beast::error_code& too_many_chunks() {
  static const beast::error_code code = asio::error::make_error_code(asio::error::message_size);
  return code;
}

HttpMethod method_of(http::verb verb) {
  switch (verb) {
    case http::verb::get:
      return HttpMethod::kGet;
    case http::verb::post:
      return HttpMethod::kPost;
    default:
      return HttpMethod::kOther;
  }
}

// One connection. Its handlers run on its strand (the stream's executor); answer() and the event
// calls may come from any thread and are posted there.
//
// Invariants: at most one request is read or answered at a time (HTTP/1.1 without pipelining:
// the next request is read once the answer is written); `in_flight_` is true from a request's
// last byte until its answer is written; writes go out in order, one at a time (`outbox_`).
// Strand-only state is everything but the constructor's arguments.
template <class Stream>
class Session final : public HttpConnection,
                      public HttpResponder,
                      public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(std::shared_ptr<HttpShared> shared, Stream stream, bool unix_socket,
          std::optional<PeerCredentials> credentials)
      : shared_(std::move(shared)), stream_(std::move(stream)), unix_socket_(unix_socket), credentials_(credentials) {
    // The last chunk (size 0) only ends the body: it is not counted.
    chunk_counter_ = [this](std::uint64_t size, beast::string_view, beast::error_code& ec) {
      if (size > 0 && ++chunks_ > shared_->options.max_chunks) ec = too_many_chunks();
    };
  }
  ~Session() override { shared_->remove(this); }

  void start() {
    if constexpr (kTls<Stream>) {
      lowest().expires_after(ms(shared_->options.header_timeout_ms));
      stream_.async_handshake(asio::ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
        if (ec) return self->close();
        self->read_next();
      });
    } else {
      read_next();
    }
  }

  // --- HttpConnection -------------------------------------------------------------------------
  void close_when_idle() override {
    asio::post(stream_.get_executor(), [self = this->shared_from_this()] {
      if (!self->in_flight_) self->close();
    });
  }
  void close_now() override {
    asio::post(stream_.get_executor(), [self = this->shared_from_this()] { self->close(); });
  }

  // --- HttpResponder --------------------------------------------------------------------------
  void answer(HttpAnswer answer) override {
    shared_->post(stream_.get_executor(), [self = this->shared_from_this(), answer = std::move(answer)]() mutable {
      self->write_answer(std::move(answer), /*close_after=*/false);
    });
  }
  void start_events() override {
    shared_->post(stream_.get_executor(), [self = this->shared_from_this()] { self->write_event_head(); });
  }
  void event(std::string data) override {
    shared_->post(stream_.get_executor(), [self = this->shared_from_this(), data = std::move(data)] {
      self->queue_chunk("data: " + data + "\n\n");
    });
  }
  void when_gone(std::function<void()> callback) override { gone_ = std::move(callback); }
  void end_events() override {
    shared_->post(stream_.get_executor(), [self = this->shared_from_this()] {
      self->events_ended_ = true;
      self->queue_raw("0\r\n\r\n");
    });
  }

 private:
  static std::chrono::milliseconds ms(int value) { return std::chrono::milliseconds(std::max(value, 1)); }
  auto& lowest() { return beast::get_lowest_layer(stream_); }

  // Waits for the next request's first byte (the idle timeout), then reads its header.
  void read_next() {
    if (shared_->closing()) return close();
    parser_.emplace();
    parser_->header_limit(shared_->options.max_header_bytes);
    parser_->body_limit(shared_->options.max_body_bytes);
    chunks_ = 0;
    parser_->on_chunk_header(chunk_counter_);
    if (buffer_.size() > 0) return read_header();
    lowest().expires_after(ms(shared_->options.idle_timeout_ms));
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = this->shared_from_this()](beast::error_code ec, size_t bytes) {
                              if (ec) return self->close();  // closed, idle too long, or shut down
                              self->buffer_.commit(bytes);
                              self->read_header();
                            });
  }

  // The header timeout is this session's own timer, not the stream's: the stream's closes the
  // socket when it fires, and a client whose request stalled is owed a 408 first. When it fires,
  // the read in progress is cancelled (it completes with operation_aborted) and refuse_read
  // answers.
  void arm_deadline() {
    lowest().expires_never();
    timed_out_ = false;
    deadline_.expires_after(ms(shared_->options.header_timeout_ms));
    deadline_.async_wait([self = this->shared_from_this()](beast::error_code ec) {
      if (ec) return;  // cancelled: the read finished in time
      self->timed_out_ = true;
      beast::error_code ignored;
      self->lowest().socket().cancel(ignored);
    });
  }

  void read_header() {
    arm_deadline();
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              self->deadline_.cancel();
                              self->on_header(ec);
                            });
  }

  void on_header(beast::error_code ec) {
    if (ec) return refuse_read(ec);
    const auto& header = parser_->get();
    if (const boost::optional<std::uint64_t> length = parser_->content_length();
        length && *length > shared_->options.max_body_bytes) {
      return refuse(413, "the request body of " + std::to_string(*length) +
                             " bytes is larger than --http-max-body-bytes (" +
                             std::to_string(shared_->options.max_body_bytes) + ")");
    }
    auto expect = header.find(http::field::expect);
    if (expect != header.end() && beast::iequals(expect->value(), "100-continue")) {
      // curl waits for this before it sends a large body.
      auto head = std::make_shared<http::response<http::empty_body>>(http::status::continue_, header.version());
      lowest().expires_after(ms(shared_->options.header_timeout_ms));
      http::async_write(stream_, *head, [self = this->shared_from_this(), head](beast::error_code write_ec, size_t) {
        if (write_ec) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  // Reads the body a piece at a time: each read must progress within the header timeout.
  void read_body() {
    if (parser_->is_done()) return on_request();
    arm_deadline();
    http::async_read_some(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->deadline_.cancel();
      if (ec) return self->refuse_read(ec);
      self->read_body();
    });
  }

  // A request that could not be read whole: answered (when the client can still read) and closed.
  void refuse_read(beast::error_code ec) {
    const HttpServerOptions& options = shared_->options;
    if (timed_out_) {
      timed_out_ = false;
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%g", options.header_timeout_ms / 1000.0);
      return refuse(408,
                    std::string("the request did not arrive within --http-header-timeout-secs (") + seconds + " s)");
    }
    if (ec == http::error::header_limit) {
      return refuse(431, "the request's headers are larger than --http-max-header-bytes (" +
                             std::to_string(options.max_header_bytes) + ")");
    }
    if (ec == http::error::body_limit) {
      return refuse(413, "the request body is larger than --http-max-body-bytes (" +
                             std::to_string(options.max_body_bytes) + ")");
    }
    if (ec == too_many_chunks()) {
      return refuse(413, "the request body comes in more than --http-max-chunks (" +
                             std::to_string(options.max_chunks) + ") chunks");
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || ec == http::error::partial_message) {
      return close();
    }
    refuse(400, "malformed HTTP request: " + ec.message());
  }

  void refuse(unsigned status, const std::string& message) {
    HttpAnswer answer;
    answer.status = status;
    answer.body = http_error_body(message);
    in_flight_ = true;
    write_answer(std::move(answer), /*close_after=*/true);
  }

  void on_request() {
    lowest().expires_never();
    http::request<http::string_body> message = parser_->release();
    parser_.reset();
    keep_alive_ = message.keep_alive();
    version_ = message.version();
    HttpRequest request;
    request.method = method_of(message.method());
    request.target = std::string(message.target());
    request.headers.reserve(static_cast<size_t>(std::distance(message.begin(), message.end())));
    for (const auto& field : message) {
      std::string name(field.name_string());
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      request.headers.emplace_back(std::move(name), std::string(field.value()));
    }
    accept_encoding_ = std::string(request.header("accept-encoding").value_or(""));
    request.unix_socket = unix_socket_;
    request.credentials = credentials_;
    in_flight_ = true;
    HttpEncoding encoding = HttpEncoding::kIdentity;
    if (!parse_content_encoding(request.header("content-encoding").value_or(""), &encoding)) {
      HttpAnswer refused;
      refused.status = 415;
      refused.body =
          http_error_body("unsupported Content-Encoding '" + std::string(*request.header("content-encoding")) +
                          "' (gzip, deflate or identity)");
      return write_answer(std::move(refused), false);
    }
    std::string& body = message.body();
    if (!shared_->transport->inflight->reserve(body.size(), &request.reservation)) {
      return write_answer(over_budget_answer(body.size()), false);
    }
    if (encoding != HttpEncoding::kIdentity) {
      std::string inflated;
      const Status status = inflate_body(encoding, body, shared_->options.max_decompressed_bytes, &inflated);
      if (!status.ok()) {
        HttpAnswer refused;
        refused.status = status.code == StatusCode::kResourceExhausted ? 413 : 400;
        refused.body = http_error_body(status.message);
        return write_answer(std::move(refused), false);
      }
      ByteReservation inflated_reservation;
      if (!shared_->transport->inflight->reserve(inflated.size(), &inflated_reservation)) {
        return write_answer(over_budget_answer(inflated.size()), false);
      }
      request.reservation = std::move(inflated_reservation);  // the compressed body goes now
      body = std::move(inflated);
    }
    *request.body = std::move(body);
    handle_http_request(shared_, std::move(request), this->shared_from_this());
  }

  HttpAnswer over_budget_answer(size_t bytes) const {
    HttpAnswer answer;
    answer.status = 429;
    answer.body = http_error_body("the server holds too many request bytes to take this request's " +
                                  std::to_string(bytes) + " (--max-inflight-bytes " +
                                  std::to_string(shared_->transport->inflight->limit()) + "); retry later");
    return answer;
  }

  void write_answer(HttpAnswer answer, bool close_after) {
    if (!in_flight_ || events_started_) return;  // answered already (a stray second answer is dropped)
    auto response = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(answer.status),
                                                                        version_ == 0 ? 11 : version_);
    response->set(http::field::server, "inferd");
    if (!answer.content_type.empty()) response->set(http::field::content_type, answer.content_type);
    if (answer.inference_header_length) {
      response->set("Inference-Header-Content-Length", std::to_string(*answer.inference_header_length));
    }
    const HttpEncoding encoding =
        answer.compressible ? choose_answer_encoding(accept_encoding_) : HttpEncoding::kIdentity;
    std::string compressed;
    if (encoding != HttpEncoding::kIdentity && !answer.body.empty() &&
        deflate_body(encoding, answer.body, &compressed)) {
      response->set(http::field::content_encoding, encoding_name(encoding));
      response->body() = std::move(compressed);
    } else {
      response->body() = std::move(answer.body);
    }
    close_after_ = close_after || !keep_alive_ || shared_->closing();
    response->keep_alive(!close_after_);
    response->prepare_payload();
    lowest().expires_after(ms(shared_->options.idle_timeout_ms));  // a client that does not read
    gone_ = nullptr;  // answered: what happens to the connection now is no news to the request
    http::async_write(stream_, *response, [self = this->shared_from_this(), response](beast::error_code ec, size_t) {
      self->in_flight_ = false;
      if (ec || self->close_after_) return self->close();
      self->read_next();
    });
  }

  // Server-Sent Events: a chunked 200 answer whose chunks are events.
  void write_event_head() {
    if (!in_flight_ || events_started_) return;
    events_started_ = true;
    std::string head =
        "HTTP/1.1 200 OK\r\nServer: inferd\r\nContent-Type: text/event-stream\r\nCache-Control: "
        "no-cache\r\nTransfer-Encoding: chunked\r\n";
    head += keep_alive_ && !shared_->closing() ? "\r\n" : "Connection: close\r\n\r\n";
    close_after_ = !keep_alive_ || shared_->closing();
    queue_raw(std::move(head));
  }
  void queue_chunk(const std::string& data) {
    char size[20];
    const int n = std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    queue_raw(std::string(size, static_cast<size_t>(n)) + data + "\r\n");
  }
  void queue_raw(std::string bytes) {
    if (!events_started_ || closed_) return;
    outbox_bytes_ += bytes.size();
    if (outbox_bytes_ > max_outbox_bytes()) return close();  // a client that does not read its events
    outbox_.push_back(std::move(bytes));
    if (outbox_.size() == 1) write_outbox();
  }
  void write_outbox() {
    lowest().expires_after(ms(shared_->options.idle_timeout_ms));
    asio::async_write(stream_, asio::buffer(outbox_.front()),
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) {
                          self->outbox_.clear();
                          return self->close();
                        }
                        self->outbox_bytes_ -= self->outbox_.front().size();
                        self->outbox_.pop_front();
                        if (!self->outbox_.empty()) return self->write_outbox();
                        if (!self->events_ended_) return;
                        self->events_started_ = false;
                        self->events_ended_ = false;
                        self->in_flight_ = false;
                        self->gone_ = nullptr;
                        if (self->close_after_) return self->close();
                        self->read_next();
                      });
  }

  // Event bytes a connection may hold unsent: the gRPC stream's bound (--stream-max-pending-bytes).
  uint64_t max_outbox_bytes() const {
    const uint64_t limit = shared_->transport->max_stream_pending_bytes;
    return limit == 0 ? UINT64_MAX : limit;
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    if (gone_) std::exchange(gone_, nullptr)();
    deadline_.cancel();
    beast::error_code ignored;
    lowest().socket().shutdown(asio::socket_base::shutdown_both, ignored);
    lowest().close();
  }

  const std::shared_ptr<HttpShared> shared_;
  Stream stream_;
  asio::steady_timer deadline_{stream_.get_executor()};  // a request's header and body reads
  bool timed_out_ = false;                               // deadline_ fired: the read was cancelled for it
  const bool unix_socket_;
  const std::optional<PeerCredentials> credentials_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::function<void(std::uint64_t, beast::string_view, beast::error_code&)> chunk_counter_;
  uint64_t chunks_ = 0;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool in_flight_ = false;
  bool close_after_ = false;
  bool closed_ = false;
  bool events_started_ = false;
  bool events_ended_ = false;
  std::string accept_encoding_;
  std::deque<std::string> outbox_;  // event bytes to write, in order
  uint64_t outbox_bytes_ = 0;
  std::function<void()> gone_;  // the request in flight's, until it is answered
};

template <class Stream>
void start_session(const std::shared_ptr<HttpShared>& shared, Stream stream, const AcceptedConnection& accepted) {
  auto session =
      std::make_shared<Session<Stream>>(shared, std::move(stream), accepted.unix_socket, accepted.credentials);
  shared->add(session.get(), session);
  session->start();
}

int socket_family(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return AF_UNSPEC;
  return address.ss_family;
}

}  // namespace

void serve_http_connection(const std::shared_ptr<HttpShared>& shared, int fd, const AcceptedConnection& accepted) {
  beast::error_code ec;
  if (accepted.unix_socket) {
    UnixStream stream(asio::make_strand(shared->io));
    stream.socket().assign(unix_protocol(), fd, ec);
    if (ec) return static_cast<void>(::close(fd));
    return start_session(shared, std::move(stream), accepted);
  }
  const tcp protocol = socket_family(fd) == AF_INET6 ? tcp::v6() : tcp::v4();
  if (shared->tls) {
    TlsStream stream(asio::make_strand(shared->io), *shared->tls);
    beast::get_lowest_layer(stream).socket().assign(protocol, fd, ec);
    if (ec) return static_cast<void>(::close(fd));
    beast::get_lowest_layer(stream).socket().set_option(tcp::no_delay(true), ec);
    return start_session(shared, std::move(stream), accepted);
  }
  TcpStream stream(asio::make_strand(shared->io));
  stream.socket().assign(protocol, fd, ec);
  if (ec) return static_cast<void>(::close(fd));
  stream.socket().set_option(tcp::no_delay(true), ec);  // an answer goes out at once, not after the next ack
  start_session(shared, std::move(stream), accepted);
}

}  // namespace inferd
