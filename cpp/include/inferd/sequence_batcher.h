#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/iterative_steps.h"
#include "inferd/request_batcher.h"
#include "inferd/sequence_state.h"
#include "inferd/tensor.h"

namespace inferd {

// One control input of a stateful model (Triton's sequence_batching.control_input): a tensor the
// core writes into each request it hands out, of one element (shape [1], or [1, 1] for a model
// that batches).
struct SequenceControl {
  enum class Kind {
    kStart,          // the request starts its sequence (its sequence_start)
    kEnd,            // the request ends it (its sequence_end)
    kReady,          // the request is a client's (a batch holds no empty slots); false: see tell_idle_end
    kCorrelationId,  // the sequence's id
  };
  Kind kind = Kind::kReady;
  uint32_t input = 0;  // its index in the model's inputs
  // The flags: INT32, FP32 or BOOL (int32_false_true, fp32_false_true, bool_false_true); the id:
  // UINT64, INT64, UINT32, INT32 or BYTES (its data_type; a BYTES id is the string id).
  DataType dtype = DataType::kInt32;
  double false_value = 0;  // a flag's values, for INT32 and FP32
  double true_value = 1;
};

// Triton's sequence_batching settings, as the core keeps them.
struct SequenceOptions {
  enum class Strategy {
    kDirect,  // each sequence holds a slot of one instance for its life; beyond them, a backlog
    kOldest,  // up to max_candidate_sequences sequences batch together, oldest request first
  };
  Strategy strategy = Strategy::kDirect;
  int64_t max_batch_size = 0;  // the model's; 0: it does not batch, a batch is one request
  uint32_t instances = 1;      // direct: each has max(1, max_batch_size) slots
  std::chrono::microseconds max_sequence_idle{1'000'000};
  // How long a batch may wait for company: direct, for minimum_slot_utilization of the
  // instance's slots to hold a waiting request; oldest, to reach a preferred size (or the most).
  std::chrono::microseconds max_queue_delay{0};
  double minimum_slot_utilization = 0;         // direct, in [0, 1]
  uint32_t max_candidate_sequences = 1;        // oldest, at least 1
  std::vector<int64_t> preferred_batch_sizes;  // oldest
  std::vector<SequenceControl> controls;
  // inferd's answer to Triton's silent idle end: the model is sent one more request of the
  // sequence, END true and READY false, every input but the controls absent, whose answer is
  // dropped; the sequence ends once it has run. `input_types`: every model input's, in order
  // (what the request's absent inputs are). Off: the sequence just ends.
  bool tell_idle_end = false;
  std::vector<DataType> input_types;
  // Called, without the batcher's lock, with a sequence ended for being idle past
  // max_sequence_idle (it had no request waiting or running); may be empty.
  std::function<void(const SequenceFlags& sequence)> idle_ended;
  // Implicit state (sequence_batching.state): null or none for a model without. The Scheduler
  // makes it from `state_specs`, `visible_outputs` and `state_memory`, with its pool.
  std::shared_ptr<const SequenceStates> states;
  std::vector<StateSpec> state_specs;
  size_t visible_outputs = 0;  // the config's outputs; the executor's after them are states' alone
  std::shared_ptr<SequenceStateMemory> state_memory;
  // iterative_sequence: each request is a sequence of its own, run one step per batch and
  // rescheduled until it ends (IterativeSteps); null for a model whose requests name sequences.
  std::shared_ptr<const IterativeSteps> iterative;
};

// The queues of a stateful model version (Triton's sequence batcher): its requests belong to
// sequences, named by their SequenceFlags id, and each sequence's requests run one at a time, in
// the order they came, each only once the one before it has its final answer (the next step of a
// sequence needs the last one's state).
//
// With implicit state (SequenceOptions::states), each sequence keeps its state here between its
// requests: a START request brings its sequence's initial state from enqueue (refused
// RESOURCE_EXHAUSTED when the state memory's bound has no room), the request handed out carries
// the state into its batch (fed as its state inputs), and its final answer brings back the state
// it left (SequenceStates::keep, by the Scheduler) or, failed, the one it was fed. Requests batch
// only with requests whose states have their shapes. A sequence's state goes when it ends.
//
// An iterative model's requests (SequenceOptions::iterative) are each a sequence of their own,
// whatever sequence parameters they carry (an id the batcher gives it, START on its first step,
// END on its last by max_steps),
// batched with the other sequences' steps as any sequence's requests are; after each step that
// does not end it, the Scheduler gives it back (reschedule) for its next, at its place in the
// oldest-first order, so that sequences join and leave the batch at every step.
//
// A request with START begins its sequence (after what that id still has waiting, when it had
// one); a request without START for an id that has no sequence, or whose last request ended it,
// is refused INVALID_ARGUMENT, as Triton refuses it. A started sequence is active while it holds
// a place - direct: a slot of one instance (the instance with the most free slots), only that
// instance runs its requests; oldest: one of max_candidate_sequences places, any instance runs
// them - and waits in a backlog, in the order sequences started, until one frees. A sequence ends
// when its END request has its final answer and nothing else of it waits, or when it has had
// nothing waiting or running for max_sequence_idle: it is reaped then (options.idle_ended; with
// tell_idle_end, after one more request tells the model), and its next request without START is
// refused.
//
// A batch holds at most one request of each sequence, of one shape (their non-batch dims), each
// with its control tensors written (SequenceControl), up to max_batch_size requests (one when
// the model does not batch). Direct: an instance's batch takes every active sequence of its slots
// with a request ready, once they fill minimum_slot_utilization of its slots or the oldest of
// them has waited max_queue_delay. Oldest: the oldest ready requests of the candidates, once the
// batch is full or reaches a preferred size, or its oldest has waited max_queue_delay.
//
// Requests whose caller's deadline passes while they wait are answered DEADLINE_EXCEEDED, even
// while every instance is busy (next_expired).
//
// Invariants: a request is in exactly one sequence's queue, or handed out exactly once (batch,
// rejection or cancel); at most one request of a sequence is out at a time; the active sequences
// never exceed the places. Every method is thread-safe: all state is guarded by one mutex.
class SequenceBatcher final : public RequestBatcher {
 public:
  explicit SequenceBatcher(SequenceOptions options);
  ~SequenceBatcher() override;

  // Queues `request` in its sequence: INVALID_ARGUMENT for a request of no sequence, of a batch
  // size above 1, or without START for a sequence it does not continue; UNAVAILABLE once closed.
  Status enqueue(std::unique_ptr<InferenceRequest>&& request) override;
  bool next_batch(uint32_t instance, std::vector<std::unique_ptr<InferenceRequest>>* batch,
                  std::vector<Rejection>* rejected) override;
  // Also reaps idle sequences when due.
  bool next_expired(std::vector<Rejection>* rejected) override;
  std::unique_ptr<InferenceRequest> cancel(uint64_t token) override;
  // The sequence's next request may run now, with the state `request` brings back; an END
  // request's sequence ends, as does an iterative request's.
  void finished(InferenceRequest& request) override;
  // An iterative request that ran a step and goes on: queued again for its next step, with the
  // state it brings back. False, the request left with the caller, once a shutdown that rejects
  // took the queues (take_all).
  bool reschedule(std::unique_ptr<InferenceRequest>& request);
  void close() override;
  std::vector<std::unique_ptr<InferenceRequest>> take_all() override;
  size_t size() const override;

  // Thread-safe snapshots: sequences that hold a place, those in the backlog, and those ended
  // for being idle since the start.
  size_t active_sequences() const;
  size_t backlog_sequences() const;
  uint64_t idle_ended() const;
  // The model's implicit state; null when it has none.
  const SequenceStates* states() const {
    return options_.states != nullptr && options_.states->any() ? options_.states.get() : nullptr;
  }

 private:
  using Key = std::pair<uint64_t, std::string>;
  struct Sequence;

  // All below require mutex_ held.
  Clock::time_point expire(Clock::time_point now, std::vector<Rejection>* rejected);
  Clock::time_point reap(Clock::time_point now, std::vector<SequenceFlags>* ended);
  // Forms the batch due now for `instance`; otherwise returns when to look again.
  Clock::time_point take_batch(uint32_t instance, Clock::time_point now,
                               std::vector<std::unique_ptr<InferenceRequest>>* batch);
  void hand_out(Sequence& sequence, std::vector<std::unique_ptr<InferenceRequest>>* batch);
  // What `sequence`'s next request batches by: its inputs' shapes and the state it would be fed.
  std::vector<int64_t> batch_key(const Sequence& sequence) const;
  // A sequence with nothing waiting or running is reaped max_sequence_idle after it was last
  // active: the expiry watcher is woken by then.
  void watch_idle(const Sequence& sequence);
  // Gives `sequence` a place, if one is free; false: it waits in the backlog.
  bool place(Sequence& sequence);
  // Queues the request that tells the model `sequence` idled out (options_.tell_idle_end).
  void tell_idle_end(Sequence& sequence, Clock::time_point now);
  // The sequence has ended: its place goes to the first sequence of the backlog.
  void end(const Key& key);
  void report(std::vector<SequenceFlags>&& ended);
  size_t places() const;

  const SequenceOptions options_;
  const size_t slots_per_instance_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::condition_variable expiry_changed_;
  std::map<Key, std::unique_ptr<Sequence>> sequences_;  // every sequence not ended
  std::deque<Key> backlog_;                             // started, waiting for a place, in order
  std::vector<size_t> occupied_;                        // direct: active sequences per instance
  size_t active_ = 0;
  size_t size_ = 0;  // requests waiting
  uint64_t next_order_ = 0;
  uint64_t idle_ended_ = 0;
  uint64_t next_iterative_id_ = 1;  // an iterative request's sequence id
  bool closed_ = false;
  bool emptied_ = false;  // take_all ran: nothing is queued again
  Clock::time_point expiry_watch_until_ = Clock::time_point::max();
};

}  // namespace inferd
