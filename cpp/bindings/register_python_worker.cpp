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

}  // namespace

void register_python_worker(py::module_& m) {
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
                       const py::object& died) {
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
             return std::make_shared<PythonWorkerExecutor>(std::move(options),
                                                           PythonWorkerHooks{hook_of(ensure_serving), hook_of(died)});
           }),
           py::arg("model_name"), py::arg("description"), py::arg("input_names"), py::arg("input_datatypes"),
           py::arg("output_names"), py::arg("output_datatypes"), py::arg("ensure_serving"), py::arg("died"),
           "A python model instance whose worker serves batches over a WorkerRing, run by the core without "
           "the GIL when given to a Scheduler. ensure_serving() is called when no worker is attached (it "
           "restarts and attaches one, or raises why none serves); died() when the attached worker exited "
           "or broke the protocol during a batch (it reaps and restarts it; what it raises fails the batch). "
           "Both are called with the GIL; died() while the batch holds exclusive().")
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
