#pragma once

#include <cstdint>

#include "inferd/cuda_stream.h"
#include "inferd/status.h"

namespace inferd {

// A point in a stream's work: for GPU timings (elapsed_ms) and for ordering one stream after
// another without blocking the host (make_wait). The host stand-in records the steady clock.
// Invariant: handle_ is a live cudaEvent_t, or null for the host stand-in (no usable device, or
// the runtime could not create one).
// Not thread-safe.
class CudaEvent {
 public:
  explicit CudaEvent(int device);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  Status record(const CudaStream& stream);
  Status synchronize();
  // Work queued on `stream` after this call starts once this event has completed.
  Status make_wait(const CudaStream& stream) const;
  // Milliseconds between two recorded, completed events.
  static Status elapsed_ms(const CudaEvent& start, const CudaEvent& end, float* ms);

 private:
  void* handle_ = nullptr;
  int64_t host_ns_ = 0;  // the host stand-in's record time
};

}  // namespace inferd
