#pragma once

// The answers of one ModelStreamInfer call waiting to be sent, and the bound on their bytes;
// private to the transport (cpp/src).

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>

#include "inferd/grpc_inflight_budget.h"

namespace inferd {

// A stream call's answers waiting to be sent, in order, front() first. Their bytes are bounded per
// call (`max_bytes`, 0: no limit; the first waiting answer always fits) and, with the requests'
// bytes, by the server's InflightBudget: each queued answer holds its bytes of the budget until it
// is sent or dropped (none when it was queued over the budget as the first, or unbounded).
// Invariants: bytes_ is the sum of the queued answers' sizes; peak_bytes_ the most it has been.
// Not thread-safe: the call's lock guards it (StreamInferCall::mutex_). Never blocks.
class PendingWrites {
 public:
  PendingWrites(uint64_t max_bytes, std::shared_ptr<InflightBudget> budget)
      : max_bytes_(max_bytes), budget_(std::move(budget)) {}

  // Queues `bytes`; `ends_request`: the request's last answer. False, and nothing queued, when
  // `bounded` and the answer does not fit (per call, or in the server's budget); an answer not
  // `bounded` is always queued.
  bool push(grpc::ByteBuffer&& bytes, bool ends_request, bool bounded) {
    const uint64_t size = bytes.Length();
    ByteReservation reservation;
    const bool first = bytes_ == 0;  // the first waiting answer always fits
    const bool within_call = first || max_bytes_ == 0 || bytes_ + size <= max_bytes_;
    if (!(within_call && budget_->reserve(size, &reservation)) && bounded && !first) return false;
    bytes_ += size;
    peak_bytes_ = std::max(peak_bytes_, bytes_);
    writes_.push_back(PendingWrite{std::move(bytes), ends_request, size, std::move(reservation)});
    return true;
  }

  bool empty() const { return writes_.empty(); }

  // The answer to send next; it stays put while others are queued (a deque's elements do).
  // Requires !empty().
  grpc::ByteBuffer* front() { return &writes_.front().bytes; }

  // Drops front(), sent; true when it was its request's last answer. Requires !empty().
  bool pop_front() {
    const bool ends_request = writes_.front().ends_request;
    bytes_ -= writes_.front().size;
    writes_.pop_front();
    return ends_request;
  }

  // Drops every answer (the client is gone); returns how many were their requests' last.
  size_t clear() {
    size_t ended = 0;
    for (const PendingWrite& write : writes_) ended += write.ends_request ? 1 : 0;
    writes_.clear();
    bytes_ = 0;
    return ended;
  }

  // The most bytes that have waited at once.
  uint64_t peak_bytes() const { return peak_bytes_; }

 private:
  struct PendingWrite {
    grpc::ByteBuffer bytes;
    bool ends_request;  // the request's last answer: sending it ends the request
    uint64_t size;
    ByteReservation reservation;  // its bytes of the InflightBudget (empty when over it but first)
  };

  const uint64_t max_bytes_;  // per call, 0: no limit
  const std::shared_ptr<InflightBudget> budget_;
  std::deque<PendingWrite> writes_;  // front() in flight
  uint64_t bytes_ = 0;               // the sizes of writes_
  uint64_t peak_bytes_ = 0;          // the most bytes_ has been
};

}  // namespace inferd
