#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "inferd/dynamic_batcher.h"
#include "inferd/iterative_steps.h"
#include "inferd/padding.h"
#include "inferd/pinned_buffer_pool.h"
#include "inferd/sequence_batcher.h"
#include "inferd/sequence_state.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

// The names of a bound settings type's fields: its read-only properties, in definition order.
std::vector<std::string> field_names(py::handle type) {
  std::vector<std::string> names;
  const py::object property = py::module_::import("builtins").attr("property");
  for (auto item : type.attr("__dict__").cast<py::dict>()) {
    if (py::isinstance(item.second, property)) names.push_back(item.first.cast<std::string>());
  }
  return names;
}

// __eq__ (field by field, as Python compares them) and __repr__ (Type(field=value, ...)) for a
// bound settings type, from its fields as bound: a field added to the binding is in both.
template <typename T>
void define_value_methods(py::class_<T>& type) {
  const std::vector<std::string> names = field_names(type);
  type.def(
          "__eq__",
          [names](const py::object& self, const py::object& other) -> py::object {
            if (!py::isinstance<T>(other)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
            for (const std::string& name : names) {
              if (!self.attr(name.c_str()).equal(other.attr(name.c_str()))) return py::bool_(false);
            }
            return py::bool_(true);
          },
          py::is_operator())
      .def("__repr__", [names](const py::object& self) {
        std::string text = py::str(py::type::of(self).attr("__name__")).cast<std::string>() + "(";
        for (size_t i = 0; i < names.size(); ++i) {
          if (i > 0) text += ", ";
          text += names[i] + "=" + py::repr(self.attr(names[i].c_str())).cast<std::string>();
        }
        return text + ")";
      });
}

}  // namespace

void register_batching(py::module_& m) {
  // The batching settings cross into the core as these types, built once from the model's config
  // (inferd.repository.batching_config): keyword constructors with the core's own defaults and
  // read-only fields, so no copy of them is made or changed field by field on the way.
  const QueuePolicy default_queue;
  py::class_<QueuePolicy> queue_policy(m, "QueuePolicy",
                                       "A priority level's queue policy (Triton's ModelQueuePolicy).");
  queue_policy
      .def(py::init([](bool delay_on_timeout, uint64_t default_timeout_us, bool allow_timeout_override,
                       uint32_t max_queue_size) {
             return QueuePolicy{delay_on_timeout, default_timeout_us, allow_timeout_override, max_queue_size};
           }),
           py::kw_only(), py::arg("delay_on_timeout") = default_queue.delay_on_timeout,
           py::arg("default_timeout_us") = default_queue.default_timeout_us,
           py::arg("allow_timeout_override") = default_queue.allow_timeout_override,
           py::arg("max_queue_size") = default_queue.max_queue_size)
      .def_readonly("delay_on_timeout", &QueuePolicy::delay_on_timeout)
      .def_readonly("default_timeout_us", &QueuePolicy::default_timeout_us)
      .def_readonly("allow_timeout_override", &QueuePolicy::allow_timeout_override)
      .def_readonly("max_queue_size", &QueuePolicy::max_queue_size);
  define_value_methods(queue_policy);

  const Padding default_padding;
  py::class_<Padding> padding_type(m, "Padding", "Variable-length inputs padded to the longest of their batch.");
  padding_type
      .def(py::init([](std::vector<bool> inputs, double value, int reference_input,
                       std::vector<std::vector<std::pair<size_t, size_t>>> outputs) {
             return Padding{std::move(inputs), value, reference_input, std::move(outputs)};
           }),
           py::kw_only(), py::arg("inputs") = default_padding.inputs, py::arg("value") = default_padding.value,
           py::arg("reference_input") = default_padding.reference_input, py::arg("outputs") = default_padding.outputs)
      .def_readonly("inputs", &Padding::inputs)
      .def_readonly("value", &Padding::value)
      .def_readonly("reference_input", &Padding::reference_input)
      .def_readonly("outputs", &Padding::outputs);
  define_value_methods(padding_type);

  const BatcherOptions default_options;
  py::class_<BatcherOptions> options_type(
      m, "BatcherOptions",
      "How a model version's requests are queued and batched: its config's dynamic_batching "
      "section (dynamic: whether it has one) and padding parameters.");
  options_type
      .def(py::init([](bool dynamic, int64_t max_batch_size, std::vector<int64_t> preferred_batch_sizes,
                       uint64_t max_queue_delay_us, uint32_t priority_levels, uint32_t default_priority_level,
                       const QueuePolicy& default_queue_policy, std::map<uint32_t, QueuePolicy> level_queue_policies,
                       bool preserve_ordering, const Padding& padding) {
             return BatcherOptions{dynamic,
                                   max_batch_size,
                                   std::move(preferred_batch_sizes),
                                   max_queue_delay_us,
                                   priority_levels,
                                   default_priority_level,
                                   default_queue_policy,
                                   std::move(level_queue_policies),
                                   preserve_ordering,
                                   padding};
           }),
           py::kw_only(), py::arg("dynamic") = default_options.dynamic,
           py::arg("max_batch_size") = default_options.max_batch_size,
           py::arg("preferred_batch_sizes") = default_options.preferred_batch_sizes,
           py::arg("max_queue_delay_us") = default_options.max_queue_delay_us,
           py::arg("priority_levels") = default_options.priority_levels,
           py::arg("default_priority_level") = default_options.default_priority_level,
           py::arg("default_queue_policy") = default_options.default_queue_policy,
           py::arg("level_queue_policies") = default_options.level_queue_policies,
           py::arg("preserve_ordering") = default_options.preserve_ordering,
           py::arg("padding") = default_options.padding)
      .def_readonly("dynamic", &BatcherOptions::dynamic)
      .def_readonly("max_batch_size", &BatcherOptions::max_batch_size)
      .def_readonly("preferred_batch_sizes", &BatcherOptions::preferred_batch_sizes)
      .def_readonly("max_queue_delay_us", &BatcherOptions::max_queue_delay_us)
      .def_readonly("priority_levels", &BatcherOptions::priority_levels)
      .def_readonly("default_priority_level", &BatcherOptions::default_priority_level)
      .def_readonly("default_queue_policy", &BatcherOptions::default_queue_policy)
      .def_readonly("level_queue_policies", &BatcherOptions::level_queue_policies)
      .def_readonly("preserve_ordering", &BatcherOptions::preserve_ordering)
      .def_readonly("padding", &BatcherOptions::padding);
  define_value_methods(options_type);

  py::class_<SequenceOptions>(
      m, "SequenceOptions",
      "How a stateful model version's requests are queued and batched: its config's sequence_batching section "
      "(sequence_batcher.h).")
      .def(py::init([](const std::string& strategy, uint64_t max_sequence_idle_us, uint64_t max_queue_delay_us,
                       double minimum_slot_utilization, uint32_t max_candidate_sequences,
                       std::vector<int64_t> preferred_batch_sizes, const std::vector<py::tuple>& controls,
                       bool tell_idle_end, const std::vector<int>& input_types, const std::vector<py::tuple>& states,
                       size_t visible_outputs, std::shared_ptr<SequenceStateMemory> state_memory,
                       const std::optional<py::tuple>& iterative) {
             SequenceOptions options;
             if (strategy == "oldest") {
               options.strategy = SequenceOptions::Strategy::kOldest;
             } else if (strategy != "direct") {
               throw std::invalid_argument("strategy: 'direct' or 'oldest', not '" + strategy + "'");
             }
             options.max_sequence_idle = std::chrono::microseconds(max_sequence_idle_us);
             options.max_queue_delay = std::chrono::microseconds(max_queue_delay_us);
             options.minimum_slot_utilization = minimum_slot_utilization;
             options.max_candidate_sequences = max_candidate_sequences;
             options.preferred_batch_sizes = std::move(preferred_batch_sizes);
             options.tell_idle_end = tell_idle_end;
             for (int code : input_types) {
               if (!is_valid_datatype(code))
                 throw std::invalid_argument("unknown datatype code " + std::to_string(code));
               options.input_types.push_back(static_cast<DataType>(code));
             }
             static const std::map<std::string, SequenceControl::Kind> kinds{
                 {"START", SequenceControl::Kind::kStart},
                 {"END", SequenceControl::Kind::kEnd},
                 {"READY", SequenceControl::Kind::kReady},
                 {"CORRID", SequenceControl::Kind::kCorrelationId}};
             for (const py::tuple& control : controls) {
               const auto kind = kinds.find(control[0].cast<std::string>());
               if (kind == kinds.end()) throw std::invalid_argument("unknown control kind");
               const int code = control[2].cast<int>();
               if (!is_valid_datatype(code))
                 throw std::invalid_argument("unknown datatype code " + std::to_string(code));
               options.controls.push_back(SequenceControl{kind->second, control[1].cast<uint32_t>(),
                                                          static_cast<DataType>(code), control[3].cast<double>(),
                                                          control[4].cast<double>()});
             }
             for (const py::tuple& state : states) {
               StateSpec spec;
               spec.input_name = state[0].cast<std::string>();
               spec.input = state[1].cast<uint32_t>();
               spec.output = state[2].cast<uint32_t>();
               const int code = state[3].cast<int>();
               if (!is_valid_datatype(code) || static_cast<DataType>(code) == DataType::kBytes)
                 throw std::invalid_argument("a state's datatype code must be a fixed-width one, not " +
                                             std::to_string(code));
               spec.dtype = static_cast<DataType>(code);
               spec.dims = state[4].cast<std::vector<int64_t>>();
               spec.initial_dims = state[5].cast<std::vector<int64_t>>();
               const std::string initial = state[6].cast<std::string>();
               const int64_t count = element_count(spec.initial_dims);
               if (count < 0) throw std::invalid_argument("a state's initial dims must all be fixed");
               if (!initial.empty() && initial.size() != static_cast<size_t>(count) * element_size(spec.dtype))
                 throw std::invalid_argument("a state's initial bytes must fill its initial dims");
               const auto* bytes = reinterpret_cast<const std::byte*>(initial.data());
               spec.initial.assign(bytes, bytes + initial.size());
               options.state_specs.push_back(std::move(spec));
             }
             options.visible_outputs = visible_outputs;
             options.state_memory = std::move(state_memory);
             if (!options.state_specs.empty() && options.state_memory == nullptr)
               throw std::invalid_argument("implicit state needs state_memory, its bound");
             if (iterative) {
               IterativeOptions steps;
               steps.feedback = (*iterative)[0].cast<std::vector<std::pair<uint32_t, uint32_t>>>();
               steps.end_output = (*iterative)[1].cast<int64_t>();
               steps.max_steps = (*iterative)[2].cast<uint32_t>();
               if (steps.max_steps == 0)
                 throw std::invalid_argument("an iterative model's max_steps must be at least 1");
               options.iterative = std::make_shared<IterativeSteps>(std::move(steps));
             }
             return options;
           }),
           py::kw_only(), py::arg("strategy") = "direct", py::arg("max_sequence_idle_us") = 1'000'000,
           py::arg("max_queue_delay_us") = 0, py::arg("minimum_slot_utilization") = 0.0,
           py::arg("max_candidate_sequences") = 1, py::arg("preferred_batch_sizes") = std::vector<int64_t>{},
           py::arg("controls") = std::vector<py::tuple>{}, py::arg("tell_idle_end") = false,
           py::arg("input_types") = std::vector<int>{}, py::arg("states") = std::vector<py::tuple>{},
           py::arg("visible_outputs") = 0, py::arg("state_memory") = nullptr, py::arg("iterative") = py::none(),
           "controls: (kind START, END, READY or CORRID, the input's index in the model's inputs, datatype code, "
           "false value, true value). tell_idle_end: a sequence ended for being idle is told to the model by one "
           "more request (END, READY false, no other input); input_types: every model input's datatype code. "
           "states: implicit state, (input name, input index, output index in the executor's outputs, datatype "
           "code, dims with -1 for any, a new sequence's dims, its bytes or b'' for zeros); visible_outputs: how "
           "many executor outputs the client sees; state_memory: the bound every sequence's state shares. "
           "iterative: each request a whole sequence run step by step, (feedback [(output index, input index)], "
           "end output index or -1, max steps).")
      .def_property_readonly("oldest",
                             [](const SequenceOptions& o) { return o.strategy == SequenceOptions::Strategy::kOldest; })
      .def_property_readonly(
          "max_sequence_idle_us",
          [](const SequenceOptions& o) { return static_cast<uint64_t>(o.max_sequence_idle.count()); })
      .def_property_readonly("controls", [](const SequenceOptions& o) { return o.controls.size(); })
      .def_property_readonly("states", [](const SequenceOptions& o) { return o.state_specs.size(); })
      .def_property_readonly("iterative", [](const SequenceOptions& o) { return o.iterative != nullptr; });

  py::class_<SequenceStateMemory, std::shared_ptr<SequenceStateMemory>>(
      m, "SequenceStateMemory", "The bytes every stateful model's sequences hold in state, and their bound.")
      .def(py::init<uint64_t, std::string>(), py::arg("limit_bytes"), py::arg("flag"))
      .def_property_readonly("used", &SequenceStateMemory::used)
      .def_property_readonly("limit", &SequenceStateMemory::limit);

  py::class_<PinnedBufferPool, std::shared_ptr<PinnedBufferPool>>(m, "PinnedBufferPool")
      .def(py::init<size_t, bool>(), py::arg("capacity_bytes"), py::arg("use_cuda") = true)
      .def("stats", [](const PinnedBufferPool& pool) {
        const auto s = pool.stats();
        return py::dict(py::arg("capacity_bytes") = s.capacity_bytes, py::arg("pooled_bytes") = s.pooled_bytes,
                        py::arg("leased_bytes") = s.leased_bytes, py::arg("allocations") = s.allocations,
                        py::arg("reuses") = s.reuses, py::arg("fallbacks") = s.fallbacks, py::arg("pinned") = s.pinned);
      });
}

}  // namespace inferd::python
