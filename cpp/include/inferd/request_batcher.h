#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/status.h"

namespace inferd {

// A request the batcher took out of its queues unanswered, and the status to answer it with.
using Rejection = std::pair<std::unique_ptr<InferenceRequest>, Status>;

// Where a Scheduler takes its batches from: the queues of one model version and the rules that
// cut them into batches. DynamicBatcher has Triton's dynamic (and default) batching,
// SequenceBatcher its sequence batcher. Every method is thread-safe.
class RequestBatcher {
 public:
  virtual ~RequestBatcher() = default;

  // Queues `request`, or fails leaving it with the caller (the status says why). Never blocks
  // beyond the batcher's lock.
  virtual Status enqueue(std::unique_ptr<InferenceRequest>&& request) = 0;
  // Blocks until a batch is due for executor instance `instance` or requests must be answered
  // without running. Fills `batch` (maybe empty) and `rejected`; returns false only when closed
  // and nothing is left for that instance.
  virtual bool next_batch(uint32_t instance, std::vector<std::unique_ptr<InferenceRequest>>* batch,
                          std::vector<Rejection>* rejected) = 0;
  // For one expiry-watching thread: blocks until queued requests must be answered without running
  // (their deadlines passed) and moves them into `rejected` (true); false once closed.
  virtual bool next_expired(std::vector<Rejection>* rejected) = 0;
  // A place in the completion order (InferenceRequest::sequence) for a request answered without
  // being queued (a response cache hit), so that preserve_ordering holds for it too; nullopt once
  // closed. A batcher of stateful models, which are never cached, admits none.
  virtual std::optional<uint64_t> admit_answered() { return std::nullopt; }
  // Takes the request with `token` out of the queues; nullptr if it is not waiting.
  virtual std::unique_ptr<InferenceRequest> cancel(uint64_t token) = 0;
  // A request that was queued here has had its final answer, however it ended (computed, failed,
  // rejected, cancelled). The batcher may take back what it lent the request (its sequence's state).
  virtual void finished(InferenceRequest& request) { (void)request; }
  // Ends intake and wakes waiters; queued requests still leave through next_batch.
  virtual void close() = 0;
  // Removes every waiting request (for a shutdown that rejects them).
  virtual std::vector<std::unique_ptr<InferenceRequest>> take_all() = 0;
  virtual size_t size() const = 0;
};

}  // namespace inferd
