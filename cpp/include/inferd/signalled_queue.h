#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <system_error>
#include <vector>

namespace inferd {

// Carries items from core threads to one consumer (the Python event loop) in bulk.
//
// The consumer watches fd() for readability (an eventfd), then calls drain(). The eventfd is
// written only when the queue goes from empty to non-empty, so a burst of items costs one wake-up
// and one drain, not one per item. With a capacity, push() drops an item past it (and counts it)
// instead of growing: for what may be lost (observations), never for what must arrive
// (completions, capacity 0).
// Invariant: whenever the queue is non-empty, the eventfd is readable or a drain is under way that
// will take every item pushed before it swaps the queue.
// Thread-safe. Lock rule: mutex_ guards items_ and dropped_; nothing is called under it but the
// eventfd's read and write.
template <typename T>
class SignalledQueue {
 public:
  // `capacity`: the most items waiting at once (0: no bound). Throws std::system_error if no
  // eventfd can be made.
  explicit SignalledQueue(size_t capacity = 0) : capacity_(capacity), fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  }
  ~SignalledQueue() { ::close(fd_); }  // undrained items are dropped
  SignalledQueue(const SignalledQueue&) = delete;
  SignalledQueue& operator=(const SignalledQueue&) = delete;

  // Takes `item`; false when the queue was full and it was dropped. Never blocks beyond the lock.
  bool push(T&& item) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (capacity_ != 0 && items_.size() >= capacity_) {
      ++dropped_;
      return false;
    }
    const bool was_empty = items_.empty();
    items_.push_back(std::move(item));
    if (was_empty) {
      // Written under the lock so a concurrent drain cannot swap the item out between the empty
      // check and the signal; a spurious wake-up drains nothing and is harmless.
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof(one));
    }
    return true;
  }

  // Resets the eventfd, then returns every waiting item, oldest first. Never blocks.
  std::vector<T> drain() {
    std::vector<T> out;
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t value = 0;
    [[maybe_unused]] ssize_t n = ::read(fd_, &value, sizeof(value));  // EAGAIN when not signalled
    out.swap(items_);
    return out;
  }

  // Items dropped because the queue was full, since the start.
  uint64_t dropped() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return dropped_;
  }

  // Readable while items wait. Owned by this object.
  int fd() const { return fd_; }

 private:
  const size_t capacity_;
  const int fd_;
  mutable std::mutex mutex_;
  std::vector<T> items_;  // guarded by mutex_
  uint64_t dropped_ = 0;  // guarded by mutex_
};

}  // namespace inferd
