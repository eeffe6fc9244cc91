#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferd/executor.h"
#include "inferd/status.h"
#include "inferd/tensor.h"
#include "inferd/worker_messages.h"

namespace inferd {

// One request's answer as a python model's worker sent it: its outputs by name, or why it failed.
struct WorkerAnswer {
  Status status;
  std::vector<std::pair<std::string, Tensor>> outputs;
  bool rescheduled = false;  // the model gave the request back for another step (no outputs)
};

// A response the worker described (worker_messages.h) as an answer. Each output views `data`,
// which holds the arena's bytes from offset `data_offset` on (every place lies within it: the
// description was decoded against it) and is kept alive by `owner`; BYTES outputs are copied out
// and checked, so that a worker writing on cannot change what was checked. An error response
// fails INTERNAL with the model's message; a BYTES output that is not its shape's elements fails
// its answer naming it.
WorkerAnswer answer_of(const worker::ResponseDescription& response, const std::byte* data, uint64_t data_offset,
                       const std::shared_ptr<const void>& owner, const std::string& model_name);

// The model's declared outputs, in order, and what answers must hold.
struct DeclaredOutputs {
  std::string model_name;
  std::vector<std::string> names;
  std::vector<DataType> types;
};

// `answer` as the core takes it: its outputs in model output order, each of its declared type (BF16
// may come as 16-bit integers). An output the request did not ask for (`requested`, empty: all)
// and the model did not send gets an empty stand-in no answer carries; a missing one it asked for,
// or one of another type, fails INTERNAL naming it.
RequestResult in_model_order(WorkerAnswer&& answer, const std::vector<std::string_view>& requested,
                             const DeclaredOutputs& declared);

}  // namespace inferd
