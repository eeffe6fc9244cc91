#include "inferd/batch.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

namespace inferd {
namespace {

// Number of bytes of rows [0, rows) of `t`: fixed-width rows, or a walk over BYTES elements.
bool row_offsets(const Tensor& t, int64_t rows, std::vector<size_t>* row_starts) {
  const int64_t total_rows = t.shape.empty() ? 1 : t.shape[0];
  if (total_rows <= 0) return rows == 0;
  const int64_t per_row = element_count(t.shape) / total_rows;
  row_starts->assign(1, 0);
  if (t.dtype != DataType::kBytes) {
    const size_t row_bytes = static_cast<size_t>(per_row) * element_size(t.dtype);
    for (int64_t r = 1; r <= rows; ++r) row_starts->push_back(static_cast<size_t>(r) * row_bytes);
    return true;
  }
  std::vector<size_t> elements;
  if (!bytes_element_offsets(t.data, t.byte_size, &elements)) return false;
  for (int64_t r = 1; r <= rows; ++r) row_starts->push_back(elements[static_cast<size_t>(r * per_row)]);
  return true;
}

}  // namespace

std::vector<Tensor> gather_inputs(const std::vector<std::unique_ptr<InferenceRequest>>& batch,
                                  PinnedBufferPool* pool) {
  if (batch.size() == 1) return batch.front()->inputs;
  std::vector<Tensor> gathered;
  const size_t num_inputs = batch.front()->inputs.size();
  for (size_t i = 0; i < num_inputs; ++i) {
    const Tensor& first = batch.front()->inputs[i];
    size_t bytes = 0;
    int64_t rows = 0;
    for (const auto& request : batch) {
      bytes += request->inputs[i].byte_size;
      rows += request->inputs[i].shape.empty() ? 1 : request->inputs[i].shape[0];
    }
    auto buffer = pool->lease(bytes);
    size_t offset = 0;
    for (const auto& request : batch) {
      const Tensor& part = request->inputs[i];
      if (part.byte_size > 0) std::memcpy(buffer->data + offset, part.data, part.byte_size);
      offset += part.byte_size;
    }
    Tensor out;
    out.dtype = first.dtype;
    out.shape = first.shape;
    if (!out.shape.empty()) out.shape[0] = rows;
    out.data = buffer->data;
    out.byte_size = bytes;
    out.owner = std::move(buffer);
    gathered.push_back(std::move(out));
  }
  return gathered;
}

Status scatter_outputs(const std::vector<Tensor>& outputs, const std::vector<int64_t>& batch_sizes,
                       std::vector<std::vector<Tensor>>* per_request) {
  per_request->assign(batch_sizes.size(), {});
  if (batch_sizes.size() == 1) {
    (*per_request)[0] = outputs;
    return Status::Ok();
  }
  int64_t total = 0;
  for (int64_t n : batch_sizes) total += n;
  std::vector<size_t> starts;
  for (const Tensor& out : outputs) {
    if (out.shape.empty() || out.shape[0] != total) {
      return Status::Error(StatusCode::kInternal, "model output has " +
                                                      std::to_string(out.shape.empty() ? 0 : out.shape[0]) +
                                                      " rows for a batch of " + std::to_string(total));
    }
    if (!row_offsets(out, total, &starts)) {
      return Status::Error(StatusCode::kInternal, "model returned a malformed BYTES output");
    }
    int64_t row = 0;
    for (size_t r = 0; r < batch_sizes.size(); ++r) {
      Tensor part = out;  // shares the owner: a view, not a copy
      part.shape[0] = batch_sizes[r];
      part.data = out.data + starts[static_cast<size_t>(row)];
      part.byte_size = starts[static_cast<size_t>(row + batch_sizes[r])] - starts[static_cast<size_t>(row)];
      row += batch_sizes[r];
      (*per_request)[r].push_back(std::move(part));
    }
  }
  return Status::Ok();
}

}  // namespace inferd
