#include "inferd/completion_queue.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <set>
#include <thread>
#include <vector>

namespace inferd {
namespace {

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

Completion completion(uint64_t token) {
  Completion c;
  c.token = token;
  return c;
}

TEST(CompletionQueue, SignalsWhenNonEmptyAndResetsOnDrain) {
  CompletionQueue queue;
  EXPECT_FALSE(readable(queue.fd()));
  queue.push(completion(1));
  queue.push(completion(2));
  EXPECT_TRUE(readable(queue.fd()));
  auto done = queue.drain();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].token, 1u);
  EXPECT_EQ(done[1].token, 2u);
  EXPECT_FALSE(readable(queue.fd()));
  EXPECT_TRUE(queue.drain().empty());
}

TEST(CompletionQueue, EveryCompletionFromManyThreadsIsDrainedOnce) {
  constexpr int kThreads = 4, kEach = 5000;
  CompletionQueue queue;
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) queue.push(completion(static_cast<uint64_t>(t * kEach + i)));
    });
  }
  std::set<uint64_t> seen;
  // The consumer sleeps on the fd as the event loop does; a lost signal would hang this loop.
  while (seen.size() < static_cast<size_t>(kThreads * kEach)) {
    pollfd p{queue.fd(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1) << "no signal with completions outstanding";
    for (auto& c : queue.drain()) EXPECT_TRUE(seen.insert(c.token).second);
  }
  for (auto& t : producers) t.join();
  EXPECT_TRUE(queue.drain().empty());
}

}  // namespace
}  // namespace inferd
