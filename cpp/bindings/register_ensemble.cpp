#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "inferd/completion_queue.h"
#include "inferd/ensemble_scheduler.h"
#include "inferd/scheduler_directory.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

// (name, datatype code, dims without the batch dim)
using TensorTuple = std::tuple<std::string, int, std::vector<int64_t>>;
// (model name, version (-1 = latest), [(model input, ensemble tensor)] in the model's input order,
//  [(model output index, model output, ensemble tensor)])
using StepTuple = std::tuple<std::string, int64_t, std::vector<std::pair<std::string, std::string>>,
                             std::vector<std::tuple<uint32_t, std::string, std::string>>>;

std::vector<EnsembleTensor> tensors(const std::vector<TensorTuple>& tuples) {
  std::vector<EnsembleTensor> out;
  for (const auto& [name, code, dims] : tuples) {
    if (!is_valid_datatype(code)) throw std::invalid_argument("unknown datatype code " + std::to_string(code));
    out.push_back(EnsembleTensor{name, static_cast<DataType>(code), dims});
  }
  return out;
}

std::shared_ptr<EnsembleScheduler> make_ensemble(const std::string& name, int64_t max_batch_size,
                                                 const std::vector<TensorTuple>& inputs,
                                                 const std::vector<TensorTuple>& outputs,
                                                 const std::vector<StepTuple>& steps,
                                                 std::shared_ptr<const SchedulerDirectory> directory,
                                                 std::shared_ptr<CompletionQueue> completions,
                                                 std::shared_ptr<ResponseCache> response_cache) {
  EnsembleDefinition definition;
  definition.name = name;
  definition.max_batch_size = max_batch_size;
  definition.inputs = tensors(inputs);
  definition.outputs = tensors(outputs);
  for (const auto& [model, version, input_map, output_map] : steps) {
    EnsembleStep step;
    step.model_name = model;
    step.model_version = version;
    for (const auto& [model_tensor, ensemble_tensor] : input_map)
      step.input_map.push_back({model_tensor, ensemble_tensor});
    for (const auto& [index, model_tensor, ensemble_tensor] : output_map) {
      step.output_map.push_back({index, {model_tensor, ensemble_tensor}});
    }
    definition.steps.push_back(std::move(step));
  }
  return std::make_shared<EnsembleScheduler>(std::move(definition), SchedulerDirectory::resolver(std::move(directory)),
                                             std::move(completions), std::move(response_cache));
}

void publish(SchedulerDirectory& directory,
             const std::map<std::string, std::map<int64_t, std::shared_ptr<Scheduler>>>& models) {
  SchedulerDirectory::Models published;
  for (const auto& [name, versions] : models) {
    SchedulerDirectory::Versions& out = published[name];
    for (const auto& [version, scheduler] : versions) out.emplace(version, scheduler);
  }
  directory.publish(std::move(published));
}

}  // namespace

void register_ensemble(py::module_& m) {
  py::class_<SchedulerDirectory, std::shared_ptr<SchedulerDirectory>>(
      m, "SchedulerDirectory",
      "The model versions that serve now, where ensembles find their steps' schedulers (held weakly).")
      .def(py::init<>())
      .def("publish", &publish, py::arg("models"),
           "Replace what serves: {model name: {version: Scheduler}}. An ensemble's next step finds these.");
  py::class_<EnsembleStepStatistics>(m, "EnsembleStepStatistics", "One ensemble step's requests.")
      .def_readonly("success", &EnsembleStepStatistics::success)
      .def_readonly("fail", &EnsembleStepStatistics::fail);
  py::class_<EnsembleScheduler, RequestScheduler, std::shared_ptr<EnsembleScheduler>>(m, "EnsembleScheduler")
      .def(py::init(&make_ensemble), py::arg("name"), py::arg("max_batch_size"), py::arg("inputs"), py::arg("outputs"),
           py::arg("steps"), py::arg("directory"), py::arg("completions"), py::arg("response_cache") = nullptr,
           "An ensemble over the schedulers the directory holds. inputs/outputs: (name, datatype code, dims) in the "
           "signature's order; steps: (model, version or -1, [(model input, ensemble tensor)] in the model's input "
           "order, [(model output index, model output, ensemble tensor)]). The plan must have been checked "
           "(inferd.repository.ensemble.plan_ensemble).")
      .def("shutdown", &EnsembleScheduler::shutdown, py::call_guard<py::gil_scoped_release>(),
           "Close intake and answer every running request UNAVAILABLE; never waits for a step.")
      .def("drain", &EnsembleScheduler::drain, py::call_guard<py::gil_scoped_release>(),
           "Close intake and wait until every running request is answered. Blocks; GIL released.")
      .def("pending_requests", &EnsembleScheduler::running_requests, "Requests accepted and not yet answered.")
      .def(
          "statistics", [](const EnsembleScheduler& e) { return e.statistics().model; },
          "The ensemble's own statistics in a model's shape: one execution per request, queue and compute "
          "durations its steps' summed.")
      .def(
          "step_statistics", [](const EnsembleScheduler& e) { return e.statistics().steps; },
          "Per step, in the config's order: its requests' successes and failures, submission to answer.");
}

}  // namespace inferd::python
