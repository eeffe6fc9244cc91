#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "inferd/infer_request_parser.h"
#include "inferd/status.h"

namespace inferd {

// The request parameter whose string keeps a client on one weighted version.
inline constexpr std::string_view kRoutingKeyParameter = "inferd.routing_key";

// The request's routing key: none, or the string it carries. A key of another type is
// INVALID_ARGUMENT. The one rule for every path that routes (the transports, the Python side's).
Status routing_key(const std::vector<WireParameter>& parameters, std::optional<std::string_view>* key);

// FNV-1a, 64 bits, of `bytes`: the hash that turns a request's routing key into a point on its
// model's weights. One implementation, bound to Python, so both serving paths pick alike.
uint64_t fnv1a64(std::string_view bytes);

// Traffic weights of a model's versions (config parameter inferd.version_weights): picks the
// index of a version for a request that names none. A routing key always picks the same index
// (its hash, modulo the total weight, is a point on the cumulative weights); no key picks at random
// with the weights' odds.
// Invariants: at least one weight; every weight positive; cumulative_ strictly increasing, its
// last element the total.
class WeightedChoice {
 public:
  // Throws std::invalid_argument when `weights` is empty, holds a zero or sums past 2^64 - 1.
  explicit WeightedChoice(const std::vector<uint64_t>& weights);

  size_t pick(std::string_view routing_key) const;
  size_t pick_random() const;
  // The index whose share holds `point` (in [0, total())).
  size_t at(uint64_t point) const;
  uint64_t total() const { return cumulative_.back(); }

 private:
  std::vector<uint64_t> cumulative_;
};

}  // namespace inferd
