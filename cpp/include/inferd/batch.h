#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "inferd/inference_request.h"

namespace inferd {

// A page-aligned host allocation of fixed size, freed on destruction. Not thread-safe to write
// concurrently; readers may share it once filled.
class HostBuffer {
 public:
  explicit HostBuffer(size_t size);  // throws std::bad_alloc
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  std::byte* data() { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Gathers the inputs of the requests of one batch into one tensor per input, concatenated along
// dim 0 in request order. A batch of one request is passed through without a copy.
// Precondition: every request has the same number of inputs with equal dtypes and equal non-batch
// dims (the scheduler only batches such requests). Thread-safe (reads its arguments only).
std::vector<Tensor> gather_inputs(const std::vector<std::unique_ptr<InferenceRequest>>& batch);

// Splits each batch output along dim 0 back to the requests, by their batch sizes, as views that
// share the batch output's owner (no copy). Fails if an output's dim 0 does not equal the sum of
// the batch sizes, or a BYTES output is malformed.
Status scatter_outputs(const std::vector<Tensor>& outputs, const std::vector<int64_t>& batch_sizes,
                       std::vector<std::vector<Tensor>>* per_request);

}  // namespace inferd
