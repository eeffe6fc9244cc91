#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "inferd/infer_request_parser.h"
#include "inferd/inference_request.h"
#include "inferd/request_token.h"
#include "inferd/serving_snapshot.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// Python models' calls to other models (Triton's BLS, InferenceRequest.exec), run by the core
// without the server's Python: routed by the serving snapshot the transport answers from, checked
// by build_inference_request and submitted to the version's scheduler, as a client's request is.
// What the snapshot cannot route (none published yet, a name or version it has no route for, the
// server not accepting) is left to the caller, which asks Python: its registry's words, as the
// transport forwards what it cannot answer.

// A call as the core runs it: the request as parsed, viewing what `owner` keeps alive until the
// core lets the request go.
struct ModelCall {
  ParsedInferRequest parsed;
  std::shared_ptr<const void> owner;
  Clock::time_point deadline = Clock::time_point::max();
};

// A call's answer: the outputs it carries (those it asked for, in its order; every output in model
// order when it asked for none) by name, in the protocol's shape, viewing the completion they came
// in (each tensor's owner keeps it); or its failure.
struct ModelCallAnswer {
  Status status;
  std::vector<std::pair<std::string, Tensor>> outputs;
};

using ModelCallDone = std::function<void(ModelCallAnswer&&)>;

// One started call. Answered exactly once: by its completion, or by cancel() before that.
// Thread-safe.
class ModelCallHandle : public CompletionSink {
 public:
  ModelCallHandle(std::weak_ptr<RequestScheduler> scheduler, uint64_t token, ModelCallDone done)
      : scheduler_(std::move(scheduler)), token_(token), done_(std::move(done)) {}

  void complete(Completion&& completion) override;
  // Answers the call `status` at once, unless it was answered; its request is cancelled where it
  // still waits in its queue (a computing one runs on, and its answer is dropped).
  void cancel(const Status& status);
  // Answers the call `status` at once, unless it was answered (a request never submitted).
  void fail(const Status& status) { answer(ModelCallAnswer{status, {}}); }
  // Answers the call, unless it was answered (a call run elsewhere: Python's).
  void answer(ModelCallAnswer&& answer);

 private:
  // Whether this caller is the one to answer (the first to ask).
  bool claim() { return !answered_.exchange(true, std::memory_order_acq_rel); }

  const std::weak_ptr<RequestScheduler> scheduler_;
  const uint64_t token_;
  ModelCallDone done_;  // called once, by the claimer
  std::atomic<bool> answered_{false};
};

// Routes and starts calls. Thread-safe; never blocks on compute.
class ModelCalls {
 public:
  // A read of the snapshot routes come from, held until the call is submitted (ServingState).
  using SnapshotSource = std::function<ServingState::Reading()>;

  // Where routes come from from now on (the transport's serving state, once the server serves).
  void serve_from(SnapshotSource source);

  // Starts `call`: null when no route takes it (the caller asks Python then, and `done` is not
  // called), else its handle, whose `done` is called once, on any thread, maybe before this
  // returns (a refused or malformed request is answered at once with its status).
  std::shared_ptr<ModelCallHandle> start(ModelCall call, ModelCallDone done);

 private:
  mutable std::mutex mutex_;
  SnapshotSource source_;  // guarded by mutex_; empty until serve_from
  RequestTokenCounter tokens_{kModelCallTokenRange, 1};
};

}  // namespace inferd
