#include "inferd/model_calls.h"

#include <optional>
#include <string_view>

#include "answer_outputs.h"
#include "inferd/model_signature.h"
#include "inferd/version_routing.h"

namespace inferd {
namespace {

// What a call's answer views: the completion's outputs and its request (the answer's order).
struct AnsweredCall {
  std::vector<Tensor> outputs;
  std::unique_ptr<InferenceRequest> request;
};

}  // namespace

void ModelCallHandle::complete(Completion&& completion) {
  if (!claim()) return;  // cancelled before: the caller has its answer
  ModelCallAnswer answer;
  answer.status = completion.status;
  if (answer.status.ok() && completion.request != nullptr) {
    auto answered = std::make_shared<AnsweredCall>();
    answered->outputs = std::move(completion.outputs);
    answered->request = std::move(completion.request);
    std::vector<AnswerOutput> outputs;
    answer.status = answer_outputs(*answered->request, answered->outputs, &outputs);
    if (answer.status.ok()) {
      for (const AnswerOutput& output : outputs) {
        Tensor tensor = *output.tensor;
        tensor.shape = output.shape;
        tensor.owner = answered;
        answer.outputs.emplace_back(output.spec->name, std::move(tensor));
      }
    }
  }
  if (!answer.status.ok()) answer.outputs.clear();
  done_(std::move(answer));
}

void ModelCallHandle::cancel(const Status& status) {
  if (!claim()) return;
  if (std::shared_ptr<RequestScheduler> scheduler = scheduler_.lock()) scheduler->cancel(token_);
  done_(ModelCallAnswer{status, {}});
}

void ModelCallHandle::answer(ModelCallAnswer&& answer) {
  if (claim()) done_(std::move(answer));
}

void ModelCalls::serve_from(SnapshotSource source) {
  std::lock_guard<std::mutex> lock(mutex_);
  source_ = std::move(source);
}

std::shared_ptr<ModelCallHandle> ModelCalls::start(ModelCall call, ModelCallDone done) {
  SnapshotSource source;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    source = source_;
  }
  if (!source) return nullptr;
  // Counted until the call is submitted: its version is not closed before (ServingState::settle).
  const ServingState::Reading reading = source();
  const std::shared_ptr<const ServingSnapshot>& snapshot = reading.snapshot();
  if (snapshot == nullptr || !snapshot->accepting) return nullptr;
  std::optional<std::string_view> key;
  if (!routing_key(call.parsed.parameters, &key).ok()) return nullptr;  // Python says what is wrong
  const std::shared_ptr<const ModelRoute> route =
      snapshot->find(call.parsed.model_name, call.parsed.model_version, key);
  if (route == nullptr) return nullptr;
  const std::shared_ptr<RequestScheduler> scheduler = route->scheduler.lock();  // the snapshot owns it
  if (scheduler == nullptr) return nullptr;

  const uint64_t token = tokens_.next();
  auto handle = std::make_shared<ModelCallHandle>(route->scheduler, token, std::move(done));
  auto request = std::make_unique<InferenceRequest>();
  request->token = token;
  request->deadline = call.deadline;
  Status status = build_inference_request(route->signature, call.parsed, call.owner, request.get());
  if (status.ok()) {
    request->sink = handle;
    status = scheduler->submit(std::move(request));  // refused: still ours, and dropped here
  }
  if (!status.ok()) handle->fail(status);
  return handle;
}

}  // namespace inferd
