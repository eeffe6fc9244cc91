#include "python_executor.h"

#include <stdexcept>
#include <string>

#include "python_tensor.h"

namespace inferd::python {
namespace {

Status status_from_exception(py::error_already_set& error) {
  StatusCode code = StatusCode::kInternal;
  if (py::hasattr(error.value(), "code")) {
    try {
      const int value = py::int_(error.value().attr("code")).cast<int>();
      if (value > 0 && value <= static_cast<int>(StatusCode::kInternal)) code = static_cast<StatusCode>(value);
    } catch (const py::error_already_set&) {
      // A `code` that is not an integer: keep INTERNAL.
    }
  }
  return Status::Error(code, py::str(error.value()).cast<std::string>());
}

}  // namespace

PythonExecutor::PythonExecutor(py::handle executor, std::vector<DataType> output_types)
    : execute_(hold_reference(executor.attr("execute"))),
      stage_(py::hasattr(executor, "stage") ? hold_reference(executor.attr("stage")) : nullptr),
      output_types_(std::move(output_types)) {}

Status PythonExecutor::stage(const std::vector<Tensor>& inputs) {
  py::gil_scoped_acquire gil;
  try {
    py::list arrays;
    for (const Tensor& input : inputs) arrays.append(executor_array(input));
    py::handle method(static_cast<PyObject*>(const_cast<void*>(stage_.get())));
    method(arrays);
    return Status::Ok();
  } catch (py::error_already_set& error) {
    return status_from_exception(error);
  } catch (const std::exception& error) {
    return Status::Error(StatusCode::kInternal, error.what());
  }
}

Status PythonExecutor::execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) {
  py::gil_scoped_acquire gil;
  try {
    py::list arrays;
    for (const Tensor& input : inputs) arrays.append(executor_array(input));
    py::handle method(static_cast<PyObject*>(const_cast<void*>(execute_.get())));
    py::object result = method(arrays);
    py::list results(result);
    if (results.size() != output_types_.size()) {
      return Status::Error(StatusCode::kInternal, "executor returned " + std::to_string(results.size()) +
                                                      " outputs, the model has " +
                                                      std::to_string(output_types_.size()));
    }
    outputs->clear();
    for (size_t i = 0; i < output_types_.size(); ++i) {
      outputs->push_back(tensor_from_executor_array(results[i], output_types_[i]));
    }
    return Status::Ok();
  } catch (py::error_already_set& error) {
    return status_from_exception(error);
  } catch (const std::exception& error) {
    return Status::Error(StatusCode::kInternal, error.what());
  }
}

}  // namespace inferd::python
