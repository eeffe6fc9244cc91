#include "inferd/version_routing.h"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>

namespace inferd {

Status routing_key(const std::vector<WireParameter>& parameters, std::optional<std::string_view>* key) {
  key->reset();
  const WireParameter* found = find_parameter(parameters, kRoutingKeyParameter);
  if (found == nullptr) return Status::Ok();
  if (found->kind != WireParameter::Kind::kString) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "the parameter '" + std::string(kRoutingKeyParameter) + "' must be a string");
  }
  *key = found->string_value;
  return Status::Ok();
}

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t hash = 14695981039346656037ULL;  // FNV-1a's offset basis
  for (const char c : bytes) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 1099511628211ULL;  // FNV's 64-bit prime
  }
  return hash;
}

WeightedChoice::WeightedChoice(const std::vector<uint64_t>& weights) {
  if (weights.empty()) throw std::invalid_argument("no version weights");
  uint64_t total = 0;
  for (const uint64_t weight : weights) {
    if (weight == 0) throw std::invalid_argument("a version weight is zero");
    if (weight > UINT64_MAX - total) throw std::invalid_argument("the version weights' sum overflows");
    total += weight;
    cumulative_.push_back(total);
  }
}

size_t WeightedChoice::at(uint64_t point) const {
  return static_cast<size_t>(std::upper_bound(cumulative_.begin(), cumulative_.end(), point) - cumulative_.begin());
}

size_t WeightedChoice::pick(std::string_view routing_key) const { return at(fnv1a64(routing_key) % total()); }

size_t WeightedChoice::pick_random() const {
  // One generator per thread: no lock on the request path.
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return at(std::uniform_int_distribution<uint64_t>(0, total() - 1)(generator));
}

}  // namespace inferd
