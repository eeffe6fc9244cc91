#pragma once

// A request's token (InferenceRequest::token) names it to the scheduler that holds it: the
// completion carries it back, and Scheduler::cancel(token) reaches the request by it. Tokens must
// differ among the requests one scheduler holds at a time. Three allocators submit to the same
// schedulers, each in a range of its own, told apart by the top two bits (63, 62):
//
//   00  the Python side's requests: inferd.core's completion tracker counts up from 1 and never
//       reaches bit 62.
//   10  the gRPC transport's requests: TransportContext::next_token (grpc_calls.h), counting up
//       from 1 per server.
//   11  ensemble steps: one process-wide counter (ensemble_scheduler.cpp), from 0, so that a step,
//       which shares its composing model's scheduler with direct traffic, is the only request
//       Scheduler::cancel(step token) can reach, whichever ensemble it belongs to.
//   01  python models' calls to other models (BLS): ModelCalls (model_calls.h), one counter per
//       ModelCalls, from 1 (one per server).

#include <atomic>
#include <cstdint>

namespace inferd {

inline constexpr uint64_t kTransportTokenRange = uint64_t{1} << 63;     // 10: the gRPC transport
inline constexpr uint64_t kEnsembleStepTokenRange = uint64_t{3} << 62;  // 11: ensemble steps
inline constexpr uint64_t kModelCallTokenRange = uint64_t{1} << 62;     // 01: BLS calls

// The tokens of one range: `range` | first, `range` | first + 1, ... Thread-safe; never blocks.
// Memory ordering: relaxed; a token hands no data across threads, it only has to differ from the
// others.
class RequestTokenCounter {
 public:
  constexpr RequestTokenCounter(uint64_t range, uint64_t first) : range_(range), count_(first) {}

  uint64_t next() { return range_ | count_.fetch_add(1, std::memory_order_relaxed); }

 private:
  const uint64_t range_;
  std::atomic<uint64_t> count_;
};

}  // namespace inferd
