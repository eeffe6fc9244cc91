#pragma once

// Implicit state of stateful models (Triton's sequence_batching.state): what the core keeps of a
// sequence between its requests, where that memory comes from and what bounds it.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "inferd/carried_state.h"
#include "inferd/inference_request.h"
#include "inferd/pinned_buffer_pool.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// The bytes that every stateful model's sequences hold in state, across models, and their bound
// (the server's --max-sequence-state-bytes). Thread-safe: one atomic count.
class SequenceStateMemory {
 public:
  // `flag`: how the bound is set, named in refusals ("--max-sequence-state-bytes").
  SequenceStateMemory(uint64_t limit_bytes, std::string flag);

  // Counts `bytes` more and returns true, or counts nothing and returns false when that would
  // pass the bound.
  bool reserve(uint64_t bytes);
  void release(uint64_t bytes);
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }
  // RESOURCE_EXHAUSTED: `what` needs `bytes` more than the bound leaves; the message names the flag.
  Status exhausted(const std::string& what, uint64_t bytes) const;

 private:
  const uint64_t limit_;
  const std::string flag_;
  std::atomic<uint64_t> used_{0};
};

// One state tensor's memory, counted in its SequenceStateMemory from allocation until the last
// shared_ptr to it goes (RAII). Below a page it is the heap's, exact; from a page up a buffer of the
// pinned pool, in its power-of-two size classes (a growing state then finds room in its own buffer
// for most steps). Counted at its capacity: what it really holds.
class StateBuffer {
 public:
  // A buffer of at least `bytes`; null when the bound has no room for it or memory cannot be had.
  static std::shared_ptr<StateBuffer> Allocate(size_t bytes, const std::shared_ptr<SequenceStateMemory>& memory,
                                               PinnedBufferPool* pool);
  ~StateBuffer();
  StateBuffer(const StateBuffer&) = delete;
  StateBuffer& operator=(const StateBuffer&) = delete;

  std::byte* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  StateBuffer(std::shared_ptr<SequenceStateMemory> memory, std::shared_ptr<void> storage, std::byte* data,
              size_t capacity);

  const std::shared_ptr<SequenceStateMemory> memory_;
  const std::shared_ptr<void> storage_;  // the heap's bytes or the pool's buffer
  std::byte* const data_;
  const size_t capacity_;
};

// One implicit state of a model version: an input the core feeds and an output the core keeps.
struct StateSpec {
  std::string input_name;  // for messages
  uint32_t input = 0;      // its index in the executor's inputs (after the config's and the controls)
  uint32_t output = 0;     // its output's index in the executor's outputs
  DataType dtype = DataType::kFp32;
  std::vector<int64_t> dims;          // without the batch dim; -1: any length (a state that grows)
  std::vector<int64_t> initial_dims;  // a new sequence's state: every dim fixed
  std::vector<std::byte> initial;     // its bytes, row-major; empty: zeros
};

// The implicit state of one model version's sequences: how a sequence's state is made, fed into
// a request and kept from its outputs. The SequenceBatcher keeps each sequence's CarriedState
// between its requests and hands it to the request that runs; the Scheduler replaces it with what
// the request computed (keep) before the request's answer lets the sequence go on, so each step
// sees the last one's state. Each tensor is in buffers of the sequence's own (StateBuffer), never
// shared with another sequence: a new state is copied into the buffer of the old one whenever it
// fits (the old one is spent by then), into a new buffer otherwise.
//
// Immutable after construction; thread-safe (the memory count is atomic).
class SequenceStates {
 public:
  // `batched`: the model batches (state tensors get a batch dim of 1). `visible_outputs`: how many
  // of the executor's outputs the client sees (the config's); those after are states' alone.
  SequenceStates(std::vector<StateSpec> specs, bool batched, size_t visible_outputs,
                 std::shared_ptr<SequenceStateMemory> memory, std::shared_ptr<PinnedBufferPool> pool);

  bool any() const { return !specs_.empty(); }
  const std::vector<StateSpec>& specs() const { return specs_; }

  // A new sequence's state (its START request's): the initial state, in buffers of its own.
  // RESOURCE_EXHAUSTED, naming the bound's flag, when the bound has no room for it.
  Status initial(const SequenceFlags& sequence, CarriedState* out) const;
  // Writes `state` into `request`'s state inputs: views of its buffers, owned by them.
  void feed(const CarriedState& state, InferenceRequest* request) const;
  // Appends each state's dims to `key`: requests batch only with equal shapes.
  void add_shapes(const CarriedState& state, std::vector<int64_t>* key) const;
  // The state a computed `request`'s `outputs` (executor output order) leave for its sequence's
  // next request, put into its CarriedState (in place of the one it was fed, whose input views it
  // lets go), and `outputs` cut to those the client sees. INTERNAL for a state output not of its
  // spec's datatype or dims; RESOURCE_EXHAUSTED, naming the flag, when the bound has no room for
  // it. On failure the request's state is unchanged.
  Status keep(InferenceRequest* request, std::vector<Tensor>* outputs) const;

 private:
  const std::vector<StateSpec> specs_;
  const bool batched_;
  const size_t visible_outputs_;
  const std::shared_ptr<SequenceStateMemory> memory_;
  const std::shared_ptr<PinnedBufferPool> pool_;
};

}  // namespace inferd
