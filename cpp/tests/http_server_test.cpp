// The core's HTTP server (HttpServer) end to end: a GrpcServer (whose TransportContext it shares)
// with a routed add_one model computed in the core, an HttpServer beside it on 127.0.0.1:0 (or a
// Unix socket), and a client that writes HTTP/1.1 by hand on a POSIX socket, so that every byte
// the server sees and sends is the test's. No backend runs: nothing here is forwarded to Python.
// Every wait is bounded (kWait).
#include "inferd/http_server.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <rapidjson/document.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "http_encoding.h"
#include "inferd/completion_queue.h"
#include "inferd/executor.h"
#include "inferd/grpc_server.h"
#include "inferd/model_signature.h"
#include "inferd/pinned_buffer_pool.h"
#include "inferd/scheduler.h"
#include "inferd/serving_snapshot.h"

namespace inferd {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The bound on any wait for something that should happen promptly.
constexpr std::chrono::milliseconds kWait = 5s;

// --- a client on a plain socket ------------------------------------------------------------------

struct Response {
  std::string status_line;
  unsigned status = 0;
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;

  std::string header(const std::string& name) const {
    const auto found = headers.find(name);
    return found == headers.end() ? "<absent>" : found->second;
  }
};

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// One connection, written and read by hand. Not thread-safe.
class Client {
 public:
  static Client tcp(int port) {
    Client client(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(client.fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) client.close();
    return client;
  }
  static Client unix_socket(const std::string& path) {
    Client client(::socket(AF_UNIX, SOCK_STREAM, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    if (::connect(client.fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) client.close();
    return client;
  }
  Client(Client&& other) noexcept : fd_(std::exchange(other.fd_, -1)), buffer_(std::move(other.buffer_)) {}
  Client& operator=(Client&&) = delete;
  ~Client() { close(); }

  bool connected() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Writes all of `bytes`; false when the connection refuses them.
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t sent = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (sent < 0 && errno == EINTR) continue;
      if (sent <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(sent));
    }
    return true;
  }

  // The next response (its body by Content-Length, chunked, or until the close), or nullopt when
  // none arrives whole within `bound`.
  std::optional<Response> read_response(std::chrono::milliseconds bound = kWait) {
    const Clock::time_point until = Clock::now() + bound;
    size_t head_end;
    while ((head_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill(until)) return std::nullopt;
    }
    Response response;
    const std::string head = buffer_.substr(0, head_end);
    buffer_.erase(0, head_end + 4);
    size_t line_end = head.find("\r\n");
    response.status_line = head.substr(0, line_end);
    if (response.status_line.size() < 12) return std::nullopt;
    response.status = static_cast<unsigned>(std::stoul(response.status_line.substr(9, 3)));
    while (line_end != std::string::npos) {
      const size_t start = line_end + 2;
      line_end = head.find("\r\n", start);
      const std::string line = head.substr(start, line_end == std::string::npos ? std::string::npos : line_end - start);
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      response.headers[lowercase(line.substr(0, colon))] = value;
    }
    if (response.status / 100 == 1 || response.status == 204) return response;
    if (response.headers.count("content-length")) {
      const size_t length = std::stoul(response.headers["content-length"]);
      while (buffer_.size() < length) {
        if (!fill(until)) return std::nullopt;
      }
      response.body = buffer_.substr(0, length);
      buffer_.erase(0, length);
      return response;
    }
    if (lowercase(response.header("transfer-encoding")) == "chunked") {
      for (;;) {
        size_t size_end;
        while ((size_end = buffer_.find("\r\n")) == std::string::npos) {
          if (!fill(until)) return std::nullopt;
        }
        const size_t size = std::stoul(buffer_.substr(0, size_end), nullptr, 16);
        while (buffer_.size() < size_end + 2 + size + 2) {
          if (!fill(until)) return std::nullopt;
        }
        response.body += buffer_.substr(size_end + 2, size);
        buffer_.erase(0, size_end + 2 + size + 2);
        if (size == 0) return response;
      }
    }
    while (fill(until)) {
    }
    if (!eof_) return std::nullopt;
    response.body = std::move(buffer_);
    buffer_.clear();
    return response;
  }

  // True when the server closes the connection (end of stream or reset) within `bound` with
  // nothing more sent; false if bytes arrive or it stays open.
  bool closed_within(std::chrono::milliseconds bound = kWait) {
    const Clock::time_point until = Clock::now() + bound;
    const size_t had = buffer_.size();
    while (fill(until)) {
    }
    return eof_ && buffer_.size() == had;
  }

  const std::string& unread() const { return buffer_; }

 private:
  explicit Client(int fd) : fd_(fd) {}

  // Reads what arrives before `until` into buffer_; false at the end of stream, on an error or
  // when nothing arrived in time.
  bool fill(Clock::time_point until) {
    if (fd_ < 0 || eof_) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char chunk[65536];
    const ssize_t got = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (got <= 0) {
      eof_ = got == 0 || errno == ECONNRESET;
      return false;
    }
    buffer_.append(chunk, static_cast<size_t>(got));
    return true;
  }

  int fd_;
  std::string buffer_;
  bool eof_ = false;
};

std::string get(const std::string& path, const std::string& extra_headers = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: test\r\n" + extra_headers + "\r\n";
}
std::string post(const std::string& path, const std::string& body, const std::string& extra_headers = "") {
  return "POST " + path +
         " HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + extra_headers + "\r\n" + body;
}

// A v2 infer request of add_one's one row.
std::string infer_body(const std::vector<float>& row, const std::string& id = "") {
  std::string data;
  for (float v : row) data += (data.empty() ? "" : ",") + std::to_string(v);
  return std::string(R"({)") + (id.empty() ? "" : R"("id":")" + id + R"(",)") +
         R"("inputs":[{"name":"INPUT","datatype":"FP32","shape":[1,4],"data":[)" + data + "]}]}";
}

// The error message of a {"error": ...} body.
std::string error_of(const std::string& body) {
  rapidjson::Document document;
  document.Parse(body.data(), body.size());
  if (document.HasParseError() || !document.IsObject() || !document.HasMember("error") ||
      !document["error"].IsString()) {
    return "<not an error body: " + body + ">";
  }
  return document["error"].GetString();
}

// Checks an infer answer of add_one: one FP32 [1, 4] output, each value one more than `row`.
void expect_add_one_answer(const std::string& body, const std::vector<float>& row, const std::string& id = "") {
  rapidjson::Document answer;
  answer.Parse(body.data(), body.size());
  ASSERT_FALSE(answer.HasParseError()) << body;
  ASSERT_TRUE(answer.IsObject()) << body;
  for (const char* member : {"model_name", "model_version", "outputs"}) ASSERT_TRUE(answer.HasMember(member)) << body;
  EXPECT_STREQ(answer["model_name"].GetString(), "add_one");
  EXPECT_STREQ(answer["model_version"].GetString(), "1");
  if (!id.empty()) {
    ASSERT_TRUE(answer.HasMember("id")) << body;
    EXPECT_EQ(answer["id"].GetString(), id);
  }
  ASSERT_TRUE(answer["outputs"].IsArray()) << body;
  ASSERT_EQ(answer["outputs"].Size(), 1u) << body;
  const rapidjson::Value& output = answer["outputs"][0];
  EXPECT_STREQ(output["name"].GetString(), "OUTPUT");
  EXPECT_STREQ(output["datatype"].GetString(), "FP32");
  for (const char* member : {"name", "datatype", "shape", "data"}) ASSERT_TRUE(output.HasMember(member)) << body;
  ASSERT_EQ(output["shape"].Size(), 2u);
  EXPECT_EQ(output["shape"][0].GetInt64(), 1);
  EXPECT_EQ(output["shape"][1].GetInt64(), 4);
  ASSERT_EQ(output["data"].Size(), row.size()) << body;
  for (rapidjson::SizeType i = 0; i < output["data"].Size(); ++i) {
    EXPECT_EQ(output["data"][i].GetFloat(), row[i] + 1.0f) << body;
  }
}

// --- the model: output = input + 1, FP32 [batch, 4], behind a gate -------------------------------

// What the executor did, and a gate the test may close to hold it inside execute().
class Gate {
 public:
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = false;
  }
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  // In execute(): counts the batch, then waits (bounded) while the gate is closed.
  void enter() {
    std::unique_lock<std::mutex> lock(mutex_);
    ++entered_;
    changed_.notify_all();
    changed_.wait_for(lock, 10s, [&] { return open_; });
  }
  bool wait_entered(int n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, kWait, [&] { return entered_ >= n; });
  }
  int entered() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return entered_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = true;
  int entered_ = 0;
};

class AddOneExecutor : public Executor {
 public:
  explicit AddOneExecutor(Gate* gate) : gate_(gate) {}
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    const Tensor& in = inputs.at(0);
    gate_->enter();
    const auto* src = reinterpret_cast<const float*>(in.data);
    auto out = std::make_shared<std::vector<float>>(src, src + in.byte_size / sizeof(float));
    for (float& v : *out) v += 1.0f;
    outputs->push_back(Tensor{DataType::kFp32, in.shape, reinterpret_cast<const std::byte*>(out->data()),
                              out->size() * sizeof(float), out});
    return Status::Ok();
  }

 private:
  Gate* gate_;
};

std::string varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
  return out;
}
std::string ld(uint32_t field, const std::string& payload) {
  return varint(uint64_t{field} << 3 | 2) + varint(payload.size()) + payload;
}

// --- the fixture ---------------------------------------------------------------------------------

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/inferd-http-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;

    auto signature = std::make_shared<ModelSignature>();
    signature->name = "add_one";
    signature->version = "1";
    signature->max_batch_size = 8;
    InputSignature in;
    in.name = "INPUT";
    in.dtype = DataType::kFp32;
    in.dims = {4};
    signature->inputs = {in};
    signature->outputs = {OutputSignature{"OUTPUT", DataType::kFp32, {4}, false}};

    SchedulerOptions options;
    options.model_name = "add_one";
    options.batching.dynamic = true;
    options.batching.max_batch_size = 8;
    options.batching.max_queue_delay_us = 500;
    std::vector<std::unique_ptr<Executor>> instances;
    instances.push_back(std::make_unique<AddOneExecutor>(&gate_));
    scheduler_ = std::make_shared<Scheduler>(options, std::move(instances), std::make_shared<CompletionQueue>(),
                                             std::make_shared<PinnedBufferPool>(1 << 22, false));
    auto route = std::make_shared<ModelRoute>();
    route->model = "add_one";
    route->version = "1";
    route->scheduler = scheduler_;
    route->signature = signature;
    route->metadata_response = ld(1, "add_one") + ld(2, "1") + ld(3, "onnxruntime");
    route_ = route;

    GrpcServerOptions grpc_options;
    grpc_options.addresses = {"127.0.0.1:0"};
    grpc_options.backend_address = "unix:" + dir_ + "/no-backend.sock";  // nothing is forwarded
    grpc_ = std::make_unique<GrpcServer>(grpc_options);
    publish();
  }

  void TearDown() override {
    gate_.open();
    if (http_) http_->shutdown(1.0);
    http_.reset();
    if (grpc_) grpc_->shutdown(1.0);
    grpc_.reset();
    if (scheduler_) scheduler_->shutdown(Scheduler::ShutdownMode::kDrain);
    route_.reset();
    scheduler_.reset();
    ::unlink((dir_ + "/http.sock").c_str());
    ::rmdir(dir_.c_str());
  }

  // Serves HTTP on 127.0.0.1:0 unless `options` names addresses.
  void start_http(HttpServerOptions options = {}) {
    if (options.addresses.empty()) options.addresses = {"127.0.0.1:0"};
    http_ = std::make_unique<HttpServer>(options, *grpc_);
    ASSERT_EQ(http_->ports().size(), options.addresses.size());
    port_ = http_->ports()[0];
  }

  // The snapshot: add_one routed as "" and "1", then `edit`.
  void publish(const std::function<void(ServingSnapshot&)>& edit = {}) {
    auto snapshot = std::make_shared<ServingSnapshot>();
    snapshot->live = true;
    snapshot->ready = true;
    snapshot->accepting = true;
    snapshot->models["add_one"][""] = route_;
    snapshot->models["add_one"]["1"] = route_;
    snapshot->schedulers.push_back(scheduler_);
    if (edit) edit(*snapshot);
    grpc_->state().publish(std::move(snapshot));
  }

  Client connect() {
    Client client = Client::tcp(port_);
    EXPECT_TRUE(client.connected()) << std::strerror(errno);
    return client;
  }

  // Sends `request` on a new connection and reads its answer.
  std::optional<Response> exchange(const std::string& request) {
    Client client = connect();
    if (!client.send(request)) return std::nullopt;
    return client.read_response();
  }

  // Until the server has `n` connections open (its count lags a client's close).
  bool wait_connections(size_t n) {
    const Clock::time_point until = Clock::now() + kWait;
    while (http_->connections() != n) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(2ms);
    }
    return true;
  }

  std::string dir_;
  Gate gate_;
  std::shared_ptr<Scheduler> scheduler_;
  std::shared_ptr<const ModelRoute> route_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<HttpServer> http_;
  int port_ = 0;
};

const std::vector<float> kRow{1, 2, 3, 4};

TEST_F(HttpServerTest, HealthLiveAndReadyComeFromTheSnapshot) {
  start_http();
  ASSERT_GT(port_, 0);
  Client client = connect();
  auto ask = [&](const std::string& path) {
    EXPECT_TRUE(client.send(get(path)));
    std::optional<Response> r = client.read_response();
    return r ? r->status : 0u;
  };
  EXPECT_EQ(ask("/v2/health/live"), 200u);
  EXPECT_EQ(ask("/v2/health/ready"), 200u);
  publish([](ServingSnapshot& s) { s.ready = false; });
  EXPECT_EQ(ask("/v2/health/ready"), 400u);
  EXPECT_EQ(ask("/v2/health/live"), 200u);
  publish([](ServingSnapshot& s) { s.live = false; });
  EXPECT_EQ(ask("/v2/health/live"), 400u);
  publish();
  ASSERT_TRUE(client.send(get("/v2/health/live")));
  std::optional<Response> r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(r->header("server"), "inferd");
  EXPECT_EQ(r->body, "{\"live\":true}");  // the status for Triton's clients, the body for KServe's
  // Model readiness and metadata come from the snapshot too (no backend runs to answer them).
  ASSERT_TRUE(client.send(get("/v2/models/add_one/versions/1/ready")));
  r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u);
  ASSERT_TRUE(client.send(get("/v2/models/add_one")));
  r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u) << r->body;
  rapidjson::Document metadata;
  metadata.Parse(r->body.data(), r->body.size());
  ASSERT_TRUE(metadata.IsObject() && metadata.HasMember("name") && metadata.HasMember("platform")) << r->body;
  EXPECT_STREQ(metadata["name"].GetString(), "add_one");
  EXPECT_STREQ(metadata["platform"].GetString(), "onnxruntime");
}

TEST_F(HttpServerTest, AKeepAliveConnectionServesRequestAfterRequest) {
  start_http();
  Client client = connect();
  ASSERT_TRUE(client.send(get("/v2/health/live")));
  std::optional<Response> first = client.read_response();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 200u);
  ASSERT_TRUE(client.send(post("/v2/models/add_one/infer", infer_body(kRow))));
  std::optional<Response> second = client.read_response();
  ASSERT_TRUE(second);
  EXPECT_EQ(second->status, 200u) << second->body;
  expect_add_one_answer(second->body, kRow);
  // A 404 does not end the connection either.
  ASSERT_TRUE(client.send(get("/v2/nowhere")));
  std::optional<Response> third = client.read_response();
  ASSERT_TRUE(third);
  EXPECT_EQ(third->status, 404u);
  EXPECT_EQ(error_of(third->body), "no endpoint at '/v2/nowhere' (Triton's HTTP API is under /v2)");
  ASSERT_TRUE(client.send(get("/v2/health/ready")));
  std::optional<Response> fourth = client.read_response();
  ASSERT_TRUE(fourth);
  EXPECT_EQ(fourth->status, 200u);
  EXPECT_EQ(http_->connections(), 1u);
}

TEST_F(HttpServerTest, ConnectionCloseAndHttp10AreAnsweredThenClosed) {
  start_http();
  Client client = connect();
  ASSERT_TRUE(client.send(get("/v2/health/live", "Connection: close\r\n")));
  std::optional<Response> r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u);
  EXPECT_EQ(lowercase(r->header("connection")), "close");
  EXPECT_TRUE(client.closed_within());

  Client old = connect();
  ASSERT_TRUE(old.send("GET /v2/health/live HTTP/1.0\r\n\r\n"));
  r = old.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status_line, "HTTP/1.0 200 OK");
  EXPECT_TRUE(old.closed_within());
}

// Two requests in one write (HTTP/1.1 pipelining): the second is in the server's buffer already
// when the first is answered.
TEST_F(HttpServerTest, PipelinedRequestsAreEachAnswered) {
  start_http();
  Client client = connect();
  ASSERT_TRUE(client.send(get("/v2/health/live") + get("/v2/health/ready")));
  std::optional<Response> first = client.read_response();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 200u);
  std::optional<Response> second = client.read_response(2s);
  ASSERT_TRUE(second) << "the second pipelined request was not answered";
  EXPECT_EQ(second->status, 200u);
}

TEST_F(HttpServerTest, AnInferWithJsonDataIsComputedInTheCore) {
  start_http();
  std::optional<Response> r = exchange(post("/v2/models/add_one/infer", infer_body(kRow, "req-1")));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u) << r->body;
  EXPECT_EQ(r->header("content-type"), "application/json");
  expect_add_one_answer(r->body, kRow, "req-1");
  EXPECT_EQ(gate_.entered(), 1);

  const std::vector<float> other{10, 20, 30, 40};
  r = exchange(post("/v2/models/add_one/versions/1/infer", infer_body(other)));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u) << r->body;
  expect_add_one_answer(r->body, other);
  EXPECT_EQ(gate_.entered(), 2);

  // A request the codec refuses never reaches the model.
  r = exchange(post("/v2/models/add_one/infer", R"({"inputs":[{"name":"INPUT"}]})"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400u) << r->body;
  EXPECT_NE(error_of(r->body).find("<not an error body"), 0u) << r->body;
  // generate: the fields become inputs, the answer's outputs fields.
  r = exchange(post("/v2/models/add_one/generate", R"({"INPUT":[5,6,7,8]})"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u) << r->body;
  EXPECT_EQ(r->body, R"({"model_name":"add_one","model_version":"1","OUTPUT":[6,7,8,9]})");
  EXPECT_EQ(gate_.entered(), 3);
}

TEST_F(HttpServerTest, GenerateStreamSendsItsAnswerAsAnEventAndTheConnectionServesOn) {
  start_http();
  Client client = connect();
  ASSERT_TRUE(client.send(post("/v2/models/add_one/generate_stream", R"({"INPUT":[5,6,7,8]})")));
  std::optional<Response> r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u) << r->body;
  EXPECT_EQ(r->header("content-type"), "text/event-stream");
  EXPECT_EQ(lowercase(r->header("transfer-encoding")), "chunked");
  EXPECT_EQ(r->body, "data: {\"model_name\":\"add_one\",\"model_version\":\"1\",\"OUTPUT\":[6,7,8,9]}\n\n");
  ASSERT_TRUE(client.send(get("/v2/health/live")));
  r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u);
}

// The client goes while the core computes its request: the answer has nowhere to go and is
// dropped; the server serves on (and, under AddressSanitizer, nothing is used after it is freed).
TEST_F(HttpServerTest, AClientThatGoesAwayMidRequestDoesNotStopTheServer) {
  start_http();
  gate_.close();
  {
    Client client = connect();
    ASSERT_TRUE(client.send(post("/v2/models/add_one/infer", infer_body(kRow))));
    ASSERT_TRUE(gate_.wait_entered(1));
  }  // closed
  std::this_thread::sleep_for(50ms);
  gate_.open();
  std::optional<Response> r = exchange(post("/v2/models/add_one/infer", infer_body(kRow)));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u) << r->body;
  expect_add_one_answer(r->body, kRow);
  EXPECT_TRUE(wait_connections(0));
}

TEST_F(HttpServerTest, MethodsAPathDoesNotTakeAre405) {
  start_http();
  std::optional<Response> r = exchange("DELETE /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405u);
  EXPECT_EQ(error_of(r->body), "'/v2/health/live' takes GET");
  r = exchange(get("/v2/models/add_one/infer"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405u);
  EXPECT_EQ(error_of(r->body), "'/v2/models/add_one/infer' takes POST");
}

TEST_F(HttpServerTest, Expect100ContinueIsAnsweredBeforeTheBodyIsSent) {
  HttpServerOptions options;
  options.max_body_bytes = 4096;
  start_http(options);
  Client client = connect();
  const std::string body = infer_body(kRow);
  ASSERT_TRUE(client.send("POST /v2/models/add_one/infer HTTP/1.1\r\nHost: t\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\nExpect: 100-continue\r\n\r\n"));
  std::optional<Response> interim = client.read_response();
  ASSERT_TRUE(interim);
  EXPECT_EQ(interim->status, 100u);
  ASSERT_TRUE(client.send(body));
  std::optional<Response> r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u) << r->body;
  expect_add_one_answer(r->body, kRow);

  // A body past the limit gets its 413 instead of the 100.
  ASSERT_TRUE(
      client.send("POST /v2/models/add_one/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n"
                  "Expect: 100-continue\r\n\r\n"));
  r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413u);
  EXPECT_TRUE(client.closed_within());
}

TEST_F(HttpServerTest, HeadersPastTheLimitAre431AndTheConnectionCloses) {
  HttpServerOptions options;
  options.max_header_bytes = 1024;
  start_http(options);
  Client client = connect();
  ASSERT_TRUE(client.send(get("/v2/health/live", "X-Pad: " + std::string(4000, 'a') + "\r\n")));
  std::optional<Response> r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 431u);
  EXPECT_EQ(error_of(r->body), "the request's headers are larger than --http-max-header-bytes (1024)");
  EXPECT_TRUE(client.closed_within());
  // Headers within it are served.
  r = exchange(get("/v2/health/live", "X-Pad: " + std::string(500, 'a') + "\r\n"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u);
}

TEST_F(HttpServerTest, ABodyPastTheLimitByContentLengthIs413BeforeItIsSent) {
  HttpServerOptions options;
  options.max_body_bytes = 1000;
  start_http(options);
  Client client = connect();
  // Only the head: the answer must come without the body.
  ASSERT_TRUE(client.send("POST /v2/models/add_one/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n"));
  std::optional<Response> r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413u);
  EXPECT_NE(error_of(r->body).find("larger than --http-max-body-bytes (1000)"), std::string::npos) << r->body;
  EXPECT_TRUE(client.closed_within());
  EXPECT_EQ(gate_.entered(), 0);

  // A chunked body has no length to check up front: it is refused once it passes the limit.
  Client chunked = connect();
  ASSERT_TRUE(
      chunked.send("POST /v2/models/add_one/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "400\r\n" +
                   std::string(1024, ' ') + "\r\n"));
  r = chunked.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413u);
  EXPECT_EQ(error_of(r->body), "the request body is larger than --http-max-body-bytes (1000)");
  EXPECT_TRUE(chunked.closed_within());
}

// A client that sends its body without waiting (no Expect) still reads the 413: the server does
// not reset the connection under the answer by closing with the body unread.
TEST_F(HttpServerTest, ARefusedBodyAlreadySentDoesNotResetTheAnswer) {
  HttpServerOptions options;
  options.max_body_bytes = 1000;
  start_http(options);
  for (int attempt = 0; attempt < 20; ++attempt) {
    SCOPED_TRACE(attempt);
    Client client = connect();
    const std::string body(256 * 1024, ' ');
    ASSERT_TRUE(client.send("POST /v2/models/add_one/infer HTTP/1.1\r\nHost: t\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n"));
    client.send(body);  // may fail part way: the server closes once it has answered
    std::optional<Response> r = client.read_response();
    ASSERT_TRUE(r) << "no answer: the connection was reset";
    EXPECT_EQ(r->status, 413u);
  }
}

std::string chunked_post(const std::string& path, const std::vector<std::string>& chunks) {
  std::string out = "POST " + path + " HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (const std::string& chunk : chunks) {
    char size[20];
    std::snprintf(size, sizeof(size), "%zx", chunk.size());
    out += std::string(size) + "\r\n" + chunk + "\r\n";
  }
  return out + "0\r\n\r\n";
}

// `body` cut into `n` chunks.
std::vector<std::string> cut(const std::string& body, size_t n) {
  std::vector<std::string> chunks;
  const size_t step = (body.size() + n - 1) / n;
  for (size_t at = 0; at < body.size(); at += step) chunks.push_back(body.substr(at, step));
  return chunks;
}

TEST_F(HttpServerTest, ABodyInMoreChunksThanTheLimitIs413) {
  HttpServerOptions options;
  options.max_chunks = 3;
  start_http(options);
  Client client = connect();
  ASSERT_TRUE(client.send(chunked_post("/v2/models/add_one/infer", cut(infer_body(kRow), 5))));
  std::optional<Response> r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413u);
  EXPECT_EQ(error_of(r->body), "the request body comes in more than --http-max-chunks (3) chunks");
  EXPECT_TRUE(client.closed_within());
  EXPECT_EQ(gate_.entered(), 0);
}

// The limit counts the body's chunks, not the empty chunk that ends it.
TEST_F(HttpServerTest, ABodyInExactlyMaxChunksIsServed) {
  HttpServerOptions options;
  options.max_chunks = 3;
  start_http(options);
  std::optional<Response> r = exchange(chunked_post("/v2/models/add_one/infer", cut(infer_body(kRow), 3)));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u) << r->body;
  expect_add_one_answer(r->body, kRow);
}

TEST_F(HttpServerTest, AnIdleConnectionIsClosedAfterTheIdleTimeout) {
  HttpServerOptions options;
  options.idle_timeout_ms = 300;
  start_http(options);
  // Nothing sent at all.
  Client silent = connect();
  Clock::time_point start = Clock::now();
  EXPECT_TRUE(silent.closed_within(3s));
  EXPECT_GE(Clock::now() - start, 250ms);
  // After an answer, the connection kept alive is closed once it idles as long.
  Client client = connect();
  ASSERT_TRUE(client.send(get("/v2/health/live")));
  std::optional<Response> r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u);
  start = Clock::now();
  EXPECT_TRUE(client.closed_within(3s));
  EXPECT_GE(Clock::now() - start, 250ms);
  EXPECT_TRUE(wait_connections(0));
}

// A stalled request is closed once the header timeout passes; a 408 before the close is allowed
// (the server means to send one), not required.
void expect_timed_out(Client* client, Clock::time_point start) {
  std::optional<Response> r = client->read_response(3s);
  if (r) {
    EXPECT_EQ(r->status, 408u);
    EXPECT_NE(error_of(r->body).find("--http-header-timeout-secs"), std::string::npos) << r->body;
  }
  EXPECT_TRUE(client->closed_within());
  EXPECT_GE(Clock::now() - start, 250ms);
}

TEST_F(HttpServerTest, AHeaderOrBodyThatStallsIsClosedAfterTheHeaderTimeout) {
  HttpServerOptions options;
  options.header_timeout_ms = 300;
  start_http(options);
  Client client = connect();
  ASSERT_TRUE(client.send("GET /v2/health/live HTTP/1.1\r\nHost: t\r\n"));  // never ends
  expect_timed_out(&client, Clock::now());

  Client body = connect();
  ASSERT_TRUE(body.send("POST /v2/models/add_one/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"in"));
  expect_timed_out(&body, Clock::now());
  EXPECT_EQ(gate_.entered(), 0);
  EXPECT_TRUE(wait_connections(0));
}

// The server says why it closes a stalled request (as refuse_read means to).
TEST_F(HttpServerTest, AStalledHeaderIsAnswered408) {
  HttpServerOptions options;
  options.header_timeout_ms = 300;
  start_http(options);
  Client client = connect();
  ASSERT_TRUE(client.send("GET /v2/health/live HTTP/1.1\r\nHost: t\r\n"));
  std::optional<Response> r = client.read_response(3s);
  ASSERT_TRUE(r) << "closed without an answer";
  EXPECT_EQ(r->status, 408u);
}

TEST_F(HttpServerTest, AConnectionPastMaxConnectionsIs429BeforeAnythingIsRead) {
  HttpServerOptions options;
  options.max_connections = 2;
  start_http(options);
  Client first = connect(), second = connect();
  for (Client* client : {&first, &second}) {
    ASSERT_TRUE(client->send(get("/v2/health/live")));
    std::optional<Response> r = client->read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200u);
  }
  EXPECT_EQ(http_->connections(), 2u);
  Client third = connect();  // sends nothing: the answer does not wait for a request
  std::optional<Response> r = third.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429u);
  EXPECT_EQ(error_of(r->body), "the server has --http-max-connections (2) connections open; retry later");
  EXPECT_EQ(lowercase(r->header("connection")), "close");
  EXPECT_TRUE(third.closed_within());
  // Once one closes, a new connection is served.
  first.close();
  ASSERT_TRUE(wait_connections(1));
  r = exchange(get("/v2/health/live"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u);
}

std::string compressed(HttpEncoding encoding, const std::string& body) {
  std::string out;
  EXPECT_TRUE(deflate_body(encoding, body, &out));
  return out;
}

TEST_F(HttpServerTest, ACompressedRequestIsInflatedAndTheAnswerCompressedAsAccepted) {
  start_http();
  const std::string body = infer_body(kRow);
  for (HttpEncoding encoding : {HttpEncoding::kGzip, HttpEncoding::kDeflate}) {
    const std::string name = encoding_name(encoding);
    SCOPED_TRACE(name);
    std::optional<Response> r = exchange(post("/v2/models/add_one/infer", compressed(encoding, body),
                                              "Content-Encoding: " + name + "\r\nAccept-Encoding: " + name + "\r\n"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200u) << r->body;
    EXPECT_EQ(r->header("content-encoding"), name);
    std::string answer;
    const Status status = inflate_body(encoding, r->body, 1 << 20, &answer);
    ASSERT_TRUE(status.ok()) << status.message;
    expect_add_one_answer(answer, kRow);
  }
  // Without Accept-Encoding the answer is plain.
  std::optional<Response> r =
      exchange(post("/v2/models/add_one/infer", compressed(HttpEncoding::kGzip, body), "Content-Encoding: gzip\r\n"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header("content-encoding"), "<absent>");
  expect_add_one_answer(r->body, kRow);
  // q decides between them.
  r = exchange(post("/v2/models/add_one/infer", body, "Accept-Encoding: gzip;q=0.1, deflate;q=0.9\r\n"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header("content-encoding"), "deflate");
}

TEST_F(HttpServerTest, ACompressedBodyThatCannotBeTakenIsRefused) {
  HttpServerOptions options;
  options.max_decompressed_bytes = 1 << 20;
  start_http(options);
  std::optional<Response> r = exchange(post("/v2/models/add_one/infer", infer_body(kRow), "Content-Encoding: br\r\n"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 415u);
  EXPECT_EQ(error_of(r->body), "unsupported Content-Encoding 'br' (gzip, deflate or identity)");
  r = exchange(post("/v2/models/add_one/infer", "\x1f\x8b not really gzip", "Content-Encoding: gzip\r\n"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400u);
  EXPECT_EQ(error_of(r->body), "the request body is not valid gzip data");
  // 64 MiB of spaces in ~64 KiB: refused at the limit.
  r = exchange(post("/v2/models/add_one/infer", compressed(HttpEncoding::kGzip, std::string(64 << 20, ' ')),
                    "Content-Encoding: gzip\r\n"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413u);
  EXPECT_EQ(error_of(r->body), "the request body inflates past --http-max-decompressed-bytes (1048576 bytes)");
  EXPECT_EQ(gate_.entered(), 0);
}

TEST_F(HttpServerTest, AMalformedRequestIs400AndTheConnectionCloses) {
  start_http();
  for (const char* request :
       {"NOT A REQUEST\r\n\r\n", "GET\r\n\r\n", "GET /v2/health/live HTTP/1.1\r\nNo colon\r\n\r\n",
        "GET /v2/health/live HTTP/1.1\r\nContent-Length: x\r\n\r\n"}) {
    SCOPED_TRACE(request);
    Client client = connect();
    ASSERT_TRUE(client.send(request));
    std::optional<Response> r = client.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400u);
    EXPECT_EQ(error_of(r->body).rfind("malformed HTTP request: ", 0), 0u) << r->body;
    EXPECT_TRUE(client.closed_within());
  }
}

TEST_F(HttpServerTest, ShutdownWithinTheGraceAnswersTheRequestInFlight) {
  start_http();
  gate_.close();
  Client client = connect();
  ASSERT_TRUE(client.send(post("/v2/models/add_one/infer", infer_body(kRow))));
  ASSERT_TRUE(gate_.wait_entered(1));
  std::thread stopping([&] { http_->shutdown(10.0); });
  std::this_thread::sleep_for(100ms);
  gate_.open();
  std::optional<Response> r = client.read_response();
  stopping.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u) << r->body;
  expect_add_one_answer(r->body, kRow);
  EXPECT_EQ(lowercase(r->header("connection")), "close");
  EXPECT_TRUE(client.closed_within());
}

// After shutdown() nothing accepts: a client is refused at once rather than left in a backlog
// nobody serves.
TEST_F(HttpServerTest, NothingIsAcceptedAfterShutdown) {
  start_http();
  http_->shutdown(0);
  Client late = Client::tcp(port_);
  EXPECT_FALSE(late.connected()) << "connected to a server that has shut down";
  if (late.connected()) {
    ASSERT_TRUE(late.send(get("/v2/health/live")));
    EXPECT_FALSE(late.read_response(500ms).has_value());
  }
}

TEST_F(HttpServerTest, ShutdownPastTheGraceClosesTheConnectionAndDropsTheLateAnswer) {
  start_http();
  gate_.close();
  Client busy = connect(), idle = connect();
  ASSERT_TRUE(busy.send(post("/v2/models/add_one/infer", infer_body(kRow))));
  ASSERT_TRUE(gate_.wait_entered(1));
  ASSERT_TRUE(wait_connections(2));
  const Clock::time_point start = Clock::now();
  http_->shutdown(0.2);
  EXPECT_LT(Clock::now() - start, 3s);
  // The request in flight is closed unanswered; the idle connection is closed.
  EXPECT_TRUE(busy.closed_within()) << busy.unread();
  EXPECT_TRUE(idle.closed_within());
  // The core's answer comes after the server has gone: dropped.
  gate_.open();
  scheduler_->shutdown(Scheduler::ShutdownMode::kDrain);
  EXPECT_EQ(gate_.entered(), 1);
  EXPECT_TRUE(wait_connections(0));  // the core let the request (and its connection) go
}

TEST_F(HttpServerTest, AUnixSocketAddressIsServed) {
  HttpServerOptions options;
  const std::string path = dir_ + "/http.sock";
  options.addresses = {"unix:" + path};
  start_http(options);
  EXPECT_EQ(port_, 0);
  Client client = Client::unix_socket(path);
  ASSERT_TRUE(client.connected()) << std::strerror(errno);
  ASSERT_TRUE(client.send(get("/v2/health/ready")));
  std::optional<Response> r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u);
  ASSERT_TRUE(client.send(post("/v2/models/add_one/infer", infer_body(kRow))));
  r = client.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200u) << r->body;
  expect_add_one_answer(r->body, kRow);
}

}  // namespace
}  // namespace inferd
