#pragma once

#include <mutex>
#include <vector>

#include "inferd/inference_request.h"

namespace inferd {

// Carries completions from core worker threads to one consumer (the Python event loop) in bulk.
//
// The consumer watches fd() for readability (an eventfd), then calls drain(). The eventfd is
// written only when the queue goes from empty to non-empty, so a burst of completions costs one
// wake-up and one drain, not one per request.
// Invariant: whenever the queue is non-empty, the eventfd is readable or a drain is under way
// that will take every item pushed before it swaps the queue.
class CompletionQueue {
 public:
  CompletionQueue();   // throws std::system_error if no eventfd can be made
  ~CompletionQueue();  // closes the fd; undrained completions are dropped
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // Thread-safe; never blocks beyond the internal lock. Takes ownership of `completion`.
  void push(Completion&& completion);
  // Thread-safe; never blocks. Resets the eventfd, then returns every queued completion, oldest first.
  std::vector<Completion> drain();
  // The readable-when-non-empty file descriptor. Owned by this object.
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::mutex mutex_;
  std::vector<Completion> items_;  // guarded by mutex_
};

}  // namespace inferd
