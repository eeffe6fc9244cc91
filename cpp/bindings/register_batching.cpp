#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "inferd/dynamic_batcher.h"
#include "inferd/padding.h"
#include "inferd/pinned_buffer_pool.h"

namespace py = pybind11;

namespace inferd::python {

void register_batching(py::module_& m) {
  py::class_<QueuePolicy>(m, "QueuePolicy")
      .def(py::init<>())
      .def_readwrite("delay_on_timeout", &QueuePolicy::delay_on_timeout)
      .def_readwrite("default_timeout_us", &QueuePolicy::default_timeout_us)
      .def_readwrite("allow_timeout_override", &QueuePolicy::allow_timeout_override)
      .def_readwrite("max_queue_size", &QueuePolicy::max_queue_size);

  py::class_<Padding>(m, "Padding")
      .def(py::init<>())
      .def_readwrite("inputs", &Padding::inputs)
      .def_readwrite("value", &Padding::value)
      .def_readwrite("reference_input", &Padding::reference_input)
      .def_readwrite("outputs", &Padding::outputs);

  py::class_<BatcherOptions>(m, "BatcherOptions")
      .def(py::init<>())
      .def_readwrite("dynamic", &BatcherOptions::dynamic)
      .def_readwrite("max_batch_size", &BatcherOptions::max_batch_size)
      .def_readwrite("preferred_batch_sizes", &BatcherOptions::preferred_batch_sizes)
      .def_readwrite("max_queue_delay_us", &BatcherOptions::max_queue_delay_us)
      .def_readwrite("priority_levels", &BatcherOptions::priority_levels)
      .def_readwrite("default_priority_level", &BatcherOptions::default_priority_level)
      .def_readwrite("default_queue_policy", &BatcherOptions::default_queue_policy)
      .def_readwrite("level_queue_policies", &BatcherOptions::level_queue_policies)
      .def_readwrite("preserve_ordering", &BatcherOptions::preserve_ordering)
      .def_readwrite("padding", &BatcherOptions::padding);

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
