#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "inferd/completion_queue.h"
#include "python_tensor.h"

namespace py = pybind11;

namespace inferd::python {

void register_completion_queue(py::module_& m) {
  py::class_<CompletionQueue, std::shared_ptr<CompletionQueue>>(m, "CompletionQueue")
      .def(py::init<>())
      .def("fileno", &CompletionQueue::fd, "The eventfd that is readable while completions wait.")
      .def(
          "drain",
          [](CompletionQueue& queue) {
            // The GIL stays held: the swap is a bounded critical section, not a wait, and no thread
            // takes the GIL while holding the queue's lock. Releasing it here would hand the GIL to
            // a waiting worker and cost the event loop a thread switch per wake-up.
            std::vector<Completion> done = queue.drain();
            py::list out;
            for (Completion& c : done) {
              // Each completion is answered even if converting it fails: nothing drained is lost.
              try {
                py::list outputs;
                for (const Tensor& t : c.outputs) {
                  outputs.append(py::make_tuple(static_cast<int>(t.dtype), py::tuple(py::cast(t.shape)), array_view(t)));
                }
                out.append(py::make_tuple(c.token, static_cast<int>(c.status.code), c.status.message, outputs));
              } catch (const std::exception& e) {
                out.append(py::make_tuple(c.token, static_cast<int>(StatusCode::kInternal),
                                          std::string("cannot return outputs: ") + e.what(), py::list()));
              }
            }
            // `done` dies here, with the GIL held: the requests' Python buffers are released on this
            // thread, not on a worker thread.
            return out;
          },
          "Every waiting completion as (token, status code, message, [(datatype, shape, ndarray)]).");
}

}  // namespace inferd::python
