#include "inferd/device_buffer_pool.h"

#include <cstdlib>

#include "cuda_device.h"

namespace inferd {

DeviceMemory::DeviceMemory(int device) : device_(cuda_device::usable(device) ? device : -1) {}

DeviceMemory::Block DeviceMemory::allocate(size_t size) const {
  void* p = device_ >= 0 ? cuda_device::cuda().device_alloc(device_, size) : std::aligned_alloc(4096, size);
  return {static_cast<std::byte*>(p)};
}

void DeviceMemory::free(const Block& block) const {
  if (device_ >= 0) {
    cuda_device::cuda().device_free(device_, block.data);
  } else {
    std::free(block.data);
  }
}

template class BufferPool<DeviceMemory>;

}  // namespace inferd
