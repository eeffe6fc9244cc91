#pragma once

// The Scheduler's batch between taking and executing it, and the pipelined instance's handoff of
// one; private to cpp/src (the Scheduler's files).

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "inferd/executor.h"
#include "inferd/inference_request.h"
#include "inferd/model_statistics.h"
#include "inferd/scheduler.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// A batch taken from the batcher with its inputs gathered (and, for a pipelined executor, staged).
struct Scheduler::StagedBatch {
  std::vector<std::unique_ptr<InferenceRequest>> requests;
  std::vector<Tensor> inputs;
  std::vector<ExecutorRequest> request_inputs;  // instead of `inputs`, for an executor answering each request
  BatchTimeline timeline;
  Status status;                 // not ok: gathering or staging failed; the requests are failed with it
  bool executor_failed = false;  // the executor (stage, execute or its outputs), not gathering, failed
};

// The handoff between a pipelined instance's stager thread and its worker: holds at most one
// staged batch, so the stager runs one batch ahead. Thread-safe.
class Scheduler::StagedBatchSlot {
 public:
  // Blocks while a batch is waiting (the worker takes every batch, so it returns).
  void put(StagedBatch&& batch) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !batch_; });
    batch_ = std::move(batch);
    staging_ = false;
    changed_.notify_all();
  }
  // Blocks until a batch is there (true) or the stager has finished and nothing is left (false).
  bool take(StagedBatch* out) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return batch_ || finished_; });
    if (!batch_) return false;
    *out = std::move(*batch_);
    batch_.reset();
    changed_.notify_all();
    return true;
  }
  void finish() {  // the stager has nothing more
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    changed_.notify_all();
  }
  // The stager, before it stages a batch: waits while the worker has paused staging.
  void begin_staging() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !paused_; });
    staging_ = true;
  }
  // The worker: stops the stager before its next batch and returns, in staging order, the
  // batches it had already staged (they are on the executor and must execute first).
  std::vector<StagedBatch> pause() {
    std::vector<StagedBatch> staged;
    std::unique_lock<std::mutex> lock(mutex_);
    paused_ = true;
    for (;;) {
      changed_.wait(lock, [&] { return batch_ || !staging_; });
      if (!batch_) return staged;
      staged.push_back(std::move(*batch_));
      batch_.reset();
      changed_.notify_all();
    }
  }
  void resume() {
    std::lock_guard<std::mutex> lock(mutex_);
    paused_ = false;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<StagedBatch> batch_;  // guarded by mutex_
  bool finished_ = false;             // guarded by mutex_
  bool paused_ = false;               // guarded by mutex_: the worker is isolating a failed batch
  bool staging_ = false;              // guarded by mutex_: from begin_staging() to put()
};

}  // namespace inferd
