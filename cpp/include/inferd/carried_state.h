#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace inferd {

class StateBuffer;  // sequence_state.h

// A stateful model's implicit state as one sequence holds it, and as the request of it that runs
// carries it (SequenceStates): a buffer per state and the shape it holds. Empty for a model
// without implicit state.
struct CarriedState {
  std::vector<std::shared_ptr<StateBuffer>> buffers;  // per StateSpec, in order
  std::vector<std::vector<int64_t>> dims;             // each state's shape, without the batch dim

  bool empty() const { return buffers.empty(); }
};

}  // namespace inferd
