#include "decoupled_batch.h"

#include <algorithm>
#include <utility>

#include "request_answers.h"

namespace inferd {

std::shared_ptr<DecoupledBatch> DecoupledRequests::open(const RequestBatch& requests,
                                                        std::unique_ptr<RunningRequests::Watch> watch) {
  auto batch = std::make_shared<DecoupledBatch>(shared_from_this(), requests, std::move(watch));
  std::lock_guard<std::mutex> lock(count_mutex_);
  batches_.erase(std::remove_if(batches_.begin(), batches_.end(),
                                [](const std::weak_ptr<DecoupledBatch>& gone) { return gone.expired(); }),
                 batches_.end());
  batches_.push_back(batch);
  open_ += requests.size();
  return batch;
}

void DecoupledRequests::fail_open(const Status& status) {
  std::vector<std::shared_ptr<DecoupledBatch>> batches;
  {
    std::lock_guard<std::mutex> lock(count_mutex_);
    for (const auto& weak : batches_) {
      if (auto batch = weak.lock()) batches.push_back(std::move(batch));
    }
  }
  for (const auto& batch : batches) {
    for (size_t i = 0; i < batch->size(); ++i) batch->finish(i, RequestResult{status, {}});
  }
}

void DecoupledRequests::wait_until_none_open() {
  std::unique_lock<std::mutex> lock(count_mutex_);
  none_open_.wait(lock, [this] { return open_ == 0; });
}

void DecoupledRequests::close() {
  std::unique_lock<std::shared_mutex> lock(use_mutex_);
  closed_ = true;
}

void DecoupledRequests::ended(size_t count) {
  std::lock_guard<std::mutex> lock(count_mutex_);
  open_ -= count;
  if (open_ == 0) none_open_.notify_all();
}

DecoupledBatch::DecoupledBatch(std::shared_ptr<DecoupledRequests> owner, const RequestBatch& requests,
                               std::unique_ptr<RunningRequests::Watch> watch)
    : owner_(std::move(owner)),
      pending_(requests.size()),
      early_finals_(requests.size()),
      ended_(requests.size(), false),
      responded_(requests.size(), false),
      watch_(std::move(watch)) {
  for (const auto& request : requests) executing_requests_.push_back(request.get());
}

DecoupledBatch::~DecoupledBatch() {
  // The executor let go of the batch: what it left open would never be answered otherwise.
  for (size_t i = 0; i < ended_.size(); ++i) {
    if (ended_[i] || pending_[i] == nullptr) continue;
    finish(i, RequestResult{Status::Error(StatusCode::kInternal,
                                          "the model released the request without sending its final response"),
                            {}});
  }
}

const InferenceRequest* DecoupledBatch::open_request(size_t index) const {
  if (index >= ended_.size() || ended_[index]) return nullptr;
  return executing_ ? executing_requests_[index] : pending_[index].get();
}

void DecoupledBatch::record_response(size_t index, bool with_response) {
  std::optional<uint64_t> first_ns;
  if (!responded_[index]) {
    responded_[index] = true;
    const InferenceRequest* request = open_request(index);
    if (request != nullptr) first_ns = ns_between(request->enqueue_time, Clock::now());
  }
  owner_->statistics_->record_responses(with_response ? 1 : 0, first_ns);
}

void DecoupledBatch::release_watch_if_done() {
  // The watch points into the scheduler, which may go once no request is open.
  for (size_t i = 0; i < ended_.size(); ++i) {
    if (!ended_[i]) return;
  }
  watch_.reset();
}

bool DecoupledBatch::respond(size_t index, RequestResult&& response) {
  std::lock_guard<std::mutex> lock(mutex_);
  const InferenceRequest* request = open_request(index);
  if (request == nullptr || (executing_ && early_finals_[index].has_value())) return false;
  std::shared_lock<std::shared_mutex> use(owner_->use_mutex_);
  if (!owner_->usable()) return false;
  record_response(index, true);
  if (response.status.ok()) {
    const Status shapes = check_answer_shapes(*request, response.outputs);
    if (!shapes.ok()) response = RequestResult{shapes, {}};
  }
  if (request->sink) request->sink->respond(*request, std::move(response));
  return true;
}

bool DecoupledBatch::finish(size_t index, RequestResult&& result) {
  size_t ended = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_request(index) == nullptr) return false;
    if (executing_) {
      // Kept until execute_requests returns: the worker still owns the request.
      if (early_finals_[index].has_value()) return false;
      early_finals_[index] = std::move(result);
      return true;
    }
    std::shared_lock<std::shared_mutex> use(owner_->use_mutex_);
    if (!owner_->usable()) return false;
    record_response(index, result.respond || !result.status.ok());
    ended_[index] = true;
    owner_->complete_(std::move(pending_[index]), std::move(result), timing_);
    ended = 1;
    release_watch_if_done();
  }
  owner_->ended(ended);
  return true;
}

void DecoupledBatch::settle(const Status& status, const RequestTiming& timing, std::vector<RequestResult>* results,
                            RequestBatch* requests) {
  size_t ended = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_lock<std::shared_mutex> use(owner_->use_mutex_);
    timing_ = timing;
    for (size_t i = 0; i < ended_.size(); ++i) {
      if (ended_[i]) continue;
      RequestResult* result = status.ok() ? &(*results)[i] : nullptr;
      if (result != nullptr && result->pending && early_finals_[i].has_value()) *result = std::move(*early_finals_[i]);
      if (result != nullptr && result->pending) {
        pending_[i] = std::move((*requests)[i]);
        continue;
      }
      // Its final result is the worker's to complete (or the whole batch failed).
      record_response(i, result == nullptr || result->respond || !result->status.ok());
      ended_[i] = true;
      ++ended;
    }
    executing_ = false;
    executing_requests_.clear();
    early_finals_.clear();
    release_watch_if_done();
  }
  owner_->ended(ended);
}

}  // namespace inferd
