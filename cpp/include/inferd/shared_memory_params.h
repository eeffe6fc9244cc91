#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "inferd/infer_request_parser.h"
#include "inferd/shared_memory.h"
#include "inferd/status.h"

namespace inferd {

// The slice of a registered region a tensor names through its parameters (Triton's shared-memory
// parameters). `region` views the request's bytes, which must outlive it.
struct SharedMemoryParams {
  bool present = false;  // the tensor names a region; the other fields are unset otherwise
  std::string_view region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// A tensor's shared-memory parameters, checked as Triton checks them (ParseSharedMemoryParams):
// `shared_memory_region` (string) names the region, `shared_memory_byte_size` (a non-negative
// integer, required with it) and `shared_memory_offset` (optional, default 0) the slice; either
// without a region is an error. No region at all leaves `out->present` false and is OK. `tensor`
// ("input 'X'", "output 'X'") begins the messages. Thread-safe (reads only); never blocks.
// INVALID_ARGUMENT naming the parameter.
Status shared_memory_params(const std::vector<WireParameter>& parameters, const std::string& tensor,
                            SharedMemoryParams* out);

// The slice `params` names in `shared_memory`, into `out` (which then keeps the region mapped; see
// SharedMemorySlice). A null `shared_memory` (this call's listener may not use it) is
// PERMISSION_DENIED; a region the registry refuses is its status, its message after `tensor`.
// Thread-safe; takes the registry's mutex for the look-up only, never blocks beyond it.
Status shared_memory_slice(const SharedMemoryRegistry* shared_memory, const SharedMemoryParams& params,
                           const std::string& tensor, SharedMemorySlice* out);

}  // namespace inferd
