#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "inferd/python_worker_executor.h"
#include "inferd/streamed_responses.h"
#include "inferd/worker_ring.h"
#include "python_executor.h"
#include "python_tensor.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

using worker::WorkerRing;

// A hook as the executor calls it: the Python callable under the GIL; what it raises is the status.
std::function<Status()> hook_of(py::handle callable) {
  std::shared_ptr<const void> held = hold_reference(callable);
  return [held]() {
    py::gil_scoped_acquire gil;
    try {
      py::handle(static_cast<PyObject*>(const_cast<void*>(held.get())))();
      return Status::Ok();
    } catch (py::error_already_set& error) {
      return status_of(error.value());
    }
  };
}

std::vector<DataType> datatypes_of(const std::vector<int>& codes) {
  std::vector<DataType> types;
  for (int code : codes) {
    if (!is_valid_datatype(code)) throw std::invalid_argument("unknown datatype code " + std::to_string(code));
    types.push_back(static_cast<DataType>(code));
  }
  return types;
}

// Holds PythonWorkerExecutor::exclusive() for a `with` block, taken with the GIL released.
class ExclusiveHold {
 public:
  explicit ExclusiveHold(std::shared_ptr<PythonWorkerExecutor> executor) : executor_(std::move(executor)) {}
  void enter() {
    py::gil_scoped_release release;
    lock_ = executor_->exclusive();
  }
  void exit() {
    if (lock_.owns_lock()) lock_.unlock();
  }

 private:
  std::shared_ptr<PythonWorkerExecutor> executor_;
  std::unique_lock<std::mutex> lock_;
};

// A request's cancellation as a Python caller of run() sets it (from a thread that watches its own
// notion of it); the executor passes it to the worker as it does a scheduled request's.
struct CancellationFlag {
  std::shared_ptr<std::atomic<bool>> flag = std::make_shared<std::atomic<bool>>(false);
};

// For warm-up and tests: a batch through the executor as the worker takes it. Each request: (id,
// inputs as (name, datatype code, ndarray), requested output names, parameters JSON, a
// CancellationFlag or None). Each answer: its outputs by name as the worker sent them, or (code,
// message).
py::list run_batch(PythonWorkerExecutor& executor, const py::list& batch) {
  std::vector<std::vector<Tensor>> tensors(batch.size());
  std::vector<std::vector<std::string>> names(batch.size());
  std::vector<std::vector<std::string>> requested(batch.size());
  std::vector<std::string> ids(batch.size());
  std::vector<std::string> parameters(batch.size());
  std::vector<std::shared_ptr<const std::atomic<bool>>> flags(batch.size());
  for (size_t r = 0; r < batch.size(); ++r) {
    const py::tuple item = batch[r].cast<py::tuple>();
    if (item.size() != 5) {
      throw std::invalid_argument("a request is (id, inputs, requested, parameters, cancellation)");
    }
    ids[r] = item[0].cast<std::string>();
    for (py::handle input : item[1].cast<py::list>()) {
      const py::tuple named = input.cast<py::tuple>();
      if (named.size() != 3) throw std::invalid_argument("an input is (name, datatype code, array)");
      const int code = named[1].cast<int>();
      if (!is_valid_datatype(code)) throw std::invalid_argument("unknown datatype code " + std::to_string(code));
      names[r].push_back(named[0].cast<std::string>());
      tensors[r].push_back(tensor_from_executor_array(named[2], static_cast<DataType>(code)));
    }
    requested[r] = item[2].cast<std::vector<std::string>>();
    parameters[r] = item[3].cast<std::string>();
    if (!item[4].is_none()) flags[r] = item[4].cast<const CancellationFlag&>().flag;
  }
  std::vector<WorkerRequest> requests(batch.size());
  for (size_t r = 0; r < batch.size(); ++r) {
    requests[r].id = ids[r];
    requests[r].parameters = parameters[r];
    requests[r].cancellation.flag = flags[r];
    for (const std::string& name : requested[r]) requests[r].requested_outputs.push_back(name);
    for (size_t i = 0; i < tensors[r].size(); ++i) requests[r].inputs.emplace_back(names[r][i], &tensors[r][i]);
  }
  std::vector<WorkerAnswer> answers;
  Status status;
  {
    py::gil_scoped_release release;
    status = executor.run(requests, &answers);
  }
  if (!status.ok()) raise_status(status);
  py::list results;
  for (const WorkerAnswer& answer : answers) {
    if (!answer.status.ok()) {
      results.append(py::make_tuple(static_cast<int>(answer.status.code), answer.status.message));
      continue;
    }
    py::dict outputs;
    for (const auto& [name, tensor] : answer.outputs) outputs[py::str(name)] = executor_array(tensor);
    results.append(outputs);
  }
  return results;
}

// hooks.call_unrouted as Python takes it: call_unrouted(model, version, request_id, parameters
// (a dict), chain, requested output names, timeout_us, inputs as [(name, array)], done), where
// done(outputs as [(name, datatype code, array)] or None, status code, message) answers the call
// once, from any thread.
std::function<void(const worker::CallDescription&, const std::vector<Tensor>&, ModelCallDone)> call_hook_of(
    py::handle callable) {
  if (callable.is_none()) return {};
  std::shared_ptr<const void> held = hold_reference(callable);
  return [held](const worker::CallDescription& call, const std::vector<Tensor>& inputs, ModelCallDone done) {
    py::gil_scoped_acquire gil;
    auto answer = [done](const py::object& outputs, int code, const std::string& message) {
      ModelCallAnswer answer;
      if (code != 0) {
        answer.status = Status::Error(static_cast<StatusCode>(code), message);
      } else {
        try {
          for (py::handle output : outputs.cast<py::list>()) {
            const py::tuple named = output.cast<py::tuple>();
            const int datatype = named[1].cast<int>();
            if (!is_valid_datatype(datatype)) throw std::invalid_argument("unknown datatype code");
            answer.outputs.emplace_back(named[0].cast<std::string>(),
                                        tensor_from_executor_array(named[2], static_cast<DataType>(datatype)));
          }
        } catch (const std::exception& error) {
          answer.outputs.clear();
          answer.status =
              Status::Error(StatusCode::kInternal, std::string("model-to-model call failed: ") + error.what());
        }
      }
      py::gil_scoped_release release;
      done(std::move(answer));
    };
    try {
      py::dict parameters;
      for (const worker::CallParameter& parameter : call.parameters) {
        const py::str key(std::string(parameter.key));
        switch (parameter.kind) {
          case worker::CallParameter::Kind::kBool:
            parameters[key] = py::bool_(parameter.number != 0);
            break;
          case worker::CallParameter::Kind::kInt64:
            parameters[key] = py::int_(parameter.number);
            break;
          case worker::CallParameter::Kind::kString:
            parameters[key] = py::str(std::string(parameter.text));
            break;
        }
      }
      py::list chain;
      for (std::string_view name : call.chain) chain.append(py::str(std::string(name)));
      py::list requested;
      for (std::string_view name : call.requested_outputs) requested.append(py::str(std::string(name)));
      py::list arrays;
      for (size_t k = 0; k < inputs.size(); ++k) {
        arrays.append(py::make_tuple(py::str(std::string(call.inputs[k].name)), executor_array(inputs[k])));
      }
      py::handle(static_cast<PyObject*>(const_cast<void*>(held.get())))(
          std::string(call.model), call.version, std::string(call.id), parameters, chain, requested, call.timeout_us,
          arrays, py::cpp_function(answer));
    } catch (py::error_already_set& error) {
      const Status status = status_of(error.value());
      py::gil_scoped_release release;
      done(ModelCallAnswer{status, {}});
    }
  };
}

// Named tensors as Python takes them: [(name, array)].
py::list named_arrays(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  py::list arrays;
  for (const auto& [name, tensor] : tensors) arrays.append(py::make_tuple(name, executor_array(tensor)));
  return arrays;
}

// Runs `call` (Python, on a core thread, with the GIL) and reports what it raises as unraisable,
// `context` naming what it was doing: there is no caller to raise it to.
template <typename Call>
void without_caller(const char* context, Call call) {
  try {
    call();
  } catch (py::error_already_set& error) {
    error.discard_as_unraisable(context);
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    py::error_already_set raised;
    raised.discard_as_unraisable(context);
  }
}

// hooks.call_answered_late as Python takes it: answered_late(number, outputs as [(name, array)]
// or None, status code, message), from any thread.
std::function<void(uint64_t, ModelCallAnswer&&)> late_hook_of(py::handle callable) {
  if (callable.is_none()) return {};
  std::shared_ptr<const void> held = hold_reference(callable);
  return [held](uint64_t number, ModelCallAnswer&& answer) {
    py::gil_scoped_acquire gil;
    without_caller("answering a model-to-model call late", [&] {
      py::object outputs = answer.status.ok() ? py::object(named_arrays(answer.outputs)) : py::none();
      py::handle(static_cast<PyObject*>(const_cast<void*>(held.get())))(
          number, outputs, static_cast<int>(answer.status.code), answer.status.message);
    });
  };
}

// StreamedResponses' delivery as Python takes it: deliver(batch, index, final, response), response
// None for the final flag alone, else (outputs as [(name, array)] or None, error message or None).
StreamedDelivery delivery_of(py::handle callable) {
  std::shared_ptr<const void> held = hold_reference(callable);
  return [held](uint64_t batch, size_t index, bool final, const WorkerAnswer* answer) {
    py::gil_scoped_acquire gil;
    without_caller("delivering a decoupled model's response", [&] {
      py::object response = py::none();
      if (answer != nullptr && answer->status.ok()) {
        response = py::make_tuple(named_arrays(answer->outputs), py::none());
      } else if (answer != nullptr) {
        response = py::make_tuple(py::none(), answer->status.message);
      }
      py::handle(static_cast<PyObject*>(const_cast<void*>(held.get())))(batch, index, final, response);
    });
  };
}

// Destroys a StreamedResponses without the GIL: its destructor joins the reader, which may wait
// for the GIL to deliver.
void destroy_streamed(StreamedResponses* streamed) {
  if (PyGILState_Check() != 0) {
    py::gil_scoped_release release;
    delete streamed;
  } else {
    delete streamed;
  }
}

}  // namespace

void register_python_worker(py::module_& m) {
  py::class_<ModelCalls, std::shared_ptr<ModelCalls>>(m, "ModelCalls")
      .def(py::init<>(),
           "Python models' calls to other models, run by the core (model_calls.h): routed by a serving "
           "snapshot once a server serves them (GrpcServer.serve_model_calls); until then, and for whatever "
           "it has no route for, each session's call_unrouted runs them.");
  py::class_<WorkerRing, std::shared_ptr<WorkerRing>>(m, "WorkerRing")
      .def(py::init([](const std::string& name) { return std::make_shared<WorkerRing>(WorkerRing::create(name)); }),
           py::arg("name"),
           "The server's end of a new channel to a python model's worker (worker_ring.h): shared-memory "
           "slots, two arenas and two eventfds. Raises OSError when they cannot be had.")
      .def_property_readonly(
          "fds", [](const WorkerRing& ring) { return ring.fds().format(); },
          "The five descriptors as the worker's --ring takes them.")
      .def_property_readonly(
          "descriptors",
          [](const WorkerRing& ring) {
            const worker::RingFds fds = ring.fds();
            return std::vector<int>{fds.ring, fds.inputs, fds.outputs, fds.to_worker, fds.to_server};
          },
          "The five descriptors, for the worker's pass_fds.");

  py::class_<StreamedResponses, std::shared_ptr<StreamedResponses>>(m, "StreamedResponses")
      .def(py::init([](std::shared_ptr<WorkerRing> ring, std::string model_name, std::vector<std::string> output_names,
                       const std::vector<int>& output_datatypes, const py::object& deliver) {
             if (output_names.size() != output_datatypes.size()) {
               throw std::invalid_argument("each output needs its datatype");
             }
             DeclaredOutputs declared{std::move(model_name), std::move(output_names), datatypes_of(output_datatypes)};
             return std::shared_ptr<StreamedResponses>(
                 new StreamedResponses(std::move(ring), std::move(declared), delivery_of(deliver)), destroy_streamed);
           }),
           py::arg("ring"), py::arg("model_name"), py::arg("output_names"), py::arg("output_datatypes"),
           py::arg("deliver"),
           "The responses a decoupled python model's worker streams on `ring`, read by a thread of the core "
           "(streamed_responses.h). A batch's responses that are not final go straight to its DecoupledResponses; "
           "the rest to deliver(batch, index, final, response) with the GIL, response None for the final flag "
           "alone, else (outputs as [(name, array)] or None, error message or None).")
      .def(
          "open",
          [](StreamedResponses& streamed, uint64_t batch, const std::shared_ptr<DecoupledResponses>& responses,
             std::vector<std::vector<std::string>> requested) {
            streamed.open(batch, responses ? responses->later() : nullptr, std::move(requested));
          },
          py::arg("batch"), py::arg("responses"), py::arg("requested"),
          "Batch `batch` was sent: its responses that are not final go to `responses` (None: to deliver); "
          "`requested`: each request's requested output names.")
      .def("forget", &StreamedResponses::forget, py::arg("batch"),
           "The batch is over: what still comes for it goes to deliver.")
      .def("sync", &StreamedResponses::sync, py::call_guard<py::gil_scoped_release>(),
           "Returns once every response the worker had sent is delivered. GIL released while it waits.")
      .def("stop", &StreamedResponses::stop, py::call_guard<py::gil_scoped_release>(),
           "Delivers what the worker sent, then stops reading. GIL released while it waits.");

  py::class_<CancellationFlag>(m, "CancellationFlag")
      .def(py::init<>())
      .def(
          "set", [](CancellationFlag& cancellation) { cancellation.flag->store(true, std::memory_order_release); },
          "The request is cancelled: the worker's is_cancelled() says so from here.");

  py::class_<ExclusiveHold>(m, "PythonWorkerExclusive")
      .def("__enter__", [](ExclusiveHold& hold) { hold.enter(); })
      .def("__exit__", [](ExclusiveHold& hold, const py::args&) { hold.exit(); });

  py::class_<PythonWorkerExecutor, std::shared_ptr<PythonWorkerExecutor>>(m, "PythonWorkerSession")
      .def(py::init([](std::string model_name, std::string description, std::vector<std::string> input_names,
                       const std::vector<int>& input_datatypes, std::vector<std::string> output_names,
                       const std::vector<int>& output_datatypes, const py::object& ensure_serving,
                       const py::object& died, const py::object& call_unrouted, const py::object& call_answered_late) {
             if (input_names.size() != input_datatypes.size() || output_names.size() != output_datatypes.size()) {
               throw std::invalid_argument("each input and output needs its datatype");
             }
             PythonWorkerOptions options;
             options.model_name = std::move(model_name);
             options.description = std::move(description);
             options.input_names = std::move(input_names);
             options.input_types = datatypes_of(input_datatypes);
             options.output_names = std::move(output_names);
             options.output_types = datatypes_of(output_datatypes);
             return std::make_shared<PythonWorkerExecutor>(
                 std::move(options), PythonWorkerHooks{hook_of(ensure_serving), hook_of(died),
                                                       call_hook_of(call_unrouted), late_hook_of(call_answered_late)});
           }),
           py::arg("model_name"), py::arg("description"), py::arg("input_names"), py::arg("input_datatypes"),
           py::arg("output_names"), py::arg("output_datatypes"), py::arg("ensure_serving"), py::arg("died"),
           py::arg("call_unrouted") = py::none(), py::arg("call_answered_late") = py::none(),
           "A python model instance whose worker serves batches over a WorkerRing, run by the core without "
           "the GIL when given to a Scheduler. ensure_serving() is called when no worker is attached (it "
           "restarts and attaches one, or raises why none serves); died() when the attached worker exited "
           "or broke the protocol during a batch (it reaps and restarts it; what it raises fails the batch). "
           "Both are called with the GIL; died() while the batch holds exclusive(). call_unrouted runs a "
           "model-to-model call the core has no route for (see call_hook_of); None answers them UNAVAILABLE. "
           "call_answered_late(number, outputs as [(name, array)] or None, status code, message) sends the answer "
           "of a call its batch did not wait for over the control channel (None: such calls are cancelled).")
      .def("set_model_calls", &PythonWorkerExecutor::set_model_calls, py::arg("calls"),
           "Where the batches' model-to-model calls are routed (None: each goes to call_unrouted).")
      .def("attach", &PythonWorkerExecutor::attach, py::arg("ring"), py::arg("pidfd"),
           "A started worker: its ring and a pidfd, owned by the session from here.")
      .def("detach", &PythonWorkerExecutor::detach, "The worker is gone or being replaced.")
      .def_property_readonly("attached", &PythonWorkerExecutor::attached)
      .def("batch_abandoned", &PythonWorkerExecutor::batch_abandoned,
           "Whether every request of the batch in flight was cancelled or passed its deadline.")
      .def(
          "exclusive", [](const std::shared_ptr<PythonWorkerExecutor>& executor) { return ExclusiveHold(executor); },
          "A context manager holding batches back (and waiting out the one in flight), GIL released while "
          "it waits.")
      .def("run", &run_batch, py::arg("requests"),
           "One batch, for warm-up and tests: per request (id, inputs as (name, datatype code, array), "
           "requested output names, parameters JSON, CancellationFlag or None); per answer its outputs by name as the "
           "worker sent "
           "them, or (status code, message). Raises (with a `code`) when the whole batch fails. GIL "
           "released while it runs.");
}

}  // namespace inferd::python
