#pragma once

#include <cstdint>
#include <memory>

#include "inferd/inference_request.h"
#include "inferd/status.h"

namespace inferd {

// What a request naming a model is handed to once it has been checked against that model's
// signature: a model version's Scheduler, or an EnsembleScheduler that runs the request through
// other models' Schedulers. The transport and the bindings route to either alike.
//
// Contract of every implementation: submit() either refuses (the request stays with the caller)
// or owns the request and answers it exactly once, to its sink if it has one, else to the
// implementation's CompletionQueue; cancel() answers a request that has not started computing
// CANCELLED and returns whether it did anything. Both are thread-safe and never block on compute.
class RequestScheduler {
 public:
  virtual ~RequestScheduler() = default;
  virtual Status submit(std::unique_ptr<InferenceRequest>&& request) = 0;
  virtual bool cancel(uint64_t token) = 0;
};

}  // namespace inferd
