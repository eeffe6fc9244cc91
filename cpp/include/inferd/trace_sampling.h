#pragma once

// Which inference requests are traced, decided by the transport before a request goes anywhere:
// a traced request goes to Python, which builds its spans; the others never leave the core. The
// rule is OpenTelemetry's samplers' (those inferd's tracing configures: always_on, always_off,
// traceidratio and their parentbased_ forms), read by Python from the sampler it built.

#include <cstdint>
#include <optional>
#include <string_view>

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

// Immutable once published; traced() is thread-safe.
struct TraceSampling {
  bool enabled = false;       // tracing is on
  bool parent_based = false;  // a caller's valid traceparent decides by its sampled flag
  double ratio = 0;           // otherwise: the share of trace ids sampled (0..1)

  // Whether a request with this traceparent header (empty: none) is traced. A request that
  // starts a trace draws its decision at random with probability `ratio`, as a fresh random
  // trace id would under TraceIdRatioBased.
  bool traced(std::string_view traceparent) const;
};

}  // namespace inferd
