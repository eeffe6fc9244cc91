#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <utility>
#include <vector>

#include "inferd/executor.h"

namespace inferd::python {

namespace py = pybind11;

// The status an exception object stands for: its integer `code` when that names a StatusCode up to
// INTERNAL, else INTERNAL; its text as the message. Requires the GIL.
Status status_of(py::handle exception);
// A failed status as a Python exception (ValueError for INVALID_ARGUMENT, else RuntimeError) whose
// `code` attribute is the StatusCode, as the Python layer's errors carry theirs. Requires the GIL.
[[noreturn]] void raise_status(const Status& status);

// An Executor whose work is done by a Python object with `execute(list[ndarray]) -> list[ndarray]`
// (the ONNX Runtime executor). Called from a core worker thread: it takes the GIL for the call
// only; the Python executor is expected to release it while it computes (ONNX Runtime does).
// Errors raised by the Python executor become its status: the exception's integer `code`
// attribute when it names a StatusCode, else INTERNAL. An object that also has
// `stage(list[ndarray]) -> None` is a pipelined executor (see Executor::stage). One that has
// `execute_requests(list[list[ndarray]]) -> list[list[ndarray] | BaseException]` answers each
// request on its own (Executor::answers_each_request): per request its outputs in model order, or
// the exception that fails it alone (its integer `code` attribute, as above).
//
// One whose `decoupled` attribute is true (read once, here) is decoupled (Executor::decoupled): the
// core calls `execute_requests(batch, respond)`, `respond` a DecoupledResponses (below): calling
// it sends request `index` one more response before its final one. The list returned holds each
// request's final answer, as above, None for the final flag alone, or PENDING for a request whose
// answers go on after execute_requests returns (the instance takes its next batch meanwhile):
// its final answer is then given by respond.finish.
//
// One whose `takes_request_details` attribute is true (read once) is also given each request's id
// and the names of the outputs it asked for: `execute_requests(batch, respond, details)`, respond
// None unless decoupled, details a list of (id: str, requested_outputs: list[str], parameters: str,
// a JSON object, cancelled: a callable answering whether the request was cancelled while it runs)
// per request.
class PythonExecutor : public Executor {
 public:
  // Requires the GIL. `output_types` is the model's output datatypes, in output order.
  PythonExecutor(py::handle executor, std::vector<DataType> output_types);

  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override;
  bool pipelined() const override { return stage_ != nullptr; }
  Status stage(const std::vector<Tensor>& inputs) override;
  bool answers_each_request() const override { return execute_requests_ != nullptr; }
  bool decoupled() const override { return decoupled_; }
  Status execute_requests(const std::vector<ExecutorRequest>& requests, std::vector<RequestResult>* results,
                          ResponseStream* responses) override;

 private:
  std::shared_ptr<const void> execute_;           // the bound method, released under the GIL
  std::shared_ptr<const void> stage_;             // null when the executor has no stage()
  std::shared_ptr<const void> execute_requests_;  // null when the executor has no execute_requests()
  bool decoupled_ = false;
  bool takes_details_ = false;  // execute_requests also gets each request's id and requested outputs
  std::vector<DataType> output_types_;
};

// One answer (list[ndarray] in model output order, or an exception) as a result; throws
// ValueError or TypeError for a malformed one. Requires the GIL.
RequestResult result_of(py::handle answer, const std::vector<DataType>& output_types);

// The object a decoupled executor's execute_requests returns for a request it goes on answering
// (RequestResult::pending): _core.PENDING. Requires the GIL; made once, never freed.
py::handle pending_marker();
// The answer of a request its model gave back for another step (RequestResult::reschedule):
// _core.RESCHEDULED. As pending_marker.
py::handle rescheduled_marker();

// A decoupled batch's answers from Python (bound as _core.DecoupledResponses), from any thread,
// while execute_requests runs and after it returned, until each request has its final answer:
// `respond(index, answer)` (also the object's call) sends one more response, `finish(index,
// answer)` the final one (None: the final flag alone) of a request execute_requests left PENDING
// (one given while execute_requests runs is kept until it returns). Each returns whether the
// request was still open: False once it ended (its final answer given, the batch failed, the
// model unloaded), and the answer is dropped. A malformed answer raises TypeError or ValueError,
// an index outside the batch IndexError. Requests still open when the last reference goes fail
// INTERNAL. Requires the GIL; releases it while the answer is handed to the core.
class DecoupledResponses {
 public:
  DecoupledResponses(std::shared_ptr<LaterResponses> later, size_t requests, std::vector<DataType> output_types)
      : later_(std::move(later)), requests_(requests), output_types_(std::move(output_types)) {}

  bool respond(size_t index, py::handle answer);
  bool finish(size_t index, py::handle answer);
  // Where the answers go, for the core's own senders (StreamedResponses).
  const std::shared_ptr<LaterResponses>& later() const { return later_; }

 private:
  void check_index(size_t index) const;

  std::shared_ptr<LaterResponses> later_;
  size_t requests_;
  std::vector<DataType> output_types_;
};

}  // namespace inferd::python
