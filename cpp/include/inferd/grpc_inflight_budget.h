#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

namespace inferd {

// Gives the memory of large requests back to the system once they are answered. glibc keeps what
// is freed in its arenas for reuse, and a large request leaves gigabytes there (grpc's receive
// slices, the joined copy, decoded contents, the answer): after four concurrent 400 MB requests an
// idle server held 2.2 GB. malloc_trim returns the free pages of every arena; it walks the heap,
// so it runs once per kBytes of large requests released, not per request. Small requests are not
// counted: their memory is reused from glibc's free lists by the next ones, and counting them would
// put a heap walk on the request path every few seconds of ordinary traffic.
// Invariants: trims at most once per kBytes released in requests of at least kLarge bytes
// (whoever crosses it trims, on its thread).
class LargeRequestTrim {
 public:
  static constexpr uint64_t kBytes = uint64_t{64} << 20;
  static constexpr uint64_t kLarge = uint64_t{1} << 20;

  void released(uint64_t bytes) {
    if (bytes < kLarge) return;
    const uint64_t total = released_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    if (total < kBytes) return;
    uint64_t expected = total;
    while (expected >= kBytes && !released_.compare_exchange_weak(expected, 0, std::memory_order_relaxed)) {
    }
    if (expected < kBytes) return;  // another thread trims
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
  }

 private:
  std::atomic<uint64_t> released_{0};  // bytes released since the last trim
};

class InflightBudget;

// Bytes taken from an InflightBudget, given back when the reservation is destroyed (or reset).
// Invariants: gives back exactly what it took, exactly once; an empty reservation holds nothing.
// Move-only; keeps its budget alive.
class ByteReservation {
 public:
  ByteReservation() = default;
  ByteReservation(ByteReservation&& other) noexcept
      : budget_(std::move(other.budget_)), bytes_(std::exchange(other.bytes_, 0)) {}
  ByteReservation& operator=(ByteReservation&& other) noexcept {
    if (this != &other) {
      reset();
      budget_ = std::move(other.budget_);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ByteReservation(const ByteReservation&) = delete;
  ByteReservation& operator=(const ByteReservation&) = delete;
  ~ByteReservation() { reset(); }

  inline void reset();
  uint64_t bytes() const { return bytes_; }

 private:
  friend class InflightBudget;
  ByteReservation(std::shared_ptr<InflightBudget> budget, uint64_t bytes) : budget_(std::move(budget)), bytes_(bytes) {}
  std::shared_ptr<InflightBudget> budget_;
  uint64_t bytes_ = 0;
};

// The bytes of requests the server has received and not yet answered, all calls together,
// against a limit (--max-inflight-bytes): a request that would take the total past it is refused
// at once instead of being held, so that however many clients send large requests at the same
// time, what they make the server hold stays bounded.
// Invariants: used() <= limit whenever limit > 0 (a reservation is taken only if it fits, by one
// compare-and-swap); used() is the sum of the live reservations. Thread-safe, never blocks. Owned
// by shared_ptr (reservations share it).
class InflightBudget : public std::enable_shared_from_this<InflightBudget> {
 public:
  explicit InflightBudget(uint64_t limit) : limit_(limit) {}  // 0 = no limit
  InflightBudget(const InflightBudget&) = delete;
  InflightBudget& operator=(const InflightBudget&) = delete;

  // `bytes` more, if they fit: true and `*out` holds them; false (and `*out` left empty) if not.
  bool reserve(uint64_t bytes, ByteReservation* out) {
    uint64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (limit_ != 0 && (bytes > limit_ || used > limit_ - bytes)) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    *out = ByteReservation(shared_from_this(), bytes);
    return true;
  }

  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }

  // `bytes` freed outside a reservation of that size (a stream's backlog of small answers): they
  // count towards the trim as one release would (LargeRequestTrim).
  void released_elsewhere(uint64_t bytes) { trim_.released(bytes); }

 private:
  friend class ByteReservation;
  void release(uint64_t bytes) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    trim_.released(bytes);
  }

  const uint64_t limit_;
  LargeRequestTrim trim_;
  std::atomic<uint64_t> used_{0};
};

inline void ByteReservation::reset() {
  if (budget_ != nullptr) budget_->release(bytes_);
  budget_.reset();
  bytes_ = 0;
}

}  // namespace inferd
