// inferd._core.LoadGenerator: the C++ load `inferd tune` drives a server with.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "inferd/load_generator.h"

namespace py = pybind11;

namespace inferd::python {

void register_load_generator(py::module_& m) {
  py::class_<LoadOptions>(m, "LoadOptions", "How LoadGenerator.run drives a server.")
      .def(py::init<>())
      .def_readwrite("target", &LoadOptions::target, "host:port, or unix:PATH")
      .def_readwrite("requests", &LoadOptions::requests, "serialized ModelInferRequests, sent in turn")
      .def_readwrite("concurrency", &LoadOptions::concurrency,
                     "closed loop: requests in flight; open loop: the most in flight")
      .def_readwrite("rate", &LoadOptions::rate, "> 0: Poisson arrivals per second (open loop)")
      .def_readwrite("warmup_s", &LoadOptions::warmup_s)
      .def_readwrite("measure_s", &LoadOptions::measure_s)
      .def_readwrite("seed", &LoadOptions::seed)
      .def_readwrite("timeout_s", &LoadOptions::timeout_s);
  py::class_<LoadResult>(m, "LoadResult", "What one run measured over its window.")
      .def_readonly("latencies_ns", &LoadResult::latencies_ns, "requests answered OK, from their arrival")
      .def_readonly("errors", &LoadResult::errors)
      .def_readonly("dropped", &LoadResult::dropped)
      .def_readonly("first_error", &LoadResult::first_error)
      .def_readonly("seconds", &LoadResult::seconds);
  py::class_<LoadGenerator>(m, "LoadGenerator")
      .def_static("run", &LoadGenerator::run, py::arg("options"), py::call_guard<py::gil_scoped_release>(),
                  "Drive the server for warmup_s + measure_s; blocks with the GIL released.");
}

}  // namespace inferd::python
