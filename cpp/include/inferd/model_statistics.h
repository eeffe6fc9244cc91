#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "inferd/inference_request.h"

namespace inferd {

// A count of events and their summed duration.
struct Duration {
  uint64_t count = 0;
  uint64_t ns = 0;
  void add(uint64_t n, uint64_t total_ns) {
    count += n;
    ns += total_ns;
  }
};

// A fixed-bucket latency histogram, for Prometheus: 100 µs .. 10 s. counts[i] counts values at
// most kBoundsUs[i] (and above the bound before it); the last count is above every bound.
struct LatencyHistogram {
  static constexpr std::array<uint64_t, 12> kBoundsUs = {100,   250,   500,   1000,   2500,    5000,
                                                         10000, 25000, 50000, 100000, 1000000, 10000000};
  std::array<uint64_t, kBoundsUs.size() + 1> counts{};
  uint64_t sum_ns = 0;
  void add(uint64_t ns);
};

// Durations of one batch execution's three compute phases.
struct BatchDurations {
  Duration compute_input, compute_infer, compute_output;
};

// What ModelStatistics reports: Triton's InferStatistics plus per-batch-size figures.
struct StatisticsSnapshot {
  uint64_t last_inference_ms = 0;  // wall clock, ms since the epoch; 0 = never
  uint64_t inference_count = 0;    // inferences computed: a request of batch size n counts n
  uint64_t execution_count = 0;    // batch executions
  Duration success, fail, queue, compute_input, compute_infer, compute_output;
  std::map<uint64_t, BatchDurations> batches;  // keyed by batch size (rows of all its requests)
  // Per request, from its enqueue to its answer (successes and failures in the core), and the
  // time it waited in the queue (successes).
  LatencyHistogram request_duration, queue_duration;
  // Decoupled models only (0 and empty for the others): responses sent (streamed ones, and a final
  // result that carries a response: ok or an error), and per request the time from its enqueue to
  // its first response (or to its final flag, when that comes first).
  uint64_t responses = 0;
  LatencyHistogram first_response;
  // A model with response_cache: hits (each also a success and a queue entry, but neither an
  // inference nor an execution) with the time to answer them, and misses with the time their
  // lookup and their answer's insert took.
  Duration cache_hit, cache_miss;
};

// The timestamps of one batch's trip through a worker, taken with the monotonic clock.
struct BatchTimeline {
  Clock::time_point start, input_done, infer_done, output_done;
};

// Cumulative statistics of one model version. Thread-safe: every method takes the internal lock
// briefly and never blocks otherwise.
class ModelStatistics {
 public:
  // Records a successfully computed batch of `requests` (each contributes its enqueue time and
  // its batch size: requests count for the success and queue figures, rows for the inferences).
  void record_batch(const std::vector<std::unique_ptr<InferenceRequest>>& requests, const BatchTimeline& timeline);
  void record_batch(const std::vector<const InferenceRequest*>& requests, const BatchTimeline& timeline);
  // One step of an iterative model's batch (sequence_batching.iterative_sequence): an execution
  // of every row `stepped` holds; of its requests, only those `finished` by it (their generation
  // ended) count as requests, their duration from their enqueue, charged this step's compute.
  void record_step(const std::vector<const InferenceRequest*>& stepped,
                   const std::vector<const InferenceRequest*>& finished, const BatchTimeline& timeline);
  // Records `count` requests that failed after `total_ns` in the core (queued or computing).
  void record_failures(uint64_t count, uint64_t total_ns);
  // Records one request of `rows` answered after `total_ns` that rode no batch of this model's
  // own (an ensemble's): one execution, as Triton counts an ensemble's, its queue and compute
  // phases the sums of its steps' (`phases`: queue, compute input, infer, output, in ns).
  void record_request(int64_t rows, uint64_t total_ns, const std::array<uint64_t, 4>& phases);
  // A decoupled model's request: `responses` more responses sent, and, when `first_response_ns`
  // is given, the time from its enqueue to its first response.
  void record_responses(uint64_t responses, std::optional<uint64_t> first_response_ns);
  // A request answered from the response cache after `total_ns`.
  void record_cache_hit(uint64_t total_ns);
  // `count` cache misses (0: more time for one already counted: its answer's insert) and `ns`.
  void record_cache_miss(uint64_t count, uint64_t ns);
  StatisticsSnapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  StatisticsSnapshot stats_;  // guarded by mutex_
};

}  // namespace inferd
