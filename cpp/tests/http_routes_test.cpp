// The HTTP transport's routing and status table (http_routes.h): every Triton path to its
// endpoint and gRPC method, percent-escapes, queries, the 404s and 405s and their messages, and
// how core and gRPC statuses become HTTP statuses and error bodies.

// inferd_http is compiled with these (CMakeLists.txt); http_routes.h reaches Asio through
// http_shared.h, so this file sees the same Asio declarations.
#define BOOST_ASIO_NO_DEPRECATED
#define BOOST_BEAST_USE_STD_STRING_VIEW

#include "http_routes.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <string>
#include <vector>

#include "inferd/grpc_status.h"

namespace inferd {
namespace {

using Kind = HttpEndpointKind;

std::string grpc(const char* name) { return std::string("/inference.GRPCInferenceService/") + name; }

// One path Triton serves, and what it parses to.
struct Served {
  HttpMethod method;
  std::string target;
  Kind kind;
  std::string grpc_method;
  std::string model, version, region;
};

std::string describe(const Served& s) {
  return (s.method == HttpMethod::kGet ? "GET " : s.method == HttpMethod::kPost ? "POST " : "OTHER ") + s.target;
}

// Every path of cpp/src/http_routes.cpp, with and without the version where it takes one.
std::vector<Served> served_paths() {
  const HttpMethod get = HttpMethod::kGet, post = HttpMethod::kPost;
  std::vector<Served> paths{
      {get, "/v2", Kind::kServerMetadata, grpc("ServerMetadata"), "", "", ""},
      {get, "/v2/health/live", Kind::kServerLive, grpc("ServerLive"), "", "", ""},
      {get, "/v2/health/ready", Kind::kServerReady, grpc("ServerReady"), "", "", ""},
      {get, "/v2/models/stats", Kind::kModelStatistics, grpc("ModelStatistics"), "", "", ""},
      {post, "/v2/repository/index", Kind::kRepositoryIndex, grpc("RepositoryIndex"), "", "", ""},
      {post, "/v2/repository/models/m/load", Kind::kRepositoryLoad, grpc("RepositoryModelLoad"), "m", "", ""},
      {post, "/v2/repository/models/m/unload", Kind::kRepositoryUnload, grpc("RepositoryModelUnload"), "m", "", ""},
      {get, "/v2/trace/setting", Kind::kTraceSetting, grpc("TraceSetting"), "", "", ""},
      {post, "/v2/trace/setting", Kind::kTraceSetting, grpc("TraceSetting"), "", "", ""},
      {get, "/v2/models/m/trace/setting", Kind::kTraceSetting, grpc("TraceSetting"), "m", "", ""},
      {post, "/v2/models/m/trace/setting", Kind::kTraceSetting, grpc("TraceSetting"), "m", "", ""},
      {get, "/v2/logging", Kind::kLogSettings, grpc("LogSettings"), "", "", ""},
      {post, "/v2/logging", Kind::kLogSettings, grpc("LogSettings"), "", "", ""},
  };
  struct ModelPath {
    HttpMethod method;
    std::string tail;
    Kind kind;
    std::string grpc_method;
  };
  const std::vector<ModelPath> model_paths{
      {get, "", Kind::kModelMetadata, grpc("ModelMetadata")},
      {get, "/ready", Kind::kModelReady, grpc("ModelReady")},
      {get, "/config", Kind::kModelConfig, grpc("ModelConfig")},
      {get, "/stats", Kind::kModelStatistics, grpc("ModelStatistics")},
      {post, "/infer", Kind::kInfer, grpc("ModelInfer")},
      {post, "/generate", Kind::kGenerate, grpc("ModelInfer")},
      {post, "/generate_stream", Kind::kGenerateStream, grpc("ModelStreamInfer")},
  };
  for (const ModelPath& p : model_paths) {
    paths.push_back({p.method, "/v2/models/m" + p.tail, p.kind, p.grpc_method, "m", "", ""});
    paths.push_back({p.method, "/v2/models/m/versions/3" + p.tail, p.kind, p.grpc_method, "m", "3", ""});
  }
  for (const std::string family : {"systemsharedmemory", "cudasharedmemory"}) {
    const bool system = family == "systemsharedmemory";
    const std::string prefix = system ? "System" : "Cuda";
    const Kind status = system ? Kind::kSystemSharedMemoryStatus : Kind::kCudaSharedMemoryStatus;
    const Kind registered = system ? Kind::kSystemSharedMemoryRegister : Kind::kCudaSharedMemoryRegister;
    const Kind unregister = system ? Kind::kSystemSharedMemoryUnregister : Kind::kCudaSharedMemoryUnregister;
    const std::string base = "/v2/" + family;
    const std::string status_method = grpc((prefix + "SharedMemoryStatus").c_str());
    const std::string register_method = grpc((prefix + "SharedMemoryRegister").c_str());
    const std::string unregister_method = grpc((prefix + "SharedMemoryUnregister").c_str());
    paths.push_back({get, base + "/status", status, status_method, "", "", ""});
    paths.push_back({get, base + "/region/r0/status", status, status_method, "", "", "r0"});
    paths.push_back({post, base + "/region/r0/register", registered, register_method, "", "", "r0"});
    paths.push_back({post, base + "/unregister", unregister, unregister_method, "", "", ""});
    paths.push_back({post, base + "/region/r0/unregister", unregister, unregister_method, "", "", "r0"});
  }
  return paths;
}

struct Parsed {
  bool ok = false;
  HttpEndpoint endpoint;
  unsigned status = 0;
  std::string message;
};

Parsed parse(HttpMethod method, std::string_view target) {
  Parsed p;
  p.ok = parse_endpoint(method, target, &p.endpoint, &p.status, &p.message);
  return p;
}

TEST(HttpRoutes, EveryTritonPathIsItsEndpointAndGrpcMethod) {
  for (const Served& s : served_paths()) {
    SCOPED_TRACE(describe(s));
    const Parsed p = parse(s.method, s.target);
    ASSERT_TRUE(p.ok) << p.status << " " << p.message;
    EXPECT_EQ(p.endpoint.kind, s.kind);
    EXPECT_EQ(p.endpoint.grpc_method, s.grpc_method);
    EXPECT_EQ(p.endpoint.model, s.model);
    EXPECT_EQ(p.endpoint.version, s.version);
    EXPECT_EQ(p.endpoint.region, s.region);
  }
}

TEST(HttpRoutes, TheQueryIsIgnored) {
  for (const Served& s : served_paths()) {
    SCOPED_TRACE(describe(s));
    const Parsed plain = parse(s.method, s.target);
    const Parsed queried = parse(s.method, s.target + "?a=1&b=%zz/v3/x");
    ASSERT_TRUE(queried.ok) << queried.message;
    EXPECT_EQ(queried.endpoint.kind, plain.endpoint.kind);
    EXPECT_EQ(queried.endpoint.model, plain.endpoint.model);
    EXPECT_EQ(queried.endpoint.version, plain.endpoint.version);
  }
  // An empty query too.
  EXPECT_TRUE(parse(HttpMethod::kGet, "/v2/health/live?").ok);
}

TEST(HttpRoutes, NamesArePercentDecoded) {
  Parsed p = parse(HttpMethod::kPost, "/v2/models/my%20model/versions/%31%30/infer");
  ASSERT_TRUE(p.ok) << p.message;
  EXPECT_EQ(p.endpoint.model, "my model");
  EXPECT_EQ(p.endpoint.version, "10");
  // An escaped slash stays inside its segment; escapes are case-insensitive hex.
  p = parse(HttpMethod::kGet, "/v2/models/a%2Fb%2fc/ready");
  ASSERT_TRUE(p.ok) << p.message;
  EXPECT_EQ(p.endpoint.kind, Kind::kModelReady);
  EXPECT_EQ(p.endpoint.model, "a/b/c");
  p = parse(HttpMethod::kPost, "/v2/systemsharedmemory/region/r%25x/register");
  ASSERT_TRUE(p.ok) << p.message;
  EXPECT_EQ(p.endpoint.region, "r%x");
  p = parse(HttpMethod::kPost, "/v2/repository/models/%E2%82%AC/load");
  ASSERT_TRUE(p.ok) << p.message;
  EXPECT_EQ(p.endpoint.model, "\xE2\x82\xAC");
  // The fixed words may be escaped too: they are compared decoded.
  p = parse(HttpMethod::kGet, "/v2/health/%6Cive");
  ASSERT_TRUE(p.ok) << p.message;
  EXPECT_EQ(p.endpoint.kind, Kind::kServerLive);
}

TEST(HttpRoutes, AMalformedEscapeIsNotFound) {
  for (const char* target :
       {"/v2/models/m%/infer", "/v2/models/m%4/infer", "/v2/models/m%zz/infer", "/v2/models/m%4g/infer",
        "/v2/models/%/ready", "/v2/models/m/versions/1%/infer", "/v2/health/live%", "/v2/health/live%2"}) {
    SCOPED_TRACE(target);
    const HttpMethod method =
        std::string(target).find("infer") != std::string::npos ? HttpMethod::kPost : HttpMethod::kGet;
    const Parsed p = parse(method, target);
    EXPECT_FALSE(p.ok);
    EXPECT_EQ(p.status, 404u);
    EXPECT_EQ(p.message, std::string("no endpoint at '") + target + "' (Triton's HTTP API is under /v2)");
  }
}

TEST(HttpRoutes, PathsTritonDoesNotServeAreNotFoundNamingThePath) {
  for (const char* target :
       {"", "v2", "/", "/v1/health/live", "/V2/health/live", "/v2/", "/v2/health", "/v2/health/alive",
        "/v2/health/live/", "/v2/models", "/v2/models/", "/v2/models//infer", "/v2/models/m/predict",
        "/v2/models/m/versions", "/v2/models/m/versions/1/trace/setting", "/v2/models/m/infer/more", "/v2/repository",
        "/v2/repository/models/m", "/v2/repository/models//load", "/v2/repository/models/m/reload", "/v2/trace",
        "/v2/logging/x", "/v2/systemsharedmemory", "/v2/systemsharedmemory/register", "/v2/cudasharedmemory/register",
        "/v2/systemsharedmemory/region/r0", "/v2/systemsharedmemory/region/r0/x", "/v2/systemsharedmemory/status/x",
        "/v2v2/health/live", "//v2/health/live",
        // An empty version or region names none (not the policy's, not all).
        "/v2/models/m/versions/", "/v2/models/m/versions//ready", "/v2/models/m/versions//infer",
        "/v2/systemsharedmemory/region//status", "/v2/systemsharedmemory/region//unregister",
        "/v2/cudasharedmemory/region//register", "/v2/cudasharedmemory/region//unregister"}) {
    for (HttpMethod method : {HttpMethod::kGet, HttpMethod::kPost, HttpMethod::kOther}) {
      SCOPED_TRACE(std::string(target) + " method " + std::to_string(static_cast<int>(method)));
      const Parsed p = parse(method, target);
      EXPECT_FALSE(p.ok);
      EXPECT_EQ(p.status, 404u);
      EXPECT_EQ(p.message, std::string("no endpoint at '") + target + "' (Triton's HTTP API is under /v2)");
    }
  }
  // The message shows the path, not the query.
  const Parsed p = parse(HttpMethod::kGet, "/nowhere?secret=1");
  EXPECT_EQ(p.message, "no endpoint at '/nowhere' (Triton's HTTP API is under /v2)");
}

TEST(HttpRoutes, ALongPathIsShownCutInTheMessage) {
  const std::string target = "/v3/" + std::string(4000, 'x');
  const Parsed p = parse(HttpMethod::kGet, target);
  EXPECT_EQ(p.status, 404u);
  EXPECT_LT(p.message.size(), kMaxStatusMessageBytes + 100);
  EXPECT_EQ(p.message.rfind("no endpoint at '/v3/xxx", 0), 0u) << p.message;
}

TEST(HttpRoutes, AMethodThePathDoesNotTakeIsNotAllowedNamingTheOnesItTakes) {
  for (const Served& s : served_paths()) {
    const bool both = s.kind == Kind::kTraceSetting || s.kind == Kind::kLogSettings;
    std::vector<HttpMethod> wrong{HttpMethod::kOther};
    if (!both) wrong.push_back(s.method == HttpMethod::kGet ? HttpMethod::kPost : HttpMethod::kGet);
    for (HttpMethod method : wrong) {
      SCOPED_TRACE(describe(s) + " as method " + std::to_string(static_cast<int>(method)));
      const Parsed p = parse(method, s.target + "?q=1");
      EXPECT_FALSE(p.ok);
      EXPECT_EQ(p.status, 405u);
      const std::string takes = both ? "GET and POST" : s.method == HttpMethod::kGet ? "GET" : "POST";
      EXPECT_EQ(p.message, "'" + s.target + "' takes " + takes);
    }
  }
}

TEST(HttpStatus, EveryCoreStatusHasItsHttpStatus) {
  const std::vector<std::pair<StatusCode, unsigned>> table{
      {StatusCode::kOk, 200},
      {StatusCode::kInvalidArgument, 400},
      {StatusCode::kNotFound, 404},
      {StatusCode::kUnavailable, 503},
      {StatusCode::kResourceExhausted, 429},
      {StatusCode::kDeadlineExceeded, 400},
      {StatusCode::kCancelled, 400},
      {StatusCode::kInternal, 500},
      {StatusCode::kUnimplemented, 501},
      {StatusCode::kFailedPrecondition, 400},
      {StatusCode::kAlreadyExists, 400},
      {StatusCode::kPermissionDenied, 403},
  };
  // The table covers the enum: its codes are 0..kPermissionDenied.
  ASSERT_EQ(table.size(), static_cast<size_t>(StatusCode::kPermissionDenied) + 1);
  for (const auto& [code, http] : table) {
    SCOPED_TRACE(static_cast<int>(code));
    EXPECT_EQ(http_status(code), http);
  }
}

TEST(HttpStatus, EveryGrpcCodeHasItsCoreStatus) {
  const std::vector<std::pair<grpc::StatusCode, StatusCode>> table{
      {grpc::StatusCode::OK, StatusCode::kOk},
      {grpc::StatusCode::CANCELLED, StatusCode::kCancelled},
      {grpc::StatusCode::UNKNOWN, StatusCode::kInternal},
      {grpc::StatusCode::INVALID_ARGUMENT, StatusCode::kInvalidArgument},
      {grpc::StatusCode::DEADLINE_EXCEEDED, StatusCode::kDeadlineExceeded},
      {grpc::StatusCode::NOT_FOUND, StatusCode::kNotFound},
      {grpc::StatusCode::ALREADY_EXISTS, StatusCode::kAlreadyExists},
      {grpc::StatusCode::PERMISSION_DENIED, StatusCode::kPermissionDenied},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, StatusCode::kResourceExhausted},
      {grpc::StatusCode::FAILED_PRECONDITION, StatusCode::kFailedPrecondition},
      {grpc::StatusCode::ABORTED, StatusCode::kInternal},
      {grpc::StatusCode::OUT_OF_RANGE, StatusCode::kInternal},
      {grpc::StatusCode::UNIMPLEMENTED, StatusCode::kUnimplemented},
      {grpc::StatusCode::INTERNAL, StatusCode::kInternal},
      {grpc::StatusCode::UNAVAILABLE, StatusCode::kUnavailable},
      {grpc::StatusCode::DATA_LOSS, StatusCode::kInternal},
      {grpc::StatusCode::UNAUTHENTICATED, StatusCode::kInternal},
  };
  for (const auto& [grpc_status, core] : table) {
    SCOPED_TRACE(static_cast<int>(grpc_status));
    EXPECT_EQ(core_status_of_grpc(grpc_status), core);
  }
  // Codes gRPC does not define are the server's failure.
  EXPECT_EQ(core_status_of_grpc(17), StatusCode::kInternal);
  EXPECT_EQ(core_status_of_grpc(-1), StatusCode::kInternal);
  // A core status sent to Python and back as gRPC is the same HTTP status.
  for (int c = 0; c <= static_cast<int>(StatusCode::kPermissionDenied); ++c) {
    const auto code = static_cast<StatusCode>(c);
    EXPECT_EQ(core_status_of_grpc(grpc_code(code)), code) << c;
  }
}

std::string error_of(const std::string& body) {
  rapidjson::Document document;
  document.Parse(body.data(), body.size());
  if (document.HasParseError() || !document.IsObject() || document.MemberCount() != 1 || !document.HasMember("error") ||
      !document["error"].IsString()) {
    return "<not an error body: " + body + ">";
  }
  return std::string(document["error"].GetString(), document["error"].GetStringLength());
}

TEST(HttpStatus, AnErrorAnswerIsTheMappedStatusAndTheMessageAsJson) {
  HttpAnswer answer = error_answer(Status::Error(StatusCode::kNotFound, "no model \"m\"\n\\ here"));
  EXPECT_EQ(answer.status, 404u);
  EXPECT_EQ(answer.content_type, "application/json");
  EXPECT_FALSE(answer.inference_header_length.has_value());
  EXPECT_EQ(error_of(answer.body), "no model \"m\"\n\\ here");

  answer = error_answer(Status::Error(StatusCode::kResourceExhausted, "busy"));
  EXPECT_EQ(answer.status, 429u);
  EXPECT_EQ(answer.body, R"({"error":"busy"})");

  // A message past the gRPC port's limit is cut as it cuts it.
  const std::string long_message(3 * kMaxStatusMessageBytes, 'y');
  answer = error_answer(Status::Error(StatusCode::kInvalidArgument, long_message));
  EXPECT_EQ(answer.status, 400u);
  EXPECT_EQ(error_of(answer.body), shown_message(long_message));
  EXPECT_LE(error_of(answer.body).size(), kMaxStatusMessageBytes);

  // Bytes that are not UTF-8 still make a JSON body.
  answer = error_answer(Status::Error(StatusCode::kInternal, std::string("bad \xff\xfe byte")));
  EXPECT_EQ(answer.status, 500u);
  EXPECT_EQ(error_of(answer.body).rfind("bad ", 0), 0u) << answer.body;
}

}  // namespace
}  // namespace inferd
