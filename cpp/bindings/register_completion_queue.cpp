#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <string>

#include "inferd/completion_queue.h"
#include "inferd/request_observation.h"
#include "python_tensor.h"
#include "wire_request.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

int64_t ns(Clock::time_point t) {
  return t == Clock::time_point{} ? 0
                                  : std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

Clock::time_point from_ns(int64_t t) {
  return t == 0 ? Clock::time_point{} : Clock::time_point{std::chrono::nanoseconds(t)};
}

// The wall clock minus the core's steady clock, read back to back once: spans are exported in
// wall time, and the two clocks do not drift apart enough within a process's life to matter.
int64_t wall_minus_steady_ns() {
  static const int64_t offset =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count() -
      ns(Clock::now());
  return offset;
}

}  // namespace

void register_completion_queue(py::module_& m) {
  py::class_<RequestTiming>(m, "RequestTiming",
                            "How the core ran one request, in the core's steady-clock ns (0 = not reached), and the "
                            "batch it rode in.")
      .def(py::init([](int64_t enqueued, int64_t compute_start, int64_t input_done, int64_t infer_done,
                       int64_t compute_end, uint64_t batch_id, uint32_t batch_requests, int64_t batch_rows,
                       uint32_t instance) {
             return RequestTiming{from_ns(enqueued),
                                  from_ns(compute_start),
                                  from_ns(input_done),
                                  from_ns(infer_done),
                                  from_ns(compute_end),
                                  batch_id,
                                  batch_requests,
                                  batch_rows,
                                  instance};
           }),
           py::arg("enqueued"), py::arg("compute_start"), py::arg("input_done"), py::arg("infer_done"),
           py::arg("compute_end"), py::arg("batch_id"), py::arg("batch_requests"), py::arg("batch_rows"),
           py::arg("instance"))
      .def_property_readonly("enqueued", [](const RequestTiming& t) { return ns(t.enqueued); })
      .def_property_readonly("compute_start", [](const RequestTiming& t) { return ns(t.compute_start); })
      .def_property_readonly("input_done", [](const RequestTiming& t) { return ns(t.input_done); })
      .def_property_readonly("infer_done", [](const RequestTiming& t) { return ns(t.infer_done); })
      .def_property_readonly("compute_end", [](const RequestTiming& t) { return ns(t.compute_end); })
      .def_readonly("batch_id", &RequestTiming::batch_id)
      .def_readonly("batch_requests", &RequestTiming::batch_requests, "Requests in the batch.")
      .def_readonly("batch_rows", &RequestTiming::batch_rows, "Rows in the batch (its requests' batch sizes).")
      .def_readonly("instance", &RequestTiming::instance, "The executor instance that ran it.")
      .def_readonly("steps", &RequestTiming::steps,
                    "An ensemble request's finished steps (EnsembleStepTiming, by step); empty otherwise.")
      .def_static(
          "now_ns", [] { return ns(Clock::now()); }, "The core's clock now.")
      .def_static(
          "wall_ns", [](int64_t steady_ns) { return steady_ns + wall_minus_steady_ns(); }, py::arg("steady_ns"),
          "A time of the core's clock on the wall clock (ns since the epoch), for export.")
      .def("__repr__", [](const RequestTiming& t) {
        return "RequestTiming(enqueued=" + std::to_string(ns(t.enqueued)) +
               ", compute_start=" + std::to_string(ns(t.compute_start)) +
               ", input_done=" + std::to_string(ns(t.input_done)) + ", infer_done=" + std::to_string(ns(t.infer_done)) +
               ", compute_end=" + std::to_string(ns(t.compute_end)) + ", batch_id=" + std::to_string(t.batch_id) +
               ", batch_requests=" + std::to_string(t.batch_requests) + ", batch_rows=" + std::to_string(t.batch_rows) +
               ", instance=" + std::to_string(t.instance) + ")";
      });
  py::class_<EnsembleStepTiming>(m, "EnsembleStepTiming",
                                 "One finished step of an ensemble request: the composing model version that ran "
                                 "it, when it was submitted to that version and answered (core clock ns), and how "
                                 "its own request went (its batch).")
      .def_readonly("step", &EnsembleStepTiming::step, "Index in the ensemble's steps.")
      .def_readonly("model", &EnsembleStepTiming::model)
      .def_readonly("version", &EnsembleStepTiming::version)
      .def_property_readonly("submitted", [](const EnsembleStepTiming& t) { return ns(t.submitted); })
      .def_property_readonly("answered", [](const EnsembleStepTiming& t) { return ns(t.answered); })
      .def_readonly("timing", &EnsembleStepTiming::timing);
  py::class_<ObservedRequest>(m, "ObservedRequest",
                              "An inference the core ran while Python observes it, as it was answered (core clock "
                              "ns).")
      .def_readonly("model", &ObservedRequest::model, "The version that ran it: its model's name.")
      .def_readonly("version", &ObservedRequest::version)
      .def_readonly("id", &ObservedRequest::id, "The request's id.")
      .def_readonly("metadata", &ObservedRequest::metadata, "The caller's metadata: [(key, value)].")
      .def_readonly("sampled", &ObservedRequest::sampled, "The transport's sampling rule picked it for tracing.")
      .def_readonly("streamed", &ObservedRequest::streamed, "A request of a ModelStreamInfer call.")
      .def_property_readonly("received", [](const ObservedRequest& o) { return ns(o.received); })
      .def_property_readonly("answered", [](const ObservedRequest& o) { return ns(o.answered); })
      .def_property_readonly("code", [](const ObservedRequest& o) { return o.status.code; })
      .def_property_readonly("message", [](const ObservedRequest& o) { return o.status.message; })
      .def_readonly("timing", &ObservedRequest::timing, "How the core ran it (zeros: it never reached a scheduler).")
      .def_readonly("responses", &ObservedRequest::responses, "Answers sent for it.");
  py::class_<ObservationQueue, std::shared_ptr<ObservationQueue>>(m, "ObservationQueue")
      .def("fileno", &ObservationQueue::fd, "The eventfd that is readable while records wait.")
      // The GIL stays held, as for CompletionQueue.drain: a bounded swap under a lock no GIL holder
      // waits on.
      .def("drain", &ObservationQueue::drain, "Every waiting ObservedRequest, oldest first.")
      .def("dropped", &ObservationQueue::dropped, "Records dropped because the queue was full, since the start.");
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
                                          py::cast(c.timing)));
              } catch (const ResponseNotWritten& e) {
                const std::string prefix = e.code == StatusCode::kInternal ? "cannot return outputs: " : "";
                out.append(py::make_tuple(c.token, static_cast<int>(e.code), prefix + e.what(), py::list(),
                                          py::cast(c.timing)));
              } catch (const std::exception& e) {
                out.append(py::make_tuple(c.token, static_cast<int>(StatusCode::kInternal),
                                          std::string("cannot return outputs: ") + e.what(), py::list(),
                                          py::cast(c.timing)));
              }
            }
            // `done` dies here, with the GIL held: the requests' Python buffers are released on this
            // thread, not on a worker thread.
            return out;
          },
          "Every waiting completion as (token, status code, message, [(datatype, shape, ndarray)] or the serialized "
          "response of a request submitted as bytes, RequestTiming).");
}

}  // namespace inferd::python
