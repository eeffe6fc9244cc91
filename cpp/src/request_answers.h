#pragma once

// What an executor that answers each request (Executor::answers_each_request, Executor::decoupled)
// is given and how its answers are checked: the request it gets, the shape check of its outputs,
// and the stream a decoupled executor's responses go through. Private to cpp/src (the Scheduler's
// run_requests and stage_batch).

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "inferd/batch.h"
#include "inferd/executor.h"
#include "inferd/inference_request.h"
#include "inferd/model_statistics.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// `request` as an executor answering each request is given it, `inputs` gathered: its id and the
// names of the outputs it asked for are views of the request and its signature, which outlive the
// batch's execution.
ExecutorRequest executor_request(const InferenceRequest& request, std::vector<Tensor>&& inputs);

// An executor that answers each request (a python model) computes its outputs' shapes itself: each
// output the request asked for must have the config's rank (one more with the batch dim), its
// batch dim equal to the request's batch size, and every fixed dim of the config; otherwise the
// request gets an INTERNAL error naming them, never a tensor its config does not allow (ONNX
// Runtime and TensorRT outputs come from models checked against the config at load). Outputs
// whose config reshapes them are left to the response writer. Outputs the request did not ask
// for may be empty stand-ins.
Status check_answer_shapes(const InferenceRequest& request, const std::vector<Tensor>& outputs);

// The ResponseStream a decoupled executor gets for one batch: hands each response to its
// request's sink (CompletionSink::respond; a request without a sink, answered through the
// CompletionQueue, gets only its final completion) and records the model's response statistics.
// Used on the worker thread only.
class StreamedResponses final : public ResponseStream {
 public:
  StreamedResponses(const RequestBatch& batch, ModelStatistics* statistics)
      : batch_(batch), statistics_(statistics), responded_(batch.size(), false) {}

  void respond(size_t index, RequestResult&& response) override {
    if (index >= batch_.size()) return;  // no request of this batch (the binding refuses such an index first)
    statistics_->record_responses(1, first_response(index));
    const InferenceRequest& request = *batch_[index];
    if (response.status.ok()) {
      const Status shapes = check_answer_shapes(request, response.outputs);
      if (!shapes.ok()) response = RequestResult{shapes, {}};
    }
    if (request.sink) request.sink->respond(request, std::move(response));
  }

  // Request `index` has its final result (`with_response`: one that is answered, ok or an error).
  void finish(size_t index, bool with_response) {
    statistics_->record_responses(with_response ? 1 : 0, first_response(index));
  }

 private:
  // The time since the request's enqueue, when this is its first response.
  std::optional<uint64_t> first_response(size_t index) {
    if (responded_[index]) return std::nullopt;
    responded_[index] = true;
    return ns_between(batch_[index]->enqueue_time, Clock::now());
  }

  const RequestBatch& batch_;
  ModelStatistics* const statistics_;
  std::vector<bool> responded_;
};

}  // namespace inferd
