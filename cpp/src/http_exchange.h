#pragma once

// One HTTP request as a connection hands it to its endpoint (http_routes.h), and the one way an
// endpoint answers it (HttpResponder): what the HTTP transport's parts pass between them.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferd/grpc_inflight_budget.h"
#include "inferd/peer_credentials.h"

namespace inferd {

enum class HttpMethod { kGet, kPost, kOther };

// A request read in full: its body inflated when it came compressed.
struct HttpRequest {
  HttpMethod method = HttpMethod::kOther;
  std::string target;                                        // as sent: path and query
  std::vector<std::pair<std::string, std::string>> headers;  // names lowercased, in order
  std::shared_ptr<std::string> body = std::make_shared<std::string>();
  ByteReservation reservation;  // the body's bytes in the in-flight budget, until answered
  bool unix_socket = false;
  std::optional<PeerCredentials> credentials;  // the peer's, on the Unix socket

  // The last header named `name` (lowercase), or nullopt.
  std::optional<std::string_view> header(std::string_view name) const {
    std::optional<std::string_view> found;
    for (const auto& [key, value] : headers)
      if (key == name) found = value;
    return found;
  }
};

// An answer: a status and a body (JSON unless content_type says otherwise; an empty body has no
// type). `inference_header_length`: the JSON's length when a binary section follows it (Triton's
// Inference-Header-Content-Length).
struct HttpAnswer {
  unsigned status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::optional<size_t> inference_header_length;
  // Compressed when the client's Accept-Encoding asks: inference answers only, as Triton (a
  // client such as aiohttp asks on every request, and reads metadata uncompressed).
  bool compressible = false;

  static HttpAnswer empty(unsigned status) {
    HttpAnswer answer;
    answer.status = status;
    answer.content_type.clear();
    return answer;
  }
};

// Where an endpoint answers its request: exactly once, from any thread, never blocking (the
// connection writes it on its own strand). Server-Sent Events instead: start_events() once, any
// number of event() calls, then end_events(); each is written in the order called.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void answer(HttpAnswer answer) = 0;
  virtual void start_events() = 0;
  // One event's data (a JSON object, on one line): written as "data: <json>\n\n".
  virtual void event(std::string data) = 0;
  virtual void end_events() = 0;
  // `callback` runs (once, on the connection's strand) if the connection closes before this
  // request's answer is written: the client went away, or stopped reading its events. Set on the
  // strand that handles the request (the endpoint's own thread), before anything is answered.
  virtual void when_gone(std::function<void()> callback) = 0;
};

}  // namespace inferd
