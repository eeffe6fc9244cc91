#pragma once

// What the transport reports of an inference it ran in the core while Python observes it (it was
// sampled for tracing, or verbose logs want a line per request): Python builds the request's span
// and log line from it afterwards, off the request's path. The request itself never waits on it.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/status.h"

namespace inferd {

// One observed inference, answered. Times on the core's steady clock.
struct ObservedRequest {
  std::string model;  // the version that ran it
  std::string version;
  std::string id;                                             // the request's id
  std::vector<std::pair<std::string, std::string>> metadata;  // the caller's, as it sent them
  bool sampled = false;                                       // traced: the transport's sampling rule picked it
  bool streamed = false;                                      // a request of a ModelStreamInfer call
  Clock::time_point received{}, answered{};
  Status status;           // what the request was answered with
  RequestTiming timing;    // how the core ran it (all zero when it never reached a scheduler)
  uint32_t responses = 0;  // answers sent for it (a decoupled request's may be many)
};

// A bounded queue of observed requests with an eventfd that Python's event loop waits on.
// Observation must never slow or fail the request it observes: push() never blocks past its
// lock, and past `capacity` waiting records it drops the new one and counts it.
// Thread-safe. Lock rule: mutex_ guards items_ and dropped_; nothing else is called under it but
// the eventfd's write.
class ObservationQueue {
 public:
  explicit ObservationQueue(size_t capacity = 8192);  // throws std::system_error without an eventfd
  ~ObservationQueue();                                // closes the fd; undrained records are dropped
  ObservationQueue(const ObservationQueue&) = delete;
  ObservationQueue& operator=(const ObservationQueue&) = delete;

  // Takes `observed`; false when the queue was full and it was dropped. Never blocks.
  bool push(ObservedRequest&& observed);
  // Resets the eventfd and returns every waiting record, oldest first. Never blocks.
  std::vector<ObservedRequest> drain();
  // Records dropped because the queue was full, since the start.
  uint64_t dropped() const;
  // Readable while records wait. Owned by this object.
  int fd() const { return fd_; }

 private:
  const size_t capacity_;
  int fd_ = -1;
  mutable std::mutex mutex_;
  std::vector<ObservedRequest> items_;  // guarded by mutex_
  uint64_t dropped_ = 0;                // guarded by mutex_
};

}  // namespace inferd
