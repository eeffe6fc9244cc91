#pragma once

// Iterative sequences (Triton's sequence_batching.iterative_sequence), the core's continuous
// batching: one request is a whole generation, run one step per batch; after each step it either
// ends or goes back to its batcher for the next step, fed what the step left.

#include <cstdint>
#include <utility>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/tensor.h"

namespace inferd {

// How an iterative model's request goes from one step to the next (the config's inferd.iterative
// parameters; its state is SequenceStates').
struct IterativeOptions {
  // (output, input), by index in the executor's outputs and inputs: after a step, the input is
  // the output's value (e.g. the token a decoder chose is its next step's input).
  std::vector<std::pair<uint32_t, uint32_t>> feedback;
  // An output whose first element, when not zero, ends the generation (e.g. DONE); -1: none.
  int64_t end_output = -1;
  // The most steps a request runs; it ends at the last whatever the end output says.
  uint32_t max_steps = 1;
};

// The rules of an iterative model's steps. Immutable; thread-safe.
class IterativeSteps {
 public:
  explicit IterativeSteps(IterativeOptions options) : options_(std::move(options)) {}

  // Whether `request`, having run a step (InferenceRequest::iteration counts it) whose outputs are
  // `outputs` (executor output order), has ended: its end output says so, or it ran max_steps.
  bool ended(const InferenceRequest& request, const std::vector<Tensor>& outputs) const;
  // Whether the step `request` runs next is its last by max_steps (its END control is then true).
  bool last_step(const InferenceRequest& request) const { return request.iteration + 1 >= options_.max_steps; }
  // Feeds the step's `outputs` back as the inputs the options name, in buffers of the request's
  // own (the outputs are views of the batch's memory).
  void feed_back(const std::vector<Tensor>& outputs, InferenceRequest* request) const;

 private:
  const IterativeOptions options_;
};

}  // namespace inferd
