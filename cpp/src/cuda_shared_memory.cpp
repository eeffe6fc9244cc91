#include "cuda_shared_memory.h"

#include <cstdint>
#include <utility>

#include "inferd/cuda_runtime.h"

namespace inferd {
namespace {

Status invalid(std::string message) { return Status::Error(StatusCode::kInvalidArgument, std::move(message)); }

std::string region_text(const SharedMemoryRegionStatus& d) { return "CUDA shared memory region '" + d.name + "'"; }

// Device memory another process exported, mapped into this one with cudaIpcOpenMemHandle.
//
// Invariants: data() is the start of the client's allocation as opened on device_id, and
// description().byte_size is within that allocation as the driver reported it at registration;
// the mapping is closed (cudaIpcCloseMemHandle) exactly once, by the destructor, when the last
// owner (the registry or a request's slice) lets go. A CUDA allocation cannot be resized, so
// there is nothing to check at use; a client that frees its allocation while it is registered is
// exercised by benchmarks/gpu_check.py (the server must keep serving), not relied on here.
class CudaRegion final : public SharedMemoryRegion {
 public:
  CudaRegion(SharedMemoryRegionStatus description, std::byte* data)
      : SharedMemoryRegion(std::move(description), data) {}
  ~CudaRegion() override { CudaRuntime::get().ipc_close(static_cast<int>(description().device_id), data()); }
  CudaRegion(const CudaRegion&) = delete;
  CudaRegion& operator=(const CudaRegion&) = delete;

  Status check_in_use() const override { return Status::Ok(); }
};

std::string needs_cuda(const std::string& why) { return "CUDA shared memory needs the CUDA runtime and a GPU; " + why; }

}  // namespace

Status open_cuda_region(const SharedMemoryRegionStatus& description, std::string_view raw_handle,
                        std::shared_ptr<const SharedMemoryRegion>* out) {
  // What a request can get wrong is refused first, whether or not there is a GPU.
  if (raw_handle.size() != CudaRuntime::kIpcHandleSize) {
    return invalid(region_text(description) + ": raw_handle is " + std::to_string(raw_handle.size()) +
                   " bytes; a cudaIpcMemHandle_t is " + std::to_string(CudaRuntime::kIpcHandleSize) + " bytes");
  }
  if (description.device_id < 0) {
    return invalid(region_text(description) + ": device_id " + std::to_string(description.device_id) + " is negative");
  }
  const CudaRuntime& cuda = CudaRuntime::get();
  if (!cuda.available()) return Status::Error(StatusCode::kUnimplemented, needs_cuda(cuda.description()));
  if (!cuda.ipc_unavailable().empty()) {
    // Without the driver's word on the allocation's size, byte_size would be the client's word.
    return Status::Error(StatusCode::kUnimplemented, needs_cuda(cuda.ipc_unavailable()));
  }
  if (description.device_id >= cuda.device_count()) {
    return invalid(region_text(description) + ": device_id " + std::to_string(description.device_id) +
                   " is not a CUDA device of this server (it sees " + std::to_string(cuda.device_count()) + ")");
  }
  const int device = static_cast<int>(description.device_id);
  void* ptr = nullptr;
  const int opened = cuda.ipc_open(device, raw_handle.data(), &ptr);
  if (opened != 0 || ptr == nullptr) {
    return invalid(region_text(description) + ": the CUDA IPC handle cannot be opened on device " +
                   std::to_string(device) + " (" + cuda.error_string(opened) + ")");
  }
  // Owned from here: a refusal below closes the handle with the region.
  auto region = std::make_shared<const CudaRegion>(description, static_cast<std::byte*>(ptr));
  const void* base = nullptr;
  size_t allocation = 0;
  const int ranged = cuda.allocation_range(device, ptr, &base, &allocation);
  if (ranged != 0) {
    return invalid(region_text(description) + ": the driver cannot tell the allocation's size (CUresult " +
                   std::to_string(ranged) + ")");
  }
  const auto start = reinterpret_cast<uintptr_t>(base);
  const auto at = reinterpret_cast<uintptr_t>(ptr);
  if (at < start || at - start > allocation) {
    return invalid(region_text(description) + ": the driver places the handle outside its allocation");
  }
  const uint64_t usable = allocation - (at - start);
  if (description.byte_size > usable) {
    return invalid(region_text(description) + ": byte_size " + std::to_string(description.byte_size) +
                   " is larger than the client's allocation (" + std::to_string(usable) + " bytes)");
  }
  *out = std::move(region);
  return Status::Ok();
}

bool cuda_copy_to_host(std::byte* dst, const std::byte* src, size_t size, int device, std::string* error) {
  if (size == 0) return true;
  const CudaRuntime& cuda = CudaRuntime::get();
  const int status = cuda.memcpy_sync(device, dst, src, size, CudaRuntime::CopyKind::kDeviceToHost);
  if (status == 0) return true;
  *error = "copying " + std::to_string(size) + " bytes from CUDA shared memory on device " + std::to_string(device) +
           " failed: " + cuda.error_string(status);
  return false;
}

bool cuda_copy_to_device(std::byte* dst, const std::byte* src, size_t size, int device, std::string* error) {
  if (size == 0) return true;
  const CudaRuntime& cuda = CudaRuntime::get();
  const int status = cuda.memcpy_sync(device, dst, src, size, CudaRuntime::CopyKind::kHostToDevice);
  if (status == 0) return true;
  *error = "copying " + std::to_string(size) + " bytes into CUDA shared memory on device " + std::to_string(device) +
           " failed: " + cuda.error_string(status);
  return false;
}

}  // namespace inferd
