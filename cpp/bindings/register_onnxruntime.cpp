#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "inferd/onnxruntime_executor.h"
#include "inferd/onnxruntime_library.h"
#include "python_executor.h"
#include "python_tensor.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

std::shared_ptr<OnnxRuntimeExecutor> make_session(std::string model_path, std::vector<std::string> input_names,
                                                  std::vector<std::string> output_names,
                                                  const std::vector<int>& output_datatypes, int intra_op_threads,
                                                  int inter_op_threads, int graph_optimization_level) {
  OnnxRuntimeExecutorOptions options;
  options.model_path = std::move(model_path);
  options.input_names = std::move(input_names);
  options.output_names = std::move(output_names);
  for (int code : output_datatypes) {
    if (!is_valid_datatype(code)) throw std::invalid_argument("unknown datatype code " + std::to_string(code));
    options.output_types.push_back(static_cast<DataType>(code));
  }
  options.intra_op_threads = intra_op_threads;
  options.inter_op_threads = inter_op_threads;
  options.graph_optimization_level = graph_optimization_level;
  std::unique_ptr<OnnxRuntimeExecutor> executor;
  Status status;
  {
    // ORT reads and optimizes the model (up to seconds): the event loop and others keep running.
    // Create touches no Python object.
    py::gil_scoped_release release;
    status = OnnxRuntimeExecutor::Create(std::move(options), &executor);
  }
  if (!status.ok()) raise_status(status);
  return executor;
}

// For warm-up and tests: the Python executor's execute(), through the native executor.
py::list execute(OnnxRuntimeExecutor& executor, const py::list& arrays) {
  const std::vector<DataType>& types = executor.input_types();
  if (arrays.size() != types.size()) {
    throw std::invalid_argument("got " + std::to_string(arrays.size()) + " inputs, the model has " +
                                std::to_string(types.size()));
  }
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < types.size(); ++i) {
    if (arrays[i].is_none()) {
      inputs.push_back(Tensor::Absent(types[i]));
      continue;
    }
    try {
      inputs.push_back(tensor_from_executor_array(arrays[i], types[i]));  // a view; BYTES serialized
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument("input " + std::to_string(i) + ": " + error.what());
    }
  }
  std::vector<Tensor> outputs;
  Status status;
  {
    // The computation touches no Python object (the inputs' buffers stay exported by `inputs`),
    // so other threads run while it lasts.
    py::gil_scoped_release release;
    status = executor.execute(inputs, &outputs);
  }
  if (!status.ok()) raise_status(status);
  py::list results;
  for (const Tensor& output : outputs) results.append(executor_array(output));
  return results;
}

}  // namespace

void register_onnxruntime(py::module_& m) {
  m.def(
      "load_onnxruntime",
      [](const std::string& path) {
        const OnnxRuntimeLibrary* library = nullptr;
        Status status;
        {
          py::gil_scoped_release release;  // dlopen maps and relocates a large library; no Python involved
          status = OnnxRuntimeLibrary::Load(path, &library);
        }
        if (!status.ok()) raise_status(status);
        return library->version();
      },
      py::arg("path"),
      "Load ONNX Runtime's shared library (once per process) for OnnxRuntimeSession; returns its version. "
      "Raises RuntimeError (ValueError for a second, different path) with the reason.");

  m.def(
      "set_onnxruntime_logging",
      [](int minimum_severity) {
        if (minimum_severity < 0 || minimum_severity > 4) {
          throw std::invalid_argument("ONNX Runtime log severity " + std::to_string(minimum_severity) +
                                      " is not 0 (verbose) to 4 (fatal)");
        }
        OnnxRuntimeLibrary::SetLogging(minimum_severity);
      },
      py::arg("minimum_severity"),
      "Which of ONNX Runtime's own log records are written (before or after load_onnxruntime): those less "
      "severe than minimum_severity (0 verbose, 1 info, 2 warning (the default), 3 error, 4 fatal) are "
      "dropped, the others written to stderr as the core's records (logger 'onnxruntime', in the format "
      "set_core_logging sets). Never calls Python.");

  py::class_<OnnxRuntimeExecutor, std::shared_ptr<OnnxRuntimeExecutor>>(m, "OnnxRuntimeSession")
      .def(py::init(&make_session), py::arg("model_path"), py::arg("input_names"), py::arg("output_names"),
           py::arg("output_datatypes"), py::arg("intra_op_threads"), py::arg("inter_op_threads"),
           py::arg("graph_optimization_level") = 99,
           "A model on ONNX Runtime's CPU provider, run by the core without the GIL when given to a "
           "Scheduler. Needs load_onnxruntime first; raises ValueError (RuntimeError when the library is "
           "not loaded) with the reason.")
      .def("execute", &execute, py::arg("inputs"),
           "Compute one batch: arrays (None: an optional input left out) in input order -> outputs in "
           "output order, as the Python executors take and return them. GIL released while computing.");
}

}  // namespace inferd::python
