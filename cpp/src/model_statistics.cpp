#include "inferd/model_statistics.h"

#include <chrono>
#include <memory>

namespace inferd {

void LatencyHistogram::add(uint64_t ns) {
  const uint64_t us = ns / 1000;
  size_t bucket = 0;
  while (bucket < kBoundsUs.size() && us > kBoundsUs[bucket]) ++bucket;
  ++counts[bucket];
  sum_ns += ns;
}

void ModelStatistics::record_batch(const std::vector<std::unique_ptr<InferenceRequest>>& requests,
                                   const BatchTimeline& timeline) {
  std::vector<const InferenceRequest*> viewed;
  viewed.reserve(requests.size());
  for (const auto& request : requests) viewed.push_back(request.get());
  record_batch(viewed, timeline);
}

void ModelStatistics::record_batch(const std::vector<const InferenceRequest*>& requests, const BatchTimeline& t) {
  record_step(requests, requests, t);
}

void ModelStatistics::record_step(const std::vector<const InferenceRequest*>& stepped,
                                  const std::vector<const InferenceRequest*>& finished, const BatchTimeline& t) {
  const uint64_t n = finished.size();
  uint64_t rows = 0, queue_ns = 0, total_ns = 0;
  LatencyHistogram request_duration, queue_duration;  // this batch's, merged under the lock
  for (const auto& request : stepped) rows += static_cast<uint64_t>(request->batch_size);
  for (const auto& request : finished) {
    const uint64_t queued = ns_between(request->enqueue_time, t.start);
    const uint64_t total = ns_between(request->enqueue_time, t.output_done);
    queue_ns += queued;
    total_ns += total;
    queue_duration.add(queued);
    request_duration.add(total);
  }
  const uint64_t input_ns = ns_between(t.start, t.input_done);
  const uint64_t infer_ns = ns_between(t.input_done, t.infer_done);
  const uint64_t output_ns = ns_between(t.infer_done, t.output_done);
  const auto now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());

  std::lock_guard<std::mutex> lock(mutex_);
  stats_.last_inference_ms = static_cast<uint64_t>(now_ms.count());
  stats_.inference_count += rows;
  stats_.execution_count += 1;
  stats_.success.add(n, total_ns);
  stats_.queue.add(n, queue_ns);
  // As Triton does, every request of the batch is charged the batch's compute time.
  stats_.compute_input.add(n, input_ns * n);
  stats_.compute_infer.add(n, infer_ns * n);
  stats_.compute_output.add(n, output_ns * n);
  BatchDurations& batch = stats_.batches[rows];
  batch.compute_input.add(1, input_ns);
  batch.compute_infer.add(1, infer_ns);
  batch.compute_output.add(1, output_ns);
  for (size_t i = 0; i < request_duration.counts.size(); ++i) {
    stats_.request_duration.counts[i] += request_duration.counts[i];
    stats_.queue_duration.counts[i] += queue_duration.counts[i];
  }
  stats_.request_duration.sum_ns += request_duration.sum_ns;
  stats_.queue_duration.sum_ns += queue_duration.sum_ns;
}

void ModelStatistics::record_failures(uint64_t count, uint64_t total_ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.fail.add(count, total_ns);
  for (uint64_t i = 0; i < count; ++i) stats_.request_duration.add(total_ns / count);
}

void ModelStatistics::record_cache_hit(uint64_t total_ns) {
  const auto now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.last_inference_ms = static_cast<uint64_t>(now_ms.count());
  stats_.success.add(1, total_ns);
  stats_.queue.add(1, 0);  // as Triton counts a hit: queued, for no time
  stats_.cache_hit.add(1, total_ns);
  stats_.request_duration.add(total_ns);
  stats_.queue_duration.add(0);
}

void ModelStatistics::record_cache_miss(uint64_t count, uint64_t ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.cache_miss.add(count, ns);
}

void ModelStatistics::record_request(int64_t rows, uint64_t total_ns, const std::array<uint64_t, 4>& phases) {
  const auto now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.last_inference_ms = static_cast<uint64_t>(now_ms.count());
  stats_.inference_count += static_cast<uint64_t>(rows);
  stats_.execution_count += 1;
  stats_.success.add(1, total_ns);
  stats_.queue.add(1, phases[0]);
  stats_.compute_input.add(1, phases[1]);
  stats_.compute_infer.add(1, phases[2]);
  stats_.compute_output.add(1, phases[3]);
  stats_.request_duration.add(total_ns);
}

void ModelStatistics::record_responses(uint64_t responses, std::optional<uint64_t> first_response_ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.responses += responses;
  if (first_response_ns) stats_.first_response.add(*first_response_ns);
}

StatisticsSnapshot ModelStatistics::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace inferd
