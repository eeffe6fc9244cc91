#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "inferd/grpc_server.h"
#include "inferd/http_server.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

// Shutting down waits for requests, some of which Python answers: never with the GIL held.
struct ShutDownWithoutGil {
  void operator()(HttpServer* server) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      std::default_delete<HttpServer>()(server);
    } else {
      std::default_delete<HttpServer>()(server);
    }
  }
};

std::shared_ptr<HttpServer> make_server(
    GrpcServer& grpc, std::vector<std::string> addresses, int threads, int header_timeout_ms, int idle_timeout_ms,
    size_t max_connections, uint32_t max_header_bytes, uint64_t max_body_bytes, uint64_t max_decompressed_bytes,
    size_t max_json_depth, uint64_t max_chunks, bool use_ssl, bool use_ssl_mutual, std::string server_cert_pem,
    std::string server_key_pem, std::string root_cert_pem,
    const std::vector<std::tuple<std::vector<std::string>, std::string, std::string>>& restricted_protocols,
    bool control_on_tcp) {
  HttpServerOptions options;
  options.addresses = std::move(addresses);
  options.threads = threads;
  options.header_timeout_ms = header_timeout_ms;
  options.idle_timeout_ms = idle_timeout_ms;
  options.max_connections = max_connections;
  options.max_header_bytes = max_header_bytes;
  options.max_body_bytes = max_body_bytes;
  options.max_decompressed_bytes = max_decompressed_bytes;
  options.max_json_depth = max_json_depth;
  options.max_chunks = max_chunks;
  options.use_ssl = use_ssl;
  options.use_ssl_mutual = use_ssl_mutual;
  options.server_cert_pem = std::move(server_cert_pem);
  options.server_key_pem = std::move(server_key_pem);
  options.root_cert_pem = std::move(root_cert_pem);
  for (const auto& [groups, key, value] : restricted_protocols) {
    options.access.restricted.push_back(RestrictedProtocol{groups, key, value});
  }
  options.access.control_on_tcp = control_on_tcp;
  std::unique_ptr<HttpServer> server;
  {
    py::gil_scoped_release release;  // binding ports and starting threads
    server = std::make_unique<HttpServer>(std::move(options), grpc);
  }
  return std::shared_ptr<HttpServer>(server.release(), ShutDownWithoutGil{});
}

}  // namespace

void register_http_server(py::module_& m) {
  py::class_<HttpServer, std::shared_ptr<HttpServer>>(m, "HttpServer")
      .def(py::init(&make_server), py::arg("grpc_server"), py::arg("addresses"), py::arg("threads") = 2,
           py::arg("header_timeout_ms") = 10'000, py::arg("idle_timeout_ms") = 60'000,
           py::arg("max_connections") = 1024, py::arg("max_header_bytes") = 64 * 1024,
           py::arg("max_body_bytes") = (uint64_t{1} << 31) - 1,
           py::arg("max_decompressed_bytes") = (uint64_t{1} << 31) - 1, py::arg("max_json_depth") = 64,
           py::arg("max_chunks") = 65'536, py::arg("use_ssl") = false, py::arg("use_ssl_mutual") = false,
           py::arg("server_cert_pem") = "", py::arg("server_key_pem") = "", py::arg("root_cert_pem") = "",
           py::arg("restricted_protocols") =
               std::vector<std::tuple<std::vector<std::string>, std::string, std::string>>{},
           py::arg("control_on_tcp") = false,
           "Binds every address (HOST:PORT or unix:PATH) and serves Triton's HTTP/REST API from the gRPC server's "
           "snapshot, schedulers and backend.")
      .def_property_readonly("ports", &HttpServer::ports, "The bound port of each address (0 for a Unix socket).")
      .def_property_readonly("connections", &HttpServer::connections, "Connections open now.")
      .def("shutdown", &HttpServer::shutdown, py::arg("grace_s"), py::call_guard<py::gil_scoped_release>(),
           "Stops accepting, answers what is in flight for grace_s seconds, closes the rest. Idempotent.");
}

}  // namespace inferd::python
