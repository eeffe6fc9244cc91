#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace inferd {

// The requests an executor is running, by token, each with the flag that tells the executor it
// was cancelled (RequestCancellation::flag): a request already in a batch cannot be taken out,
// but a model that answers each request (Triton's python backend: request.is_cancelled()) can
// stop early. Thread-safe.
//
// A request taken from the batcher is staged (its inputs gathered) before its Watch registers it;
// a cancel in between finds it neither queued nor running. Such a cancel is remembered, among the
// last kRememberedCancels, and the request's flag starts set when its Watch registers it. Tokens
// are unique to a request, so a remembered cancel of a request that already finished (a cancel
// that came too late) can match no other.
//
// Invariants: a token is present from the Watch that registered it until that Watch is
// destroyed; a flag, once set, stays set; flags outlive the map entry (shared with the executor);
// at most kRememberedCancels cancels are remembered, each until its request registers.
class RunningRequests {
 public:
  using Flag = std::shared_ptr<const std::atomic<bool>>;

  static constexpr size_t kRememberedCancels = 256;

  // Registers a batch's tokens for its execution; they are forgotten when it is destroyed.
  class Watch {
   public:
    Watch(RunningRequests* owner, std::vector<uint64_t> tokens) : owner_(owner), tokens_(std::move(tokens)) {
      flags_.reserve(tokens_.size());
      std::lock_guard<std::mutex> lock(owner_->mutex_);
      for (const uint64_t token : tokens_) {
        auto flag = std::make_shared<std::atomic<bool>>(owner_->take_remembered_cancel(token));
        owner_->running_[token] = flag;
        flags_.push_back(std::move(flag));
      }
    }
    ~Watch() {
      std::lock_guard<std::mutex> lock(owner_->mutex_);
      for (const uint64_t token : tokens_) owner_->running_.erase(token);
    }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    // The flag of the i-th token given.
    Flag flag(size_t i) const { return flags_.at(i); }

   private:
    RunningRequests* const owner_;
    const std::vector<uint64_t> tokens_;
    std::vector<std::shared_ptr<std::atomic<bool>>> flags_;
  };

  // Sets the flag of the running request with `token`; returns whether one was running. Else
  // remembers the cancel for a Watch still to come (the request may be being staged).
  bool cancel(uint64_t token) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = running_.find(token);
    if (found == running_.end()) {
      if (remembered_cancels_.size() == kRememberedCancels) remembered_cancels_.pop_front();
      remembered_cancels_.push_back(token);
      return false;
    }
    found->second->store(true, std::memory_order_release);
    return true;
  }

 private:
  // Whether `token` was cancelled before it ran; forgets that cancel. Requires mutex_.
  bool take_remembered_cancel(uint64_t token) {
    const auto found = std::find(remembered_cancels_.begin(), remembered_cancels_.end(), token);
    if (found == remembered_cancels_.end()) return false;
    remembered_cancels_.erase(found);
    return true;
  }

  std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<std::atomic<bool>>> running_;  // guarded by mutex_
  std::deque<uint64_t> remembered_cancels_;                         // guarded by mutex_, oldest first
};

}  // namespace inferd
