#pragma once

#include <cstddef>

#include "inferd/buffer_pool.h"

namespace inferd {

// Memory on one CUDA device, for batches' device copies. Host stand-in (device -1, or no usable
// device): page-aligned host memory, so the same code runs without a GPU. A memory kind for
// BufferPool (see its requirements).
class DeviceMemory {
 public:
  struct Block {
    std::byte* data = nullptr;  // a device address when on_device, else host memory
  };
  struct Facts {
    bool on_device = false;  // real device memory (else the host stand-in)
  };

  explicit DeviceMemory(int device);

  // The device, or -1 for the host stand-in.
  int device() const { return device_; }
  Block allocate(size_t size) const;
  // The same memory: a lease past the bound still needs device memory.
  Block allocate_fallback(size_t size) const { return allocate(size); }
  void free(const Block& block) const;
  Facts facts() const { return {device_ >= 0}; }

 private:
  int device_;
};

// Device memory for one device's batches, bounded in total bytes: BufferPool over DeviceMemory,
// which holds the algorithm and its invariants. This class only names the kind and keeps the
// constructor and device() its users (the bindings) call.
class DeviceBufferPool final : public BufferPool<DeviceMemory> {
 public:
  DeviceBufferPool(int device, size_t capacity_bytes) : BufferPool(capacity_bytes, DeviceMemory(device)) {}
  int device() const { return memory().device(); }
};

extern template class BufferPool<DeviceMemory>;  // instantiated once, in device_buffer_pool.cpp

}  // namespace inferd
