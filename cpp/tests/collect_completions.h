#pragma once

#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "inferd/completion_queue.h"
#include "inferd/inference_request.h"

namespace inferd {

// Collects completions from `queue` until `n` have arrived (or a 10 s guard passes), each token
// once; `order`, when given, gets the tokens in the order they were answered.
inline std::map<uint64_t, Completion> collect(CompletionQueue& queue, size_t n,
                                              std::vector<uint64_t>* order = nullptr) {
  std::map<uint64_t, Completion> done;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (done.size() < n && std::chrono::steady_clock::now() < deadline) {
    pollfd p{queue.fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
    for (auto& c : queue.drain()) {
      if (order != nullptr) order->push_back(c.token);
      EXPECT_TRUE(done.emplace(c.token, std::move(c)).second) << "token answered twice";
    }
  }
  return done;
}

}  // namespace inferd
