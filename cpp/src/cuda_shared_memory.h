#pragma once

// The CUDA half of shared_memory.h: regions opened from CUDA IPC handles through the run-time
// libcudart (cuda_runtime.h), and copies between them and host memory.

#include <memory>
#include <string>
#include <string_view>

#include "inferd/shared_memory.h"

namespace inferd {

// Opens `raw_handle` (a cudaIpcMemHandle_t, 64 bytes) on `device_id` as a region of `byte_size`
// bytes; the mapping is closed (cudaIpcCloseMemHandle) when the last owner lets go.
// INVALID_ARGUMENT for a handle of the wrong size or a negative device (checked first, GPU or
// not); UNIMPLEMENTED without the CUDA runtime, a device, or the driver's cuMemGetAddressRange
// (without it byte_size could not be checked); INVALID_ARGUMENT for a device that does not
// exist, a handle the driver refuses, or byte_size past the allocation's real size.
Status open_cuda_region(const SharedMemoryRegionStatus& description, std::string_view raw_handle,
                        std::shared_ptr<const SharedMemoryRegion>* out);

// A synchronous copy between host memory and `device` memory. False (and `error` set) on failure.
bool cuda_copy_to_host(std::byte* dst, const std::byte* src, size_t size, int device, std::string* error);
bool cuda_copy_to_device(std::byte* dst, const std::byte* src, size_t size, int device, std::string* error);

}  // namespace inferd
