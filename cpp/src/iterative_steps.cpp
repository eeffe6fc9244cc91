#include "inferd/iterative_steps.h"

#include <algorithm>
#include <cstring>
#include <memory>

namespace inferd {

bool IterativeSteps::ended(const InferenceRequest& request, const std::vector<Tensor>& outputs) const {
  if (request.iteration >= options_.max_steps) return true;
  if (options_.end_output < 0) return false;
  const auto index = static_cast<size_t>(options_.end_output);
  if (index >= outputs.size()) return true;  // no answer to go on from
  const Tensor& end = outputs[index];
  const size_t element = std::min(element_size(end.dtype), end.byte_size);
  return std::any_of(end.data, end.data + element, [](std::byte b) { return b != std::byte{0}; });
}

void IterativeSteps::feed_back(const std::vector<Tensor>& outputs, InferenceRequest* request) const {
  for (const auto& [output, input] : options_.feedback) {
    if (output >= outputs.size()) continue;
    const Tensor& from = outputs[output];
    auto bytes = std::make_shared<std::vector<std::byte>>(from.data, from.data + from.byte_size);
    Tensor fed;
    fed.dtype = from.dtype;
    fed.shape = from.shape;
    fed.data = bytes->data();
    fed.byte_size = bytes->size();
    fed.owner = std::move(bytes);
    if (request->inputs.size() <= input) request->inputs.resize(input + 1);
    request->inputs[input] = std::move(fed);
  }
}

}  // namespace inferd
