#include "answer_outputs.h"

#include <string>

#include "inferd/shared_memory.h"

namespace inferd {

Status answer_outputs(const InferenceRequest& request, const std::vector<Tensor>& outputs,
                      std::vector<AnswerOutput>* out) {
  const ModelSignature& model = *request.signature;
  const bool batched = model.max_batch_size > 0;
  Status status;
  auto fail = [&](StatusCode code, std::string message) {
    if (status.ok()) status = Status::Error(code, std::move(message));
  };
  auto add = [&](uint32_t index) {
    if (index >= outputs.size() || index >= model.outputs.size()) {
      fail(StatusCode::kInternal, "model '" + model.name + "' gave fewer outputs than its signature lists");
      return;
    }
    const OutputSignature& spec = model.outputs[index];
    const Tensor& tensor = outputs[index];
    AnswerOutput answer{&spec, &tensor, tensor.shape, nullptr};
    if (spec.has_reshape && !reshape_dims(tensor.shape, spec.dims, batched, &answer.shape)) {
      fail(StatusCode::kInternal,
           "output '" + spec.name + "' of model '" + model.name + "' cannot be shown in its dims (reshape)");
    }
    for (const SharedMemoryOutput& target : request.shared_memory_outputs) {
      if (target.output != index || !status.ok()) continue;
      answer.shared_memory = &target;
      if (tensor.byte_size > target.slice.size) {
        // Triton's words; INVALID_ARGUMENT where Triton says INTERNAL: the client sized the slice.
        fail(StatusCode::kInvalidArgument, "shared memory size specified with the request for output '" + spec.name +
                                               "' (" + std::to_string(target.slice.size) +
                                               " bytes) should be at least " + std::to_string(tensor.byte_size) +
                                               " bytes to hold the results");
        break;
      }
      std::string error;
      if (!copy_to_slice(target.slice, tensor.data, tensor.byte_size, &error)) {
        fail(StatusCode::kInvalidArgument, "output '" + spec.name + "': " + error);
      }
      break;
    }
    out->push_back(std::move(answer));
  };
  if (request.requested_outputs.empty()) {
    for (uint32_t i = 0; i < model.outputs.size() && i < outputs.size(); ++i) add(i);
  } else {
    for (uint32_t i : request.requested_outputs) add(i);
  }
  return status;
}

}  // namespace inferd
