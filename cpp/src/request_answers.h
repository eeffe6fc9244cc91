#pragma once

// What an executor that answers each request (Executor::answers_each_request, Executor::decoupled)
// is given and how its answers are checked: the request it gets and the shape check of its
// outputs (a decoupled executor's stream is decoupled_batch.h). Private to cpp/src (the
// Scheduler's run_requests and stage_batch, DecoupledBatch).

#include <cstdint>
#include <utility>
#include <vector>

#include "inferd/executor.h"
#include "inferd/inference_request.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// `request` as an executor answering each request is given it, `inputs` gathered: its id and the
// names of the outputs it asked for are views of the request and its signature, which outlive the
// batch's execution.
ExecutorRequest executor_request(const InferenceRequest& request, std::vector<Tensor>&& inputs);

// An executor that answers each request (a python model) computes its outputs' shapes itself: each
// output the request asked for must have the config's rank (one more with the batch dim), its
// batch dim equal to the request's batch size, and every fixed dim of the config; otherwise the
// request gets an INTERNAL error naming them, never a tensor its config does not allow (ONNX
// Runtime and TensorRT outputs come from models checked against the config at load). Outputs
// whose config reshapes them are left to the response writer. Outputs the request did not ask
// for may be empty stand-ins.
Status check_answer_shapes(const InferenceRequest& request, const std::vector<Tensor>& outputs);

}  // namespace inferd
