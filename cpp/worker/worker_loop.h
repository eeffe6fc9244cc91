#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "inferd/worker_ring.h"

namespace inferd::worker {

namespace py = pybind11;

struct PlacedOutput;

// What the worker's Python (inferd.python_backend.worker) gives the loop: the model, and the few
// helpers that are Python by nature (pb_utils' types, tracebacks, coroutines).
struct LoopCallbacks {
  py::object execute;  // the model's execute(requests)
  // make_request(index, id, inputs: list[(name, ndarray)], requested: list[str], parameters: str,
  // cancelled: () -> bool) -> pb_utils.InferenceRequest
  py::object make_request;
  py::object resolve;        // resolve(result): an awaitable's result; anything else as it is
  py::object report;         // report(exception) -> str: prints its traceback, returns its message
  py::object response_type;  // pb_utils.InferenceResponse
  py::object should_stop;    // should_stop() -> bool: asked when the loop is woken with no batch
};

// The worker's side of a python model's batches: waits on its WorkerRing, builds the model's
// requests (inputs as numpy views of the inputs arena; BYTES as object arrays of bytes), calls
// execute, writes the responses into the outputs arena and answers. The model's code is the only
// Python on the way, but for pb_utils' constructors.
//
// Failures, as Triton's python backend has them: an exception from execute fails every request of
// the batch with its message; an error response fails its request alone; execute returning
// anything but one InferenceResponse per request fails the whole batch, saying so. An output no
// protocol datatype holds fails its request.
//
// Thread rules: serve() runs on one thread (the worker's main thread) and holds the GIL but while
// it waits and copies; wake() may be called from any thread.
class WorkerLoop {
 public:
  // `fds`: the descriptors the server passed (RingFds::format). Throws std::invalid_argument.
  explicit WorkerLoop(const std::string& fds);

  // Serves batches until should_stop() answers true. Requires the GIL.
  void serve(const LoopCallbacks& callbacks);
  // Makes serve() ask should_stop() (the control socket brought a stop, or closed).
  void wake() const { ring_.wake(); }

 private:
  struct Batch;

  void run(const LoopCallbacks& callbacks, const Message& execute);
  py::list requests_of(const LoopCallbacks& callbacks, const Batch& batch);
  // The batch's answers: per response its error ("" for none) or its outputs (`spans` into
  // `placed`), written above the execute's floor, then the result slot.
  void write_answers(const Message& execute, const std::vector<std::string>& errors,
                     const std::vector<PlacedOutput>& placed, const std::vector<std::pair<size_t, size_t>>& spans);

  WorkerRing ring_;
};

}  // namespace inferd::worker
