#pragma once

#include <cstddef>

#include "inferd/pinned_buffer_pool.h"
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

// A point in a stream's work: for GPU timings (elapsed_ms) and for ordering one stream after
// another without blocking the host (make_wait). The host stand-in records the steady clock.
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

// Device memory for one device's batches, in power-of-two size classes reused through free lists
// and bounded in total bytes; past the bound a lease is allocated outside the pool and freed on
// release (counted in fallbacks). The host stand-in leases page-aligned host memory, so the same
// code runs without a GPU. Thread-safe; buffers may outlive the pool (then they are freed).
class DeviceBufferPool {
 public:
  struct Stats {
    uint64_t capacity_bytes = 0;
    uint64_t pooled_bytes = 0;
    uint64_t leased_bytes = 0;
    uint64_t allocations = 0;
    uint64_t reuses = 0;
    uint64_t fallbacks = 0;
    bool on_device = false;
  };
  struct Buffer {
    std::byte* data = nullptr;  // a device address when on_device, else host memory
    size_t size = 0;
  };

  DeviceBufferPool(int device, size_t capacity_bytes);
  ~DeviceBufferPool();
  DeviceBufferPool(const DeviceBufferPool&) = delete;
  DeviceBufferPool& operator=(const DeviceBufferPool&) = delete;

  // At least `size` bytes. Throws std::bad_alloc when the device (or host) has no memory left.
  std::shared_ptr<Buffer> lease(size_t size);
  Stats stats() const;
  int device() const { return device_; }

 private:
  struct State;
  int device_;
  std::shared_ptr<State> state_;
};

}  // namespace inferd
