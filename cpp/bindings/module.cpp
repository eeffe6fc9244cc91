// inferd._core: the C++ batching core, seen from Python. This file is the table of contents; each
// register_* binds one area and holds no logic of its own.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace inferd::python {
void register_status(py::module_& m);
void register_batching(py::module_& m);
void register_cuda(py::module_& m);
void register_completion_queue(py::module_& m);
void register_scheduler(py::module_& m);
void register_ensemble(py::module_& m);
void register_shared_memory(py::module_& m);
void register_onnxruntime(py::module_& m);
void register_python_worker(py::module_& m);
void register_wire(py::module_& m);
void register_grpc_server(py::module_& m);
void register_logging(py::module_& m);
void register_load_generator(py::module_& m);
#ifdef INFERD_HAS_HTTP
void register_http_server(py::module_& m);
#endif
}  // namespace inferd::python

PYBIND11_MODULE(_core, m) {
  m.doc() = "inferd's C++ core: request queues, batch assembly, executors' worker threads, completions.";
  inferd::python::register_status(m);
  inferd::python::register_logging(m);
  inferd::python::register_batching(m);
  inferd::python::register_cuda(m);
  inferd::python::register_completion_queue(m);
  inferd::python::register_wire(m);
  inferd::python::register_onnxruntime(m);
  inferd::python::register_python_worker(m);
  inferd::python::register_scheduler(m);
  inferd::python::register_ensemble(m);
  inferd::python::register_shared_memory(m);
  inferd::python::register_grpc_server(m);
  inferd::python::register_load_generator(m);
#ifdef INFERD_HAS_HTTP
  inferd::python::register_http_server(m);
#endif
}
