#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "inferd/completion_queue.h"
#include "inferd/executor.h"
#include "inferd/inference_request.h"
#include "inferd/model_statistics.h"
#include "inferd/request_queue.h"

namespace inferd {

struct SchedulerOptions {
  std::string model_name;      // used in messages only
  int64_t max_batch_size = 0;  // 0: the model does not batch, dim 0 is an ordinary dim
};

// Owns one model version's request queue and one worker thread per executor instance. Each worker
// takes the next batch from the queue, gathers its inputs, runs its executor, scatters the outputs
// back per request and pushes one completion per request.
//
// Invariants: every request accepted by submit() gets exactly one completion, computed or failed,
// also across shutdown; each executor is used by one worker thread only; workers are joined before
// the scheduler is destroyed.
class Scheduler {
 public:
  enum class ShutdownMode {
    kDrain,   // queued requests are still computed
    kReject,  // queued requests are answered UNAVAILABLE without being computed
  };

  // Starts one worker per instance. `completions` outlives nothing: it is shared.
  Scheduler(SchedulerOptions options, std::vector<std::unique_ptr<Executor>> instances,
            std::shared_ptr<CompletionQueue> completions);
  // Shuts down with kDrain if shutdown() was not called. Blocks until the workers exit.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Checks that each input's bytes match its shape (INVALID_ARGUMENT if not) and queues `request`.
  // Thread-safe; never blocks beyond the queue lock. On success the scheduler owns the request; on
  // failure (that, or UNAVAILABLE once shut down) it stays with the caller.
  Status submit(std::unique_ptr<InferenceRequest>&& request);

  // Closes intake, answers or computes what is queued (per `mode`) and joins the workers.
  // Thread-safe and idempotent; blocks until every worker has exited.
  void shutdown(ShutdownMode mode);

  // Thread-safe, non-blocking snapshots.
  StatisticsSnapshot statistics() const { return statistics_.snapshot(); }
  size_t pending_requests() const { return queue_.size_approx(); }
  size_t instance_count() const { return instances_.size(); }

 private:
  void run_instance(Executor* executor);
  void execute_batch(Executor* executor, std::vector<std::unique_ptr<InferenceRequest>>* batch);
  void fail_batch(std::vector<std::unique_ptr<InferenceRequest>>* batch, const Status& status);

  const SchedulerOptions options_;
  std::vector<std::unique_ptr<Executor>> instances_;
  std::shared_ptr<CompletionQueue> completions_;
  RequestQueue<std::unique_ptr<InferenceRequest>> queue_;
  ModelStatistics statistics_;
  std::atomic<bool> reject_queued_{false};
  std::mutex shutdown_mutex_;         // serializes shutdown() callers
  std::vector<std::thread> workers_;  // guarded by shutdown_mutex_ after construction
};

}  // namespace inferd
