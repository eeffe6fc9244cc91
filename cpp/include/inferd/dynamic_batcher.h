#pragma once

#include <chrono>
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
#include "inferd/request_batcher.h"

namespace inferd {

// What happens to one priority level's queued requests (Triton's ModelQueuePolicy).
struct QueuePolicy {
  bool delay_on_timeout = false;        // on timeout: true = DELAY (move behind), false = REJECT
  uint64_t default_timeout_us = 0;      // 0 = requests never time out in the queue
  bool allow_timeout_override = false;  // a request's timeout_us may shorten the default
  uint32_t max_queue_size = 0;          // 0 = unbounded; else enqueue past it is RESOURCE_EXHAUSTED
};

// What requests must share to batch together: the non-batch dims of each input (those `padding`
// pads only by rank), -1 for an input left out.
std::vector<int64_t> shape_key(const InferenceRequest& request, const Padding& padding);

// Triton's dynamic_batching settings, plus `dynamic` = whether the section is there at all.
struct BatcherOptions {
  bool dynamic = false;        // false: every request is a batch of its own
  int64_t max_batch_size = 0;  // rows per batch; 0 = the model does not batch
  std::vector<int64_t> preferred_batch_sizes;
  uint64_t max_queue_delay_us = 0;  // the most a batch waits for company (see DynamicBatcher); 0 = never
  uint32_t priority_levels = 0;     // 0 = one level
  uint32_t default_priority_level = 0;
  QueuePolicy default_queue_policy;
  std::map<uint32_t, QueuePolicy> level_queue_policies;  // overrides default_queue_policy per level
  bool preserve_ordering = false;                        // read by the scheduler
  Padding padding;                                       // padded inputs are bucketed by rank only
};

// How often requests arrive while a batcher is busy (a request already queued, or a batch it
// handed out still running), per second of busy time: exponentially decayed counts of those
// arrivals and of busy time, both fading with wall-clock time (time constant kMemory), so the
// estimate follows the last few hundred milliseconds of traffic. Busy time, not wall time, is the
// denominator, and only arrivals that find the batcher busy count: a lone closed-loop client,
// which sends only once answered, never arrives while busy however fast it sends; any real
// concurrency does, even when nothing waits (requests arrive while a batch computes).
// Not thread-safe: DynamicBatcher guards it with its mutex. Never blocks.
class BusyArrivalRate {
 public:
  static constexpr std::chrono::milliseconds kMemory{250};

  // Brings the sums to `now`, the batcher having been `busy` (or not) since the last call. A time
  // before the last one (read before the caller got its lock) adds nothing.
  void advance(Clock::time_point now, bool busy);
  // One request arrived while busy; call advance() first.
  void count_arrival() { arrivals_ += 1.0; }
  // Arrivals per second of busy time, counting `prior_s` more seconds of busy time without an
  // arrival: once the sums have faded (no recent traffic) the estimate falls to zero.
  double per_second(double prior_s) const;

 private:
  Clock::time_point last_{};
  double arrivals_ = 0.0;  // decayed count
  double busy_s_ = 0.0;    // decayed seconds
};

// The queues of one model version and the rules that cut them into batches.
//
// Requests wait in one FIFO per priority level (1 first). A batch starts from the first waiting
// request in priority order and takes the following requests of the same shape (shape_key) in
// order, skipping - not stopping at - requests of other shapes, which keep their place for a
// later batch (Triton stops at the first mismatch). It is sent at once when it reaches
// max_batch_size or the next request would not fit, or when it has reached a preferred size (the
// largest reached). Short of those, max_queue_delay_us bounds the wait for company, it does not
// fix it: the batch waits only while the recent arrivals seen while busy (BusyArrivalRate, `rate`)
// predict at least one more request before its oldest has waited the delay - that is, until
// `oldest + delay - 1/rate` - and goes at once when they predict none. A lone closed-loop client
// (concurrency 1), whose next request can only follow this one's answer, so never finds the
// batcher busy, adds no waiting; concurrent traffic, whose requests arrive while others wait or
// compute, still batches up to the delay. The estimate counts kPriorDelays delays of busy time
// without an arrival on top of what it saw, so a few stray arrivals cannot make a request wait;
// after traffic stops, a lone request goes at once after about kMemory * ln(A / kPriorDelays),
// A being the decayed count of busy arrivals when it stopped (about rate * kMemory).
// Requests whose caller's deadline passes in the queue are answered DEADLINE_EXCEEDED; those whose
// queue timeout passes are rejected (UNAVAILABLE) or, with DELAY, moved behind every waiting
// request of their level. Both happen at that time even while every taker is busy computing: an
// expiry watcher (next_expired) sleeps until the earliest one.
// Invariant: a request is in exactly one queue, or handed out exactly once (batch, rejection or
// cancel). Every method is thread-safe: all state, the estimate included, is guarded by one
// mutex (no atomics, so no memory-ordering subtleties).
class DynamicBatcher final : public RequestBatcher {
 public:
  explicit DynamicBatcher(BatcherOptions options);

  // Queues `request`, or fails leaving it with the caller: INVALID_ARGUMENT for a priority above
  // the levels, RESOURCE_EXHAUSTED when its level's queue is full, UNAVAILABLE once closed.
  // Never blocks beyond the internal lock.
  Status enqueue(std::unique_ptr<InferenceRequest>&& request) override;
  std::optional<uint64_t> admit_answered() override;

  // Blocks until a batch is due or requests must be answered without running. Fills `batch`
  // (maybe empty) and `rejected`; returns false only when closed and nothing is left. A call is
  // taken to mean its caller is free again: the batch it took last, if any, has finished running.
  // Every instance takes from the same queues.
  bool next_batch(std::vector<std::unique_ptr<InferenceRequest>>* batch, std::vector<Rejection>* rejected);
  bool next_batch(uint32_t, std::vector<std::unique_ptr<InferenceRequest>>* batch,
                  std::vector<Rejection>* rejected) override {
    return next_batch(batch, rejected);
  }

  // For one expiry-watching thread: blocks until queued requests' deadlines or queue timeouts pass
  // and moves them into `rejected` (true), so they are answered when due although every
  // next_batch caller is busy computing; false once closed. Requests without either never wake it.
  bool next_expired(std::vector<Rejection>* rejected) override;
  // Takes the request with `token` out of the queues; nullptr if it is not waiting (running or done).
  std::unique_ptr<InferenceRequest> cancel(uint64_t token) override;

  // Ends intake and wakes waiters; queued requests still leave through next_batch.
  void close() override;
  // Removes every waiting request (for a shutdown that rejects them).
  std::vector<std::unique_ptr<InferenceRequest>> take_all() override;
  size_t size() const override;
  // The arrival estimate the waiting rule reads now, in requests per second of busy time (prior
  // included). Thread-safe; never blocks beyond the internal lock.
  double busy_arrival_rate() const;
  const BatcherOptions& options() const { return options_; }

  // The estimate's prior: this many max_queue_delays of busy time without an arrival.
  static constexpr double kPriorDelays = 4.0;

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
  // Brings the arrival estimate to `now`; call before any change to size_ or batches_out_.
  void advance_estimate(Clock::time_point now) { rate_.advance(now, busy()); }
  bool busy() const { return size_ > 0 || batches_out_ > 0; }
  // When waiting for company stops paying off for a batch due at `due`: the time after which
  // fewer than one more arrival is expected before `due`; `now` when none is expected now.
  Clock::time_point stop_waiting_at(Clock::time_point now, Clock::time_point due) const;
  template <typename Fn>
  void for_each_queue(Fn&& fn);

  const BatcherOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::condition_variable expiry_changed_;  // wakes the expiry watcher only
  std::vector<Level> levels_;               // guarded by mutex_; index 0 = priority 1
  size_t size_ = 0;                         // guarded by mutex_
  uint64_t next_sequence_ = 0;              // guarded by mutex_
  bool closed_ = false;                     // guarded by mutex_
  size_t batches_out_ = 0;                  // guarded by mutex_: handed out, their takers not back yet
  BusyArrivalRate rate_;                    // guarded by mutex_
  // Guarded by mutex_: when the expiry watcher wakes next (max: it waits to be woken); an earlier
  // expiry enqueued wakes it.
  Clock::time_point expiry_watch_until_ = Clock::time_point::max();
};

}  // namespace inferd
