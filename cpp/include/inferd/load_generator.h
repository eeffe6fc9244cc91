#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace inferd {

// How LoadGenerator::run drives a server.
struct LoadOptions {
  std::string target;                 // host:port, or unix:PATH
  std::vector<std::string> requests;  // serialized ModelInferRequests, sent in turn
  // Closed loop (rate 0): this many requests in flight, each answer sending the next. Open loop
  // (rate > 0): Poisson arrivals at `rate` requests per second, at most `concurrency` in flight
  // (an arrival finding them all out counts as `dropped`, never delayed).
  uint32_t concurrency = 1;
  double rate = 0;
  double warmup_s = 1.0;   // sent, not counted
  double measure_s = 5.0;  // the window counted: requests sent in it and answered
  uint64_t seed = 1;       // the arrivals' generator
  double timeout_s = 30;   // each call's deadline
};

// What one run measured: the window's answered requests and how long each took (from its
// arrival - when the closed loop sent it, or when the open loop's schedule said it should be sent,
// so that a server falling behind shows in the latencies instead of hiding in fewer arrivals).
struct LoadResult {
  std::vector<uint64_t> latencies_ns;  // requests answered OK, in the order they were answered
  uint64_t errors = 0;                 // answered with an error status
  uint64_t dropped = 0;                // open loop: arrivals with `concurrency` already in flight
  std::string first_error;
  double seconds = 0;  // the measured window's length
};

// inferd's own load generator, for `inferd tune`: ModelInfer over one grpc++ channel with a
// completion queue of its own, one thread taking completions and (closed loop) sending the next
// request, and for the open loop the caller's thread sending on schedule. Written in C++ so that
// the load costs the machine as little as perf_analyzer's, and its figures are the server's, not
// the client's.
//
// run() blocks for warmup_s + measure_s plus the time the last calls take (each bounded by
// timeout_s); every call has ended, the queue is shut down and its thread joined when it returns.
// Thread-safe (each run has its own channel, queue and thread).
class LoadGenerator {
 public:
  static LoadResult run(const LoadOptions& options);
};

}  // namespace inferd
