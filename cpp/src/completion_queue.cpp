#include "inferd/completion_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <system_error>

namespace inferd {

CompletionQueue::CompletionQueue() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

CompletionQueue::~CompletionQueue() { ::close(fd_); }

void CompletionQueue::push(Completion&& completion) {
  bool was_empty = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    was_empty = items_.empty();
    items_.push_back(std::move(completion));
    if (was_empty) {
      // Written under the lock so a concurrent drain cannot swap the item out between the
      // empty check and the signal; a spurious wake-up drains nothing and is harmless.
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof(one));
    }
  }
}

std::vector<Completion> CompletionQueue::drain() {
  std::vector<Completion> out;
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t value = 0;
  [[maybe_unused]] ssize_t n = ::read(fd_, &value, sizeof(value));  // EAGAIN when not signalled
  out.swap(items_);
  return out;
}

}  // namespace inferd
