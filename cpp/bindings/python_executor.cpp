#include "python_executor.h"

#include <memory>
#include <stdexcept>
#include <string>

#include "python_tensor.h"

namespace inferd::python {

Status status_of(py::handle exception) {
  StatusCode code = StatusCode::kInternal;
  if (py::hasattr(exception, "code")) {
    try {
      const int value = py::int_(exception.attr("code")).cast<int>();
      if (value > 0 && value <= static_cast<int>(StatusCode::kInternal)) code = static_cast<StatusCode>(value);
    } catch (const py::error_already_set&) {
      // A `code` that is not an integer: keep INTERNAL.
    }
  }
  return Status::Error(code, py::str(exception).cast<std::string>());
}

void raise_status(const Status& status) {
  py::handle type = status.code == StatusCode::kInvalidArgument ? PyExc_ValueError : PyExc_RuntimeError;
  py::object error = type(status.message);
  error.attr("code") = static_cast<int>(status.code);
  PyErr_SetObject(type.ptr(), error.ptr());
  throw py::error_already_set();
}

namespace {

Status status_from_exception(py::error_already_set& error) { return status_of(error.value()); }

}  // namespace

PythonExecutor::PythonExecutor(py::handle executor, std::vector<DataType> output_types)
    : execute_(hold_reference(executor.attr("execute"))),
      stage_(py::hasattr(executor, "stage") ? hold_reference(executor.attr("stage")) : nullptr),
      execute_requests_(py::hasattr(executor, "execute_requests") ? hold_reference(executor.attr("execute_requests"))
                                                                  : nullptr),
      decoupled_(py::hasattr(executor, "decoupled") && py::bool_(executor.attr("decoupled"))),
      takes_details_(py::hasattr(executor, "takes_request_details") &&
                     py::bool_(executor.attr("takes_request_details"))),
      output_types_(std::move(output_types)) {}

RequestResult result_of(py::handle answer, const std::vector<DataType>& output_types) {
  RequestResult result;
  if (PyExceptionInstance_Check(answer.ptr())) {
    result.status = status_of(answer);
    return result;
  }
  py::list arrays(py::reinterpret_borrow<py::object>(answer));
  if (arrays.size() != output_types.size()) {
    throw py::value_error("executor returned " + std::to_string(arrays.size()) + " outputs, the model has " +
                          std::to_string(output_types.size()));
  }
  for (size_t i = 0; i < output_types.size(); ++i) {
    result.outputs.push_back(tensor_from_executor_array(arrays[i], output_types[i]));
  }
  return result;
}

py::handle pending_marker() {
  // Leaked on purpose: a static py::object would be released after the interpreter is gone.
  static PyObject* const marker = [] {
    py::object made = py::module_::import("types").attr("SimpleNamespace")();
    return made.release().ptr();
  }();
  return marker;
}

py::handle rescheduled_marker() {
  static PyObject* const marker = [] {  // leaked, as pending_marker's
    py::object made = py::module_::import("types").attr("SimpleNamespace")();
    return made.release().ptr();
  }();
  return marker;
}

void DecoupledResponses::check_index(size_t index) const {
  if (index >= requests_) {
    throw py::index_error("request " + std::to_string(index) + " of a batch of " + std::to_string(requests_));
  }
}

bool DecoupledResponses::respond(size_t index, py::handle answer) {
  check_index(index);
  RequestResult response = result_of(answer, output_types_);
  py::gil_scoped_release release;
  return later_->respond(index, std::move(response));
}

bool DecoupledResponses::finish(size_t index, py::handle answer) {
  check_index(index);
  RequestResult result;
  if (answer.is_none()) {
    result.respond = false;  // the final flag alone
  } else {
    result = result_of(answer, output_types_);
  }
  py::gil_scoped_release release;
  return later_->finish(index, std::move(result));
}

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

Status PythonExecutor::execute_requests(const std::vector<ExecutorRequest>& requests,
                                        std::vector<RequestResult>* results, ResponseStream* responses) {
  py::gil_scoped_acquire gil;
  try {
    py::list batch;
    py::list details;
    for (const ExecutorRequest& request : requests) {
      py::list arrays;
      for (const Tensor& input : request.inputs) arrays.append(executor_array(input));
      batch.append(arrays);
      if (takes_details_) {
        py::list requested;
        for (const std::string_view name : request.requested_outputs)
          requested.append(py::str(name.data(), name.size()));
        const std::string_view parameters = request.parameters.empty() ? "{}" : request.parameters;
        // A copy: Python may keep the callable past this batch.
        py::cpp_function cancelled([cancellation = request.cancellation] { return cancellation.requested(); });
        // A stateful model's sequence, as pb_utils' correlation_id() and flags() give it.
        py::object correlation = py::int_(0);
        int flags = 0;
        if (request.sequence != nullptr) {
          correlation = request.sequence->string_id.empty() ? py::object(py::int_(request.sequence->id))
                                                            : py::object(py::str(request.sequence->string_id));
          flags = (request.sequence->start ? 1 : 0) | (request.sequence->end ? 2 : 0);
        }
        details.append(py::make_tuple(py::str(request.id.data(), request.id.size()), requested,
                                      py::str(parameters.data(), parameters.size()), cancelled, correlation, flags));
      }
    }
    py::handle method(static_cast<PyObject*>(const_cast<void*>(execute_requests_.get())));
    py::object returned;
    if (decoupled_) {
      py::object respond =
          py::cast(std::make_shared<DecoupledResponses>(responses->later(), requests.size(), output_types_));
      returned = takes_details_ ? method(batch, respond, details) : method(batch, respond);
    } else {
      returned = takes_details_ ? method(batch, py::none(), details) : method(batch);
    }
    py::list answers(returned);
    if (answers.size() != requests.size()) {
      return Status::Error(StatusCode::kInternal, "executor answered " + std::to_string(answers.size()) +
                                                      " requests of " + std::to_string(requests.size()));
    }
    results->clear();
    for (py::handle answer : answers) {
      RequestResult result;
      // One request's malformed answer fails that request alone.
      try {
        if (decoupled_ && answer.is_none()) {
          result.respond = false;  // the final flag alone
        } else if (decoupled_ && answer.is(pending_marker())) {
          result.pending = true;  // answered later, through `respond`
        } else if (answer.is(rescheduled_marker())) {
          result.reschedule = true;  // back for another step, unanswered
          result.respond = false;    // no response of its own here
        } else {
          result = result_of(answer, output_types_);
        }
      } catch (py::error_already_set& error) {
        result = RequestResult{status_from_exception(error), {}};
      } catch (const std::exception& error) {
        result = RequestResult{Status::Error(StatusCode::kInternal, error.what()), {}};
      }
      results->push_back(std::move(result));
    }
    return Status::Ok();
  } catch (py::error_already_set& error) {
    return status_from_exception(error);
  } catch (const std::exception& error) {
    return Status::Error(StatusCode::kInternal, error.what());
  }
}

}  // namespace inferd::python
