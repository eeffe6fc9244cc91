#include "inferd/worker_answers.h"

#include <algorithm>

#include "inferd/datatype_names.h"

namespace inferd {
namespace {

bool holds(DataType declared, DataType sent) {
  // BF16 has no numpy type: a model returns its bits as 16-bit integers.
  return sent == declared || (declared == DataType::kBf16 && (sent == DataType::kUint16 || sent == DataType::kInt16));
}

}  // namespace

WorkerAnswer answer_of(const worker::ResponseDescription& response, const std::byte* data, uint64_t data_offset,
                       const std::shared_ptr<const void>& owner, const std::string& model_name) {
  WorkerAnswer answer;
  if (!response.ok) {
    answer.status = Status::Error(StatusCode::kInternal, std::string(response.error));
    return answer;
  }
  if (response.rescheduled) {
    answer.rescheduled = true;
    return answer;
  }
  for (const worker::TensorPlace& place : response.outputs) {
    Tensor tensor;
    tensor.dtype = place.dtype;
    tensor.shape = place.shape;
    const std::byte* bytes = data + (place.offset - data_offset);
    if (place.dtype == DataType::kBytes) {
      // Copied out before it is checked: the response writer walks the lengths again later.
      auto owned = std::make_shared<std::vector<std::byte>>(bytes, bytes + place.nbytes);
      std::vector<size_t> offsets;
      if (!bytes_element_offsets(owned->data(), owned->size(), &offsets) ||
          static_cast<int64_t>(offsets.size() - 1) != element_count(place.shape)) {
        answer.status =
            Status::Error(StatusCode::kInternal, "python model '" + model_name + "': output '" +
                                                     std::string(place.name) + "' is not a BYTES tensor of its shape");
        answer.outputs.clear();
        return answer;
      }
      tensor.data = owned->data();
      tensor.byte_size = owned->size();
      tensor.owner = std::move(owned);
    } else {
      tensor.data = bytes;
      tensor.byte_size = place.nbytes;
      tensor.owner = owner;
    }
    answer.outputs.emplace_back(std::string(place.name), std::move(tensor));
  }
  return answer;
}

RequestResult in_model_order(WorkerAnswer&& answer, const std::vector<std::string_view>& requested,
                             const DeclaredOutputs& declared) {
  if (!answer.status.ok()) return RequestResult{std::move(answer.status), {}};
  if (answer.rescheduled) {
    RequestResult again;
    again.reschedule = true;
    return again;
  }
  const std::string model = "python model '" + declared.model_name + "'";
  RequestResult result;
  for (size_t k = 0; k < declared.names.size(); ++k) {
    const std::string& name = declared.names[k];
    const DataType type = declared.types[k];
    auto sent = std::find_if(answer.outputs.begin(), answer.outputs.end(),
                             [&name](const auto& output) { return output.first == name; });
    if (sent == answer.outputs.end()) {
      if (requested.empty() || std::find(requested.begin(), requested.end(), name) != requested.end()) {
        return RequestResult{
            Status::Error(StatusCode::kInternal, model + ": its response has no output '" + name + "'"), {}};
      }
      Tensor stand_in;  // not asked for, not computed: no answer carries it
      stand_in.dtype = type;
      stand_in.shape = {0};
      result.outputs.push_back(std::move(stand_in));
      continue;
    }
    if (!holds(type, sent->second.dtype)) {
      return RequestResult{Status::Error(StatusCode::kInternal, model + ": output '" + name + "' is " +
                                                                    datatype_name(sent->second.dtype) +
                                                                    ", the model declares " + datatype_name(type)),
                           {}};
    }
    sent->second.dtype = type;
    result.outputs.push_back(std::move(sent->second));
  }
  return result;
}

}  // namespace inferd
