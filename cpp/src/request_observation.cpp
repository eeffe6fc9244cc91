#include "inferd/request_observation.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace inferd {

ObservationQueue::ObservationQueue(size_t capacity)
    : capacity_(capacity), fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

ObservationQueue::~ObservationQueue() { ::close(fd_); }

bool ObservationQueue::push(ObservedRequest&& observed) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (items_.size() >= capacity_) {
    ++dropped_;
    return false;
  }
  const bool was_empty = items_.empty();
  items_.push_back(std::move(observed));
  if (was_empty) {
    // Under the lock, as CompletionQueue does: a concurrent drain cannot take the record between
    // the check and the signal; a spurious wake-up drains nothing.
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof(one));
  }
  return true;
}

std::vector<ObservedRequest> ObservationQueue::drain() {
  std::vector<ObservedRequest> out;
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t value = 0;
  [[maybe_unused]] ssize_t n = ::read(fd_, &value, sizeof(value));  // EAGAIN when not signalled
  out.swap(items_);
  return out;
}

uint64_t ObservationQueue::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

}  // namespace inferd
