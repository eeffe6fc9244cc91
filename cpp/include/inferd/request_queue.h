#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace inferd {

// An unbounded multi-producer, multi-consumer FIFO with a close() that ends intake.
//
// Invariants: items leave in the order they were pushed; once closed, push fails and never
// takes the item, while items already queued can still be popped (so nothing accepted is lost);
// pop_wait returns empty only when the queue is closed and drained.
// Every method is thread-safe.
template <typename T>
class RequestQueue {
 public:
  RequestQueue() = default;
  RequestQueue(const RequestQueue&) = delete;
  RequestQueue& operator=(const RequestQueue&) = delete;

  // Appends `item`. Does not block beyond the internal lock. On success the queue owns the item;
  // when closed, returns false and leaves `item` untouched so the caller can answer it.
  bool push(T&& item) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return false;
      items_.push_back(std::move(item));
    }
    ready_.notify_one();
    return true;
  }

  // Blocks until an item is available or the queue is closed and empty (then returns nullopt).
  std::optional<T> pop_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [this] { return !items_.empty() || closed_; });
    return pop_locked();
  }

  // Like pop_wait, but gives up after `timeout` and returns nullopt.
  template <typename Rep, typename Period>
  std::optional<T> pop_wait_for(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait_for(lock, timeout, [this] { return !items_.empty() || closed_; });
    return pop_locked();
  }

  // Never blocks beyond the internal lock; nullopt when empty.
  std::optional<T> try_pop() {
    std::lock_guard<std::mutex> lock(mutex_);
    return pop_locked();
  }

  // Removes and returns everything queued, oldest first. Never blocks beyond the internal lock.
  std::vector<T> drain() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<T> out;
    out.reserve(items_.size());
    for (auto& item : items_) out.push_back(std::move(item));
    items_.clear();
    return out;
  }

  // Ends intake and wakes every waiter. Idempotent.
  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    ready_.notify_all();
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_;
  }

  // A snapshot that may be stale by the time the caller reads it.
  size_t size_approx() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return items_.size();
  }

 private:
  // Requires mutex_ held.
  std::optional<T> pop_locked() {
    if (items_.empty()) return std::nullopt;
    std::optional<T> out(std::move(items_.front()));
    items_.pop_front();
    return out;
  }

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<T> items_;  // guarded by mutex_
  bool closed_ = false;  // guarded by mutex_
};

}  // namespace inferd
