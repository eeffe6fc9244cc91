#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "inferd/completion_queue.h"
#include "python_tensor.h"
#include "wire_request.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

int64_t ns(Clock::time_point t) {
  return t == Clock::time_point{} ? 0
                                  : std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

py::tuple timing_tuple(const RequestTiming& t) {
  return py::make_tuple(ns(t.enqueued), ns(t.compute_start), ns(t.input_done), ns(t.infer_done), ns(t.compute_end),
                        t.batch_id, t.batch_requests, t.batch_rows, t.instance);
}

}  // namespace

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
                py::object outputs;
                if (c.request && c.request->signature && c.status.ok()) {
                  outputs = write_response(*c.request, c.outputs);  // a request that came as bytes
                } else {
                  py::list arrays;
                  for (const Tensor& t : c.outputs) {
                    arrays.append(
                        py::make_tuple(static_cast<int>(t.dtype), py::tuple(py::cast(t.shape)), array_view(t)));
                  }
                  outputs = std::move(arrays);
                }
                out.append(py::make_tuple(c.token, static_cast<int>(c.status.code), c.status.message, outputs,
                                          timing_tuple(c.timing)));
              } catch (const std::exception& e) {
                out.append(py::make_tuple(c.token, static_cast<int>(StatusCode::kInternal),
                                          std::string("cannot return outputs: ") + e.what(), py::list(),
                                          timing_tuple(c.timing)));
              }
            }
            // `done` dies here, with the GIL held: the requests' Python buffers are released on this
            // thread, not on a worker thread.
            return out;
          },
          "Every waiting completion as (token, status code, message, [(datatype, shape, ndarray)] or the serialized "
          "response of a request submitted as bytes, timing): "
          "timing = (enqueued, compute_start, input_done, infer_done, compute_end in steady-clock ns, 0 = "
          "not reached; batch_id, batch_requests, batch_rows, instance).");
  m.def("steady_clock_ns", [] { return ns(Clock::now()); }, "The core's clock, for converting its timings.");
}

}  // namespace inferd::python
