#pragma once

#include <cstdint>
#include <string>

namespace inferd {

// A request's place in a sequence of a stateful model (Triton's `sequence_id`, `sequence_start` and
// `sequence_end` request parameters): `id` or, for a string id, `string_id` (never both; a
// request of no sequence has neither).
struct SequenceFlags {
  uint64_t id = 0;
  std::string string_id;
  bool start = false;
  bool end = false;
  // False only for the request the core sends a model to tell it its sequence ended for being
  // idle (SequenceOptions::tell_idle_end): its READY control is false, its other inputs absent.
  bool ready = true;

  bool any() const { return id != 0 || !string_id.empty(); }
  // The id as messages show it.
  std::string shown() const { return string_id.empty() ? std::to_string(id) : "'" + string_id + "'"; }
};

}  // namespace inferd
