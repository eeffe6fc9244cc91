#pragma once

// A decoupled executor's batch (Executor::decoupled) from its execute_requests() until each of
// its requests has its final result, and the scheduler's side of all such batches. Private to
// cpp/src (the Scheduler's run_requests and shutdown).

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <vector>

#include "inferd/batch.h"
#include "inferd/executor.h"
#include "inferd/inference_request.h"
#include "inferd/model_statistics.h"
#include "inferd/running_requests.h"

namespace inferd {

class DecoupledBatch;

// The scheduler's decoupled batches with a request still open (RequestResult::pending: the
// model's execute returned before it sent that request's final response, as Triton's python
// backend allows; the instance takes its next batch meanwhile). Completes their requests through
// the scheduler until close(); the scheduler fails or waits out what is open before closing.
//
// Lock rules: use_mutex_ is held shared by every call that reaches the scheduler (its statistics,
// a sink, `complete_`), exclusively by close(), so that nothing reaches a scheduler being
// destroyed; count_mutex_ guards batches_ and open_ only. Order: a batch's mutex, then
// use_mutex_, then count_mutex_; none is held by this class across a call that takes a batch's.
class DecoupledRequests : public std::enable_shared_from_this<DecoupledRequests> {
 public:
  // Completes an open request with its final result (the scheduler's complete_open).
  using Complete = std::function<void(std::unique_ptr<InferenceRequest>, RequestResult&&, const RequestTiming&)>;

  DecoupledRequests(Complete complete, ModelStatistics* statistics)
      : complete_(std::move(complete)), statistics_(statistics) {}

  // A batch about to be executed: its requests (viewed while it executes) and the watch that
  // carries their cancellations, kept while one of them is open.
  std::shared_ptr<DecoupledBatch> open(const RequestBatch& requests, std::unique_ptr<RunningRequests::Watch> watch);
  // Every request still open ends with `status` (a shutdown that rejects).
  void fail_open(const Status& status);
  // Blocks until no request is open (a shutdown that drains).
  void wait_until_none_open();
  // From here nothing reaches the scheduler: a call for an open request changes nothing.
  void close();

 private:
  friend class DecoupledBatch;

  // Requires use_mutex_ (shared): whether the scheduler is still there.
  bool usable() const { return !closed_; }
  void ended(size_t count);

  const Complete complete_;
  ModelStatistics* const statistics_;
  mutable std::shared_mutex use_mutex_;
  bool closed_ = false;  // guarded by use_mutex_
  std::mutex count_mutex_;
  std::condition_variable none_open_;
  std::vector<std::weak_ptr<DecoupledBatch>> batches_;  // guarded by count_mutex_
  size_t open_ = 0;                                     // requests open, guarded by count_mutex_
};

// One decoupled batch's requests, answered through it during execute_requests() (its Stream) and
// after (LaterResponses, from any thread). While the batch executes, the scheduler's worker owns
// its requests and a final result given for one is kept until execute_requests returns (settle);
// after, each request left pending is owned here until its final result completes it. When the
// last copy goes, requests still open fail INTERNAL, so none is left without an answer.
//
// Lock rules: mutex_ guards everything below and is held across each call into a request's sink,
// so that one request's responses and final completion reach its sink one at a time, in order.
class DecoupledBatch final : public LaterResponses {
 public:
  // The ResponseStream execute_requests() gets: responses go to the batch; later() is the batch.
  class Stream final : public ResponseStream {
   public:
    explicit Stream(std::shared_ptr<DecoupledBatch> batch) : batch_(std::move(batch)) {}
    void respond(size_t index, RequestResult&& response) override { batch_->respond(index, std::move(response)); }
    std::shared_ptr<LaterResponses> later() override { return batch_; }

   private:
    std::shared_ptr<DecoupledBatch> batch_;
  };

  DecoupledBatch(std::shared_ptr<DecoupledRequests> owner, const RequestBatch& requests,
                 std::unique_ptr<RunningRequests::Watch> watch);
  ~DecoupledBatch() override;
  DecoupledBatch(const DecoupledBatch&) = delete;
  DecoupledBatch& operator=(const DecoupledBatch&) = delete;

  // execute_requests returned: with `status` not ok every request ends (the caller fails them);
  // else each pending result takes the final result given meanwhile, if one was, and each
  // request still pending moves from `requests` (left null) into this batch, to be completed
  // with `timing` once its final result comes. Records the response statistics of the finals.
  void settle(const Status& status, const RequestTiming& timing, std::vector<RequestResult>* results,
              RequestBatch* requests);

  bool respond(size_t index, RequestResult&& response) override;
  bool finish(size_t index, RequestResult&& result) override;
  size_t size() const { return ended_.size(); }

 private:
  // Requires mutex_: the request `index` names while it is open, else null.
  const InferenceRequest* open_request(size_t index) const;
  // Requires mutex_ and the owner's use_mutex_: records one response (or none, the final flag
  // alone) of request `index`, with its first response's latency.
  void record_response(size_t index, bool with_response);
  // Requires mutex_: lets the requests' cancellation watch go once every request ended.
  void release_watch_if_done();

  const std::shared_ptr<DecoupledRequests> owner_;
  std::mutex mutex_;
  bool executing_ = true;
  std::vector<const InferenceRequest*> executing_requests_;  // while executing_
  std::vector<std::unique_ptr<InferenceRequest>> pending_;   // after: the requests still open
  std::vector<std::optional<RequestResult>> early_finals_;   // given while executing_
  std::vector<bool> ended_;
  std::vector<bool> responded_;  // a first response was counted
  RequestTiming timing_;
  std::unique_ptr<RunningRequests::Watch> watch_;  // until every request ended
};

}  // namespace inferd
