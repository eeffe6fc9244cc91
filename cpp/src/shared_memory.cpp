#include "inferd/shared_memory.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "cuda_shared_memory.h"
#include "inferd/guarded_copy.h"

namespace inferd {
namespace {

Status invalid(std::string message) { return Status::Error(StatusCode::kInvalidArgument, std::move(message)); }

std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

const char* kind_text(SharedMemoryKind kind) { return kind == SharedMemoryKind::kSystem ? "system" : "CUDA"; }

// [offset, offset + size) within [0, limit), without overflow.
bool within(uint64_t offset, uint64_t size, uint64_t limit) { return offset <= limit && size <= limit - offset; }

// A mapping of a POSIX shared-memory object, from its page-aligned start below the region to the
// region's end. Owns the descriptor (kept open to fstat the object at each use) and the mapping.
class SystemRegion final : public SharedMemoryRegion {
 public:
  SystemRegion(SharedMemoryRegionStatus description, int fd, void* map, size_t map_length, std::byte* data)
      : SharedMemoryRegion(std::move(description), data), fd_(fd), map_(map), map_length_(map_length) {}
  ~SystemRegion() override {
    if (map_ != MAP_FAILED) munmap(map_, map_length_);
    close(fd_);
  }
  SystemRegion(const SystemRegion&) = delete;
  SystemRegion& operator=(const SystemRegion&) = delete;

  Status check_in_use() const override {
    struct stat st{};
    if (fstat(fd_, &st) != 0) return invalid("shared memory region " + quoted(description().name) + " cannot be read");
    const uint64_t end = description().offset + description().byte_size;
    if (static_cast<uint64_t>(st.st_size) < end) {
      return invalid("shared memory region " + quoted(description().name) + ": its object " +
                     quoted(description().key) + " is now " + std::to_string(st.st_size) +
                     " bytes, smaller than the region's end (" + std::to_string(end) + ") it was registered with");
    }
    return Status::Ok();
  }

 private:
  int fd_;
  void* map_;
  size_t map_length_;
};

}  // namespace

bool is_valid_shared_memory_key(std::string_view key) {
  if (!key.empty() && key.front() == '/') key.remove_prefix(1);
  if (key.empty() || key.size() > NAME_MAX || key == "." || key == "..") return false;
  for (const char c : key) {
    // No path separators, and nothing a log or a terminal would render as something else.
    if (c == '/' || c == '\0' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

bool copy_from_slice(std::byte* dst, const SharedMemorySlice& from, size_t size, std::string* error) {
  if (from.kind() == SharedMemoryKind::kCuda) return cuda_copy_to_host(dst, from.data, size, from.device(), error);
  if (guarded_copy(dst, from.data, size)) return true;
  *error = "shared memory region " + quoted(from.region->description().name) +
           " shrank while it was read (its object was truncated)";
  return false;
}

bool copy_to_slice(const SharedMemorySlice& to, const std::byte* src, size_t size, std::string* error) {
  if (to.kind() == SharedMemoryKind::kCuda) return cuda_copy_to_device(to.data, src, size, to.device(), error);
  if (guarded_copy(to.data, src, size)) return true;
  *error = "shared memory region " + quoted(to.region->description().name) +
           " shrank while it was written (its object was truncated)";
  return false;
}

SharedMemoryRegistry::SharedMemoryRegistry(SharedMemoryOptions options) : options_(options) {}

Status SharedMemoryRegistry::register_system(const std::string& name, const std::string& key, uint64_t offset,
                                             uint64_t byte_size, const PeerCredentials* caller) {
  if (!options_.system) {
    return Status::Error(StatusCode::kUnimplemented,
                         "system shared memory is switched off on this server (--shared-memory)");
  }
  if (name.empty()) return invalid("a shared memory region needs a name");
  if (!is_valid_shared_memory_key(key)) {
    return invalid("shared memory key " + quoted(key) +
                   " is not a POSIX shared-memory object name (one optional leading '/', then no '/')");
  }
  if (byte_size == 0) return invalid("shared memory region " + quoted(name) + ": byte_size must be positive");
  if (!within(offset, byte_size, UINT64_MAX)) {
    return invalid("shared memory region " + quoted(name) + ": offset + byte_size overflows");
  }
  {
    // Refused before the object is opened: a live name or a full registry costs no mapping.
    std::lock_guard<std::mutex> lock(mutex_);
    if (regions_.count(name) != 0) {
      return Status::Error(StatusCode::kAlreadyExists,
                           "shared memory region " + quoted(name) + " is already registered; unregister it first");
    }
  }
  // O_NOFOLLOW: glibc's shm_open adds it too; said here because a link would name another file.
  const int fd = shm_open(key.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    return invalid("cannot open shared memory object " + quoted(key) + " for region " + quoted(name) + ": " +
                   std::strerror(errno));
  }
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return invalid("shared memory object " + quoted(key) + " is not a shared-memory object");
  }
  // Checked on the object opened, not its name: a rename in between cannot swap it.
  if (std::string why; caller != nullptr && !may_read_and_write(st, *caller, &why)) {
    close(fd);
    return Status::Error(StatusCode::kPermissionDenied,
                         "shared memory object " + quoted(key) + " for region " + quoted(name) + ": " + why);
  }
  if (!within(offset, byte_size, static_cast<uint64_t>(st.st_size))) {
    close(fd);
    return invalid("shared memory region " + quoted(name) + ": offset " + std::to_string(offset) + " + byte_size " +
                   std::to_string(byte_size) + " is past the end of object " + quoted(key) + " (" +
                   std::to_string(st.st_size) + " bytes)");
  }
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t map_start = offset - offset % page;
  const uint64_t map_length = offset + byte_size - map_start;
  if (map_length > SIZE_MAX) {
    close(fd);
    return invalid("shared memory region " + quoted(name) + " is larger than this process can map");
  }
  void* map = mmap(nullptr, static_cast<size_t>(map_length), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                   static_cast<off_t>(map_start));
  if (map == MAP_FAILED) {
    const int error = errno;
    close(fd);
    return invalid("cannot map shared memory object " + quoted(key) + ": " + std::strerror(error));
  }
  SharedMemoryRegionStatus description{name, SharedMemoryKind::kSystem, key, offset, byte_size, 0};
  auto* data = static_cast<std::byte*>(map) + (offset - map_start);
  // The region owns fd and mapping from here: a refusal below unmaps them with it.
  return add(
      std::make_shared<const SystemRegion>(std::move(description), fd, map, static_cast<size_t>(map_length), data));
}

Status SharedMemoryRegistry::register_cuda(const std::string& name, std::string_view raw_handle, int64_t device_id,
                                           uint64_t byte_size) {
  if (!options_.cuda) {
    return Status::Error(StatusCode::kUnimplemented,
                         "CUDA shared memory is switched off on this server (--shared-memory)");
  }
  if (name.empty()) return invalid("a shared memory region needs a name");
  if (byte_size == 0) return invalid("shared memory region " + quoted(name) + ": byte_size must be positive");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (regions_.count(name) != 0) {
      return Status::Error(StatusCode::kAlreadyExists,
                           "shared memory region " + quoted(name) + " is already registered; unregister it first");
    }
  }
  std::shared_ptr<const SharedMemoryRegion> region;
  SharedMemoryRegionStatus description{name, SharedMemoryKind::kCuda, "", 0, byte_size, device_id};
  Status status = open_cuda_region(description, raw_handle, &region);
  if (!status.ok()) return status;
  return add(std::move(region));
}

Status SharedMemoryRegistry::add(std::shared_ptr<const SharedMemoryRegion> region) {
  const SharedMemoryRegionStatus& d = region->description();
  std::lock_guard<std::mutex> lock(mutex_);
  if (regions_.count(d.name) != 0) {  // registered meanwhile by another call
    return Status::Error(StatusCode::kAlreadyExists,
                         "shared memory region " + quoted(d.name) + " is already registered; unregister it first");
  }
  if (regions_.size() >= options_.max_regions) {
    return Status::Error(StatusCode::kResourceExhausted,
                         "the server holds " + std::to_string(regions_.size()) +
                             " shared memory regions, its limit (--shared-memory-max-regions); unregister some first");
  }
  if (d.byte_size > options_.max_bytes - bytes_) {
    return Status::Error(StatusCode::kResourceExhausted, "registering " + std::to_string(d.byte_size) +
                                                             " bytes would take the server's shared memory "
                                                             "past its limit of " +
                                                             std::to_string(options_.max_bytes) +
                                                             " bytes (--shared-memory-max-bytes); " +
                                                             std::to_string(bytes_) + " are registered");
  }
  bytes_ += d.byte_size;
  regions_.emplace(d.name, std::move(region));
  return Status::Ok();
}

Status SharedMemoryRegistry::unregister(SharedMemoryKind kind, const std::string& name) {
  // Dropped outside the lock: the last reference unmaps.
  std::vector<std::shared_ptr<const SharedMemoryRegion>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = regions_.begin(); it != regions_.end();) {
      const SharedMemoryRegionStatus& d = it->second->description();
      if (d.kind == kind && (name.empty() || d.name == name)) {
        bytes_ -= d.byte_size;
        dropped.push_back(std::move(it->second));
        it = regions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return Status::Ok();
}

Status SharedMemoryRegistry::status(SharedMemoryKind kind, const std::string& name,
                                    std::vector<SharedMemoryRegionStatus>* out) const {
  out->clear();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [region_name, region] : regions_) {
    const SharedMemoryRegionStatus& d = region->description();
    if (d.kind == kind && (name.empty() || region_name == name)) out->push_back(d);
  }
  if (!name.empty() && out->empty()) {
    return Status::Error(StatusCode::kNotFound, std::string("no ") + kind_text(kind) + " shared memory region " +
                                                    quoted(name) + " is registered");
  }
  return Status::Ok();
}

Status SharedMemoryRegistry::slice(std::string_view name, uint64_t offset, uint64_t byte_size,
                                   SharedMemorySlice* out) const {
  std::shared_ptr<const SharedMemoryRegion> region;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = regions_.find(name);
    if (it == regions_.end()) return invalid("no shared memory region " + quoted(name) + " is registered");
    region = it->second;
  }
  const SharedMemoryRegionStatus& d = region->description();
  if (!within(offset, byte_size, d.byte_size)) {
    return invalid("shared memory offset " + std::to_string(offset) + " + byte_size " + std::to_string(byte_size) +
                   " is past the end of region " + quoted(name) + " (" + std::to_string(d.byte_size) + " bytes)");
  }
  Status status = region->check_in_use();
  if (!status.ok()) return status;
  out->data = region->data() + offset;
  out->size = static_cast<size_t>(byte_size);
  out->offset = offset;
  out->region = std::move(region);
  return Status::Ok();
}

size_t SharedMemoryRegistry::region_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return regions_.size();
}

uint64_t SharedMemoryRegistry::registered_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

}  // namespace inferd
