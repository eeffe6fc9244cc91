#include "inferd/worker_ring.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <new>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace inferd::worker {
namespace {

constexpr uint32_t kMagic = 0x494e4652;  // "INFR"
constexpr uint32_t kVersion = 2;
// Beyond this a region is refused: the other side grew its file past any batch we would serve.
constexpr size_t kMaxRegionBytes = size_t{1} << 38;

[[noreturn]] void fail(const char* what) { throw std::system_error(errno, std::generic_category(), what); }

size_t page_rounded(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

}  // namespace

std::string RingFds::format() const {
  std::ostringstream out;
  out << ring << ',' << inputs << ',' << outputs << ',' << to_worker << ',' << to_server;
  return out.str();
}

RingFds RingFds::parse(const std::string& text) {
  int values[5];
  size_t start = 0;
  for (int i = 0; i < 5; ++i) {
    const size_t end = i < 4 ? text.find(',', start) : text.size();
    if (end == std::string::npos || end == start) throw std::invalid_argument("ring descriptors: '" + text + "'");
    const std::string item = text.substr(start, end - start);
    if (item.find_first_not_of("0123456789") != std::string::npos || item.size() > 9) {
      throw std::invalid_argument("ring descriptors: '" + text + "'");
    }
    values[i] = std::stoi(item);
    start = end + 1;
  }
  return RingFds{values[0], values[1], values[2], values[3], values[4]};
}

// --- SharedRegion -------------------------------------------------------------------------------

Mapping::Mapping(int fd, size_t size) : size_(size) {
  if (size > kMaxRegionBytes) {
    throw std::system_error(EFBIG, std::generic_category(), "shared region of " + std::to_string(size) + " bytes");
  }
  if (size == 0) return;
  void* data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) fail("mmap");
  data_ = static_cast<std::byte*>(data);
}

Mapping::~Mapping() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

SharedRegion SharedRegion::create(const char* name, size_t size, bool fixed) {
  SharedRegion region;
  region.fd_ = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (region.fd_ < 0) fail("memfd_create");
  const size_t bytes = page_rounded(size);
  if (::ftruncate(region.fd_, static_cast<off_t>(bytes)) != 0) fail("ftruncate");
  // The other side may never shrink what this side has mapped (its pages would SIGBUS here).
  if (::fcntl(region.fd_, F_ADD_SEALS, F_SEAL_SHRINK | (fixed ? F_SEAL_GROW : 0) | F_SEAL_SEAL) != 0) {
    fail("F_ADD_SEALS");
  }
  region.mapping_ = std::make_shared<Mapping>(region.fd_, bytes);
  return region;
}

SharedRegion SharedRegion::adopt(int fd) {
  SharedRegion region;
  region.fd_ = fd;
  struct stat status{};
  if (::fstat(fd, &status) != 0) fail("fstat");
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    throw std::invalid_argument("a shared region must be a memfd sealed against shrinking");
  }
  region.mapping_ = std::make_shared<Mapping>(fd, static_cast<size_t>(status.st_size));
  return region;
}

SharedRegion::~SharedRegion() {
  if (fd_ >= 0) ::close(fd_);
}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), mapping_(std::move(other.mapping_)) {}

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    mapping_ = std::move(other.mapping_);
  }
  return *this;
}

void SharedRegion::reserve(size_t bytes) {
  if (bytes <= size()) return;
  const size_t grown = page_rounded(std::max(bytes, 2 * size()));
  if (::ftruncate(fd_, static_cast<off_t>(grown)) != 0) fail("ftruncate");
  mapping_ = std::make_shared<Mapping>(fd_, grown);
}

bool SharedRegion::cover(size_t end) {
  if (end <= size()) return true;
  struct stat status{};
  if (::fstat(fd_, &status) != 0) fail("fstat");
  if (static_cast<size_t>(status.st_size) < end) return false;
  mapping_ = std::make_shared<Mapping>(fd_, static_cast<size_t>(status.st_size));
  return true;
}

// --- Doorbell -----------------------------------------------------------------------------------

Doorbell Doorbell::create() {
  Doorbell bell;
  bell.fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (bell.fd_ < 0) fail("eventfd");
  return bell;
}

Doorbell Doorbell::adopt(int fd) {
  Doorbell bell;
  bell.fd_ = fd;
  // Inherited descriptors may be blocking: a drain must never wait.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) fail("fcntl(O_NONBLOCK)");
  return bell;
}

Doorbell::~Doorbell() {
  if (fd_ >= 0) ::close(fd_);
}

Doorbell::Doorbell(Doorbell&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

Doorbell& Doorbell::operator=(Doorbell&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void Doorbell::ring() const {
  const uint64_t one = 1;
  // EAGAIN only when the counter is near 2^64: it is readable then anyway.
  while (::write(fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void Doorbell::drain() const {
  uint64_t count = 0;
  while (::read(fd_, &count, sizeof count) < 0 && errno == EINTR) {
  }
}

// --- WorkerRing ---------------------------------------------------------------------------------

WorkerRing::WorkerRing(Side side, SharedRegion ring, SharedRegion inputs, SharedRegion outputs, Doorbell to_worker,
                       Doorbell to_server)
    : side_(side),
      ring_(std::move(ring)),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      to_worker_(std::move(to_worker)),
      to_server_(std::move(to_server)),
      header_(reinterpret_cast<RingHeader*>(ring_.data())) {}

WorkerRing WorkerRing::create(const std::string& name) {
  SharedRegion ring = SharedRegion::create(("inferd-ring-" + name).c_str(), sizeof(RingHeader), true);
  auto* header = new (ring.data()) RingHeader{};
  header->magic = kMagic;
  header->version = kVersion;
  header->slot_count = kSlotCount;
  header->slot_bytes = sizeof(Message);
  SharedRegion inputs = SharedRegion::create(("inferd-inputs-" + name).c_str(), 1 << 20, false);
  SharedRegion outputs = SharedRegion::create(("inferd-outputs-" + name).c_str(), 1 << 20, false);
  return WorkerRing(Side::kServer, std::move(ring), std::move(inputs), std::move(outputs), Doorbell::create(),
                    Doorbell::create());
}

WorkerRing WorkerRing::adopt(const RingFds& fds) {
  // Each descriptor is owned as soon as it is adopted, so a refusal below closes them all.
  SharedRegion ring = SharedRegion::adopt(fds.ring);
  SharedRegion inputs = SharedRegion::adopt(fds.inputs);
  SharedRegion outputs = SharedRegion::adopt(fds.outputs);
  Doorbell to_worker = Doorbell::adopt(fds.to_worker);
  Doorbell to_server = Doorbell::adopt(fds.to_server);
  if (ring.size() < sizeof(RingHeader)) throw std::invalid_argument("the ring region is too small");
  const auto* header = reinterpret_cast<const RingHeader*>(ring.data());
  if (header->magic != kMagic || header->version != kVersion || header->slot_count != kSlotCount ||
      header->slot_bytes != sizeof(Message)) {
    throw std::invalid_argument("the ring region is not of this protocol version (server and worker differ)");
  }
  return WorkerRing(Side::kWorker, std::move(ring), std::move(inputs), std::move(outputs), std::move(to_worker),
                    std::move(to_server));
}

RingFds WorkerRing::fds() const {
  return RingFds{ring_.fd(), inputs_.fd(), outputs_.fd(), to_worker_.fd(), to_server_.fd()};
}

SlotQueue& WorkerRing::outbound() const { return side_ == Side::kServer ? header_->to_worker : header_->to_server; }

SlotQueue& WorkerRing::inbound() const { return side_ == Side::kServer ? header_->to_server : header_->to_worker; }

bool WorkerRing::send(const Message& message) {
  SlotQueue& queue = outbound();
  const uint32_t tail = queue.tail.load(std::memory_order_relaxed);
  // Unsigned: a head the other side wrote past the tail reads as a full queue, never as room.
  if (tail - queue.head.load(std::memory_order_acquire) >= kSlotCount) return false;
  queue.slots[tail % kSlotCount] = message;
  // Sequentially consistent with the receiver's store of `sleeping` and its load of `tail`:
  // either it sees this message before it sleeps, or this sees it sleeping and rings.
  queue.tail.store(tail + 1, std::memory_order_seq_cst);
  if (queue.sleeping.load(std::memory_order_seq_cst) != 0) outbound_bell().ring();
  return true;
}

bool WorkerRing::receive(Message* message) {
  SlotQueue& queue = inbound();
  const uint32_t head = queue.head.load(std::memory_order_relaxed);
  const uint32_t tail = queue.tail.load(std::memory_order_acquire);
  if (tail == head) return false;
  if (tail - head > kSlotCount) throw std::runtime_error("the ring's counters are corrupt");
  *message = queue.slots[head % kSlotCount];
  queue.head.store(head + 1, std::memory_order_release);
  return true;
}

WorkerRing::Wait WorkerRing::wait(int timeout_ms, int also, std::chrono::microseconds spin) {
  SlotQueue& queue = inbound();
  auto pending = [&queue] {
    return queue.tail.load(std::memory_order_seq_cst) != queue.head.load(std::memory_order_relaxed);
  };
  if (pending()) return Wait::kMessage;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  if (spin.count() > 0 && timeout_ms != 0) {
    auto until = std::chrono::steady_clock::now() + spin;
    if (timeout_ms > 0) until = std::min(until, deadline);
    for (uint32_t round = 1;; ++round) {
      if (pending()) return Wait::kMessage;
      if (round % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
  queue.sleeping.store(1, std::memory_order_seq_cst);
  if (pending()) {
    queue.sleeping.store(0, std::memory_order_relaxed);
    return Wait::kMessage;
  }
  pollfd fds[2] = {{inbound_bell().fd(), POLLIN, 0}, {also, POLLIN, 0}};
  int ready = 0;
  while (true) {
    int wait_ms = timeout_ms;
    if (timeout_ms >= 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      wait_ms = static_cast<int>(std::max<int64_t>(left.count(), 0));
    }
    ready = ::poll(fds, also >= 0 ? 2 : 1, wait_ms);
    if (ready >= 0 || errno != EINTR) break;
  }
  queue.sleeping.store(0, std::memory_order_relaxed);
  if (ready < 0) fail("poll");
  if ((fds[0].revents & POLLIN) != 0) inbound_bell().drain();
  if (pending()) return Wait::kMessage;
  if (also >= 0 && fds[1].revents != 0) return Wait::kOther;
  return ready == 0 ? Wait::kTimeout : Wait::kWoken;
}

void WorkerRing::wake() const { inbound_bell().ring(); }

uint32_t WorkerRing::inbound_sent() const { return inbound().tail.load(std::memory_order_acquire); }

uint64_t WorkerRing::streamed_taken() const { return header_->streamed_taken.load(std::memory_order_acquire); }

void WorkerRing::set_streamed_taken(uint64_t taken) { header_->streamed_taken.store(taken, std::memory_order_release); }

}  // namespace inferd::worker
