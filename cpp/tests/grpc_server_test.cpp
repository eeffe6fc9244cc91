// The core's gRPC server (GrpcServer) end to end: a real server on 127.0.0.1:0, a fake backend (its
// own grpc::Server with a CallbackGenericService on a Unix socket, standing in for Python's
// grpc.aio server) whose answers each test chooses, and a real client (grpc::GenericStub, raw
// ByteBuffers). Requests are serialized by hand and answers read with WireReader, field numbers
// from proto/grpc_service.proto. Every wait is bounded (kWait).
#include "inferd/grpc_server.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "inferd/completion_queue.h"
#include "inferd/executor.h"
#include "inferd/infer_request_parser.h"
#include "inferd/model_signature.h"
#include "inferd/pinned_buffer_pool.h"
#include "inferd/scheduler.h"
#include "inferd/serving_snapshot.h"
#include "inferd/structured_log.h"
#include "inferd/wire_format.h"

namespace inferd {
namespace {

using namespace std::chrono_literals;
using SysClock = std::chrono::system_clock;
using Metadata = std::vector<std::pair<std::string, std::string>>;

// The bound on any wait for something that should happen promptly.
constexpr std::chrono::milliseconds kWait = 5s;

std::string method(const char* name) { return std::string("/inference.GRPCInferenceService/") + name; }

// --- wire bytes by hand ------------------------------------------------------------------------

std::string varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
  return out;
}
std::string key(uint32_t field, int wire_type) {
  return varint((uint64_t{field} << 3) | static_cast<uint64_t>(wire_type));
}
std::string ld(uint32_t field, const std::string& payload) { return key(field, 2) + varint(payload.size()) + payload; }

std::string float_bytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A ModelInferRequest with one FP32 input "INPUT" of shape [rows, cols], its values raw.
std::string infer_request(const std::string& model, const std::string& id, const std::vector<float>& values,
                          int64_t rows, int64_t cols = 4, const std::string& version = "") {
  const std::string shape = varint(static_cast<uint64_t>(rows)) + varint(static_cast<uint64_t>(cols));
  const std::string input = ld(1, "INPUT") + ld(2, "FP32") + ld(3, shape);
  std::string out = ld(1, model);
  if (!version.empty()) out += ld(2, version);
  if (!id.empty()) out += ld(3, id);
  return out + ld(5, input) + ld(7, float_bytes(values));
}

// `rows` rows of 4 values, base, base + 1, ...
std::vector<float> rows_from(float base, int64_t rows) {
  std::vector<float> out;
  for (int64_t i = 0; i < rows * 4; ++i) out.push_back(base + static_cast<float>(i));
  return out;
}
std::vector<float> plus_one(std::vector<float> values) {
  for (float& v : values) v += 1.0f;
  return values;
}

// A request message naming a model (ModelReadyRequest, ModelMetadataRequest, ModelConfigRequest).
std::string name_version(const std::string& name, const std::string& version = "") {
  return ld(1, name) + (version.empty() ? "" : ld(2, version));
}

// --- reading answers -----------------------------------------------------------------------------

struct OutputTensor {
  std::string name, datatype;
  std::vector<int64_t> shape;
};

// A ModelInferResponse, read with WireReader.
struct InferAnswer {
  std::string model_name, model_version, id;
  std::vector<OutputTensor> outputs;
  std::vector<std::string> raw;

  std::vector<float> values(size_t i) const {
    std::vector<float> out(raw.at(i).size() / sizeof(float));
    std::memcpy(out.data(), raw.at(i).data(), out.size() * sizeof(float));
    return out;
  }
};

bool parse_output(std::string_view bytes, OutputTensor* out) {
  WireReader reader(bytes);
  while (!reader.done()) {
    uint32_t field;
    WireType type;
    if (!reader.read_tag(&field, &type)) return false;
    std::string_view value;
    if (field == 3 && type == WireType::kLengthDelimited) {  // packed shape
      if (!reader.read_bytes(&value)) return false;
      WireReader dims(value);
      while (!dims.done()) {
        uint64_t d;
        if (!dims.read_varint(&d)) return false;
        out->shape.push_back(static_cast<int64_t>(d));
      }
    } else if (field == 3 && type == WireType::kVarint) {
      uint64_t d;
      if (!reader.read_varint(&d)) return false;
      out->shape.push_back(static_cast<int64_t>(d));
    } else if ((field == 1 || field == 2) && type == WireType::kLengthDelimited) {
      if (!reader.read_bytes(&value)) return false;
      (field == 1 ? out->name : out->datatype) = std::string(value);
    } else if (!reader.skip(type)) {
      return false;
    }
  }
  return true;
}

bool parse_answer(std::string_view bytes, InferAnswer* out) {
  WireReader reader(bytes);
  while (!reader.done()) {
    uint32_t field;
    WireType type;
    if (!reader.read_tag(&field, &type)) return false;
    if (type != WireType::kLengthDelimited || field == 4 || field > 6) {
      if (!reader.skip(type)) return false;
      continue;
    }
    std::string_view value;
    if (!reader.read_bytes(&value)) return false;
    switch (field) {
      case 1:
        out->model_name = std::string(value);
        break;
      case 2:
        out->model_version = std::string(value);
        break;
      case 3:
        out->id = std::string(value);
        break;
      case 5: {
        OutputTensor tensor;
        if (!parse_output(value, &tensor)) return false;
        out->outputs.push_back(std::move(tensor));
        break;
      }
      case 6:
        out->raw.emplace_back(value);
        break;
      default:
        break;
    }
  }
  return true;
}

// A ModelStreamInferResponse: error_message = 1, infer_response = 2.
struct StreamAnswer {
  std::string error_message;
  bool has_infer_response = false;
  std::string infer_bytes;
  InferAnswer infer;
};

bool parse_stream_answer(std::string_view bytes, StreamAnswer* out) {
  WireReader reader(bytes);
  while (!reader.done()) {
    uint32_t field;
    WireType type;
    if (!reader.read_tag(&field, &type)) return false;
    if ((field == 1 || field == 2) && type == WireType::kLengthDelimited) {
      std::string_view value;
      if (!reader.read_bytes(&value)) return false;
      if (field == 1) {
        out->error_message = std::string(value);
      } else {
        out->has_infer_response = true;
        out->infer_bytes = std::string(value);
        if (!parse_answer(value, &out->infer)) return false;
      }
    } else if (!reader.skip(type)) {
      return false;
    }
  }
  return true;
}

// A ServerLive/ServerReady/ModelReady response: bool field 1 (absent = false). nullopt if malformed.
std::optional<bool> parse_bool_answer(std::string_view bytes) {
  WireReader reader(bytes);
  bool value = false;
  while (!reader.done()) {
    uint32_t field;
    WireType type;
    if (!reader.read_tag(&field, &type)) return std::nullopt;
    if (field == 1 && type == WireType::kVarint) {
      uint64_t v;
      if (!reader.read_varint(&v)) return std::nullopt;
      value = v != 0;
    } else if (!reader.skip(type)) {
      return std::nullopt;
    }
  }
  return value;
}

// What the core says of a request: the parser's, then the builder's message (empty when fine).
Status check_request(const std::shared_ptr<const ModelSignature>& signature, const std::string& bytes) {
  auto owner = std::make_shared<std::string>(bytes);
  ParsedInferRequest parsed;
  Status status = parse_infer_request(reinterpret_cast<const std::byte*>(owner->data()), owner->size(), &parsed);
  if (!status.ok() || signature == nullptr) return status;
  InferenceRequest request;
  return build_inference_request(signature, parsed, owner, &request);
}

// --- ByteBuffers -------------------------------------------------------------------------------

std::string to_string(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}
grpc::ByteBuffer to_buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// --- the model: output = input + 1, FP32 [batch, 4] ----------------------------------------------

std::shared_ptr<const ModelSignature> add_one_signature() {
  auto m = std::make_shared<ModelSignature>();
  m->name = "add_one";
  m->version = "1";
  m->max_batch_size = 8;
  InputSignature in;
  in.name = "INPUT";
  in.dtype = DataType::kFp32;
  in.dims = {4};
  m->inputs = {in};
  m->outputs = {OutputSignature{"OUTPUT", DataType::kFp32, {4}, false}};
  return m;
}

// What the executor did, and a gate the test may close to hold it inside execute().
class ExecutionLog {
 public:
  void close_gate() {
    std::lock_guard<std::mutex> lock(mutex_);
    gate_open_ = false;
  }
  void open_gate() {
    std::lock_guard<std::mutex> lock(mutex_);
    gate_open_ = true;
    changed_.notify_all();
  }
  void set_delay(std::chrono::milliseconds delay) {
    std::lock_guard<std::mutex> lock(mutex_);
    delay_ = delay;
  }

  // In execute(): records the batch, then waits (bounded) while the gate is closed.
  void enter(const Tensor& input) {
    std::unique_lock<std::mutex> lock(mutex_);
    ++executions_;
    batch_rows_.push_back(input.shape.at(0));
    const auto* values = reinterpret_cast<const float*>(input.data);
    for (int64_t row = 0; row < input.shape.at(0); ++row) row_firsts_.push_back(values[row * 4]);
    changed_.notify_all();
    changed_.wait_for(lock, 10s, [&] { return gate_open_; });
    const auto delay = delay_;
    lock.unlock();
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
  }

  bool wait_executions(int n, std::chrono::milliseconds bound = kWait) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, bound, [&] { return executions_ >= n; });
  }
  int executions() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return executions_;
  }
  std::vector<int64_t> batch_rows() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return batch_rows_;
  }
  // The first value of every row computed.
  std::vector<float> row_firsts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return row_firsts_;
  }
  bool computed_row_starting_with(float value) const {
    const auto firsts = row_firsts();
    return std::find(firsts.begin(), firsts.end(), value) != firsts.end();
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool gate_open_ = true;
  std::chrono::milliseconds delay_{0};
  int executions_ = 0;
  std::vector<int64_t> batch_rows_;
  std::vector<float> row_firsts_;
};

// output = input + 1; a batch whose first value is negative fails (INTERNAL).
class AddOneExecutor : public Executor {
 public:
  explicit AddOneExecutor(ExecutionLog* log) : log_(log) {}
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    const Tensor& in = inputs.at(0);
    log_->enter(in);
    const auto* src = reinterpret_cast<const float*>(in.data);
    const size_t n = in.byte_size / sizeof(float);
    if (n > 0 && src[0] < 0) return Status::Error(StatusCode::kInternal, "negative input");
    auto out = std::make_shared<std::vector<float>>(src, src + n);
    for (float& v : *out) v += 1.0f;
    outputs->push_back(Tensor{DataType::kFp32, in.shape, reinterpret_cast<const std::byte*>(out->data()),
                              out->size() * sizeof(float), out});
    return Status::Ok();
  }

 private:
  ExecutionLog* log_;
};

// --- the fake backend ----------------------------------------------------------------------------

// One call the backend received.
struct ReceivedCall {
  std::string method;
  std::multimap<std::string, std::string> metadata;
  SysClock::time_point deadline;
  std::vector<std::string> messages;
  bool cancelled = false;

  std::string metadata_value(const std::string& k) const {
    const auto found = metadata.find(k);
    return found == metadata.end() ? "<absent>" : found->second;
  }
};

// How the backend answers a method (other than the echo methods below).
struct BackendReply {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;  // the status's message
  std::string body;     // the answer, with OK (unary)
  Metadata trailing;
  bool hang = false;         // answer nothing until cancelled
  int stream_messages = -1;  // >= 0: server streaming, "message 0".. then the status
};

// The served methods the fake backend gives the shapes of the tests' calls (the server forwards
// only methods it serves: AccessPolicy).
constexpr char kEchoChat[] = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
constexpr char kEchoOneThenEnd[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
constexpr char kSlowHang[] = "/inference.GRPCInferenceService/RepositoryIndex";

// A grpc server on a Unix socket answering every method generically:
//   kEchoChat: bidi, echoes each message ("echo:" + it) until the client stops sending,
//     then OK with trailing metadata x-echoed = the count;
//   kEchoOneThenEnd: echoes the first message and ends the call (ABORTED) at once;
//   any other method: reads one message and answers as set_reply() said (default: OK, body
//     "backend answered " + method).
class FakeBackend {
 public:
  explicit FakeBackend(const std::string& address) : service_(this) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~FakeBackend() {
    if (server_) {
      server_->Shutdown(SysClock::now());
      server_->Wait();
    }
  }
  bool started() const { return server_ != nullptr; }

  void set_reply(const std::string& m, BackendReply reply) {
    std::lock_guard<std::mutex> lock(mutex_);
    replies_[m] = std::move(reply);
  }
  std::vector<ReceivedCall> calls() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ReceivedCall> out;
    for (const auto& c : calls_) out.push_back(*c);
    return out;
  }
  size_t call_count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_.size();
  }
  // Until `n` calls have arrived, each with its first message (or was cancelled).
  bool wait_calls(size_t n, std::chrono::milliseconds bound = kWait) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, bound, [&] {
      if (calls_.size() < n) return false;
      for (const auto& c : calls_) {
        if (c->messages.empty() && !c->cancelled) return false;
      }
      return true;
    });
  }
  bool wait_cancelled(size_t index, std::chrono::milliseconds bound = kWait) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, bound, [&] { return index < calls_.size() && calls_[index]->cancelled; });
  }

 private:
  class Unary;
  class Echo;

  class Service final : public grpc::CallbackGenericService {
   public:
    explicit Service(FakeBackend* backend) : backend_(backend) {}
    grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override;

   private:
    FakeBackend* const backend_;
  };

  std::shared_ptr<ReceivedCall> start_call(const grpc::GenericCallbackServerContext& context) {
    auto call = std::make_shared<ReceivedCall>();
    call->method = context.method();
    for (const auto& [k, v] : context.client_metadata()) {
      call->metadata.emplace(std::string(k.data(), k.size()), std::string(v.data(), v.size()));
    }
    call->deadline = context.deadline();
    std::lock_guard<std::mutex> lock(mutex_);
    calls_.push_back(call);
    changed_.notify_all();
    return call;
  }
  void add_message(ReceivedCall* call, std::string bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    call->messages.push_back(std::move(bytes));
    changed_.notify_all();
  }
  void mark_cancelled(ReceivedCall* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    call->cancelled = true;
    changed_.notify_all();
  }
  BackendReply reply_for(const std::string& m) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = replies_.find(m);
    if (found != replies_.end()) return found->second;
    BackendReply reply;
    reply.body = "backend answered " + m;
    return reply;
  }

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, BackendReply> replies_;       // guarded by mutex_
  std::vector<std::shared_ptr<ReceivedCall>> calls_;  // guarded by mutex_, and the records' fields
  Service service_;
  std::unique_ptr<grpc::Server> server_;
};

class FakeBackend::Unary final : public grpc::ServerGenericBidiReactor {
 public:
  Unary(FakeBackend* backend, grpc::GenericCallbackServerContext* context, std::shared_ptr<ReceivedCall> call,
        BackendReply reply)
      : backend_(backend), context_(context), call_(std::move(call)), reply_(std::move(reply)) {
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) return finish_once(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message"));
    backend_->add_message(call_.get(), to_string(in_));
    if (reply_.hang) return;  // answered in OnCancel
    if (reply_.stream_messages >= 0) return next_stream_message();
    if (reply_.code != grpc::StatusCode::OK) return finish_once(grpc::Status(reply_.code, reply_.message));
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    for (const auto& [k, v] : reply_.trailing) context_->AddTrailingMetadata(k, v);
    out_ = to_buffer(reply_.body);
    StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return finish_once(grpc::Status(grpc::StatusCode::CANCELLED, "the write failed"));
    next_stream_message();
  }
  void OnCancel() override {
    backend_->mark_cancelled(call_.get());
    if (reply_.hang) finish_once(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while hanging"));
  }
  void OnDone() override { delete this; }

 private:
  void next_stream_message() {
    if (sent_ == reply_.stream_messages) return finish_once(grpc::Status(reply_.code, reply_.message));
    out_ = to_buffer("message " + std::to_string(sent_++));
    StartWrite(&out_);
  }
  void finish_once(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    finished_ = true;
    for (const auto& [k, v] : reply_.trailing) context_->AddTrailingMetadata(k, v);
    Finish(status);
  }

  FakeBackend* const backend_;
  grpc::GenericCallbackServerContext* const context_;
  const std::shared_ptr<ReceivedCall> call_;
  const BackendReply reply_;
  grpc::ByteBuffer in_, out_;
  int sent_ = 0;
  std::mutex mutex_;
  bool finished_ = false;  // guarded by mutex_
};

class FakeBackend::Echo final : public grpc::ServerGenericBidiReactor {
 public:
  Echo(FakeBackend* backend, grpc::GenericCallbackServerContext* context, std::shared_ptr<ReceivedCall> call,
       bool end_after_first)
      : backend_(backend), context_(context), call_(std::move(call)), end_after_first_(end_after_first) {
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      context_->AddTrailingMetadata("x-echoed", std::to_string(count_));
      Finish(grpc::Status::OK);
      return;
    }
    const std::string text = to_string(in_);
    backend_->add_message(call_.get(), text);
    ++count_;
    out_ = to_buffer("echo:" + text);
    if (end_after_first_) {
      StartWriteAndFinish(&out_, grpc::WriteOptions(),
                          grpc::Status(grpc::StatusCode::ABORTED, "the backend ended the stream"));
    } else {
      StartWrite(&out_);
    }
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the write failed"));
      return;
    }
    StartRead(&in_);
  }
  void OnCancel() override { backend_->mark_cancelled(call_.get()); }
  void OnDone() override { delete this; }

 private:
  FakeBackend* const backend_;
  grpc::GenericCallbackServerContext* const context_;
  const std::shared_ptr<ReceivedCall> call_;
  const bool end_after_first_;
  grpc::ByteBuffer in_, out_;
  int count_ = 0;
};

grpc::ServerGenericBidiReactor* FakeBackend::Service::CreateReactor(grpc::GenericCallbackServerContext* context) {
  auto call = backend_->start_call(*context);
  if (context->method() == kEchoChat) return new Echo(backend_, context, std::move(call), false);
  if (context->method() == kEchoOneThenEnd) return new Echo(backend_, context, std::move(call), true);
  return new Unary(backend_, context, std::move(call), backend_->reply_for(context->method()));
}

// --- the client ----------------------------------------------------------------------------------

struct ClientResult {
  grpc::Status status;
  std::string body;
  std::multimap<std::string, std::string> trailing;

  std::string trailing_value(const std::string& k) const {
    const auto found = trailing.find(k);
    return found == trailing.end() ? "<absent>" : found->second;
  }
};

void set_up_context(grpc::ClientContext* context, const Metadata& metadata, std::chrono::milliseconds timeout) {
  for (const auto& [k, v] : metadata) context->AddMetadata(k, v);
  context->set_deadline(SysClock::now() + timeout);
}

// One unary call in flight (the generic stub's callback UnaryCall); wait() for its result.
// The client context (which holds a reference to the channel) stays with this object, on the
// test's thread: grpc's callback keeps only the promise. (Dropping the last reference to a
// channel on one of grpc 1.51's callback threads can tear down the completion queue that thread
// is serving.)
class PendingUnary {
 public:
  PendingUnary(grpc::GenericStub* stub, const std::string& m, const std::string& body, const Metadata& metadata = {},
               std::chrono::milliseconds timeout = 10s)
      : call_(std::make_unique<Call>()), done_(std::make_shared<std::promise<grpc::Status>>()) {
    set_up_context(&call_->context, metadata, timeout);
    call_->request = to_buffer(body);
    future_ = done_->get_future();
    stub->UnaryCall(&call_->context, m, grpc::StubOptions(), &call_->request, &call_->response,
                    [done = done_](grpc::Status status) { done->set_value(std::move(status)); });
  }
  ~PendingUnary() {
    if (!future_.valid() || future_.wait_for(0s) == std::future_status::ready) return;
    call_->context.TryCancel();
    if (future_.wait_for(kWait) != std::future_status::ready) {
      ADD_FAILURE() << "a call never ended, even cancelled";
      call_.release();  // grpc may still write into it: leaked rather than freed under it
    }
  }
  PendingUnary(PendingUnary&&) = default;

  void cancel() { call_->context.TryCancel(); }
  bool done_within(std::chrono::milliseconds bound) { return future_.wait_for(bound) == std::future_status::ready; }

  ClientResult wait(std::chrono::milliseconds bound = kWait) {
    ClientResult result;
    if (future_.wait_for(bound) != std::future_status::ready) {
      call_->context.TryCancel();
      result.status = grpc::Status(grpc::StatusCode::UNKNOWN, "test: no answer in time");
      return result;
    }
    result.status = future_.get();
    result.body = to_string(call_->response);
    for (const auto& [k, v] : call_->context.GetServerTrailingMetadata()) {
      result.trailing.emplace(std::string(k.data(), k.size()), std::string(v.data(), v.size()));
    }
    return result;
  }

 private:
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer request, response;
  };
  std::unique_ptr<Call> call_;
  std::shared_ptr<std::promise<grpc::Status>> done_;
  std::future<grpc::Status> future_;
};

// One streaming call (any method: every gRPC call is a bidi stream on the wire), used
// synchronously: write() queues a message, read() waits for the next one, finish() for the status.
class StreamClient final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `reading`: false for a client that reads nothing until start_reading() (the server's writes
  // then wait once the transport's flow-control window is full).
  StreamClient(grpc::GenericStub* stub, const std::string& m, const Metadata& metadata = {},
               std::chrono::milliseconds timeout = 10s, bool reading = true) {
    set_up_context(&context_, metadata, timeout);
    stub->PrepareBidiStreamingCall(&context_, m, grpc::StubOptions(), this);
    if (reading) StartRead(&incoming_);
    StartCall();
  }
  void start_reading() { StartRead(&incoming_); }
  ~StreamClient() override {
    if (wait_done(kWait)) return;
    context_.TryCancel();
    if (!wait_done(kWait)) {
      std::fprintf(stderr, "a test's stream never ended, even cancelled\n");
      std::abort();
    }
  }

  void write(const std::string& bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (writes_failed_) return;
    writes_.push_back(to_buffer(bytes));
    if (writing_) return;
    writing_ = true;
    grpc::ByteBuffer* next = &writes_.front();
    lock.unlock();
    StartWrite(next);
  }
  void writes_done() {
    std::unique_lock<std::mutex> lock(mutex_);
    close_after_writes_ = true;
    if (writing_ || writes_done_started_) return;
    writes_done_started_ = true;
    lock.unlock();
    StartWritesDone();
  }
  // The next message; false when the stream ended (or nothing came within `bound`).
  bool read(std::string* out, std::chrono::milliseconds bound = kWait) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, bound, [&] { return !received_.empty() || reads_ended_; });
    if (received_.empty()) return false;
    *out = std::move(received_.front());
    received_.pop_front();
    return true;
  }
  bool wait_done(std::chrono::milliseconds bound) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, bound, [&] { return done_; });
  }
  // The call's status, or UNKNOWN "test: ..." if it did not end within `bound`.
  grpc::Status finish(std::chrono::milliseconds bound = kWait) {
    if (!wait_done(bound)) return grpc::Status(grpc::StatusCode::UNKNOWN, "test: the stream did not end in time");
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
  }
  void cancel() { context_.TryCancel(); }
  std::string trailing_value(const std::string& k) {
    if (!wait_done(kWait)) return "<not done>";
    for (const auto& [key, value] : context_.GetServerTrailingMetadata()) {
      if (std::string_view(key.data(), key.size()) == k) return std::string(value.data(), value.size());
    }
    return "<absent>";
  }

  void OnReadDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ok) {
      reads_ended_ = true;
      changed_.notify_all();
      return;
    }
    received_.push_back(to_string(incoming_));
    changed_.notify_all();
    lock.unlock();
    StartRead(&incoming_);
  }
  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    writes_.pop_front();
    if (!ok) {
      writes_failed_ = true;
      writes_.clear();
      writing_ = false;
      return;
    }
    if (!writes_.empty()) {
      grpc::ByteBuffer* next = &writes_.front();
      lock.unlock();
      StartWrite(next);
      return;
    }
    writing_ = false;
    if (close_after_writes_ && !writes_done_started_) {
      writes_done_started_ = true;
      lock.unlock();
      StartWritesDone();
    }
  }
  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mutex_);
    status_ = status;
    done_ = true;
    changed_.notify_all();
  }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer incoming_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<grpc::ByteBuffer> writes_;  // front() is being written
  bool writing_ = false;
  bool writes_failed_ = false;
  bool close_after_writes_ = false;
  bool writes_done_started_ = false;
  std::deque<std::string> received_;
  bool reads_ended_ = false;
  bool done_ = false;
  grpc::Status status_;
};

// Polls `predicate` every millisecond until it holds or `bound` passes.
bool eventually(const std::function<bool()>& predicate, std::chrono::milliseconds bound = kWait) {
  const auto until = std::chrono::steady_clock::now() + bound;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// --- the fixture ---------------------------------------------------------------------------------

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/inferd-grpc-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    backend_address_ = "unix:" + dir_ + "/backend.sock";
    backend_ = std::make_unique<FakeBackend>(backend_address_);
    ASSERT_TRUE(backend_->started());

    signature_ = add_one_signature();
    SchedulerOptions options;
    options.model_name = "add_one";
    options.batching.dynamic = true;
    options.batching.max_batch_size = 8;
    options.batching.max_queue_delay_us = 2000;
    std::vector<std::unique_ptr<Executor>> instances;
    instances.push_back(std::make_unique<AddOneExecutor>(&log_));
    scheduler_ = std::make_shared<Scheduler>(options, std::move(instances), std::make_shared<CompletionQueue>(),
                                             std::make_shared<PinnedBufferPool>(1 << 24, false));
    auto route = std::make_shared<ModelRoute>();
    route->model = "add_one";
    route->version = "1";
    route->scheduler = scheduler_;
    route->signature = signature_;
    route->metadata_response = ld(1, "add_one") + ld(2, "1") + ld(3, "onnxruntime");
    route->config_response = ld(1, ld(1, "add_one") + key(4, 0) + varint(8));
    route_ = route;

    start_server();
    publish();
  }

  // Serves on 127.0.0.1:0 first, then on the addresses `options` names (a Unix socket).
  void start_server(GrpcServerOptions options = {}) {
    options.addresses.insert(options.addresses.begin(), "127.0.0.1:0");
    options.backend_address = backend_address_;
    server_ = std::make_unique<GrpcServer>(options);
    ASSERT_EQ(server_->ports().size(), options.addresses.size());
    ASSERT_GT(server_->ports()[0], 0);
    channel_ =
        grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->ports()[0]), grpc::InsecureChannelCredentials());
    stub_ = std::make_unique<grpc::GenericStub>(channel_);
  }

  void TearDown() override {
    log_.open_gate();
    if (server_) server_->shutdown(1.0);
    server_.reset();
    stub_.reset();
    channel_.reset();
    if (scheduler_) scheduler_->shutdown(Scheduler::ShutdownMode::kDrain);
    route_.reset();
    scheduler_.reset();
    backend_.reset();
    if (!dir_.empty()) {
      ::unlink((dir_ + "/backend.sock").c_str());
      ::rmdir(dir_.c_str());
    }
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
    server_->state().publish(std::move(snapshot));
  }

  ClientResult unary(const std::string& m, const std::string& body, const Metadata& metadata = {},
                     std::chrono::milliseconds timeout = 10s) {
    PendingUnary call(stub_.get(), m, body, metadata, timeout);
    return call.wait();
  }

  // The transport's failure counts as (model, version, code, count), each checked to be gRPC's.
  std::vector<std::tuple<std::string, std::string, int, uint64_t>> failures() {
    std::vector<std::tuple<std::string, std::string, int, uint64_t>> out;
    for (const auto& [model, version, code, protocol, count] : server_->failures().snapshot()) {
      EXPECT_EQ(protocol, "grpc");
      out.emplace_back(model, version, code, count);
    }
    return out;
  }

  std::string dir_, backend_address_;
  std::unique_ptr<FakeBackend> backend_;
  ExecutionLog log_;
  std::shared_ptr<const ModelSignature> signature_;
  std::shared_ptr<Scheduler> scheduler_;
  std::shared_ptr<const ModelRoute> route_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

void expect_add_one_answer(const std::string& body, const std::string& id, const std::vector<float>& input,
                           int64_t rows) {
  InferAnswer answer;
  ASSERT_TRUE(parse_answer(body, &answer));
  EXPECT_EQ(answer.model_name, "add_one");
  EXPECT_EQ(answer.model_version, "1");
  EXPECT_EQ(answer.id, id);
  ASSERT_EQ(answer.outputs.size(), 1u);
  EXPECT_EQ(answer.outputs[0].name, "OUTPUT");
  EXPECT_EQ(answer.outputs[0].datatype, "FP32");
  EXPECT_EQ(answer.outputs[0].shape, (std::vector<int64_t>{rows, 4}));
  ASSERT_EQ(answer.raw.size(), 1u);
  EXPECT_EQ(answer.values(0), plus_one(input));
}

// --- 1. ModelInfer in the core -----------------------------------------------------------------

TEST_F(GrpcServerTest, ModelInferIsComputedInTheCore) {
  const auto input = std::vector<float>{1, 2, 3, 4, 10, 20, 30, 40};
  ClientResult r = unary(method("ModelInfer"), infer_request("add_one", "req-1", input, 2));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  expect_add_one_answer(r.body, "req-1", input, 2);

  // The version written as the snapshot has it ("1") is routed too.
  const auto one_row = rows_from(100, 1);
  r = unary(method("ModelInfer"), infer_request("add_one", "req-2", one_row, 1, 4, "1"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  expect_add_one_answer(r.body, "req-2", one_row, 1);

  EXPECT_EQ(log_.executions(), 2);
  EXPECT_EQ(backend_->call_count(), 0u);
  EXPECT_TRUE(failures().empty());
}

TEST_F(GrpcServerTest, ConcurrentModelInferCallsEachGetTheirOwnRows) {
  log_.set_delay(2ms);  // batches take a little time, so that requests queue up behind them
  constexpr int kThreads = 4, kPerThread = 25;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  std::atomic<int64_t> rows_sent{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      struct Sent {
        std::string id;
        std::vector<float> input;
        int64_t rows;
      };
      std::vector<Sent> sent;
      std::vector<std::unique_ptr<PendingUnary>> calls;
      for (int i = 0; i < kPerThread; ++i) {
        const int64_t rows = 1 + (i % 3);
        const float base = static_cast<float>((t * 100 + i) * 16);
        Sent s{"t" + std::to_string(t) + "-" + std::to_string(i), rows_from(base, rows), rows};
        rows_sent += rows;
        calls.push_back(std::make_unique<PendingUnary>(stub_.get(), method("ModelInfer"),
                                                       infer_request("add_one", s.id, s.input, rows)));
        sent.push_back(std::move(s));
      }
      for (int i = 0; i < kPerThread; ++i) {
        ClientResult r = calls[i]->wait();
        EXPECT_TRUE(r.status.ok()) << r.status.error_message();
        if (!r.status.ok()) continue;
        expect_add_one_answer(r.body, sent[i].id, sent[i].input, sent[i].rows);
        ++ok;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  const auto batches = log_.batch_rows();
  int64_t rows = 0;
  for (int64_t r : batches) {
    EXPECT_LE(r, 8);
    rows += r;
  }
  EXPECT_EQ(rows, rows_sent.load());
  EXPECT_LT(batches.size(), static_cast<size_t>(kThreads * kPerThread));  // the calls shared batches
  EXPECT_EQ(backend_->call_count(), 0u);
}

// --- 2. forwarding ModelInfer --------------------------------------------------------------------

TEST_F(GrpcServerTest, UnknownModelIsForwardedWithItsMetadataAndDeadline) {
  BackendReply reply;
  reply.code = grpc::StatusCode::NOT_FOUND;
  reply.message = "Request for unknown model: 'nope' is not found";
  backend_->set_reply(method("ModelInfer"), reply);
  const std::string request = infer_request("nope", "x1", rows_from(1, 1), 1);
  const std::string traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const auto sent_at = SysClock::now();
  ClientResult r = unary(method("ModelInfer"), request, {{"traceparent", traceparent}, {"x-custom", "v"}}, 3000ms);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(r.status.error_message(), reply.message);

  const auto calls = backend_->calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].method, method("ModelInfer"));
  ASSERT_EQ(calls[0].messages.size(), 1u);
  EXPECT_EQ(calls[0].messages[0], request);  // unparsed, unchanged
  EXPECT_EQ(calls[0].metadata_value("traceparent"), traceparent);
  EXPECT_EQ(calls[0].metadata_value("x-custom"), "v");
  // The client's deadline (3 s from sent_at), give or take gRPC's rounding of grpc-timeout.
  EXPECT_GT(calls[0].deadline, sent_at + 2500ms);
  EXPECT_LT(calls[0].deadline, sent_at + 3200ms);
  EXPECT_EQ(log_.executions(), 0);
  EXPECT_TRUE(failures().empty());  // Python counts what it answers
}

TEST_F(GrpcServerTest, ForwardedAnswerAndTrailingMetadataComeBackUnchanged) {
  BackendReply reply;
  reply.body = ld(1, "other") + ld(3, "y1") + std::string("\x00\x01\xff", 3);
  reply.trailing = {{"x-backend", "yes"}};
  backend_->set_reply(method("ModelInfer"), reply);
  // An unknown model, and a version of add_one that the snapshot does not name.
  for (const std::string& request :
       {infer_request("other", "y1", rows_from(1, 1), 1), infer_request("add_one", "y2", rows_from(1, 1), 1, 4, "7")}) {
    ClientResult r = unary(method("ModelInfer"), request);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.body, reply.body);
    EXPECT_EQ(r.trailing_value("x-backend"), "yes");
  }
  EXPECT_EQ(backend_->call_count(), 2u);
  EXPECT_EQ(log_.executions(), 0);
}

// --- 3. forward_inference ------------------------------------------------------------------------

TEST_F(GrpcServerTest, ForwardInferenceSendsRoutedRequestsToTheBackend) {
  BackendReply reply;
  reply.body = "answered by python";
  backend_->set_reply(method("ModelInfer"), reply);
  publish([](ServingSnapshot& s) { s.forward_inference = true; });
  const std::string request = infer_request("add_one", "f1", rows_from(1, 1), 1);
  ClientResult r = unary(method("ModelInfer"), request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.body, "answered by python");
  ASSERT_EQ(backend_->call_count(), 1u);
  EXPECT_EQ(backend_->calls()[0].messages.at(0), request);
  EXPECT_EQ(log_.executions(), 0);

  // And back in the core once the snapshot says so.
  publish();
  r = unary(method("ModelInfer"), request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  expect_add_one_answer(r.body, "f1", rows_from(1, 1), 1);
  EXPECT_EQ(backend_->call_count(), 1u);
  EXPECT_EQ(log_.executions(), 1);
}

// The value of `key` in an observation's metadata, or "<absent>".
std::string observed_value(const ObservedRequest& observed, const std::string& key) {
  for (const auto& [k, v] : observed.metadata) {
    if (k == key) return v;
  }
  return "<absent>";
}

// A request the snapshot's tracing samples runs in the core like any other, and its record, with
// the caller's metadata, goes to Python's observation queue once it is answered; the others leave
// no record; a caller cannot mark its own request sampled.
TEST_F(GrpcServerTest, TracedRequestsRunInTheCoreAndAreReportedToPython) {
  publish([](ServingSnapshot& s) { s.tracing = TraceSampling{true, true, 0.0}; });
  const std::string sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const std::string not_sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
  const std::string request = infer_request("add_one", "t1", rows_from(1, 1), 1);
  ObservationQueue& observations = *server_->observations();

  ClientResult r = unary(method("ModelInfer"), request, {{"traceparent", sampled}, {"x-caller", "me"}});
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  expect_add_one_answer(r.body, "t1", rows_from(1, 1), 1);
  EXPECT_EQ(backend_->call_count(), 0u);
  std::vector<ObservedRequest> records = observations.drain();  // pushed before the answer
  ASSERT_EQ(records.size(), 1u);
  const ObservedRequest& traced = records[0];
  EXPECT_EQ(traced.model, "add_one");
  EXPECT_EQ(traced.version, "1");
  EXPECT_EQ(traced.id, "t1");
  EXPECT_TRUE(traced.sampled);
  EXPECT_FALSE(traced.streamed);
  EXPECT_TRUE(traced.status.ok());
  EXPECT_EQ(traced.responses, 1u);
  EXPECT_EQ(observed_value(traced, "traceparent"), sampled);
  EXPECT_EQ(observed_value(traced, "x-caller"), "me");
  EXPECT_LE(traced.received, traced.timing.enqueued);
  EXPECT_LE(traced.timing.compute_start, traced.timing.compute_end);
  EXPECT_LE(traced.timing.compute_end, traced.answered);
  EXPECT_EQ(traced.timing.batch_requests, 1u);

  // Not sampled by the caller, or no traceparent at ratio 0, or a caller's own mark: no record.
  for (const Metadata& metadata : std::vector<Metadata>{
           {{"traceparent", not_sampled}}, {}, {{"inferd-trace-sampled", "1"}, {"traceparent", not_sampled}}}) {
    r = unary(method("ModelInfer"), request, metadata);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    expect_add_one_answer(r.body, "t1", rows_from(1, 1), 1);
  }
  EXPECT_TRUE(observations.drain().empty());
  EXPECT_EQ(backend_->call_count(), 0u);
  EXPECT_EQ(log_.executions(), 4);

  // A sampled request the core refuses is reported with its status, and never ran.
  r = unary(method("ModelInfer"), infer_request("add_one", "t3", rows_from(1, 1), 2), {{"traceparent", sampled}});
  ASSERT_FALSE(r.status.ok());
  records = observations.drain();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].status.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(records[0].responses, 0u);
  EXPECT_EQ(records[0].timing.compute_start, Clock::time_point{});

  // Every request observed (verbose logs): recorded, unsampled.
  publish([](ServingSnapshot& s) { s.observe_inference = true; });
  r = unary(method("ModelInfer"), request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  records = observations.drain();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_FALSE(records[0].sampled);

  // A caller's mark never reaches Python either (here an unknown model, forwarded untraced).
  publish([](ServingSnapshot& s) { s.tracing = TraceSampling{true, true, 0.0}; });
  BackendReply reply;
  reply.body = "answered by python";
  backend_->set_reply(method("ModelInfer"), reply);
  r = unary(method("ModelInfer"), infer_request("nope", "t2", rows_from(1, 1), 1),
            {{"inferd-trace-sampled", "1"}, {"traceparent", not_sampled}});
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(backend_->call_count(), 1u);
  EXPECT_EQ(backend_->calls()[0].metadata_value("inferd-trace-sampled"), "<absent>");
  // And a sampled one for a model without a route goes there marked (Python answers and traces it).
  r = unary(method("ModelInfer"), infer_request("nope", "t2", rows_from(1, 1), 1), {{"traceparent", sampled}});
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(backend_->call_count(), 2u);
  EXPECT_EQ(backend_->calls()[1].metadata_value("inferd-trace-sampled"), "1");
}

// A model's own trace settings (Triton's per-model TraceSetting) decide its requests instead of
// the global rule, budget included; the other models keep the global rule.
TEST_F(GrpcServerTest, AModelsOwnTracingRuleOverridesTheGlobalOne) {
  const std::string request = infer_request("add_one", "m1", rows_from(1, 1), 1);
  ObservationQueue& observations = *server_->observations();
  auto budget = std::make_shared<TraceBudget>(2);
  publish([&](ServingSnapshot& s) {
    s.tracing = TraceSampling{true, false, 0.0};                           // globally: nothing
    s.model_tracing["add_one"] = TraceSampling{true, false, 1.0, budget};  // add_one: two traces
  });
  for (int i = 0; i < 3; ++i) {
    ClientResult r = unary(method("ModelInfer"), request);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  }
  std::vector<ObservedRequest> records = observations.drain();
  ASSERT_EQ(records.size(), 2u);  // the third found the budget spent
  EXPECT_TRUE(records[0].sampled && records[1].sampled);
  EXPECT_EQ(budget->remaining(), 0);

  // A model without its own rule is sampled by the global one: an unknown model, forwarded
  // unmarked, then marked once the global rule samples everything.
  BackendReply reply;
  reply.body = "answered by python";
  backend_->set_reply(method("ModelInfer"), reply);
  const std::string other = infer_request("nope", "m2", rows_from(1, 1), 1);
  ASSERT_TRUE(unary(method("ModelInfer"), other).status.ok());
  publish([&](ServingSnapshot& s) {
    s.tracing = TraceSampling{true, false, 1.0};
    s.model_tracing["add_one"] = TraceSampling{};  // add_one: off
  });
  ASSERT_TRUE(unary(method("ModelInfer"), other).status.ok());
  ASSERT_EQ(backend_->call_count(), 2u);
  EXPECT_EQ(backend_->calls()[0].metadata_value("inferd-trace-sampled"), "<absent>");
  EXPECT_EQ(backend_->calls()[1].metadata_value("inferd-trace-sampled"), "1");
  ASSERT_TRUE(unary(method("ModelInfer"), request).status.ok());
  EXPECT_TRUE(observations.drain().empty());
}

TEST_F(GrpcServerTest, StreamRequestsAreSampledAndReportedOneByOne) {
  // Ratio 1 at the root: with no traceparent every request of the stream is traced.
  publish([](ServingSnapshot& s) { s.tracing = TraceSampling{true, true, 1.0}; });
  ObservationQueue& observations = *server_->observations();
  {
    StreamClient stream(stub_.get(), method("ModelStreamInfer"));
    for (int i = 0; i < 3; ++i) stream.write(infer_request("add_one", "s1", rows_from(1, 1), 1));
    for (int i = 0; i < 3; ++i) {
      std::string bytes;
      ASSERT_TRUE(stream.read(&bytes));
      StreamAnswer answer;
      ASSERT_TRUE(parse_stream_answer(bytes, &answer));
      expect_add_one_answer(answer.infer_bytes, "s1", rows_from(1, 1), 1);
    }
    stream.writes_done();
    EXPECT_TRUE(stream.finish().ok());
  }
  EXPECT_EQ(backend_->call_count(), 0u);
  const std::vector<ObservedRequest> records = observations.drain();
  ASSERT_EQ(records.size(), 3u);
  for (const ObservedRequest& record : records) {
    EXPECT_TRUE(record.sampled);
    EXPECT_TRUE(record.streamed);
    EXPECT_EQ(record.id, "s1");
    EXPECT_EQ(record.responses, 1u);
    EXPECT_TRUE(record.status.ok());
  }
  // The caller's unsampled parent leaves no record.
  {
    StreamClient stream(stub_.get(), method("ModelStreamInfer"),
                        {{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}});
    stream.write(infer_request("add_one", "s2", rows_from(1, 1), 1));
    std::string bytes;
    ASSERT_TRUE(stream.read(&bytes));
    StreamAnswer answer;
    ASSERT_TRUE(parse_stream_answer(bytes, &answer));
    EXPECT_EQ(answer.error_message, "");
    stream.writes_done();
    EXPECT_TRUE(stream.finish().ok());
  }
  EXPECT_TRUE(observations.drain().empty());
  EXPECT_EQ(backend_->call_count(), 0u);
}

// --- 4. calls answered from the snapshot ---------------------------------------------------------

TEST_F(GrpcServerTest, ServerLiveAndReadyComeFromTheSnapshot) {
  for (bool ready : {true, false}) {
    publish([&](ServingSnapshot& s) { s.ready = ready; });
    ClientResult r = unary(method("ServerReady"), "");
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(parse_bool_answer(r.body), std::optional<bool>(ready));
    r = unary(method("ServerLive"), "");
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(parse_bool_answer(r.body), std::optional<bool>(true));
  }
  publish([](ServingSnapshot& s) { s.live = false; });
  ClientResult r = unary(method("ServerLive"), "");
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(parse_bool_answer(r.body), std::optional<bool>(false));
  EXPECT_EQ(backend_->call_count(), 0u);
}

TEST_F(GrpcServerTest, ModelCallsAreAnsweredFromTheSnapshotsBytes) {
  for (const std::string& version : {std::string(), std::string("1")}) {
    SCOPED_TRACE("version '" + version + "'");
    ClientResult r = unary(method("ModelMetadata"), name_version("add_one", version));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.body, route_->metadata_response);
    r = unary(method("ModelConfig"), name_version("add_one", version));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.body, route_->config_response);
    r = unary(method("ModelReady"), name_version("add_one", version));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(parse_bool_answer(r.body), std::optional<bool>(true));
  }
  publish([](ServingSnapshot& s) { s.accepting = false; });
  ClientResult r = unary(method("ModelReady"), name_version("add_one"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(parse_bool_answer(r.body), std::optional<bool>(false));
  EXPECT_EQ(backend_->call_count(), 0u);
}

TEST_F(GrpcServerTest, SnapshotMissesAreForwarded) {
  BackendReply not_found;
  not_found.code = grpc::StatusCode::NOT_FOUND;
  not_found.message = "Request for unknown model: 'nope' is not found";
  backend_->set_reply(method("ModelMetadata"), not_found);
  backend_->set_reply(method("ModelConfig"), not_found);
  BackendReply ready;
  ready.body = std::string("\x08\x01", 2);
  backend_->set_reply(method("ModelReady"), ready);

  ClientResult r = unary(method("ModelMetadata"), name_version("nope"));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(r.status.error_message(), not_found.message);
  r = unary(method("ModelConfig"), name_version("add_one", "2"));  // a version not in the snapshot
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(r.status.error_message(), not_found.message);
  publish([](ServingSnapshot& s) { s.accepting = false; });
  r = unary(method("ModelReady"), name_version("other"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(parse_bool_answer(r.body), std::optional<bool>(true));  // the backend's word, not the snapshot's
  const std::string malformed(
      "\x0a\x09"
      "add",
      5);  // a name cut short: Python says what is wrong
  r = unary(method("ModelReady"), malformed);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  // Calls the snapshot never answers.
  r = unary(method("ServerMetadata"), "");
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.body, "backend answered " + method("ServerMetadata"));
  r = unary(method("RepositoryIndex"), ld(1, "repo"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.body, "backend answered " + method("RepositoryIndex"));

  const auto calls = backend_->calls();
  ASSERT_EQ(calls.size(), 6u);
  EXPECT_EQ(calls[0].method, method("ModelMetadata"));
  EXPECT_EQ(calls[0].messages.at(0), name_version("nope"));
  EXPECT_EQ(calls[1].method, method("ModelConfig"));
  EXPECT_EQ(calls[2].method, method("ModelReady"));
  EXPECT_EQ(calls[3].messages.at(0), malformed);
  EXPECT_EQ(calls[4].method, method("ServerMetadata"));
  EXPECT_EQ(calls[5].messages.at(0), ld(1, "repo"));
}

// --- 5. forwarded streaming calls ----------------------------------------------------------------

TEST_F(GrpcServerTest, ForwardedServerStreamRelaysEveryMessageAndTheStatus) {
  BackendReply watch;
  watch.stream_messages = 20;
  watch.code = grpc::StatusCode::FAILED_PRECONDITION;
  watch.message = "the watch is over";
  watch.trailing = {{"x-watch", "done"}};
  backend_->set_reply("/grpc.health.v1.Health/Watch", watch);
  StreamClient stream(stub_.get(), "/grpc.health.v1.Health/Watch", {{"x-client", "watcher"}});
  stream.write(ld(1, "inference.GRPCInferenceService"));
  stream.writes_done();
  for (int i = 0; i < 20; ++i) {
    std::string message;
    ASSERT_TRUE(stream.read(&message)) << "message " << i;
    EXPECT_EQ(message, "message " + std::to_string(i));
  }
  std::string extra;
  EXPECT_FALSE(stream.read(&extra));
  const grpc::Status status = stream.finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "the watch is over");
  EXPECT_EQ(stream.trailing_value("x-watch"), "done");
  const auto calls = backend_->calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].method, "/grpc.health.v1.Health/Watch");
  EXPECT_EQ(calls[0].messages, std::vector<std::string>{ld(1, "inference.GRPCInferenceService")});
  EXPECT_EQ(calls[0].metadata_value("x-client"), "watcher");
}

TEST_F(GrpcServerTest, ForwardedBidiRelaysMessagesBothWays) {
  StreamClient stream(stub_.get(), kEchoChat);
  for (int i = 0; i < 3; ++i) {
    stream.write("m" + std::to_string(i));
    std::string echoed;
    ASSERT_TRUE(stream.read(&echoed)) << "echo " << i;
    EXPECT_EQ(echoed, "echo:m" + std::to_string(i));
  }
  stream.writes_done();
  std::string extra;
  EXPECT_FALSE(stream.read(&extra));
  const grpc::Status status = stream.finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(stream.trailing_value("x-echoed"), "3");
  const auto calls = backend_->calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].messages, (std::vector<std::string>{"m0", "m1", "m2"}));
}

// A backend may end a bidi call while its client still has the stream open (gRPC lets a server
// finish at any time): the client must get the status without having to send or half-close first.
TEST_F(GrpcServerTest, ForwardedBidiStatusReachesAClientThatHasNotHalfClosed) {
  // The control: straight to the backend, the status comes at once.
  {
    grpc::GenericStub direct(grpc::CreateChannel(backend_address_, grpc::InsecureChannelCredentials()));
    StreamClient stream(&direct, kEchoOneThenEnd);
    stream.write("hello");
    std::string echoed;
    ASSERT_TRUE(stream.read(&echoed));
    const grpc::Status status = stream.finish(1000ms);
    ASSERT_EQ(status.error_code(), grpc::StatusCode::ABORTED) << "the fake backend itself: " << status.error_message();
  }
  // Through the server.
  StreamClient stream(stub_.get(), kEchoOneThenEnd);
  stream.write("hello");
  std::string echoed;
  ASSERT_TRUE(stream.read(&echoed));
  EXPECT_EQ(echoed, "echo:hello");
  const grpc::Status status = stream.finish(1000ms);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED) << status.error_message();
  EXPECT_EQ(status.error_message(), "the backend ended the stream");
  if (status.error_code() == grpc::StatusCode::UNKNOWN) {
    // Held back: it comes once the client half-closes.
    stream.writes_done();
    const grpc::Status late = stream.finish(1000ms);
    EXPECT_EQ(late.error_code(), grpc::StatusCode::ABORTED)
        << "after the client's half-close: " << late.error_message();
  }
  stream.cancel();
}

TEST_F(GrpcServerTest, CancellingAForwardedCallCancelsTheBackendsCall) {
  BackendReply hang;
  hang.hang = true;
  backend_->set_reply(kSlowHang, hang);
  backend_->set_reply(method("ModelInfer"), hang);
  // A call relayed as a stream (ForwardedCall) and a ModelInfer miss (forwarded as unary).
  const std::vector<std::pair<std::string, std::string>> calls = {
      {kSlowHang, "please wait"}, {method("ModelInfer"), infer_request("nope", "h1", rows_from(1, 1), 1)}};
  for (size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE(calls[i].first);
    PendingUnary call(stub_.get(), calls[i].first, calls[i].second);
    ASSERT_TRUE(backend_->wait_calls(i + 1));
    EXPECT_FALSE(call.done_within(50ms));
    call.cancel();
    EXPECT_EQ(call.wait().status.error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_TRUE(backend_->wait_cancelled(i, 2000ms));
  }
}

// --- 6. ModelStreamInfer -------------------------------------------------------------------------

TEST_F(GrpcServerTest, StreamInferAnswersEveryRequestWithItsId) {
  log_.set_delay(1ms);
  StreamClient stream(stub_.get(), method("ModelStreamInfer"));
  constexpr int kRequests = 6;
  std::map<std::string, std::vector<float>> inputs;
  for (int i = 0; i < kRequests; ++i) {
    const std::string id = "s" + std::to_string(i);
    inputs[id] = rows_from(static_cast<float>(i * 100), 1);
    stream.write(infer_request("add_one", id, inputs[id], 1));
  }
  std::map<std::string, std::vector<float>> answered;
  for (int i = 0; i < kRequests; ++i) {
    std::string bytes;
    ASSERT_TRUE(stream.read(&bytes)) << "answer " << i;
    StreamAnswer answer;
    ASSERT_TRUE(parse_stream_answer(bytes, &answer));
    EXPECT_EQ(answer.error_message, "");
    ASSERT_TRUE(answer.has_infer_response);
    EXPECT_EQ(answer.infer.model_name, "add_one");
    ASSERT_EQ(answer.infer.raw.size(), 1u);
    EXPECT_TRUE(answered.emplace(answer.infer.id, answer.infer.values(0)).second)
        << "answered twice: " << answer.infer.id;
  }
  for (const auto& [id, input] : inputs) EXPECT_EQ(answered[id], plus_one(input)) << id;
  stream.writes_done();
  std::string extra;
  EXPECT_FALSE(stream.read(&extra));
  const grpc::Status status = stream.finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(backend_->call_count(), 0u);
}

// Issue 13, item 3: a message that does not parse ends the stream with INVALID_ARGUMENT, after
// the requests accepted before it are answered; what comes after it is not read.
TEST_F(GrpcServerTest, StreamInferEndsOnAMalformedMessageAfterAnsweringTheRequestsBeforeIt) {
  StreamClient stream(stub_.get(), method("ModelStreamInfer"));
  const std::string malformed(
      "\x0a\x05"
      "ab",
      4);
  const Status parse_error = check_request(nullptr, malformed);
  ASSERT_FALSE(parse_error.ok());
  std::set<std::string> sent;
  for (int i = 0; i < 6; ++i) {
    sent.insert("before-" + std::to_string(i));
    stream.write(infer_request("add_one", "before-" + std::to_string(i), rows_from(static_cast<float>(i), 1), 1));
  }
  stream.write(malformed);
  stream.write(infer_request("add_one", "after", rows_from(5, 1), 1));
  std::set<std::string> answered;
  std::string bytes;
  while (stream.read(&bytes)) {
    StreamAnswer answer;
    ASSERT_TRUE(parse_stream_answer(bytes, &answer));
    EXPECT_EQ(answer.error_message, "");
    answered.insert(answer.infer.id);
  }
  EXPECT_EQ(answered, sent);
  const grpc::Status status = stream.finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), parse_error.message);
}

TEST_F(GrpcServerTest, StreamInferForwardsUnknownModelsAndReturnsTheirErrorWithTheId) {
  BackendReply not_found;
  not_found.code = grpc::StatusCode::NOT_FOUND;
  not_found.message = "Request for unknown model: 'nope' is not found";
  backend_->set_reply(method("ModelInfer"), not_found);
  const std::string traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  StreamClient stream(stub_.get(), method("ModelStreamInfer"), {{"traceparent", traceparent}});
  const std::string request = infer_request("nope", "u1", rows_from(1, 1), 1);
  stream.write(request);
  std::string bytes;
  ASSERT_TRUE(stream.read(&bytes));
  StreamAnswer answer;
  ASSERT_TRUE(parse_stream_answer(bytes, &answer));
  EXPECT_EQ(answer.error_message, not_found.message);
  EXPECT_EQ(answer.infer.id, "u1");

  // A forwarded request the backend answers comes back as the stream's infer_response, as is.
  BackendReply answered;
  answered.body = ld(1, "nope") + ld(3, "u2");
  backend_->set_reply(method("ModelInfer"), answered);
  stream.write(infer_request("nope", "u2", rows_from(1, 1), 1));
  ASSERT_TRUE(stream.read(&bytes));
  answer = StreamAnswer();
  ASSERT_TRUE(parse_stream_answer(bytes, &answer));
  EXPECT_EQ(answer.error_message, "");
  EXPECT_EQ(answer.infer_bytes, answered.body);
  stream.writes_done();
  const grpc::Status status = stream.finish();
  EXPECT_TRUE(status.ok()) << status.error_message();

  const auto calls = backend_->calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].method, method("ModelInfer"));
  EXPECT_EQ(calls[0].messages.at(0), request);
  EXPECT_EQ(calls[0].metadata_value("traceparent"), traceparent);
}

TEST_F(GrpcServerTest, StreamInferWithTritonGrpcErrorEndsTheCallOnTheFirstError) {
  StreamClient stream(stub_.get(), method("ModelStreamInfer"), {{"triton_grpc_error", "true"}});
  stream.write(infer_request("add_one", "good", rows_from(1, 1), 1));
  std::string bytes;
  ASSERT_TRUE(stream.read(&bytes));
  StreamAnswer answer;
  ASSERT_TRUE(parse_stream_answer(bytes, &answer));
  EXPECT_EQ(answer.infer.id, "good");
  const std::string wrong_shape = infer_request("add_one", "bad", {1, 2, 3}, 1, 3);
  const Status expected = check_request(signature_, wrong_shape);
  ASSERT_EQ(expected.code, StatusCode::kInvalidArgument);
  stream.write(wrong_shape);
  EXPECT_FALSE(stream.read(&bytes));  // no error_message: the call ends
  const grpc::Status status = stream.finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), expected.message);
}

// A decoupled model: a request whose first value is n gets n responses, the k-th four values k
// (shape [1, 4]), 1 ms apart (so that they meet the stream's writes in flight), then its final flag
// alone.
class CountdownExecutor : public Executor {
 public:
  Status execute(const std::vector<Tensor>&, std::vector<Tensor>*) override {
    return Status::Error(StatusCode::kInternal, "execute() called on a decoupled executor");
  }
  bool decoupled() const override { return true; }
  Status execute_requests(const std::vector<ExecutorRequest>& requests, std::vector<RequestResult>* results,
                          ResponseStream* responses) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto n = static_cast<int>(*reinterpret_cast<const float*>(requests[i].inputs.at(0).data));
      for (int k = 0; k < n; ++k) {
        auto values = std::make_shared<std::vector<float>>(4, static_cast<float>(k));
        RequestResult response;
        response.outputs.push_back(
            Tensor{DataType::kFp32, {1, 4}, reinterpret_cast<const std::byte*>(values->data()), 16, values});
        responses->respond(i, std::move(response));
        std::this_thread::sleep_for(1ms);
      }
      RequestResult flag_only;
      flag_only.respond = false;
      results->push_back(std::move(flag_only));
    }
    return Status::Ok();
  }
};

TEST_F(GrpcServerTest, ConcurrentStreamsOfADecoupledModelGetEachResponseInOrderThenTheFinalFlag) {
  auto signature = std::make_shared<ModelSignature>(*signature_);
  signature->name = "countdown";
  signature->decoupled = true;
  SchedulerOptions options;
  options.model_name = "countdown";
  options.batching.dynamic = true;
  options.batching.max_batch_size = 8;
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::make_unique<CountdownExecutor>());
  auto scheduler = std::make_shared<Scheduler>(options, std::move(instances), std::make_shared<CompletionQueue>(),
                                               std::make_shared<PinnedBufferPool>(1 << 24, false));
  auto route = std::make_shared<ModelRoute>();
  route->model = "countdown";
  route->version = "1";
  route->scheduler = scheduler;
  route->signature = signature;
  publish([&](ServingSnapshot& snapshot) {
    snapshot.models["countdown"][""] = route;
    snapshot.schedulers.push_back(scheduler);
  });
  // ModelInferRequest.parameters {"triton_enable_empty_final_response": bool_param true}
  const std::string wants_flag = ld(4, ld(1, "triton_enable_empty_final_response") + ld(2, key(1, 0) + varint(1)));
  const std::string final_true("triton_final_response\x12\x02\x08\x01", 25);
  const std::string final_false("triton_final_response\x12\x02\x08\x00", 25);
  const std::vector<int> counts = {3, 0, 5, 1};
  constexpr int kStreams = 8;
  std::vector<std::thread> clients;
  for (int c = 0; c < kStreams; ++c) {
    clients.emplace_back([&, c] {
      StreamClient stream(stub_.get(), method("ModelStreamInfer"));
      for (int n : counts) {
        stream.write(infer_request("countdown", std::to_string(c) + "-" + std::to_string(n),
                                   rows_from(static_cast<float>(n), 1), 1) +
                     wants_flag);
      }
      std::map<std::string, int> next;  // id -> responses seen; -1 once its final flag came
      size_t messages = 0;
      std::string bytes;
      while (messages < 9 + counts.size() && stream.read(&bytes)) {
        ++messages;
        StreamAnswer answer;
        ASSERT_TRUE(parse_stream_answer(bytes, &answer));
        EXPECT_EQ(answer.error_message, "");
        const std::string& id = answer.infer.id;
        const int n = std::stoi(id.substr(id.find('-') + 1));
        if (answer.infer_bytes.find(final_true) != std::string::npos) {
          EXPECT_TRUE(answer.infer.outputs.empty()) << id;  // the empty final response
          EXPECT_EQ(next[id], n) << id << ": final flag before its responses";
          next[id] = -1;
          continue;
        }
        EXPECT_NE(answer.infer_bytes.find(final_false), std::string::npos) << id;
        ASSERT_EQ(answer.infer.raw.size(), 1u) << id;
        EXPECT_EQ(answer.infer.values(0), std::vector<float>(4, static_cast<float>(next[id]))) << id;
        ++next[id];
      }
      EXPECT_EQ(messages, 9 + counts.size());
      for (int n : counts) EXPECT_EQ(next[std::to_string(c) + "-" + std::to_string(n)], -1) << n;
      stream.writes_done();
      const grpc::Status status = stream.finish();
      EXPECT_TRUE(status.ok()) << status.error_message();
    });
  }
  for (auto& client : clients) client.join();
  EXPECT_EQ(backend_->call_count(), 0u);
  EXPECT_EQ(scheduler->statistics().responses, static_cast<uint64_t>(kStreams * 9));
}

// Issue 25, items 2 and 3: a decoupled model that sends 1 MiB responses as fast as it can, to a
// client that reads none: it stops (cancelled) once the call holds its bound of unsent answers.
class FloodExecutor : public Executor {
 public:
  Status execute(const std::vector<Tensor>&, std::vector<Tensor>*) override {
    return Status::Error(StatusCode::kInternal, "execute() called on a decoupled executor");
  }
  bool decoupled() const override { return true; }
  Status execute_requests(const std::vector<ExecutorRequest>& requests, std::vector<RequestResult>* results,
                          ResponseStream* responses) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto n = static_cast<int>(*reinterpret_cast<const float*>(requests[i].inputs.at(0).data));
      int k = 0;
      for (; k < n && !requests[i].cancellation.requested(); ++k) {
        auto values = std::make_shared<std::vector<float>>(kValues, static_cast<float>(k));
        RequestResult response;
        response.outputs.push_back(Tensor{DataType::kFp32,
                                          {1, kValues},
                                          reinterpret_cast<const std::byte*>(values->data()),
                                          kValues * sizeof(float),
                                          values});
        responses->respond(i, std::move(response));
      }
      sent.store(k);
      RequestResult flag_only;
      flag_only.respond = false;
      results->push_back(std::move(flag_only));
    }
    done.store(done.load() + 1);
    return Status::Ok();
  }
  static constexpr int64_t kValues = 1 << 18;  // 1 MiB of FP32
  std::atomic<int> sent{-1};                   // responses the last request got before it stopped
  std::atomic<int> done{0};                    // requests run
};

class FloodTest : public GrpcServerTest {
 protected:
  // Restarts the server with `options` and publishes the flood model.
  void serve_flood(GrpcServerOptions options) {
    server_->shutdown(1.0);
    start_server(options);
    auto signature = std::make_shared<ModelSignature>(*signature_);
    signature->name = "flood";
    signature->decoupled = true;
    signature->outputs.at(0).dims = {-1};
    SchedulerOptions scheduler_options;
    scheduler_options.model_name = "flood";
    std::vector<std::unique_ptr<Executor>> instances;
    auto executor = std::make_unique<FloodExecutor>();
    flood_ = executor.get();
    instances.push_back(std::move(executor));
    flood_scheduler_ =
        std::make_shared<Scheduler>(scheduler_options, std::move(instances), std::make_shared<CompletionQueue>(),
                                    std::make_shared<PinnedBufferPool>(1 << 24, false));
    auto route = std::make_shared<ModelRoute>();
    route->model = "flood";
    route->version = "1";
    route->scheduler = flood_scheduler_;
    route->signature = signature;
    publish([&](ServingSnapshot& snapshot) {
      snapshot.models["flood"][""] = route;
      snapshot.schedulers.push_back(flood_scheduler_);
    });
  }
  void TearDown() override {
    if (flood_scheduler_) flood_scheduler_->shutdown(Scheduler::ShutdownMode::kDrain);
    GrpcServerTest::TearDown();
  }
  FloodExecutor* flood_ = nullptr;
  std::shared_ptr<Scheduler> flood_scheduler_;
};

TEST_F(FloodTest, ADecoupledModelsUnsentResponsesAreBoundedPerCallAndTheRequestFailsPastIt) {
  GrpcServerOptions options;
  options.max_stream_pending_bytes = uint64_t{4} << 20;
  serve_flood(options);
  FloodExecutor* flood = flood_;
  {
    StreamClient stream(stub_.get(), method("ModelStreamInfer"), {}, 20s, /*reading=*/false);
    stream.write(infer_request("flood", "deluge", rows_from(1000, 1), 1));
    ASSERT_TRUE(eventually([&] { return flood->done.load() == 1; }, 15s)) << "the model was never stopped";
    // 4 MiB per call, a few more in grpc's flow-control windows: far from the 1000 MiB asked for.
    EXPECT_LT(flood->sent.load(), 64) << "responses sent before the request was cancelled";
    stream.start_reading();
    std::string bytes;
    int responses = 0;
    StreamAnswer answer;
    while (stream.read(&bytes)) {
      answer = StreamAnswer{};
      ASSERT_TRUE(parse_stream_answer(bytes, &answer));
      if (!answer.error_message.empty()) break;
      ASSERT_EQ(answer.infer.raw.size(), 1u);
      EXPECT_EQ(answer.infer.values(0).front(), static_cast<float>(responses)) << "in order";
      ++responses;
    }
    EXPECT_NE(answer.error_message.find("waiting to be sent passed their bound"), std::string::npos)
        << answer.error_message;
    EXPECT_EQ(answer.infer.id, "deluge");
    EXPECT_NE(answer.infer_bytes.find(std::string("triton_final_response\x12\x02\x08\x01", 25)), std::string::npos)
        << "the error is the request's last answer";
    EXPECT_GE(responses, 3);  // three 1 MiB answers (and their headers) fit in 4 MiB
    EXPECT_LE(responses, flood->sent.load());
    EXPECT_FALSE(stream.read(&bytes, 200ms)) << "nothing after the request's last answer";
    stream.writes_done();
    const grpc::Status status = stream.finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  // The same model serves a client that reads, whole (within the bound: the model writes faster
  // than any client reads, so 1 MiB responses past it would fail).
  StreamClient reader(stub_.get(), method("ModelStreamInfer"));
  reader.write(infer_request("flood", "drizzle", rows_from(3, 1), 1));
  std::string bytes;
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(reader.read(&bytes)) << k;
    StreamAnswer answer;
    ASSERT_TRUE(parse_stream_answer(bytes, &answer));
    EXPECT_EQ(answer.error_message, "");
  }
  reader.writes_done();
  EXPECT_TRUE(reader.finish().ok());
  EXPECT_EQ(flood->sent.load(), 3);
}

// Item 3: with no bound per call, the server's budget (--max-inflight-bytes) bounds what every
// stream's unsent answers hold together.
TEST_F(FloodTest, UnsentResponsesOfEveryStreamCountInTheServersBudget) {
  GrpcServerOptions options;
  options.max_stream_pending_bytes = 0;
  options.max_inflight_bytes = uint64_t{6} << 20;
  serve_flood(options);
  std::vector<std::unique_ptr<StreamClient>> streams;
  for (int c = 0; c < 3; ++c) {
    streams.push_back(std::make_unique<StreamClient>(stub_.get(), method("ModelStreamInfer"), Metadata{}, 20s,
                                                     /*reading=*/false));
    streams.back()->write(infer_request("flood", "s" + std::to_string(c), rows_from(1000, 1), 1));
    ASSERT_TRUE(eventually([&] { return flood_->done.load() == c + 1; }, 15s))
        << "stream " << c << " was never stopped";
    EXPECT_LT(flood_->sent.load(), 64) << "stream " << c;
  }
  for (auto& stream : streams) {
    stream->start_reading();
    std::string bytes;
    std::string last_error;
    while (stream->read(&bytes)) {
      StreamAnswer answer;
      ASSERT_TRUE(parse_stream_answer(bytes, &answer));
      last_error = answer.error_message;
      if (!last_error.empty()) break;  // the request's last answer
    }
    EXPECT_NE(last_error.find("6291456 bytes in all, --max-inflight-bytes"), std::string::npos) << last_error;
    stream->cancel();
  }
}

// --- 7. invalid bytes ----------------------------------------------------------------------------

TEST_F(GrpcServerTest, InvalidRequestBytesAreInvalidArgumentAndServingGoesOn) {
  const std::vector<std::string> invalid = {
      std::string("\x0a\x05"
                  "ab",
                  4),          // a model name longer than the message
      ld(1, "\xff\xfe"),       // a model name that is not UTF-8
      std::string("\x80", 1),  // a key cut off
  };
  for (const std::string& bytes : invalid) {
    const Status expected = check_request(nullptr, bytes);
    ASSERT_EQ(expected.code, StatusCode::kInvalidArgument);
    ClientResult r = unary(method("ModelInfer"), bytes);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(r.status.error_message(), expected.message);
  }
  ClientResult r = unary(method("ModelInfer"), infer_request("add_one", "fine", rows_from(3, 1), 1));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  expect_add_one_answer(r.body, "fine", rows_from(3, 1), 1);
  EXPECT_EQ(backend_->call_count(), 0u);
  EXPECT_TRUE(failures().empty());  // no model named: nothing to count against
}

// Issue 13, small ones: bytes that are not protobuf are INVALID_ARGUMENT on the calls the snapshot
// answers too, never a live or ready answer.
TEST_F(GrpcServerTest, ServerLiveAndReadyRefuseBytesThatAreNotProtobuf) {
  for (const char* name : {"ServerLive", "ServerReady"}) {
    SCOPED_TRACE(name);
    ClientResult r = unary(method(name), std::string("\xff\xff\xff", 3));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    r = unary(method(name), key(99, 0) + varint(1));  // an unknown field is fine
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }
  EXPECT_EQ(backend_->call_count(), 0u);
}

// --- 8. cancellation -----------------------------------------------------------------------------

// One request holds the only executor (gate closed); the next waits in the batcher's queue.
TEST_F(GrpcServerTest, ACancelledCallStillQueuedIsNotComputed) {
  log_.close_gate();
  PendingUnary first(stub_.get(), method("ModelInfer"), infer_request("add_one", "first", rows_from(1000, 1), 1));
  ASSERT_TRUE(log_.wait_executions(1));
  PendingUnary queued(stub_.get(), method("ModelInfer"), infer_request("add_one", "queued", rows_from(2000, 1), 1));
  ASSERT_TRUE(eventually([&] { return scheduler_->pending_requests() == 1; }));
  queued.cancel();
  EXPECT_EQ(queued.wait().status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(eventually([&] { return scheduler_->pending_requests() == 0; }));  // out of the queue
  log_.open_gate();
  ClientResult r = first.wait();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  expect_add_one_answer(r.body, "first", rows_from(1000, 1), 1);
  EXPECT_EQ(log_.executions(), 1);
  EXPECT_FALSE(log_.computed_row_starting_with(2000));
}

// Issue 13, item 1: the in-flight byte budget. A request the core holds keeps its bytes; one that
// would pass the budget is RESOURCE_EXHAUSTED at once and never reaches the core; once the first
// is answered its bytes are back and the next fits.
TEST_F(GrpcServerTest, ARequestPastTheInflightBudgetIsRefusedAtOnceAndTheBytesComeBack) {
  const std::string request = infer_request("add_one", "first", rows_from(1000, 1), 1);
  server_->shutdown(1.0);
  GrpcServerOptions options;
  options.max_inflight_bytes = request.size() + request.size() / 2;  // one fits, two do not
  start_server(options);
  publish();
  log_.close_gate();
  PendingUnary first(stub_.get(), method("ModelInfer"), request);
  ASSERT_TRUE(log_.wait_executions(1));
  ClientResult refused = unary(method("ModelInfer"), infer_request("add_one", "other", rows_from(2000, 1), 1));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.status.error_message().find("--max-inflight-bytes"), std::string::npos)
      << refused.status.error_message();
  log_.open_gate();
  ASSERT_TRUE(first.wait().status.ok());
  // Its bytes come back once the call is done, just after the client has the answer.
  EXPECT_TRUE(eventually([&] {
    return unary(method("ModelInfer"), infer_request("add_one", "third", rows_from(3000, 1), 1)).status.ok();
  }));
  EXPECT_FALSE(log_.computed_row_starting_with(2000));
}

TEST_F(GrpcServerTest, ADeadlinePassedWhileQueuedIsNotComputed) {
  log_.close_gate();
  PendingUnary first(stub_.get(), method("ModelInfer"), infer_request("add_one", "first", rows_from(1000, 1), 1));
  ASSERT_TRUE(log_.wait_executions(1));
  PendingUnary late(stub_.get(), method("ModelInfer"), infer_request("add_one", "late", rows_from(3000, 1), 1), {},
                    200ms);
  EXPECT_EQ(late.wait().status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(eventually([&] { return scheduler_->pending_requests() == 0; }));
  // The core's deadline took it out, not grpc's cancellation at the same instant: it is counted as
  // a missed deadline (without the deadline passed to the core it would wait and be computed).
  using Count = std::tuple<std::string, std::string, int, uint64_t>;
  EXPECT_TRUE(eventually([&] {
    return failures() == std::vector<Count>{Count{"add_one", "1", static_cast<int>(StatusCode::kDeadlineExceeded), 1}};
  }));
  log_.open_gate();
  ClientResult r = first.wait();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(log_.executions(), 1);
  EXPECT_FALSE(log_.computed_row_starting_with(3000));
}

// A stream's deadline reaches its queued requests the same way.
TEST_F(GrpcServerTest, AStreamsDeadlineReachesItsQueuedRequests) {
  log_.close_gate();
  PendingUnary first(stub_.get(), method("ModelInfer"), infer_request("add_one", "first", rows_from(1000, 1), 1));
  ASSERT_TRUE(log_.wait_executions(1));
  {
    StreamClient stream(stub_.get(), method("ModelStreamInfer"), {}, 200ms);
    stream.write(infer_request("add_one", "late", rows_from(5000, 1), 1));
    EXPECT_EQ(stream.finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  EXPECT_TRUE(eventually([&] { return scheduler_->pending_requests() == 0; }));
  using Count = std::tuple<std::string, std::string, int, uint64_t>;
  EXPECT_TRUE(eventually([&] {
    return failures() == std::vector<Count>{Count{"add_one", "1", static_cast<int>(StatusCode::kDeadlineExceeded), 1}};
  }));
  log_.open_gate();
  ASSERT_TRUE(first.wait().status.ok());
  EXPECT_EQ(log_.executions(), 1);
  EXPECT_FALSE(log_.computed_row_starting_with(5000));
}

// A call cancelled while its batch computes is answered CANCELLED at once; the late result is
// dropped when the batch ends, and the server goes on.
TEST_F(GrpcServerTest, ACallCancelledWhileComputingIsAnsweredAtOnce) {
  log_.close_gate();
  PendingUnary running(stub_.get(), method("ModelInfer"), infer_request("add_one", "r", rows_from(1, 1), 1));
  ASSERT_TRUE(log_.wait_executions(1));
  running.cancel();
  EXPECT_EQ(running.wait(2000ms).status.error_code(), grpc::StatusCode::CANCELLED);
  log_.open_gate();
  ClientResult r = unary(method("ModelInfer"), infer_request("add_one", "next", rows_from(7, 1), 1));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  expect_add_one_answer(r.body, "next", rows_from(7, 1), 1);
  EXPECT_EQ(log_.executions(), 2);
}

TEST_F(GrpcServerTest, ACancelledStreamDropsItsQueuedRequests) {
  log_.close_gate();
  {
    StreamClient stream(stub_.get(), method("ModelStreamInfer"));
    stream.write(infer_request("add_one", "a", rows_from(1000, 1), 1));
    ASSERT_TRUE(log_.wait_executions(1));
    stream.write(infer_request("add_one", "b", rows_from(4000, 1), 1));
    ASSERT_TRUE(eventually([&] { return scheduler_->pending_requests() == 1; }));
    stream.cancel();
    EXPECT_EQ(stream.finish().error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_TRUE(eventually([&] { return scheduler_->pending_requests() == 0; }));
  }
  log_.open_gate();
  // The first request's batch ends; the server goes on.
  ClientResult r = unary(method("ModelInfer"), infer_request("add_one", "next", rows_from(7, 1), 1));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(log_.executions(), 2);
  EXPECT_FALSE(log_.computed_row_starting_with(4000));
}

// --- 9. shutdown ---------------------------------------------------------------------------------

TEST_F(GrpcServerTest, ShutdownWaitsForACallInFlight) {
  log_.close_gate();
  PendingUnary call(stub_.get(), method("ModelInfer"), infer_request("add_one", "inflight", rows_from(1, 1), 1));
  ASSERT_TRUE(log_.wait_executions(1));
  const auto started = std::chrono::steady_clock::now();
  auto shutdown = std::async(std::launch::async, [&] { server_->shutdown(3.0); });
  EXPECT_EQ(shutdown.wait_for(200ms), std::future_status::timeout);  // waiting for the call
  log_.open_gate();
  ASSERT_EQ(shutdown.wait_for(2500ms), std::future_status::ready);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2500ms);  // well within the grace
  ClientResult r = call.wait();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  expect_add_one_answer(r.body, "inflight", rows_from(1, 1), 1);
  server_->shutdown(1.0);  // idempotent
  server_.reset();         // the destructor after shutdown
}

TEST_F(GrpcServerTest, ShutdownPastTheGraceCancelsTheCallAndTheLateResultIsDropped) {
  log_.close_gate();
  PendingUnary call(stub_.get(), method("ModelInfer"), infer_request("add_one", "stuck", rows_from(1, 1), 1));
  ASSERT_TRUE(log_.wait_executions(1));
  const auto started = std::chrono::steady_clock::now();
  server_->shutdown(0.2);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1500ms);
  EXPECT_FALSE(call.wait(2000ms).status.ok());
  server_.reset();  // the call's request is still computing
  log_.open_gate();
  ASSERT_TRUE(eventually([&] { return scheduler_->pending_requests() == 0; }));
  scheduler_->shutdown(Scheduler::ShutdownMode::kDrain);  // the late answer is delivered and dropped
  EXPECT_EQ(log_.executions(), 1);
}

// Calls relayed to the backend and open streams are cancelled once the grace has passed, and
// shutdown returns.
TEST_F(GrpcServerTest, ShutdownPastTheGraceEndsForwardedCallsAndOpenStreams) {
  BackendReply hang;
  hang.hang = true;
  backend_->set_reply(kSlowHang, hang);
  backend_->set_reply(method("ModelInfer"), hang);
  PendingUnary relayed(stub_.get(), kSlowHang, "wait");
  PendingUnary forwarded(stub_.get(), method("ModelInfer"), infer_request("nope", "n", rows_from(1, 1), 1));
  StreamClient chat(stub_.get(), kEchoChat);
  chat.write("m0");
  std::string bytes;
  ASSERT_TRUE(chat.read(&bytes));
  StreamClient infer(stub_.get(), method("ModelStreamInfer"));
  infer.write(infer_request("add_one", "s", rows_from(1, 1), 1));
  ASSERT_TRUE(infer.read(&bytes));
  ASSERT_TRUE(backend_->wait_calls(3));

  const auto started = std::chrono::steady_clock::now();
  server_->shutdown(0.2);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1500ms);
  EXPECT_FALSE(relayed.wait(2000ms).status.ok());
  EXPECT_FALSE(forwarded.wait(2000ms).status.ok());
  EXPECT_FALSE(chat.finish(2000ms).ok());
  EXPECT_FALSE(infer.finish(2000ms).ok());
  // The backend's calls that were still waiting are cancelled. (The echo call is left out: the
  // relay may pass the end of the caller's stream on as a half-close before the cancellation, and
  // the echo then ends it cleanly.)
  const auto calls = backend_->calls();
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].method == kEchoChat) continue;
    EXPECT_TRUE(backend_->wait_cancelled(i, 2000ms)) << calls[i].method;
  }
  server_.reset();
}

// A call keeps its route until the core lets its request go, which can be on the scheduler's own
// worker thread when the call was cancelled while its batch computed. Were the route an owner of
// the scheduler, and its last one by then (the model unloaded from the snapshot and the scheduler
// dropped without an explicit shutdown, which its destructor allows), ~Scheduler would run on that
// worker and join itself. The snapshot owns the scheduler instead: dropping the last owner drains
// the batch and ends. Run in a child process: the failure is a std::terminate.
TEST_F(GrpcServerTest, ASchedulerDroppedWhileACancelledCallsBatchComputesIsDestroyedCleanly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // This child process never reaches TearDown: its socket's name goes now (the test does
        // not use the backend).
        ::unlink((dir_ + "/backend.sock").c_str());
        ::rmdir(dir_.c_str());
        log_.close_gate();
        {
          PendingUnary running(stub_.get(), method("ModelInfer"), infer_request("add_one", "r", rows_from(1, 1), 1));
          if (!log_.wait_executions(1)) _exit(3);
          running.cancel();
          if (running.wait(2000ms).status.error_code() != grpc::StatusCode::CANCELLED) _exit(4);
        }
        publish([](ServingSnapshot& s) {  // the model is unloaded
          s.models.clear();
          s.schedulers.clear();
        });
        route_.reset();
        std::this_thread::sleep_for(50ms);  // grpc lets the finished call go (OnDone)
        // The last owner goes while the batch computes: ~Scheduler waits for it.
        std::thread dropper([this] { scheduler_.reset(); });
        std::this_thread::sleep_for(50ms);
        log_.open_gate();  // the batch ends on the worker, which lets the call go
        dropper.join();
        std::this_thread::sleep_for(100ms);
        std::fflush(stdout);
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// --- 10. failure counts --------------------------------------------------------------------------

TEST_F(GrpcServerTest, FailuresOfRoutedRequestsAreCountedByModelAndVersion) {
  const std::string wrong_shape = infer_request("add_one", "bad", {1, 2, 3}, 1, 3);
  const Status expected = check_request(signature_, wrong_shape);
  ASSERT_EQ(expected.code, StatusCode::kInvalidArgument);
  ClientResult r = unary(method("ModelInfer"), wrong_shape);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(r.status.error_message(), expected.message);
  r = unary(method("ModelInfer"), infer_request("add_one", "bad", {1, 2, 3}, 1, 3, "1"));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // The executor's failure (a negative first value).
  r = unary(method("ModelInfer"), infer_request("add_one", "neg", rows_from(-5, 1), 1));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(r.status.error_message(), "negative input");
  // In a stream, answered in error_message.
  {
    StreamClient stream(stub_.get(), method("ModelStreamInfer"));
    stream.write(wrong_shape);
    std::string bytes;
    ASSERT_TRUE(stream.read(&bytes));
    StreamAnswer answer;
    ASSERT_TRUE(parse_stream_answer(bytes, &answer));
    EXPECT_EQ(answer.error_message, expected.message);
    EXPECT_EQ(answer.infer.id, "bad");
    stream.writes_done();
    EXPECT_TRUE(stream.finish().ok());
  }
  // Not counted: a miss (Python counts it) and bytes that name no model.
  unary(method("ModelInfer"), infer_request("nope", "", rows_from(1, 1), 1));
  unary(method("ModelInfer"), std::string("\x80", 1));

  using Count = std::tuple<std::string, std::string, int, uint64_t>;
  const std::vector<Count> expected_counts = {
      Count{"add_one", "1", static_cast<int>(StatusCode::kInvalidArgument), 3},
      Count{"add_one", "1", static_cast<int>(StatusCode::kInternal), 1},
  };
  EXPECT_EQ(failures(), expected_counts);
}

}  // namespace
}  // namespace inferd

namespace inferd {
namespace {

// A request the transport answers INTERNAL leaves one record on stderr, in the shape Python writes
// for those it answers: model, version, request id, the caller's trace id, the reason.
TEST_F(GrpcServerTest, AnInternalFailureLeavesOneLogRecord) {
  set_core_logging(LogLevel::kInfo, /*json=*/true);
  const std::string traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  ::testing::internal::CaptureStderr();
  ClientResult r = unary(method("ModelInfer"), infer_request("add_one", "neg-7", rows_from(-5, 1), 1),
                         Metadata{{"traceparent", traceparent}});
  ClientResult ok = unary(method("ModelInfer"), infer_request("add_one", "fine", rows_from(5, 1), 1));
  const std::string written = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_TRUE(ok.status.ok());
  EXPECT_EQ(std::count(written.begin(), written.end(), '\n'), 1) << written;
  EXPECT_EQ(written.rfind("{\"event\": \"request failed\", \"level\": \"error\", \"reason\": \"negative input\", "
                          "\"model\": \"add_one\", \"version\": \"1\", \"request_id\": \"neg-7\", \"code\": "
                          "\"INTERNAL\", \"trace_id\": \"0af7651916cd43dd8448eb211c80319c\", \"timestamp\": ",
                          0),
            0u)
      << written;
  // Above the error level, nothing.
  set_core_logging(LogLevel::kCritical, /*json=*/true);
  ::testing::internal::CaptureStderr();
  unary(method("ModelInfer"), infer_request("add_one", "neg-8", rows_from(-5, 1), 1));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  set_core_logging(LogLevel::kInfo, /*json=*/true);
}

// --- access: restricted protocols and control calls (issue 13, item 6) ---------------------------

using ClientMetadata = std::multimap<grpc::string_ref, grpc::string_ref>;

TEST(AccessPolicyTest, EveryMethodHasTritonsGroup) {
  EXPECT_EQ(AccessPolicy::group_of(method("ServerLive")), "health");
  EXPECT_EQ(AccessPolicy::group_of(method("ModelReady")), "health");
  EXPECT_EQ(AccessPolicy::group_of("/grpc.health.v1.Health/Check"), "health");
  EXPECT_EQ(AccessPolicy::group_of("/grpc.health.v1.Health/Watch"), "health");
  EXPECT_EQ(AccessPolicy::group_of(method("ServerMetadata")), "metadata");
  EXPECT_EQ(AccessPolicy::group_of("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"), "metadata");
  EXPECT_EQ(AccessPolicy::group_of("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"), "metadata");
  EXPECT_EQ(AccessPolicy::group_of(method("ModelInfer")), "inference");
  EXPECT_EQ(AccessPolicy::group_of(method("ModelStreamInfer")), "inference");
  EXPECT_EQ(AccessPolicy::group_of(method("ModelConfig")), "model-config");
  EXPECT_EQ(AccessPolicy::group_of(method("ModelStatistics")), "statistics");
  EXPECT_EQ(AccessPolicy::group_of(method("RepositoryIndex")), "model-repository");
  EXPECT_EQ(AccessPolicy::group_of(method("RepositoryModelUnload")), "model-repository");
  EXPECT_EQ(AccessPolicy::group_of(method("CudaSharedMemoryRegister")), "shared-memory");
  EXPECT_EQ(AccessPolicy::group_of(method("TraceSetting")), "trace");
  EXPECT_EQ(AccessPolicy::group_of(method("LogSettings")), "logging");
  EXPECT_EQ(AccessPolicy::group_of(method("NoSuchMethod")), "");
  EXPECT_EQ(AccessPolicy::group_of("/other.Service/ModelInfer"), "");
  for (const char* control : {"RepositoryModelLoad", "RepositoryModelUnload", "LogSettings", "TraceSetting",
                              "SystemSharedMemoryRegister", "CudaSharedMemoryUnregister"}) {
    EXPECT_TRUE(AccessPolicy::is_control_method(method(control))) << control;
  }
  for (const char* other : {"ModelInfer", "RepositoryIndex", "ServerLive", "SystemSharedMemoryStatus"}) {
    EXPECT_FALSE(AccessPolicy::is_control_method(method(other))) << other;
  }
}

// Issue 25, item 1: a path that is not exactly a served method is refused whatever its group's
// rule, before it could be forwarded (grpcio matches a method only up to a NUL byte).
TEST(AccessPolicyTest, APathThatIsNotExactlyAServedMethodIsUnimplemented) {
  const AccessPolicy policy(AccessOptions{{RestrictedProtocol{{"model-repository", "inference"}, "admin", "s3cret"}}});
  ClientMetadata with_key;
  with_key.emplace("triton-grpc-protocol-admin", "s3cret");
  const std::string unload = method("RepositoryModelUnload");
  const std::vector<std::string> near_misses{
      unload + std::string(1, '\0'),
      unload + std::string("\0x", 2),
      unload + "/",
      unload + " ",
      method("repositorymodelunload"),
      "/inference.grpcinferenceservice/RepositoryModelUnload",
      "/inference.GRPCInferenceService//RepositoryModelUnload",
      "inference.GRPCInferenceService/RepositoryModelUnload",
      method("RepositoryModelUnload\xc3\xa9"),
      method("ModelInfer") + std::string(1, '\0'),
      method("LogSettings") + "\n",
      "/grpc.health.v1.Health/Check" + std::string(1, '\0'),
      "/grpc.health.v1.Health/",
      "",
      "/",
  };
  for (const std::string& path : near_misses) {
    for (const char* peer : {"ipv4:127.0.0.1:5000", "unix:"}) {
      const grpc::Status refused = policy.check(path, peer, with_key);
      EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNIMPLEMENTED) << path;
      EXPECT_EQ(refused.error_message().find('\0'), std::string::npos) << "the message shows no raw bytes";
    }
    EXPECT_EQ(AccessPolicy::group_of(path), "") << path;
  }
  EXPECT_EQ(policy.check(unload + std::string(1, '\0'), "unix:", with_key).error_message(),
            "unknown method '/inference.GRPCInferenceService/RepositoryModelUnload\\x00'");
  EXPECT_TRUE(policy.check(unload, "ipv4:127.0.0.1:5000", with_key).ok());
}

TEST(AccessPolicyTest, AHeaderGivenTwiceMustCarryTheValueBothTimes) {
  const AccessPolicy policy(AccessOptions{{RestrictedProtocol{{"inference"}, "admin", "s3cret"}}});
  const std::string header = "triton-grpc-protocol-admin";
  for (const auto& values :
       std::vector<std::vector<std::string>>{{"s3cret", "wrong"}, {"wrong", "s3cret"}, {"", "s3cret"}}) {
    ClientMetadata metadata;
    for (const std::string& v : values) metadata.emplace(header, v);
    EXPECT_EQ(policy.check(method("ModelInfer"), "ipv4:127.0.0.1:5000", metadata).error_code(),
              grpc::StatusCode::UNAVAILABLE)
        << values[0] << ", " << values[1];
  }
  ClientMetadata twice;
  twice.emplace(header, "s3cret");
  twice.emplace(header, "s3cret");
  EXPECT_TRUE(policy.check(method("ModelInfer"), "ipv4:127.0.0.1:5000", twice).ok());
}

TEST(AccessPolicyTest, ARestrictedGroupNeedsItsHeaderWithTheExactValue) {
  const AccessPolicy policy(AccessOptions{{RestrictedProtocol{{"inference", "health"}, "Admin-Key", "s3cret"}}});
  const std::string header = "triton-grpc-protocol-admin-key";
  const auto check = [&](const std::string& m, const std::string& value) {
    ClientMetadata metadata;
    if (!value.empty()) metadata.emplace(header, value);
    return policy.check(m, "ipv4:127.0.0.1:5000", metadata);
  };
  EXPECT_TRUE(check(method("ModelInfer"), "s3cret").ok());
  EXPECT_TRUE(check(method("ServerLive"), "s3cret").ok());
  for (const std::string wrong : {"", "s3cre", "s3cret!", "S3CRET", "x3cret"}) {
    const grpc::Status refused = check(method("ModelInfer"), wrong);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << wrong;
    EXPECT_EQ(refused.error_message(), "This protocol is restricted, expecting header '" + header + "'");
  }
  EXPECT_TRUE(check(method("ModelMetadata"), "").ok()) << "an unrestricted group needs no header";
}

TEST(AccessPolicyTest, ControlCallsOnTcpAreRefusedUnlessOpenedOrProtected) {
  const ClientMetadata none;
  const AccessPolicy closed{AccessOptions{}};
  const grpc::Status refused = closed.check(method("RepositoryModelLoad"), "ipv4:127.0.0.1:5000", none);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(refused.error_message().find("--grpc-control-on-tcp"), std::string::npos) << refused.error_message();
  EXPECT_EQ(closed.check(method("LogSettings"), "ipv6:[::1]:5000", none).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(closed.check(method("RepositoryModelLoad"), "unix:", none).ok());
  EXPECT_TRUE(closed.check(method("RepositoryIndex"), "ipv4:127.0.0.1:5000", none).ok());

  AccessOptions open;
  open.control_on_tcp = true;
  EXPECT_TRUE(AccessPolicy(open).check(method("RepositoryModelUnload"), "ipv4:127.0.0.1:5000", none).ok());

  // Protecting the group opens it on TCP to those with the header, and on the socket asks for it too.
  const AccessPolicy protected_repository(AccessOptions{{RestrictedProtocol{{"model-repository"}, "admin", "k"}}});
  ClientMetadata with_key;
  with_key.emplace("triton-grpc-protocol-admin", "k");
  EXPECT_TRUE(protected_repository.check(method("RepositoryModelLoad"), "ipv4:127.0.0.1:5000", with_key).ok());
  EXPECT_EQ(protected_repository.check(method("RepositoryModelLoad"), "ipv4:127.0.0.1:5000", none).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(protected_repository.check(method("RepositoryModelLoad"), "unix:", none).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(protected_repository.check(method("LogSettings"), "ipv4:127.0.0.1:5000", with_key).error_code(),
            grpc::StatusCode::PERMISSION_DENIED)
      << "the logging group is not protected";
}

TEST(AccessPolicyTest, RulesItCannotEnforceAreRefused) {
  const auto refused = [](std::vector<RestrictedProtocol> rules) {
    try {
      AccessPolicy policy(AccessOptions{std::move(rules)});
      return false;
    } catch (const std::invalid_argument&) {
      return true;
    }
  };
  EXPECT_TRUE(refused({{{"inferences"}, "k", "v"}}));
  EXPECT_TRUE(refused({{{}, "k", "v"}}));
  EXPECT_TRUE(refused({{{"health"}, "", "v"}}));
  EXPECT_TRUE(refused({{{"health"}, "bad key", "v"}}));
  EXPECT_TRUE(refused({{{"health"}, "k", ""}}));
  EXPECT_TRUE(refused({{{"health"}, "k", "line\nbreak"}}));
  EXPECT_TRUE(refused({{{"health"}, "a", "v"}, {{"metadata", "health"}, "b", "w"}}));
  EXPECT_FALSE(refused({{{"health"}, "a", "v"}, {{"metadata", "logging"}, "b", "w"}}));
}

// Every kind of call passes the policy: one the core computes, one answered from the snapshot, one
// forwarded, a stream. A refused call reaches neither the core nor the backend.
TEST_F(GrpcServerTest, ARestrictedGroupIsRefusedOnEveryKindOfCallWithoutItsHeader) {
  server_->shutdown(1.0);
  GrpcServerOptions options;
  options.access.restricted.push_back({{"inference", "health", "model-repository"}, "key", "open-sesame"});
  start_server(options);
  publish();
  const Metadata right{{"triton-grpc-protocol-key", "open-sesame"}};
  const Metadata wrong{{"triton-grpc-protocol-key", "open-sesamE"}};
  const std::string infer = infer_request("add_one", "r", rows_from(1, 1), 1);
  for (const Metadata& metadata : {Metadata{}, wrong}) {
    for (const auto& [m, body] : std::vector<std::pair<std::string, std::string>>{
             {method("ModelInfer"), infer}, {method("ServerLive"), ""}, {method("RepositoryIndex"), ""}}) {
      ClientResult r = unary(m, body, metadata);
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << m;
      EXPECT_EQ(r.status.error_message(), "This protocol is restricted, expecting header 'triton-grpc-protocol-key'");
    }
    StreamClient stream(stub_.get(), method("ModelStreamInfer"), metadata);
    stream.write(infer);
    std::string bytes;
    EXPECT_FALSE(stream.read(&bytes));
    EXPECT_EQ(stream.finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  EXPECT_EQ(log_.executions(), 0);
  EXPECT_EQ(backend_->call_count(), 0u);

  ClientResult r = unary(method("ModelInfer"), infer, right);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  expect_add_one_answer(r.body, "r", rows_from(1, 1), 1);
  r = unary(method("ServerLive"), "", right);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  r = unary(method("RepositoryIndex"), "", right);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(backend_->call_count(), 1u);
  r = unary(method("ModelMetadata"), ld(1, "add_one"));  // metadata: not restricted
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
}

// Issue 25, item 1, through the server: near misses of served paths reach neither the backend nor
// the core, on TCP and on the Unix socket; the exact name still works. (grpc++'s client cuts a
// method at a NUL byte, so the NUL itself is sent by tests/integration/test_access.py's grpcio.)
TEST_F(GrpcServerTest, ANearMissOfAMethodPathIsUnimplementedAndNeverForwarded) {
  server_->shutdown(1.0);
  GrpcServerOptions options;
  options.addresses = {"unix:" + dir_ + "/near.sock"};
  options.access.restricted.push_back({{"model-repository", "inference"}, "admin", "s3cret"});
  start_server(options);
  publish();
  auto socket = grpc::CreateChannel("unix:" + dir_ + "/near.sock", grpc::InsecureChannelCredentials());
  grpc::GenericStub local(socket);
  for (const std::string& m :
       {method("RepositoryModelUnload") + "\x01", method("RepositoryIndex") + "/", method("LogSettings") + "%00",
        method("SystemSharedMemoryRegister") + " ", method("modelinfer"), method("ModelStreamInfer") + "\xc3\xa9",
        std::string("/inference.GRPCInferenceService//ModelInfer"), method("NoSuchMethod")}) {
    ClientResult r = unary(m, ld(1, "add_one"));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << m << ": " << r.status.error_message();
    PendingUnary call(&local, m, ld(1, "add_one"));
    EXPECT_EQ(call.wait().status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << m;
  }
  EXPECT_EQ(backend_->call_count(), 0u);
  EXPECT_EQ(log_.executions(), 0);
  const Metadata key{{"triton-grpc-protocol-admin", "s3cret"}};
  ClientResult r = unary(method("ModelInfer"), infer_request("add_one", "ok", rows_from(1, 1), 1), key);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  expect_add_one_answer(r.body, "ok", rows_from(1, 1), 1);
  server_->shutdown(1.0);
  ::unlink((dir_ + "/near.sock").c_str());
}

TEST_F(GrpcServerTest, ControlCallsAreRefusedOnTcpAndForwardedFromTheUnixSocket) {
  server_->shutdown(1.0);
  GrpcServerOptions options;
  options.addresses = {"unix:" + dir_ + "/public.sock"};
  start_server(options);
  publish();
  for (const char* control : {"RepositoryModelLoad", "RepositoryModelUnload", "LogSettings"}) {
    ClientResult r = unary(method(control), ld(1, "add_one"));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << control;
    EXPECT_NE(r.status.error_message().find("--grpc-control-on-tcp"), std::string::npos) << r.status.error_message();
  }
  EXPECT_EQ(backend_->call_count(), 0u);
  EXPECT_TRUE(unary(method("RepositoryIndex"), "").status.ok());

  auto socket = grpc::CreateChannel("unix:" + dir_ + "/public.sock", grpc::InsecureChannelCredentials());
  grpc::GenericStub local(socket);
  for (const char* control : {"RepositoryModelLoad", "RepositoryModelUnload", "LogSettings"}) {
    PendingUnary call(&local, method(control), ld(1, "add_one"));
    ClientResult r = call.wait();
    EXPECT_TRUE(r.status.ok()) << control << ": " << r.status.error_message();
  }
  EXPECT_EQ(backend_->call_count(), 4u);
  server_->shutdown(1.0);
  ::unlink((dir_ + "/public.sock").c_str());
}

TEST_F(GrpcServerTest, ControlOnTcpForwardsControlCallsFromTcp) {
  server_->shutdown(1.0);
  GrpcServerOptions options;
  options.access.control_on_tcp = true;
  start_server(options);
  publish();
  ClientResult r = unary(method("RepositoryModelUnload"), ld(1, "add_one"));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(backend_->call_count(), 1u);
}

}  // namespace
}  // namespace inferd
