#pragma once

// Which inference requests are traced, decided by the transport before a request goes anywhere:
// a traced request goes to Python, which builds its spans; the others never leave the core. The
// rule is OpenTelemetry's samplers' (those inferd's tracing configures: always_on, always_off,
// traceidratio and their parentbased_ forms), read by Python from the sampler it built.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

namespace inferd {

// A W3C traceparent header (version-traceid-parentid-flags), as OpenTelemetry's propagator
// accepts it.
struct TraceParent {
  uint64_t trace_id_low = 0;  // the trace id's lower 64 bits: what TraceIdRatioBased compares
  bool sampled = false;       // flags bit 0
};
// The header's fields, or nullopt when the propagator would ignore it (then the request starts a
// trace of its own).
std::optional<TraceParent> parse_traceparent(std::string_view header);

// How many more traces may be taken (Triton's trace_count): shared by every snapshot that carries
// it and by Python's sampler, so that a republish keeps the count, until a new trace_count
// replaces the budget. Thread-safe; never blocks.
// Memory ordering: relaxed. The count is the only state, and nothing else is handed across
// threads through it.
class TraceBudget {
 public:
  explicit TraceBudget(int64_t traces) : remaining_(traces) {}
  // Takes one trace when any is left: true if it took one.
  bool take();
  // Traces left (0 once spent); approximate while other threads take.
  int64_t remaining() const { return remaining_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> remaining_;
};

// Immutable once published (the budget it points to counts down); traced() is thread-safe.
struct TraceSampling {
  TraceSampling() = default;  // off
  TraceSampling(bool enabled_, bool parent_based_, double ratio_, std::shared_ptr<TraceBudget> budget_ = nullptr)
      : enabled(enabled_), parent_based(parent_based_), ratio(ratio_), budget(std::move(budget_)) {}

  bool enabled = false;       // tracing is on
  bool parent_based = false;  // a caller's valid traceparent decides by its sampled flag
  double ratio = 0;           // otherwise: the share of trace ids sampled (0..1)
  // The traces left to take, shared (null: unlimited): a request the rule samples is traced only
  // while one is left, and takes it.
  std::shared_ptr<TraceBudget> budget;

  // Whether a request with this traceparent header (empty: none) is traced. A request that
  // starts a trace draws its decision at random with probability `ratio`, as a fresh random
  // trace id would under TraceIdRatioBased. A traced request takes one trace of the budget.
  bool traced(std::string_view traceparent) const;

 private:
  bool drawn(std::string_view traceparent) const;  // the rule's decision, before the budget
};

}  // namespace inferd
