#include "inferd/trace_sampling.h"

#include <cmath>
#include <random>

namespace inferd {
namespace {

std::optional<uint64_t> hex(std::string_view digits) {
  uint64_t value = 0;
  for (const char c : digits) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return std::nullopt;  // lower case only, as the propagator's pattern
    }
    value = (value << 4) | static_cast<uint64_t>(digit);
  }
  return value;
}

// TraceIdRatioBased: sampled when the trace id's lower 64 bits are below ratio * 2^64.
bool below_ratio(uint64_t trace_id_low, double ratio) {
  if (ratio >= 1) return true;
  if (ratio <= 0) return false;
  return trace_id_low < static_cast<uint64_t>(std::ldexp(ratio, 64));
}

}  // namespace

std::optional<TraceParent> parse_traceparent(std::string_view header) {
  // The propagator's pattern: [ \t]* 2-32-16-2 hex digits, then "-..." (a later version's
  // fields) or [ \t]*; at most 512 characters.
  constexpr size_t kMaxLength = 512;
  constexpr size_t kLength = 55;
  if (header.size() > kMaxLength) return std::nullopt;
  while (!header.empty() && (header.front() == ' ' || header.front() == '\t')) header.remove_prefix(1);
  if (header.size() < kLength || header[2] != '-' || header[35] != '-' || header[52] != '-') return std::nullopt;
  const std::string_view version = header.substr(0, 2);
  const auto high = hex(header.substr(3, 16));
  const auto low = hex(header.substr(19, 16));
  const auto parent = hex(header.substr(36, 16));
  const auto flags = hex(header.substr(53, 2));
  if (!hex(version) || !high || !low || !parent || !flags) return std::nullopt;
  std::string_view rest = header.substr(kLength);
  if (!rest.empty() && rest.front() == '-') {
    if (version == "00") return std::nullopt;  // version 00 has no more fields
  } else if (rest.find_first_not_of(" \t") != std::string_view::npos) {
    return std::nullopt;
  }
  if (version == "ff") return std::nullopt;
  if ((*high == 0 && *low == 0) || *parent == 0) return std::nullopt;  // the invalid ids
  return TraceParent{*low, (*flags & 1) != 0};
}

bool TraceBudget::take() {
  int64_t left = remaining_.load(std::memory_order_relaxed);
  // compare_exchange_weak reloads `left` when another thread took one first.
  while (left > 0 && !remaining_.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) {
  }
  return left > 0;
}

bool TraceSampling::traced(std::string_view traceparent) const {
  return drawn(traceparent) && (budget == nullptr || budget->take());
}

bool TraceSampling::drawn(std::string_view traceparent) const {
  if (!enabled) return false;
  if (!traceparent.empty()) {
    if (const std::optional<TraceParent> parent = parse_traceparent(traceparent)) {
      if (parent_based) return parent->sampled;
      return below_ratio(parent->trace_id_low, ratio);
    }
  }
  if (ratio >= 1) return true;
  if (ratio <= 0) return false;
  thread_local std::mt19937_64 random{std::random_device{}()};
  return below_ratio(random(), ratio);
}

}  // namespace inferd
