#pragma once

#include <pybind11/pybind11.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "inferd/status.h"
#include "inferd/tensor.h"
#include "inferd/worker_messages.h"
#include "inferd/worker_ring.h"

namespace inferd::worker {

namespace py = pybind11;

struct PlacedOutput;

// What the worker's Python (inferd.python_backend.worker) gives the loop: the model, and the few
// helpers that are Python by nature (pb_utils' types, tracebacks, coroutines).
struct LoopCallbacks {
  py::object execute;  // the model's execute(requests)
  // make_request(index, id, inputs: list[(name, ndarray)], requested: list[str], parameters: str,
  // cancelled: () -> bool, correlation_id: int | str, flags: int) -> pb_utils.InferenceRequest
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
// Model-to-model calls (BLS) made while a batch runs go on the same ring (call()): the call's
// tensors and description into the outputs arena above what the batch's answers will not reach,
// its answer copied out of the inputs arena on receipt. A call still open when execute returns is
// abandoned (the server cancels it too): it fails, and its answer, if any comes, is dropped.
//
// Thread rules: serve() runs on one thread (the worker's main thread) and holds the GIL but while
// it waits and copies; call() runs on any thread (the model's, async_exec's) during a batch;
// wake() may be called from any thread. Inbound messages are taken in turns: whichever waiting
// thread finds nobody receiving receives (and dispatches what it gets: executes to serve(),
// answers to their calls) until what it waits for came, the others wait on `changed_`. mutex_
// guards the state below and every send and every touch of the arenas' regions; the GIL is never
// taken with it held.
class WorkerLoop {
 public:
  // `fds`: the descriptors the server passed (RingFds::format). Throws std::invalid_argument.
  explicit WorkerLoop(const std::string& fds);

  // Serves batches until should_stop() answers true. Requires the GIL.
  void serve(const LoopCallbacks& callbacks);
  // Makes serve() ask should_stop() (the control socket brought a stop, or closed).
  void wake() const { ring_.wake(); }

  // One call's answer, copied out of the arena.
  struct CallReply {
    struct Output {
      std::string name;
      DataType dtype = DataType::kFp32;
      std::vector<int64_t> shape;
      std::string bytes;
    };
    bool late = false;  // its batch was answered first: the answer comes on the control channel
    StatusCode code = StatusCode::kOk;
    std::string error;
    std::vector<Output> outputs;
  };
  // A model-to-model call on the ring (InferenceRequest.exec), numbered `number` by the caller
  // (unique in this worker): `parameters` as [(key, bool, int or str)], `inputs` as [(name,
  // ndarray)]. Its answer as (outputs as [(name, ndarray)], status code, message); (None, 0, "")
  // when its batch was answered before it (a thread of the model's made it): its answer comes on
  // the control channel, under `number`; None when no batch runs (the caller sends it another
  // way). Requires the GIL (released while it waits). Throws std::invalid_argument for a parameter
  // or an input the protocol cannot carry.
  py::object call(uint64_t number, const std::string& model, int64_t version, const std::string& id,
                  const py::list& parameters, const std::vector<std::string>& chain,
                  const std::vector<std::string>& requested, uint64_t timeout_us, const py::list& inputs);

  // A decoupled model's response to request `index` of the server's batch `batch`, sent at once
  // as one ring message (kResponse): `outputs` as [(name, ndarray)], or `error` its message, or
  // both None for the final flag alone. Its bytes go into the outputs arena after the last
  // response's, from its start again once the server took every response sent (it waits for that
  // when the arena is full, and grows the arena for a response bigger than it). From any thread;
  // requires the GIL (released while it copies and waits). Throws std::invalid_argument for an
  // output the protocol cannot carry.
  void respond(uint64_t batch, uint32_t index, bool final, const py::object& outputs, const py::object& error);

 private:
  struct Batch;
  struct OpenCall {
    bool answered = false;
    bool late = false;
    CallReply reply;
  };

  std::optional<CallReply> send_call(uint64_t number, const CallDescription& call, const py::list& inputs);
  // Takes every message in and dispatches it; whether there was one. Requires mutex_.
  bool take_messages();
  // Takes inbound messages in turns until `done()` (see the class comment). Requires `lock` held.
  template <typename Done>
  void receive_until(std::unique_lock<std::mutex>& lock, Done done);
  // One received message to whom it is for. Requires mutex_.
  void dispatch(const Message& message);
  // The batch has ended: its open calls fail, nothing more is sent in it. Requires mutex_.
  void end_batch();

  void run(const LoopCallbacks& callbacks, const Message& execute);
  py::list requests_of(const LoopCallbacks& callbacks, const Batch& batch);
  // The batch's answers: per response its error ("" for none) or its outputs (`spans` into
  // `placed`), or that the model rescheduled it (`rescheduled`, empty: none), written above the
  // execute's floor, then the result slot.
  void write_answers(const Message& execute, const std::vector<std::string>& errors,
                     const std::vector<PlacedOutput>& placed, const std::vector<std::pair<size_t, size_t>>& spans,
                     const std::vector<bool>& rescheduled = {});

  WorkerRing ring_;
  std::mutex mutex_;
  std::condition_variable changed_;                      // a turn to receive ended (with mutex_)
  bool receiving_ = false;                               // a thread takes inbound messages
  bool woken_ = false;                                   // a wake() came: serve() asks should_stop()
  std::deque<Message> executes_;                         // received, for serve()
  uint64_t batch_ = 0;                                   // the batch running, 0 between batches
  uint64_t scratch_ = 0;                                 // where the next call's bytes go in the outputs arena
  uint64_t answers_taken_ = 0;                           // call answers taken in the running batch
  uint64_t stream_position_ = 0;                         // where the next streamed response goes
  uint64_t streamed_sent_ = 0;                           // streamed responses sent (kResponse)
  std::map<uint64_t, std::shared_ptr<OpenCall>> calls_;  // the running batch's open calls
};

}  // namespace inferd::worker
