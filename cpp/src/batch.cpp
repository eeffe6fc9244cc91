#include "inferd/batch.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "inferd/shared_memory.h"

namespace inferd {
namespace {

// Byte offsets of rows [0, rows] of `t`: fixed-width rows, or a walk over BYTES elements.
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

size_t product(const std::vector<int64_t>& dims, size_t from) {
  size_t n = 1;
  for (size_t d = from; d < dims.size(); ++d) n *= static_cast<size_t>(dims[d]);
  return n;
}

// Copies the leading `region` of a row-major array of dims `src_dims` into the leading corner of
// one of dims `dst_dims` (same rank; region <= both, dim by dim).
void copy_region(const std::byte* src, const std::vector<int64_t>& src_dims, std::byte* dst,
                 const std::vector<int64_t>& dst_dims, const std::vector<int64_t>& region, size_t dim, size_t element) {
  if (dim + 1 >= region.size()) {
    std::memcpy(dst, src, static_cast<size_t>(region.empty() ? 1 : region[dim]) * element);
    return;
  }
  const size_t src_stride = product(src_dims, dim + 1) * element;
  const size_t dst_stride = product(dst_dims, dim + 1) * element;
  for (int64_t i = 0; i < region[dim]; ++i) {
    copy_region(src + static_cast<size_t>(i) * src_stride, src_dims, dst + static_cast<size_t>(i) * dst_stride,
                dst_dims, region, dim + 1, element);
  }
}

template <typename T>
void fill_as(std::byte* dst, size_t count, double value) {
  const T v = static_cast<T>(value);
  auto* typed = reinterpret_cast<T*>(dst);
  std::fill(typed, typed + count, v);
}

// Fills `count` elements of `dtype` with `value` (FP16/BF16: only 0, whose bits are all zero).
void fill(std::byte* dst, size_t count, DataType dtype, double value) {
  switch (dtype) {
    case DataType::kBool:
      return fill_as<uint8_t>(dst, count, value != 0 ? 1 : 0);
    case DataType::kUint8:
      return fill_as<uint8_t>(dst, count, value);
    case DataType::kUint16:
      return fill_as<uint16_t>(dst, count, value);
    case DataType::kUint32:
      return fill_as<uint32_t>(dst, count, value);
    case DataType::kUint64:
      return fill_as<uint64_t>(dst, count, value);
    case DataType::kInt8:
      return fill_as<int8_t>(dst, count, value);
    case DataType::kInt16:
      return fill_as<int16_t>(dst, count, value);
    case DataType::kInt32:
      return fill_as<int32_t>(dst, count, value);
    case DataType::kInt64:
      return fill_as<int64_t>(dst, count, value);
    case DataType::kFp32:
      return fill_as<float>(dst, count, value);
    case DataType::kFp64:
      return fill_as<double>(dst, count, value);
    case DataType::kFp16:
    case DataType::kBf16:
    case DataType::kBytes:
      std::memset(dst, 0, count * element_size(dtype));
      return;
  }
}

Tensor leased_tensor(PinnedBufferPool* pool, DataType dtype, std::vector<int64_t> shape, size_t bytes) {
  auto buffer = pool->lease(bytes);
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = buffer->data;
  t.byte_size = bytes;
  t.owner = std::move(buffer);
  return t;
}

// Copies `size` bytes of `part` (at its start) to `dst`: memcpy, or copy_from_slice for client memory.
void copy_part(std::byte* dst, const Tensor& part, size_t size, size_t request) {
  if (size == 0) return;
  if (!part.client_memory) {
    std::memcpy(dst, part.data, size);
    return;
  }
  std::string error;
  if (!copy_from_slice(dst, *part.client_memory, size, &error)) throw ClientMemoryFault(request, error);
}

// `part` in a leased buffer of its own, when it is client memory (which copy_region may not read).
Tensor readable(const Tensor& part, PinnedBufferPool* pool, size_t request) {
  if (!part.client_memory) return part;
  Tensor copy = leased_tensor(pool, part.dtype, part.shape, part.byte_size);
  copy_part(const_cast<std::byte*>(copy.data), part, part.byte_size, request);
  return copy;
}

Tensor gather_padded(const RequestBatch& batch, size_t i, PinnedBufferPool* pool, const Padding& padding) {
  const Tensor& first = batch.front()->inputs[i];
  std::vector<int64_t> shape = first.shape;
  shape[0] = 0;
  for (const auto& request : batch) {
    const auto& s = request->inputs[i].shape;
    shape[0] += s[0];
    for (size_t d = 1; d < shape.size(); ++d) shape[d] = std::max(shape[d], s[d]);
  }
  const size_t element = element_size(first.dtype);
  Tensor out = leased_tensor(pool, first.dtype, shape, product(shape, 0) * element);
  auto* dst = const_cast<std::byte*>(out.data);  // freshly leased: ours to write
  fill(dst, product(shape, 0), first.dtype, padding.value);
  const size_t row_bytes = product(shape, 1) * element;
  size_t row = 0;
  for (size_t r = 0; r < batch.size(); ++r) {
    const Tensor part = readable(batch[r]->inputs[i], pool, r);
    std::vector<int64_t> dst_dims = shape;
    dst_dims[0] = part.shape[0];
    copy_region(part.data, part.shape, dst + row * row_bytes, dst_dims, part.shape, 0, element);
    row += static_cast<size_t>(part.shape[0]);
  }
  return out;
}

}  // namespace

std::vector<Tensor> gather_inputs(const RequestBatch& batch, PinnedBufferPool* pool, const Padding& padding) {
  if (batch.size() == 1) {
    std::vector<Tensor> inputs = batch.front()->inputs;
    for (Tensor& input : inputs) input = readable(input, pool, 0);
    return inputs;
  }
  std::vector<Tensor> gathered;
  const size_t num_inputs = batch.front()->inputs.size();
  for (size_t i = 0; i < num_inputs; ++i) {
    const Tensor& first = batch.front()->inputs[i];
    if (first.absent) {  // the batcher keys on absence: the whole batch left it out
      gathered.push_back(first);
      continue;
    }
    const bool ragged = std::any_of(batch.begin(), batch.end(), [&](const auto& r) {
      return !std::equal(r->inputs[i].shape.begin() + 1, r->inputs[i].shape.end(), first.shape.begin() + 1,
                         first.shape.end());
    });
    if (ragged && padding.pads_input(i) && first.dtype != DataType::kBytes && !first.shape.empty()) {
      gathered.push_back(gather_padded(batch, i, pool, padding));
      continue;
    }
    size_t bytes = 0;
    int64_t rows = 0;
    for (const auto& request : batch) {
      bytes += request->inputs[i].byte_size;
      rows += request->inputs[i].shape.empty() ? 1 : request->inputs[i].shape[0];
    }
    std::vector<int64_t> shape = first.shape;
    if (!shape.empty()) shape[0] = rows;
    Tensor out = leased_tensor(pool, first.dtype, std::move(shape), bytes);
    auto* dst = const_cast<std::byte*>(out.data);  // freshly leased: ours to write
    size_t offset = 0;
    for (size_t r = 0; r < batch.size(); ++r) {
      const Tensor& part = batch[r]->inputs[i];
      copy_part(dst + offset, part, part.byte_size, r);
      offset += part.byte_size;
    }
    gathered.push_back(std::move(out));
  }
  return gathered;
}

Status scatter_outputs(const std::vector<Tensor>& outputs, const RequestBatch& batch, const Padding& padding,
                       PinnedBufferPool* pool, std::vector<std::vector<Tensor>>* per_request) {
  per_request->assign(batch.size(), {});
  if (batch.size() == 1) {
    (*per_request)[0] = outputs;
    return Status::Ok();
  }
  int64_t total = 0;
  for (const auto& request : batch) total += request->batch_size;
  std::vector<size_t> starts;
  for (size_t o = 0; o < outputs.size(); ++o) {
    const Tensor& out = outputs[o];
    if (out.shape.empty() || out.shape[0] != total) {
      return Status::Error(StatusCode::kInternal, "model output has " +
                                                      std::to_string(out.shape.empty() ? 0 : out.shape[0]) +
                                                      " rows for a batch of " + std::to_string(total));
    }
    if (!row_offsets(out, total, &starts)) {
      return Status::Error(StatusCode::kInternal, "model returned a malformed BYTES output");
    }
    const bool slice =
        padding.enabled() && o < padding.outputs.size() && !padding.outputs[o].empty() && out.dtype != DataType::kBytes;
    int64_t row = 0;
    for (size_t r = 0; r < batch.size(); ++r) {
      const int64_t rows = batch[r]->batch_size;
      const auto begin = starts[static_cast<size_t>(row)];
      Tensor part = out;  // a view that shares the owner, unless sliced below
      part.shape[0] = rows;
      part.data = out.data + begin;
      part.byte_size = starts[static_cast<size_t>(row + rows)] - begin;
      if (slice) {
        // Cut the padding off: this request's lengths come from its reference input.
        const auto& lengths = batch[r]->inputs[static_cast<size_t>(padding.reference_input)].shape;
        std::vector<int64_t> own = part.shape;
        for (const auto& [out_dim, in_dim] : padding.outputs[o]) {
          if (out_dim < own.size() && in_dim < lengths.size()) own[out_dim] = std::min(own[out_dim], lengths[in_dim]);
        }
        if (own != part.shape) {
          const size_t element = element_size(out.dtype);
          Tensor copy = leased_tensor(pool, out.dtype, own, product(own, 0) * element);
          copy_region(part.data, part.shape, const_cast<std::byte*>(copy.data), own, own, 0, element);
          part = std::move(copy);
        }
      }
      row += rows;
      (*per_request)[r].push_back(std::move(part));
    }
  }
  return Status::Ok();
}

}  // namespace inferd
