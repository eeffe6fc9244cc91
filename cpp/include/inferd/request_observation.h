#pragma once

// What the transport reports of an inference it ran in the core while Python observes it (it was
// sampled for tracing, or verbose logs want a line per request): Python builds the request's span
// and log line from it afterwards, off the request's path. The request itself never waits on it.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/signalled_queue.h"
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

// The observed requests waiting for Python, bounded: observation must never slow or fail the
// request it observes, so past kObservationQueueCapacity waiting records a new one is dropped and
// counted (SignalledQueue::dropped).
using ObservationQueue = SignalledQueue<ObservedRequest>;
inline constexpr size_t kObservationQueueCapacity = 8192;

}  // namespace inferd
