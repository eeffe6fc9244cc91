#pragma once

// Client memory the server reads inputs from and writes outputs into: Triton's system (POSIX
// shared-memory objects) and CUDA (IPC handles) shared-memory extensions. A client registers a
// region by name; a request then names the region, an offset and a byte size per tensor instead
// of sending the bytes.
//
// The region is the client's memory, so nothing here trusts it: every slice is bounds-checked
// against the registered region with overflow-safe arithmetic; a system object is checked at
// registration against its real size (fstat) and again at every use; every byte is read or
// written through copy_from_client/copy_to_client (guarded_copy.h), which survive a client that
// shrinks its object meanwhile (the page fault becomes a failed copy, not a SIGBUS); and a region
// stays mapped while a request holds a slice of it, even once unregistered.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "inferd/peer_credentials.h"
#include "inferd/status.h"

namespace inferd {

enum class SharedMemoryKind : uint8_t { kSystem, kCuda };

// What the server accepts, fixed at start (--shared-memory and its limits).
struct SharedMemoryOptions {
  bool system = true;                // SystemSharedMemory* RPCs and system regions in requests
  bool cuda = true;                  // CudaSharedMemory* RPCs (answered UNIMPLEMENTED without CUDA)
  size_t max_regions = 1024;         // registered regions, both kinds together
  uint64_t max_bytes = 64ull << 30;  // registered byte sizes, both kinds together
};

// One registered region as SystemSharedMemoryStatus / CudaSharedMemoryStatus report it.
struct SharedMemoryRegionStatus {
  std::string name;
  SharedMemoryKind kind = SharedMemoryKind::kSystem;
  std::string key;      // system: the object's name
  uint64_t offset = 0;  // system: where the region starts in the object
  uint64_t byte_size = 0;
  int64_t device_id = 0;  // cuda
};

// A registered region: its description and its mapping, immutable once registered. Shared by the
// registry (while registered) and by the slices requests hold; the last owner unmaps it.
class SharedMemoryRegion {
 public:
  virtual ~SharedMemoryRegion() = default;
  const SharedMemoryRegionStatus& description() const { return description_; }
  // First byte of the region in this process (host memory for kSystem, device memory for kCuda).
  std::byte* data() const { return data_; }
  // OK while the region can still be read and written: for a system object, that the object
  // is still at least as large as the region's end (one fstat). A client that shrinks it after
  // this check is caught by the guarded copy instead.
  virtual Status check_in_use() const = 0;

 protected:
  SharedMemoryRegion(SharedMemoryRegionStatus description, std::byte* data)
      : description_(std::move(description)), data_(data) {}

 private:
  SharedMemoryRegionStatus description_;
  std::byte* data_;
};

// The part of a region one tensor uses: [data, data + size). Holding it keeps the region mapped.
struct SharedMemorySlice {
  std::shared_ptr<const SharedMemoryRegion> region;
  std::byte* data = nullptr;
  size_t size = 0;
  uint64_t offset = 0;  // within the region, as the request gave it
  SharedMemoryKind kind() const { return region->description().kind; }
  int device() const { return static_cast<int>(region->description().device_id); }
};

// Copies between a slice and host memory, whichever kind the slice is: a fault-guarded memcpy
// for system memory, a synchronous CUDA copy for device memory. False (and `error` set) when the
// client's object shrank under the copy or the CUDA copy failed; nothing else is harmed.
bool copy_from_slice(std::byte* dst, const SharedMemorySlice& from, size_t size, std::string* error);
bool copy_to_slice(const SharedMemorySlice& to, const std::byte* src, size_t size, std::string* error);

// The registered regions of one server, by name (one namespace for both kinds, as Triton's).
//
// Invariants: at most options.max_regions regions whose byte sizes sum to at most
// options.max_bytes; a name is registered at most once (re-registering a live name is refused,
// never replaces it); a system region's [offset, offset + byte_size) lay within its object when
// it was registered; unregistering drops the registry's reference only, so requests holding a
// slice finish on the old mapping. Thread-safe: one mutex, held for map operations only (never
// while mapping, unmapping or copying).
class SharedMemoryRegistry {
 public:
  explicit SharedMemoryRegistry(SharedMemoryOptions options = {});
  SharedMemoryRegistry(const SharedMemoryRegistry&) = delete;
  SharedMemoryRegistry& operator=(const SharedMemoryRegistry&) = delete;

  const SharedMemoryOptions& options() const { return options_; }

  // SystemSharedMemoryRegister: maps [offset, offset + byte_size) of the POSIX shared-memory
  // object `key` (shm_open's name: one optional leading '/', then no '/', no "." or "..", at most
  // NAME_MAX bytes) read-write. INVALID_ARGUMENT for a bad name or key, a region outside the
  // object or an object that cannot be opened; ALREADY_EXISTS for a live name; RESOURCE_EXHAUSTED
  // past the limits; UNIMPLEMENTED when system shared memory is switched off.
  // `caller`: the client's credentials when it is on this machine (the Unix socket): the object is
  // mapped only if the client could open it for reading and writing itself (may_read_and_write),
  // else PERMISSION_DENIED; null when unknown (TCP, opened by --shared-memory-listeners all).
  Status register_system(const std::string& name, const std::string& key, uint64_t offset, uint64_t byte_size,
                         const PeerCredentials* caller = nullptr);

  // CudaSharedMemoryRegister: opens a cudaIpcMemHandle_t (`raw_handle`, 64 bytes) on `device_id`.
  // The allocation's real size is asked of the driver: byte_size beyond it is INVALID_ARGUMENT.
  // UNIMPLEMENTED without the CUDA runtime and a device, or when switched off.
  Status register_cuda(const std::string& name, std::string_view raw_handle, int64_t device_id, uint64_t byte_size);

  // *SharedMemoryUnregister: `name` of `kind`, or every region of `kind` when empty. Unknown
  // names (or another kind's) are not an error, as in Triton.
  Status unregister(SharedMemoryKind kind, const std::string& name);

  // *SharedMemoryStatus: every region of `kind`, or the one named (NOT_FOUND if none is).
  Status status(SharedMemoryKind kind, const std::string& name, std::vector<SharedMemoryRegionStatus>* out) const;

  // The slice [offset, offset + byte_size) of region `name`, for one tensor of one request.
  // INVALID_ARGUMENT (naming region and tensor) when the region is unknown, the slice is not
  // within it, or a system object shrank below it since registration.
  Status slice(std::string_view name, uint64_t offset, uint64_t byte_size, SharedMemorySlice* out) const;

  size_t region_count() const;
  uint64_t registered_bytes() const;

 private:
  Status add(std::shared_ptr<const SharedMemoryRegion> region);

  const SharedMemoryOptions options_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const SharedMemoryRegion>, std::less<>> regions_;  // guarded by mutex_
  uint64_t bytes_ = 0;                                                                     // guarded by mutex_
};

// Whether `key` is a name shm_open may take and nothing else: no path, no "..".
bool is_valid_shared_memory_key(std::string_view key);

}  // namespace inferd
