#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "inferd/executor.h"

namespace inferd::python {

namespace py = pybind11;

// The Executor a Scheduler runs for `object` when it is an OnnxRuntimeSession (the native ONNX
// Runtime executor, see register_onnxruntime.cpp): it forwards to the session's executor, which
// it shares with the Python object, and takes no GIL. Null for any other object. Requires the GIL.
std::unique_ptr<Executor> native_executor(py::handle object);

}  // namespace inferd::python
