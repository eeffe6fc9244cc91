#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/padding.h"

namespace inferd {

// What happens to one priority level's queued requests (Triton's ModelQueuePolicy).
struct QueuePolicy {
  bool delay_on_timeout = false;  // on timeout: true = DELAY (move behind), false = REJECT
  uint64_t default_timeout_us = 0;  // 0 = requests never time out in the queue
  bool allow_timeout_override = false;  // a request's timeout_us may shorten the default
  uint32_t max_queue_size = 0;  // 0 = unbounded; else enqueue past it is RESOURCE_EXHAUSTED
};

// Triton's dynamic_batching settings, plus `dynamic` = whether the section is there at all.
struct BatcherOptions {
  bool dynamic = false;            // false: every request is a batch of its own
  int64_t max_batch_size = 0;      // rows per batch; 0 = the model does not batch
  std::vector<int64_t> preferred_batch_sizes;
  uint64_t max_queue_delay_us = 0;  // 0 = send what is ready, never wait
  uint32_t priority_levels = 0;     // 0 = one level
  uint32_t default_priority_level = 0;
  QueuePolicy default_policy;
  std::map<uint32_t, QueuePolicy> level_policies;  // overrides default_policy per level
  bool preserve_ordering = false;  // read by the scheduler
  Padding padding;                 // padded inputs are bucketed by rank only
};

// A request the batcher took out of its queues unanswered, and the status to answer it with.
using Rejection = std::pair<std::unique_ptr<InferenceRequest>, Status>;

// The queues of one model version and the rules that cut them into batches.
//
// Requests wait in one FIFO per priority level (1 first). A batch starts from the first waiting
// request in priority order and takes the following requests of the same shape (shape_key) in
// order, skipping - not stopping at - requests of other shapes, which keep their place for a
// later batch (Triton stops at the first mismatch). It is sent when it reaches max_batch_size or
// the next request would not fit, when the oldest of it has waited max_queue_delay_us, or, before
// that, when it has reached a preferred size (the largest reached). Requests whose caller's
// deadline passes in the queue are answered DEADLINE_EXCEEDED; those whose queue timeout passes are
// rejected (UNAVAILABLE) or, with DELAY, moved behind every waiting request of their level.
// Invariant: a request is in exactly one queue, or handed out exactly once (batch, rejection or
// cancel). Every method is thread-safe.
class DynamicBatcher {
 public:
  explicit DynamicBatcher(BatcherOptions options);

  // Queues `request`, or fails leaving it with the caller: INVALID_ARGUMENT for a priority above
  // the levels, RESOURCE_EXHAUSTED when its level's queue is full, UNAVAILABLE once closed.
  // Never blocks beyond the internal lock.
  Status enqueue(std::unique_ptr<InferenceRequest>&& request);

  // Blocks until a batch is due or requests must be answered without running. Fills `batch`
  // (maybe empty) and `rejected`; returns false only when closed and nothing is left.
  bool next_batch(std::vector<std::unique_ptr<InferenceRequest>>* batch, std::vector<Rejection>* rejected);

  // Takes the request with `token` out of the queues; nullptr if it is not waiting (running or done).
  std::unique_ptr<InferenceRequest> cancel(uint64_t token);

  // Ends intake and wakes waiters; queued requests still leave through next_batch.
  void close();
  // Removes every waiting request (for a shutdown that rejects them).
  std::vector<std::unique_ptr<InferenceRequest>> take_all();
  size_t size() const;
  const BatcherOptions& options() const { return options_; }

 private:
  using Queue = std::deque<std::unique_ptr<InferenceRequest>>;
  struct Level {
    QueuePolicy policy;
    Queue waiting;  // in arrival order
    Queue delayed;  // timed out under DELAY: behind `waiting`, before lower levels
  };

  // All below require mutex_ held.
  // Moves requests whose deadline or queue timeout has passed out of the queues.
  void expire(Clock::time_point now, std::vector<Rejection>* rejected);
  // Forms the batch due now into `batch`; otherwise returns when to look again.
  Clock::time_point take_batch(Clock::time_point now, std::vector<std::unique_ptr<InferenceRequest>>* batch);
  Clock::time_point earliest_expiry() const;
  template <typename Fn>
  void for_each_queue(Fn&& fn);

  const BatcherOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Level> levels_;  // guarded by mutex_; index 0 = priority 1
  size_t size_ = 0;            // guarded by mutex_
  uint64_t next_sequence_ = 0; // guarded by mutex_
  bool closed_ = false;        // guarded by mutex_
};

}  // namespace inferd
