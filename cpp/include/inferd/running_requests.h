#pragma once

#include <atomic>
#include <cstdint>
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
// Invariants: a token is present from the Watch that registered it until that Watch is
// destroyed; a flag, once set, stays set; flags outlive the map entry (shared with the executor).
class RunningRequests {
 public:
  using Flag = std::shared_ptr<const std::atomic<bool>>;

  // Registers a batch's tokens for its execution; they are forgotten when it is destroyed.
  class Watch {
   public:
    Watch(RunningRequests* owner, std::vector<uint64_t> tokens) : owner_(owner), tokens_(std::move(tokens)) {
      flags_.reserve(tokens_.size());
      std::lock_guard<std::mutex> lock(owner_->mutex_);
      for (const uint64_t token : tokens_) {
        auto flag = std::make_shared<std::atomic<bool>>(false);
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

  // Sets the flag of the running request with `token`; returns whether one was running.
  bool cancel(uint64_t token) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = running_.find(token);
    if (found == running_.end()) return false;
    found->second->store(true, std::memory_order_release);
    return true;
  }

 private:
  std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<std::atomic<bool>>> running_;  // guarded by mutex_
};

}  // namespace inferd
