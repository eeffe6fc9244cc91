// The transport floor in C++: the fastest a grpc++ server answers the Triton protocol.
//
//   floor_server --responses DIR [--port 0] [--host 127.0.0.1]
//
// Why: benchmarks/transport_floor.py measures what a Python grpcio server costs per request
// when it does nothing but answer. As inferd's gRPC transport moves into C++, its floor is what
// grpc++ itself costs: this server, measured beside the Python one (benchmarks/run.py, config
// floor-cpp), is that floor. What a C++ transport spends above it is its own cost.
//
// What it does: grpc++'s callback API with one grpc::CallbackGenericService (raw ByteBuffers,
// no generated code) serving inference.GRPCInferenceService on loopback, with inferd's message
// size limits (2^31 - 1). Its answers are the Python floor's, pre-serialized by
// `transport_floor.py --write-responses DIR` (one file per RPC, named after it):
//   ServerLive, ServerReady, ServerMetadata   the file, whatever the request
//   ModelReady                                the file for the served model, else ready = false
//   ModelMetadata, ModelConfig                the file for the served model, else NOT_FOUND
//   ModelInfer                                the file (a ModelInferResponse without id) with
//                                             the request's id appended, nothing else: no
//                                             decoding beyond the top-level fields, no compute
//   ModelStatistics                           written here: inference_count = execution_count =
//                                             ModelInfer calls answered (one atomic increment
//                                             each), so that run.py can divide CPU by it
// The served model's name and version are the ModelInfer file's model_name and model_version.
// Other RPCs answer UNIMPLEMENTED. Logs {"event": "server started", "port": N} to stderr as
// inferd does (--port 0 picks a free port) and stops on SIGINT or SIGTERM.

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace {

// --- protobuf wire format, top-level fields only ------------------------------------------

bool ReadVarint(const char*& p, const char* end, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const auto byte = static_cast<uint8_t>(*p++);
    value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// The last value of string field `number` in `message` (proto3: the last one wins); empty when
// absent or when the message does not parse.
std::string_view StringField(std::string_view message, uint32_t number) {
  std::string_view found;
  const char* p = message.data();
  const char* end = p + message.size();
  while (p < end) {
    uint64_t tag = 0, value = 0;
    if (!ReadVarint(p, end, tag)) return {};
    switch (tag & 7) {
      case 0:  // varint
        if (!ReadVarint(p, end, value)) return {};
        break;
      case 1:  // fixed64
        if (end - p < 8) return {};
        p += 8;
        break;
      case 2:  // length-delimited
        if (!ReadVarint(p, end, value) || value > static_cast<uint64_t>(end - p)) return {};
        if ((tag >> 3) == number) found = std::string_view(p, value);
        p += value;
        break;
      case 5:  // fixed32
        if (end - p < 4) return {};
        p += 4;
        break;
      default:  // groups (3, 4) and invalid wire types
        return {};
    }
  }
  return found;
}

void PutVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void PutString(std::string& out, uint32_t number, std::string_view value) {
  PutVarint(out, (uint64_t{number} << 3) | 2);
  PutVarint(out, value.size());
  out.append(value);
}

void PutUint(std::string& out, uint32_t number, uint64_t value) {
  PutVarint(out, uint64_t{number} << 3);
  PutVarint(out, value);
}

// --- the service ------------------------------------------------------------------------------

enum class Method {
  kServerLive,
  kServerReady,
  kModelReady,
  kServerMetadata,
  kModelMetadata,
  kModelConfig,
  kModelInfer,
  kModelStatistics,
  kUnknown,
};

constexpr std::string_view kPrefix = "/inference.GRPCInferenceService/";
// The RPCs answered from a file, in Method order (ModelStatistics is written here).
constexpr std::string_view kFiles[] = {
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig", "ModelInfer",
};
constexpr int kFileCount = static_cast<int>(std::size(kFiles));

Method Parse(std::string_view path) {
  if (path.substr(0, kPrefix.size()) != kPrefix) return Method::kUnknown;
  const std::string_view name = path.substr(kPrefix.size());
  for (int i = 0; i < kFileCount; ++i) {
    if (name == kFiles[i]) return static_cast<Method>(i);
  }
  return name == "ModelStatistics" ? Method::kModelStatistics : Method::kUnknown;
}

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);  // a copy: the answers are small, all but ModelInfer's are rare
  return grpc::ByteBuffer(&slice, 1);
}

class FloorService final : public grpc::CallbackGenericService {
 public:
  explicit FloorService(const std::string& directory) {
    for (int i = 0; i < kFileCount; ++i) {
      const std::string path = directory + "/" + std::string(kFiles[i]);
      std::ifstream file(path, std::ios::binary);
      if (!file) throw std::runtime_error("cannot read " + path);
      std::ostringstream bytes;
      bytes << file.rdbuf();
      answers_[i] = bytes.str();
    }
    const std::string& infer = answers_[static_cast<int>(Method::kModelInfer)];
    model_name_ = StringField(infer, 1);
    model_version_ = StringField(infer, 2);
    if (model_name_.empty()) throw std::runtime_error("the ModelInfer answer names no model");
  }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    return new Call(*this, Parse(ctx->method()));
  }

 private:
  // One unary call: read the request, answer it, finish.
  class Call final : public grpc::ServerGenericBidiReactor {
   public:
    Call(FloorService& service, Method method) : service_(service), method_(method) {
      if (method_ == Method::kUnknown) {
        Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, ""));
      } else {
        StartRead(&request_);
      }
    }

    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message"));
        return;
      }
      grpc::Slice slice;
      if (!request_.TrySingleSlice(&slice).ok() && !request_.DumpToSingleSlice(&slice).ok()) {
        Finish(grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the request"));
        return;
      }
      const std::string_view request(reinterpret_cast<const char*>(slice.begin()), slice.size());
      const grpc::Status status = service_.Answer(method_, request, response_);
      if (status.ok()) {
        StartWriteAndFinish(&response_, grpc::WriteOptions(), status);
      } else {
        Finish(status);
      }
    }

    void OnDone() override { delete this; }

   private:
    FloorService& service_;
    const Method method_;
    grpc::ByteBuffer request_;
    grpc::ByteBuffer response_;
  };

  bool Known(std::string_view request) const {
    const std::string_view version = StringField(request, 2);
    return StringField(request, 1) == model_name_ && (version.empty() || version == model_version_);
  }

  grpc::Status NotFound(std::string_view request) const {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown model '" + std::string(StringField(request, 1)) + "'");
  }

  grpc::Status Answer(Method method, std::string_view request, grpc::ByteBuffer& response) {
    const std::string& canned = answers_[static_cast<int>(method)];
    switch (method) {
      case Method::kModelInfer: {
        answered_.fetch_add(1, std::memory_order_relaxed);
        // The canned answer, shared (not copied), then the request's id: a field appended to a
        // message sets it. perf_analyzer's async client matches answers to requests by the id.
        const std::string_view id = StringField(request, 3);
        std::string id_field;
        if (!id.empty()) PutString(id_field, 3, id);  // proto3 writes no empty string
        const grpc::Slice slices[] = {
            grpc::Slice(canned.data(), canned.size(), grpc::Slice::STATIC_SLICE),
            grpc::Slice(id_field),
        };
        response = grpc::ByteBuffer(slices, id.empty() ? 1 : 2);
        return grpc::Status::OK;
      }
      case Method::kModelStatistics: {
        if (!StringField(request, 1).empty() && !Known(request)) return NotFound(request);
        const uint64_t answered = answered_.load(std::memory_order_relaxed);
        std::string stats;  // ModelStatistics: name 1, version 2, inference 4, execution 5
        PutString(stats, 1, model_name_);
        PutString(stats, 2, model_version_);
        PutUint(stats, 4, answered);
        PutUint(stats, 5, answered);
        std::string bytes;  // ModelStatisticsResponse: model_stats 1
        PutString(bytes, 1, stats);
        response = Buffer(bytes);
        return grpc::Status::OK;
      }
      case Method::kModelReady:  // an empty ModelReadyResponse is ready = false
        response = Buffer(Known(request) ? canned : std::string());
        return grpc::Status::OK;
      case Method::kModelMetadata:
      case Method::kModelConfig:
        if (!Known(request)) return NotFound(request);
        response = Buffer(canned);
        return grpc::Status::OK;
      default:
        response = Buffer(canned);
        return grpc::Status::OK;
    }
  }

  std::string answers_[kFileCount];
  std::string model_name_;
  std::string model_version_;
  std::atomic<uint64_t> answered_{0};
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr, "%s\nusage: floor_server --responses DIR [--port N] [--host HOST]\n", why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string responses, host = "127.0.0.1";
  int port = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 == argc) Usage("a flag without a value");
    const char* value = argv[++i];
    if (flag == "--responses") {
      responses = value;
    } else if (flag == "--port") {
      port = std::atoi(value);
    } else if (flag == "--host") {
      host = value;
    } else {
      Usage("unknown flag");
    }
  }
  if (responses.empty()) Usage("--responses is required");

  // Blocked before gRPC starts a thread, so that every thread inherits the mask and the signals
  // wait for sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::unique_ptr<FloorService> service;
  try {
    service = std::make_unique<FloorService>(responses);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "floor_server: %s\n", e.what());
    return 1;
  }
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(host + ":" + std::to_string(port), grpc::InsecureServerCredentials(), &bound);
  builder.SetMaxReceiveMessageSize(INT_MAX);  // inferd's limit, 2^31 - 1, not gRPC's 4 MiB
  builder.SetMaxSendMessageSize(INT_MAX);
  builder.RegisterCallbackGenericService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound == 0) {
    std::fprintf(stderr, "floor_server: cannot bind %s:%d\n", host.c_str(), port);
    return 1;
  }
  std::fprintf(stderr,
               "{\"event\": \"server started\", \"port\": %d, "
               "\"server\": \"inferd-transport-floor-cpp\"}\n",
               bound);
  std::fflush(stderr);

  int received = 0;
  sigwait(&stop_signals, &received);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  std::fprintf(stderr, "{\"event\": \"server stopped\"}\n");
  std::fflush(stderr);
  return 0;
}
