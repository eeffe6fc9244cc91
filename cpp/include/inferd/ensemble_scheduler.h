#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "inferd/completion_queue.h"
#include "inferd/inference_request.h"
#include "inferd/model_statistics.h"
#include "inferd/request_scheduler.h"
#include "inferd/response_cache.h"
#include "inferd/scheduler.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// A tensor of an ensemble's own signature (config `input` / `output`).
struct EnsembleTensor {
  std::string name;
  DataType dtype = DataType::kFp32;
  std::vector<int64_t> dims;  // without the batch dim; -1 = any
};

// One `ensemble_scheduling.step`. Both maps pair a name of the composing model with a name of the
// ensemble's tensors (an ensemble input or another step's output).
struct EnsembleStepMapping {
  std::string model_tensor;     // the composing model's input or output name
  std::string ensemble_tensor;  // the ensemble's tensor it reads or writes
};
struct EnsembleStep {
  std::string model_name;
  int64_t model_version = -1;  // -1 = the latest version the resolver finds
  // One entry per input of the composing model, in that model's input order (the order its
  // Scheduler takes inputs in).
  std::vector<EnsembleStepMapping> input_map;
  // The outputs the ensemble keeps: `model_output` indexes the composing model's output order.
  struct Output {
    uint32_t model_output = 0;
    EnsembleStepMapping mapping;
  };
  std::vector<Output> output_map;
};

// An ensemble (Triton's `platform: "ensemble"`) as the core runs it.
struct EnsembleDefinition {
  std::string name;  // used in messages
  int64_t max_batch_size = 0;
  std::vector<EnsembleTensor> inputs;   // the order requests give their inputs in
  std::vector<EnsembleTensor> outputs;  // the order answers give their outputs in
  std::vector<EnsembleStep> steps;
};

// The Scheduler that runs a composing model's version now, and that version's number.
struct ResolvedScheduler {
  std::shared_ptr<Scheduler> scheduler;  // null when no such version is loaded
  int64_t version = 0;
};
// Finds the Scheduler of a composing model's version (-1 = latest). Called once per step of each
// request, so a model reloaded meanwhile is found anew.
using SchedulerResolver = std::function<ResolvedScheduler(const std::string& model, int64_t version)>;

// One step's requests, from their submission to their answer.
struct EnsembleStepStatistics {
  Duration success;  // answered with outputs
  Duration fail;     // answered with an error (the step's own; a cancelled step counts here)
};

// What EnsembleScheduler::statistics() reports: the ensemble's own counts and durations, from
// submit() to the answer, in a model's shape as Triton reports an ensemble (one execution per
// request, rows as inferences, queue and compute durations its successful steps' summed; the
// composing models count their steps in their own statistics too); and per step.
struct EnsembleStatisticsSnapshot {
  uint64_t requests = 0;                      // accepted by submit()
  StatisticsSnapshot model;                   // success: answered with every output; fail: with an error
  std::vector<EnsembleStepStatistics> steps;  // per step, in the definition's order
};

// Runs an ensemble's steps as a dataflow graph over the composing models' own Schedulers.
//
// submit() stores the request's inputs in the run's tensor table and starts every step whose
// inputs all exist, each as an InferenceRequest submitted to the Scheduler the resolver returns
// for that step, with a CompletionSink of this class. No thread waits on a step: the step's
// completion (on the composing model's worker thread) stores its outputs in the table (Tensors
// share their buffers: nothing is copied between steps) and starts the steps that became ready, so
// independent steps run concurrently and ensemble traffic batches with direct traffic in each
// composing model's batcher. A step request carries the ensemble request's id, batch size,
// priority, queue timeout and deadline. When every ensemble output exists the request is answered
// with them in the definition's output order, its timing listing each finished step's. The first failing step fails the
// request (its code, a message naming the step's index and model, then the step's message); the run's later step
// completions are dropped. A step that cannot start (no scheduler: UNAVAILABLE; refused by its
// scheduler: that status) fails the request the same way.
//
// Preconditions (checked when the ensemble is loaded, not here): the steps form an acyclic graph;
// every step input is an ensemble input or exactly one step's output; every ensemble output is
// produced by a step; each step's input_map lists the composing model's inputs in its order, with
// datatypes and shapes that model accepts; when max_batch_size > 0 every composing model batches;
// a tensor is produced once. Tensor owners must be safe to release on any thread (a step request
// may be released on a composing model's worker thread; the binding's owners take the GIL). A
// Scheduler the resolver returns must outlive the reference this class holds while submitting to
// it (its owner shuts it down and keeps it until after its workers have exited): the last
// reference to a Scheduler must never be released on that Scheduler's own worker thread.
//
// Invariants: every request submit() accepts gets exactly one answer - its outputs, a step's
// failure, CANCELLED after cancel(), or UNAVAILABLE at shutdown - to its own sink if it has one,
// else to the CompletionQueue; a step starts at most once per request and only once all its inputs
// exist; a run's state is touched only under its own lock, and no lock of this class is held while
// calling a Scheduler or a sink. Late step completions (after the answer) hold only shared state
// (never this object), so they are safe after this object is gone.
class EnsembleScheduler final : public RequestScheduler {
 public:
  // `response_cache`: the server's, when the ensemble's own answers are cached (null: not).
  EnsembleScheduler(EnsembleDefinition definition, SchedulerResolver resolver,
                    std::shared_ptr<CompletionQueue> completions,
                    std::shared_ptr<ResponseCache> response_cache = nullptr);
  // Shuts down if shutdown() was not called.
  ~EnsembleScheduler() override;
  EnsembleScheduler(const EnsembleScheduler&) = delete;
  EnsembleScheduler& operator=(const EnsembleScheduler&) = delete;

  // Takes a request whose inputs are the ensemble's inputs in the definition's order
  // (build_inference_request against the ensemble's signature makes them so). Refuses, leaving the
  // request with the caller: INVALID_ARGUMENT for a wrong input count or a token already in
  // flight, UNAVAILABLE after shutdown(). Otherwise owns the request and answers it exactly once,
  // possibly on this thread (a first step that cannot start). Thread-safe.
  Status submit(std::unique_ptr<InferenceRequest>&& request) override;

  // Cancels the request with `token` if it is still running: its queued steps are cancelled in
  // their schedulers, no further step starts, and the request is answered CANCELLED (a step
  // already computing runs to its end and is then dropped). Returns whether the request was
  // running. Thread-safe; the answer may be delivered on this thread.
  bool cancel(uint64_t token) override;

  // Closes intake and answers every running request UNAVAILABLE, cancelling its queued steps.
  // Thread-safe and idempotent; never waits for a step.
  void shutdown();

  // Closes intake and blocks until every running request has been answered (its steps run on in
  // their composing models, whose own shutdown answers what they hold). Thread-safe.
  void drain();

  EnsembleStatisticsSnapshot statistics() const;
  size_t running_requests() const;

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
};

}  // namespace inferd
