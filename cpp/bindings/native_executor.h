#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "inferd/executor.h"

namespace inferd::python {

namespace py = pybind11;

// The Executor a Scheduler runs for `object` when it is one of the core's own: an OnnxRuntimeSession
// (register_onnxruntime.cpp) or a PythonWorkerSession (register_python_worker.cpp). It forwards to
// that executor, which it shares with the Python object (warm-up and tests call it too), and takes
// no GIL. Null for any other object. Requires the GIL.
std::unique_ptr<Executor> native_executor(py::handle object);

}  // namespace inferd::python
