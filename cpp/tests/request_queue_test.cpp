#include "inferd/request_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <thread>
#include <vector>

namespace inferd {
namespace {

TEST(RequestQueue, PopsInPushOrder) {
  RequestQueue<int> queue;
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(queue.push(int{i}));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(queue.try_pop(), i);
  EXPECT_FALSE(queue.try_pop().has_value());
}

TEST(RequestQueue, PushAfterCloseFailsAndLeavesTheItem) {
  RequestQueue<std::unique_ptr<int>> queue;
  queue.close();
  auto item = std::make_unique<int>(7);
  EXPECT_FALSE(queue.push(std::move(item)));
  ASSERT_NE(item, nullptr);  // still the caller's, to answer
  EXPECT_EQ(*item, 7);
}

TEST(RequestQueue, CloseLetsQueuedItemsOutThenEndsWaiters) {
  RequestQueue<int> queue;
  ASSERT_TRUE(queue.push(1));
  ASSERT_TRUE(queue.push(2));
  queue.close();
  EXPECT_EQ(queue.pop_wait(), 1);
  EXPECT_EQ(queue.pop_wait(), 2);
  EXPECT_FALSE(queue.pop_wait().has_value());
}

TEST(RequestQueue, CloseWakesBlockedConsumers) {
  RequestQueue<int> queue;
  std::atomic<int> woke{0};
  std::vector<std::thread> consumers;
  for (int i = 0; i < 4; ++i) {
    consumers.emplace_back([&] {
      if (!queue.pop_wait().has_value()) woke.fetch_add(1);
    });
  }
  queue.close();
  for (auto& t : consumers) t.join();
  EXPECT_EQ(woke.load(), 4);
}

TEST(RequestQueue, PopWaitForTimesOut) {
  RequestQueue<int> queue;
  EXPECT_FALSE(queue.pop_wait_for(std::chrono::milliseconds(5)).has_value());
}

TEST(RequestQueue, ManyProducersAndConsumersDeliverEachItemOnce) {
  constexpr int kProducers = 4, kConsumers = 4, kPerProducer = 5000;
  RequestQueue<int> queue;
  std::vector<std::thread> threads;
  std::vector<std::vector<int>> seen(kConsumers);
  for (int c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&, c] {
      while (auto v = queue.pop_wait()) seen[c].push_back(*v);
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) ASSERT_TRUE(queue.push(p * kPerProducer + i));
    });
  }
  for (auto& t : producers) t.join();
  queue.close();
  for (auto& t : threads) t.join();

  std::set<int> all;
  size_t total = 0;
  for (const auto& s : seen) {
    total += s.size();
    all.insert(s.begin(), s.end());
    // Each consumer sees each producer's items in the order they were pushed.
    std::vector<int> last(kProducers, -1);
    for (int v : s) {
      EXPECT_GT(v, last[v / kPerProducer]);
      last[v / kPerProducer] = v;
    }
  }
  EXPECT_EQ(total, static_cast<size_t>(kProducers * kPerProducer));
  EXPECT_EQ(all.size(), static_cast<size_t>(kProducers * kPerProducer));
}

}  // namespace
}  // namespace inferd
