#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "inferd/grpc_calls.h"
#include "inferd/grpc_server.h"
#include "inferd/model_calls.h"
#include "inferd/request_scheduler.h"
#include "inferd/shared_memory.h"
#include "inferd/trace_sampling.h"
#include "inferd/version_routing.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

// Shutting down waits for calls, some of which Python answers: never with the GIL held.
struct ShutDownWithoutGil {
  void operator()(GrpcServer* server) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      std::default_delete<GrpcServer>()(server);
    } else {
      std::default_delete<GrpcServer>()(server);
    }
  }
};

std::shared_ptr<GrpcServer> make_server(
    std::vector<std::string> addresses, std::string backend_address, int max_message_bytes, int keepalive_time_ms,
    int keepalive_timeout_ms, int max_concurrent_streams, bool use_ssl, bool use_ssl_mutual,
    std::string server_cert_pem, std::string server_key_pem, std::string root_cert_pem, size_t max_stream_outstanding,
    int max_connection_idle_ms,
    const std::vector<std::tuple<std::vector<std::string>, std::string, std::string>>& restricted_protocols,
    bool control_on_tcp, uint64_t max_inflight_bytes, std::shared_ptr<SharedMemoryRegistry> shared_memory,
    bool shared_memory_on_tcp, uint64_t max_stream_pending_bytes) {
  GrpcServerOptions options;
  options.addresses = std::move(addresses);
  options.backend_address = std::move(backend_address);
  options.max_message_bytes = max_message_bytes;
  options.keepalive_time_ms = keepalive_time_ms;
  options.keepalive_timeout_ms = keepalive_timeout_ms;
  options.max_concurrent_streams = max_concurrent_streams;
  options.use_ssl = use_ssl;
  options.use_ssl_mutual = use_ssl_mutual;
  options.server_cert_pem = std::move(server_cert_pem);
  options.server_key_pem = std::move(server_key_pem);
  options.root_cert_pem = std::move(root_cert_pem);
  options.max_stream_outstanding = max_stream_outstanding;
  options.max_stream_pending_bytes = max_stream_pending_bytes;
  options.max_connection_idle_ms = max_connection_idle_ms;
  for (const auto& [groups, key, value] : restricted_protocols) {
    options.access.restricted.push_back(RestrictedProtocol{groups, key, value});
  }
  options.access.control_on_tcp = control_on_tcp;
  options.max_inflight_bytes = max_inflight_bytes;
  options.shared_memory = std::move(shared_memory);
  options.shared_memory_on_tcp = shared_memory_on_tcp;
  std::unique_ptr<GrpcServer> server;
  {
    py::gil_scoped_release release;  // binding ports and starting grpc's threads
    server = std::make_unique<GrpcServer>(std::move(options));
  }
  return std::shared_ptr<GrpcServer>(server.release(), ShutDownWithoutGil{});
}

void publish(GrpcServer& server, bool live, bool ready, bool accepting, bool forward_inference,
             const TraceSampling& tracing, const std::vector<py::tuple>& routes,
             const std::vector<std::tuple<std::string, std::vector<std::tuple<std::string, uint64_t>>>>& weights,
             bool observe_inference, const std::map<std::string, TraceSampling>& model_tracing) {
  auto snapshot = std::make_shared<ServingSnapshot>();
  snapshot->live = live;
  snapshot->ready = ready;
  snapshot->accepting = accepting;
  snapshot->forward_inference = forward_inference;
  snapshot->tracing = tracing;
  snapshot->model_tracing.insert(model_tracing.begin(), model_tracing.end());
  snapshot->observe_inference = observe_inference;
  for (const py::tuple& r : routes) {
    auto route = std::make_shared<ModelRoute>();
    route->model = r[2].cast<std::string>();
    route->version = r[3].cast<std::string>();
    auto scheduler = r[4].cast<std::shared_ptr<RequestScheduler>>();
    route->scheduler = scheduler;
    snapshot->schedulers.push_back(std::move(scheduler));
    route->signature = r[5].cast<std::shared_ptr<ModelSignature>>();
    route->metadata_response = r[6].cast<std::string>();
    route->config_response = r[7].cast<std::string>();
    snapshot->models[r[0].cast<std::string>()][r[1].cast<std::string>()] = std::move(route);
  }
  for (const auto& [name, versions] : weights) {
    std::vector<uint64_t> shares;
    std::vector<std::shared_ptr<const ModelRoute>> routes_of_model;
    for (const auto& [version, weight] : versions) {
      std::shared_ptr<const ModelRoute> route = snapshot->find(name, version);
      if (route == nullptr) throw std::invalid_argument("weighted version " + name + "/" + version + " has no route");
      shares.push_back(weight);
      routes_of_model.push_back(std::move(route));
    }
    snapshot->weighted.emplace(name, ServingSnapshot::WeightedVersions{WeightedChoice(shares), routes_of_model});
  }
  server.state().publish(std::move(snapshot));
}

// The index of the version a request naming none takes: the Python path's side of the choice the
// transport makes (WeightedChoice), so both paths pick alike.
size_t choose_weighted(const std::vector<uint64_t>& weights, const std::optional<std::string>& routing_key) {
  const WeightedChoice choice(weights);
  return routing_key ? choice.pick(*routing_key) : choice.pick_random();
}

}  // namespace

void register_grpc_server(py::module_& m) {
  py::class_<TraceBudget, std::shared_ptr<TraceBudget>>(
      m, "TraceBudget", "How many more traces may be taken (Triton's trace_count), shared with the core.")
      .def(py::init<int64_t>(), py::arg("traces"))
      .def("take", &TraceBudget::take, "Takes one trace when any is left: True if it took one.")
      .def_property_readonly("remaining", &TraceBudget::remaining, "Traces left (0 once spent).");
  py::class_<TraceSampling>(m, "TraceSampling")
      .def(py::init([](bool enabled, bool parent_based, double ratio, std::shared_ptr<TraceBudget> budget) {
             return TraceSampling{enabled, parent_based, ratio, std::move(budget)};
           }),
           py::arg("enabled") = false, py::arg("parent_based") = false, py::arg("ratio") = 0.0,
           py::arg("budget") = nullptr)
      .def_readonly("enabled", &TraceSampling::enabled)
      .def_readonly("parent_based", &TraceSampling::parent_based)
      .def_readonly("ratio", &TraceSampling::ratio)
      .def_readonly("budget", &TraceSampling::budget)
      .def("traced", &TraceSampling::traced, py::arg("traceparent"),
           "Whether the transport traces a request with this traceparent header ('' = none).");
  py::class_<GrpcServer, std::shared_ptr<GrpcServer>>(m, "GrpcServer")
      .def(py::init(&make_server), py::arg("addresses"), py::arg("backend_address"), py::arg("max_message_bytes"),
           py::arg("keepalive_time_ms") = 0, py::arg("keepalive_timeout_ms") = 0, py::arg("max_concurrent_streams") = 0,
           py::arg("use_ssl") = false, py::arg("use_ssl_mutual") = false, py::arg("server_cert_pem") = "",
           py::arg("server_key_pem") = "", py::arg("root_cert_pem") = "", py::arg("max_stream_outstanding") = 1024,
           py::arg("max_connection_idle_ms") = 0,
           py::arg("restricted_protocols") =
               std::vector<std::tuple<std::vector<std::string>, std::string, std::string>>{},
           py::arg("control_on_tcp") = false, py::arg("max_inflight_bytes") = 0, py::arg("shared_memory") = py::none(),
           py::arg("shared_memory_on_tcp") = false, py::arg("max_stream_pending_bytes") = uint64_t{64} << 20,
           "Binds every address (HOST:PORT or unix:PATH) and serves: inference in the core, every call it does not "
           "answer forwarded to the backend address. restricted_protocols: (groups, key, value) as Triton's "
           "--grpc-restricted-protocol; control_on_tcp: control calls answered on TCP too; shared_memory: the "
           "server's SharedMemoryRegistry (None: shared memory off), served on the Unix socket, and on TCP too with "
           "shared_memory_on_tcp. Raises RuntimeError "
           "when an address cannot be served, ValueError for a restricted protocol it cannot enforce.")
      .def_property_readonly("ports", &GrpcServer::ports, "The bound port of each address (0 for a Unix socket).")
      .def_property_readonly("observations", &GrpcServer::observations,
                             "The ObservationQueue of the inferences the core ran while Python observes them.")
      .def(
          "serve_model_calls",
          [](GrpcServer& server, ModelCalls& calls) {
            std::shared_ptr<TransportContext> transport = server.transport();
            calls.serve_from([transport]() { return transport->state.read(); });
          },
          py::arg("calls"),
          "Python models' calls (ModelCalls) are routed by this server's serving snapshot from here on, as "
          "its clients' requests are.")
      .def(
          "settle",
          [](GrpcServer& server, int64_t timeout_ms) {
            return server.state().settle(std::chrono::milliseconds(timeout_ms));
          },
          py::arg("timeout_ms"), py::call_guard<py::gil_scoped_release>(),
          "Waits until no call that read an earlier snapshot can still submit by it (see ServingState), "
          "at most timeout_ms; False when it timed out. GIL released.")
      .def("publish", &publish, py::arg("live"), py::arg("ready"), py::arg("accepting"), py::arg("forward_inference"),
           py::arg("tracing"), py::arg("routes"),
           py::arg("weights") = std::vector<std::tuple<std::string, std::vector<std::tuple<std::string, uint64_t>>>>{},
           py::arg("observe_inference") = false, py::arg("model_tracing") = std::map<std::string, TraceSampling>{},
           "Replace the serving snapshot. forward_inference: every inference goes to the backend; tracing: those "
           "it samples are observed (run in the core, reported on observations); observe_inference: every one is. "
           "model_tracing: {model name: TraceSampling} for the models whose trace settings override tracing. "
           "routes: (name, version as requested ('' = default), model, version, "
           "Scheduler or EnsembleScheduler, ModelSignature, serialized ModelMetadataResponse, serialized "
           "ModelConfigResponse); weights: "
           "(name, [(version, weight)]) of the models whose inferences naming no version are routed by weight among "
           "those routed versions.")
      .def(
          "failures", [](const GrpcServer& server) { return const_cast<GrpcServer&>(server).failures().snapshot(); },
          "Inference requests the transport failed on a known version: [(model, version, StatusCode, count)].")
      .def("shutdown", &GrpcServer::shutdown, py::arg("grace_s"), py::call_guard<py::gil_scoped_release>(),
           "Stop accepting calls, let those in flight finish for grace_s seconds, cancel the rest; blocks.");
  m.def("choose_weighted_version", &choose_weighted, py::arg("weights"), py::arg("routing_key"),
        "The index of the version a request naming none takes among positive weights: by the FNV-1a 64 hash of "
        "routing_key's UTF-8 bytes modulo the total weight when given, at random otherwise. Raises ValueError for "
        "no weights or a zero.");
  m.def(
      "grpc_status_code", [](StatusCode code) { return grpc_code(code); }, py::arg("code"),
      "The gRPC status code the core's transport answers for a StatusCode.");
  m.def("shown_message", &shown_message, py::arg("message"),
        "A status message as a client is shown it: message, or its first whole UTF-8 characters and an ellipsis, "
        "within the transport's limit (kMaxStatusMessageBytes).");
}

}  // namespace inferd::python
