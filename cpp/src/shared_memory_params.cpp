#include "inferd/shared_memory_params.h"

#include "request_messages.h"

namespace inferd {
namespace {

using request_messages::invalid;

Status integer_parameter(const WireParameter& p, const std::string& tensor, uint64_t* value) {
  if (p.kind == WireParameter::Kind::kUint64) {
    *value = p.uint64_value;
  } else if (p.kind == WireParameter::Kind::kInt64 && p.int64_value >= 0) {
    *value = static_cast<uint64_t>(p.int64_value);
  } else {
    return invalid(tensor + ": '" + std::string(p.key) + "' must be a non-negative integer (int64_param)");
  }
  return Status::Ok();
}

}  // namespace

Status shared_memory_params(const std::vector<WireParameter>& parameters, const std::string& tensor,
                            SharedMemoryParams* out) {
  const WireParameter* region = find_parameter(parameters, "shared_memory_region");
  const WireParameter* offset = find_parameter(parameters, "shared_memory_offset");
  const WireParameter* size = find_parameter(parameters, "shared_memory_byte_size");
  if (region == nullptr) {
    if (offset != nullptr || size != nullptr) {
      return invalid(tensor + ": '" + std::string((offset != nullptr ? offset : size)->key) +
                     "' can not be given without 'shared_memory_region'");
    }
    return Status::Ok();
  }
  if (region->kind != WireParameter::Kind::kString) {
    return invalid(tensor + ": 'shared_memory_region' must be a string (string_param)");
  }
  if (size == nullptr) return invalid(tensor + ": 'shared_memory_byte_size' must be given with 'shared_memory_region'");
  out->present = true;
  out->region = region->string_value;
  Status status = integer_parameter(*size, tensor, &out->byte_size);
  if (status.ok() && offset != nullptr) status = integer_parameter(*offset, tensor, &out->offset);
  return status;
}

Status shared_memory_slice(const SharedMemoryRegistry* shared_memory, const SharedMemoryParams& params,
                           const std::string& tensor, SharedMemorySlice* out) {
  if (shared_memory == nullptr) {
    return Status::Error(StatusCode::kPermissionDenied,
                         tensor +
                             ": shared memory is not accepted on this listener (it is served on the Unix socket; "
                             "see --shared-memory and --shared-memory-listeners)");
  }
  Status status = shared_memory->slice(params.region, params.offset, params.byte_size, out);
  if (!status.ok()) status.message = tensor + ": " + status.message;
  return status;
}

}  // namespace inferd
