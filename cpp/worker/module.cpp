// inferd._worker: the python-backend worker's loop over its ring (worker_loop.h), imported by the
// worker process only. It links the ring and its descriptions, none of the server.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "worker_loop.h"

namespace py = pybind11;

PYBIND11_MODULE(_worker, module) {
  module.doc() = "The python-backend worker's loop over its shared-memory ring";
  py::class_<inferd::worker::WorkerLoop>(module, "WorkerLoop")
      .def(py::init<const std::string&>(), py::arg("fds"),
           "Adopts the ring the server passed: its five descriptors, as --ring gives them.")
      .def(
          "serve",
          [](inferd::worker::WorkerLoop& loop, py::object execute, py::object make_request, py::object resolve,
             py::object report, py::object response_type, py::object should_stop) {
            loop.serve(inferd::worker::LoopCallbacks{std::move(execute), std::move(make_request), std::move(resolve),
                                                     std::move(report), std::move(response_type),
                                                     std::move(should_stop)});
          },
          py::arg("execute"), py::arg("make_request"), py::arg("resolve"), py::arg("report"), py::arg("response_type"),
          py::arg("should_stop"), "Serves batches until should_stop() answers true after a wake().")
      .def("wake", &inferd::worker::WorkerLoop::wake, "Makes serve() ask should_stop(); from any thread.")
      .def("call", &inferd::worker::WorkerLoop::call, py::arg("number"), py::arg("model"), py::arg("version"),
           py::arg("request_id"), py::arg("parameters"), py::arg("chain"), py::arg("requested"), py::arg("timeout_us"),
           py::arg("inputs"),
           "A model-to-model call on the ring while a batch runs: (outputs as [(name, ndarray)], status code, "
           "message); (None, 0, '') when its answer comes on the control channel under `number` (its batch "
           "was answered first); None between batches.")
      .def("respond", &inferd::worker::WorkerLoop::respond, py::arg("batch"), py::arg("index"), py::arg("final"),
           py::arg("outputs"), py::arg("error"),
           "A decoupled model's response to request `index` of the server's batch `batch`, sent at once on the "
           "ring: outputs as [(name, ndarray)], or error its message, or both None for the final flag alone. "
           "Raises ValueError for an output the protocol cannot carry.");
}
