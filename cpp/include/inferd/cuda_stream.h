#pragma once

#include <cstddef>

#include "inferd/status.h"

namespace inferd {

// One CUDA stream on one device: an executor instance's copies and kernels run on it in order,
// and overlap other instances' streams. No device-wide synchronisation: a caller waits for this
// stream alone (synchronize) or for one point of it (CudaEvent).
// Host stand-in (device -1, or no CUDA runtime): copies are memcpy, complete when the call returns,
// and synchronize() does nothing, so callers have one code path with or without a GPU.
// Invariant: handle() is a live cudaStream_t on device() exactly when on_device().
// Not thread-safe: one owner (the instance's worker thread) issues work on it.
class CudaStream {
 public:
  // Throws std::runtime_error if CUDA is available but the stream cannot be created.
  explicit CudaStream(int device);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  bool on_device() const { return handle_ != nullptr; }
  int device() const { return device_; }
  void* handle() const { return handle_; }

  // Queue a copy on the stream; `src` (host) must stay valid until the stream has passed it, and is
  // best page-locked (PinnedBufferPool) for the copy to be asynchronous.
  Status copy_to_device(void* dst, const void* src, size_t size);
  Status copy_to_host(void* dst, const void* src, size_t size);
  // Blocks until everything queued on this stream is done.
  Status synchronize();

 private:
  int device_ = -1;
  void* handle_ = nullptr;
};

}  // namespace inferd
