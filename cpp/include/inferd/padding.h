#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace inferd {

// Batching of variable-length inputs by padding (config parameters inferd.pad_inputs,
// inferd.pad_value, inferd.pad_outputs; see docs/batching.md). Requests whose padded inputs differ only in
// their non-batch dims still share a batch: each padded input is padded up to the longest in the
// batch with `value`, and the outputs listed in `outputs` are sliced back to each request's own
// lengths, taken from the reference input.
struct Padding {
  std::vector<bool> inputs;  // by input index: may differ in non-batch dims within a batch
  double value = 0;          // written into the padding, converted to the input's type
  int reference_input = -1;  // the padded input whose lengths the outputs follow; -1 = no padding
  // By output index: pairs (output dim, reference input dim) to slice back; empty = row split only.
  std::vector<std::vector<std::pair<size_t, size_t>>> outputs;

  bool enabled() const { return reference_input >= 0; }
  bool pads_input(size_t i) const { return i < inputs.size() && inputs[i]; }
};

}  // namespace inferd
