#include "request_answers.h"

#include <algorithm>
#include <string>
#include <utility>

#include "inferd/model_signature.h"
#include "request_messages.h"

namespace inferd {

using request_messages::shape_text;

ExecutorRequest executor_request(const InferenceRequest& request, std::vector<Tensor>&& inputs) {
  ExecutorRequest taken{std::move(inputs),       request.id, {},
                        request.parameters_json, nullptr,    {nullptr, request.deadline}};
  if (request.sequence_flags.any()) taken.sequence = &request.sequence_flags;
  if (request.signature != nullptr) {
    for (const uint32_t output : request.requested_outputs) {
      taken.requested_outputs.push_back(request.signature->outputs.at(output).name);
    }
  }
  return taken;
}

Status check_answer_shapes(const InferenceRequest& request, const std::vector<Tensor>& outputs) {
  if (request.signature == nullptr) return Status::Ok();
  const ModelSignature& model = *request.signature;
  const bool batched = model.max_batch_size > 0;
  const auto asked = [&](uint32_t index) {
    return request.requested_outputs.empty() ||
           std::find(request.requested_outputs.begin(), request.requested_outputs.end(), index) !=
               request.requested_outputs.end();
  };
  for (uint32_t i = 0; i < outputs.size() && i < model.outputs.size(); ++i) {
    const OutputSignature& spec = model.outputs[i];
    if (spec.has_reshape || !asked(i)) continue;
    const std::vector<int64_t>& shape = outputs[i].shape;
    bool fits = shape.size() == spec.dims.size() + (batched ? 1 : 0) && (!batched || shape[0] == request.batch_size);
    for (size_t d = 0; fits && d < spec.dims.size(); ++d) {
      fits = spec.dims[d] < 0 || shape[d + (batched ? 1 : 0)] == spec.dims[d];
    }
    if (!fits) {
      return Status::Error(
          StatusCode::kInternal,
          "model '" + model.name + "' answered output '" + spec.name + "' with shape " + shape_text(shape) +
              ", not its config's " + shape_text(spec.dims) +
              (batched ? " after a batch dim of " + std::to_string(request.batch_size) : std::string()));
    }
  }
  return Status::Ok();
}

}  // namespace inferd
