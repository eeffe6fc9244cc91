#include "inferd/sequence_state.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "inferd/datatype_names.h"
#include "request_messages.h"

namespace inferd {
namespace {

constexpr size_t kPage = 4096;  // below it a state's memory is the heap's, exact

using request_messages::quoted;
using request_messages::shape_text;

size_t state_bytes(const StateSpec& spec, const std::vector<int64_t>& dims) {
  return static_cast<size_t>(element_count(dims)) * element_size(spec.dtype);
}

}  // namespace

SequenceStateMemory::SequenceStateMemory(uint64_t limit_bytes, std::string flag)
    : limit_(limit_bytes), flag_(std::move(flag)) {}

bool SequenceStateMemory::reserve(uint64_t bytes) {
  uint64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ || used > limit_ - bytes) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

void SequenceStateMemory::release(uint64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

Status SequenceStateMemory::exhausted(const std::string& what, uint64_t bytes) const {
  return Status::Error(StatusCode::kResourceExhausted,
                       what + " needs " + std::to_string(bytes) + " bytes of sequence state memory, and " +
                           std::to_string(used()) + " of the " + std::to_string(limit_) + " bytes that " + flag_ +
                           " allows are held; end sequences or raise " + flag_);
}

StateBuffer::StateBuffer(std::shared_ptr<SequenceStateMemory> memory, std::shared_ptr<void> storage, std::byte* data,
                         size_t capacity)
    : memory_(std::move(memory)), storage_(std::move(storage)), data_(data), capacity_(capacity) {}

StateBuffer::~StateBuffer() { memory_->release(capacity_); }

std::shared_ptr<StateBuffer> StateBuffer::Allocate(size_t bytes, const std::shared_ptr<SequenceStateMemory>& memory,
                                                   PinnedBufferPool* pool) {
  bytes = std::max<size_t>(bytes, 1);
  try {
    if (bytes < kPage || pool == nullptr) {
      if (!memory->reserve(bytes)) return nullptr;
      std::shared_ptr<std::byte[]> heap;
      try {
        heap.reset(new std::byte[bytes]);
      } catch (const std::bad_alloc&) {
        memory->release(bytes);
        return nullptr;
      }
      std::byte* data = heap.get();
      return std::shared_ptr<StateBuffer>(new StateBuffer(memory, std::move(heap), data, bytes));
    }
    // The pool's size class is what the buffer holds: counted before it is leased.
    size_t capacity = kPage;
    while (capacity < bytes) capacity *= 2;
    if (!memory->reserve(capacity)) return nullptr;
    std::shared_ptr<PooledBuffer> leased;
    try {
      leased = pool->lease(bytes);
    } catch (const std::bad_alloc&) {
      memory->release(capacity);
      return nullptr;
    }
    if (leased->size != capacity) {  // a pool whose classes differ: count what it gave
      memory->release(capacity);
      if (!memory->reserve(leased->size)) return nullptr;
      capacity = leased->size;
    }
    std::byte* data = leased->data;
    return std::shared_ptr<StateBuffer>(new StateBuffer(memory, std::move(leased), data, capacity));
  } catch (const std::bad_alloc&) {  // the shared_ptr's own block
    return nullptr;
  }
}

SequenceStates::SequenceStates(std::vector<StateSpec> specs, bool batched, size_t visible_outputs,
                               std::shared_ptr<SequenceStateMemory> memory, std::shared_ptr<PinnedBufferPool> pool)
    : specs_(std::move(specs)),
      batched_(batched),
      visible_outputs_(visible_outputs),
      memory_(std::move(memory)),
      pool_(std::move(pool)) {}

Status SequenceStates::initial(const SequenceFlags& sequence, CarriedState* out) const {
  CarriedState state;
  for (const StateSpec& spec : specs_) {
    const size_t bytes = state_bytes(spec, spec.initial_dims);
    auto buffer = StateBuffer::Allocate(bytes, memory_, pool_.get());
    if (buffer == nullptr) {
      return memory_->exhausted("the initial state " + quoted(spec.input_name) + " of new sequence " + sequence.shown(),
                                bytes);
    }
    if (spec.initial.empty()) {
      std::memset(buffer->data(), 0, bytes);
    } else {
      std::memcpy(buffer->data(), spec.initial.data(), std::min(bytes, spec.initial.size()));
    }
    state.buffers.push_back(std::move(buffer));
    state.dims.push_back(spec.initial_dims);
  }
  *out = std::move(state);
  return Status::Ok();
}

void SequenceStates::feed(const CarriedState& state, InferenceRequest* request) const {
  for (size_t k = 0; k < specs_.size() && k < state.buffers.size(); ++k) {
    const StateSpec& spec = specs_[k];
    Tensor tensor;
    tensor.dtype = spec.dtype;
    if (batched_) tensor.shape.push_back(1);
    tensor.shape.insert(tensor.shape.end(), state.dims[k].begin(), state.dims[k].end());
    tensor.data = state.buffers[k]->data();
    tensor.byte_size = state_bytes(spec, state.dims[k]);
    tensor.owner = state.buffers[k];
    if (request->inputs.size() <= spec.input) request->inputs.resize(spec.input + 1);
    request->inputs[spec.input] = std::move(tensor);
  }
}

void SequenceStates::add_shapes(const CarriedState& state, std::vector<int64_t>* key) const {
  for (const auto& dims : state.dims) {
    key->push_back(static_cast<int64_t>(dims.size()));
    key->insert(key->end(), dims.begin(), dims.end());
  }
}

Status SequenceStates::keep(InferenceRequest* request, std::vector<Tensor>* outputs) const {
  if (specs_.empty()) return Status::Ok();
  CarriedState* state = &request->state;
  const std::string sequence = "sequence " + request->sequence_flags.shown();
  // First every check and every allocation, so that a failure leaves the state as it was.
  std::vector<std::vector<int64_t>> dims(specs_.size());
  std::vector<std::shared_ptr<StateBuffer>> buffers(specs_.size());
  for (size_t k = 0; k < specs_.size(); ++k) {
    const StateSpec& spec = specs_[k];
    if (spec.output >= outputs->size()) {
      return Status::Error(StatusCode::kInternal, "the model gave no output state " + quoted(spec.input_name));
    }
    const Tensor& out = (*outputs)[spec.output];
    const size_t skip = batched_ ? 1 : 0;
    bool fits =
        out.dtype == spec.dtype && out.shape.size() == spec.dims.size() + skip && (!batched_ || out.shape[0] == 1);
    for (size_t d = 0; fits && d < spec.dims.size(); ++d) {
      fits = out.shape[d + skip] >= 0 && (spec.dims[d] < 0 || out.shape[d + skip] == spec.dims[d]);
    }
    if (fits) {
      dims[k].assign(out.shape.begin() + static_cast<std::ptrdiff_t>(skip), out.shape.end());
      fits = out.byte_size == state_bytes(spec, dims[k]);
    }
    if (!fits) {
      return Status::Error(StatusCode::kInternal, "the model's output state for " + quoted(spec.input_name) + " is " +
                                                      datatype_name(out.dtype) + " " + shape_text(out.shape) +
                                                      ", its config says " + datatype_name(spec.dtype) + " " +
                                                      shape_text(spec.dims) +
                                                      (batched_ ? " after a batch dim of 1" : ""));
    }
    const bool room = k < state->buffers.size() && state->buffers[k] != nullptr &&
                      state->buffers[k]->capacity() >= std::max<size_t>(out.byte_size, 1);
    buffers[k] = room ? state->buffers[k] : StateBuffer::Allocate(out.byte_size, memory_, pool_.get());
    if (buffers[k] == nullptr) {
      return memory_->exhausted(
          "the state " + quoted(spec.input_name) + " of " + sequence + " (" + shape_text(dims[k]) + ")", out.byte_size);
    }
  }
  // The request has computed: the state it was fed is spent, its buffers may take the new one.
  for (size_t k = 0; k < specs_.size(); ++k) {
    const Tensor& out = (*outputs)[specs_[k].output];
    if (out.byte_size != 0) std::memcpy(buffers[k]->data(), out.data, out.byte_size);
  }
  state->buffers = std::move(buffers);
  state->dims = std::move(dims);
  for (const StateSpec& spec : specs_) {  // spent: the old buffers go now, not with the request
    if (spec.input < request->inputs.size()) request->inputs[spec.input] = Tensor::Absent(spec.dtype);
  }
  if (outputs->size() > visible_outputs_) outputs->resize(visible_outputs_);
  return Status::Ok();
}

}  // namespace inferd
