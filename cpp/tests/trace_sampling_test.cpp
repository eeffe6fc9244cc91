#include "inferd/trace_sampling.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace inferd {
namespace {

constexpr char kSampled[] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
constexpr char kNotSampled[] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

// A traceparent whose trace id's lower 64 bits are `low`.
std::string with_low_bits(const char* low, const char* flags = "01") {
  return std::string("00-0000000000000001") + low + "-b7ad6b7169203331-" + flags;
}

TEST(TraceParentTest, ReadsTheTraceIdsLowerBitsAndTheSampledFlag) {
  const auto parent = parse_traceparent(kSampled);
  ASSERT_TRUE(parent.has_value());
  EXPECT_EQ(parent->trace_id_low, 0x8448eb211c80319cULL);
  EXPECT_TRUE(parent->sampled);
  ASSERT_TRUE(parse_traceparent(kNotSampled).has_value());
  EXPECT_FALSE(parse_traceparent(kNotSampled)->sampled);
  EXPECT_TRUE(parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03")->sampled);
}

TEST(TraceParentTest, AcceptsWhatTheW3cPropagatorAccepts) {
  EXPECT_TRUE(parse_traceparent(std::string(" \t") + kSampled + " \t"));
  // A later version may append fields; version 00 may not.
  EXPECT_TRUE(parse_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-whatever"));
  EXPECT_FALSE(parse_traceparent(std::string(kSampled) + "-whatever"));
}

TEST(TraceParentTest, RefusesWhatThePropagatorIgnores) {
  for (const std::string& header : {
           std::string(""),
           std::string("garbage"),
           std::string("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01"),  // upper case
           std::string("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),  // version ff
           std::string("00-00000000000000000000000000000000-b7ad6b7169203331-01"),  // no trace id
           std::string("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"),  // no parent id
           std::string("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0"),   // short
           std::string("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x"),
           std::string("00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
           std::string("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-") + std::string(500, 'x'),
       }) {
    EXPECT_FALSE(parse_traceparent(header)) << header;
  }
}

TEST(TraceSamplingTest, OffTracesNothing) {
  const TraceSampling off;
  EXPECT_FALSE(off.traced(kSampled));
  EXPECT_FALSE(off.traced(""));
}

TEST(TraceSamplingTest, ParentBasedFollowsTheCallersFlagAndTheRatioAtTheRoot) {
  TraceSampling sampling{true, true, 0.0};
  EXPECT_TRUE(sampling.traced(kSampled));
  EXPECT_FALSE(sampling.traced(kNotSampled));
  EXPECT_FALSE(sampling.traced(""));         // a new trace, ratio 0
  EXPECT_FALSE(sampling.traced("garbage"));  // as if none was sent
  sampling.ratio = 1.0;
  EXPECT_FALSE(sampling.traced(kNotSampled));
  EXPECT_TRUE(sampling.traced(""));
}

TEST(TraceSamplingTest, TraceIdRatioComparesTheTraceIdsLowerBits) {
  const TraceSampling sampling{true, false, 0.5};
  EXPECT_TRUE(sampling.traced(with_low_bits("7fffffffffffffff", "00")));  // the flag does not matter
  EXPECT_FALSE(sampling.traced(with_low_bits("8000000000000000", "01")));
  EXPECT_TRUE(sampling.traced(with_low_bits("0000000000000000")));
  EXPECT_FALSE((TraceSampling{true, false, 0.0}.traced(with_low_bits("0000000000000000"))));
  EXPECT_TRUE((TraceSampling{true, false, 1.0}.traced(with_low_bits("ffffffffffffffff"))));
}

TEST(TraceSamplingTest, ANewTraceIsSampledWithTheRatiosProbability) {
  const TraceSampling sampling{true, true, 0.25};
  int traced = 0;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) traced += sampling.traced("") ? 1 : 0;
  // 0.25 +- 0.02 is over 6 standard deviations (61 draws) either way.
  EXPECT_GT(traced, kDraws * 0.23);
  EXPECT_LT(traced, kDraws * 0.27);
}

TEST(TraceBudgetTest, TakesUntilSpentAndNeverGoesBelowZero) {
  TraceBudget budget(2);
  EXPECT_TRUE(budget.take());
  EXPECT_EQ(budget.remaining(), 1);
  EXPECT_TRUE(budget.take());
  EXPECT_FALSE(budget.take());
  EXPECT_FALSE(budget.take());
  EXPECT_EQ(budget.remaining(), 0);
  EXPECT_FALSE(TraceBudget(0).take());
}

TEST(TraceBudgetTest, ThreadsTakingAtOnceTakeExactlyTheBudget) {
  constexpr int kThreads = 8;
  constexpr int kTries = 5000;
  TraceBudget budget(10000);
  std::atomic<int> taken{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kTries; ++i) taken += budget.take() ? 1 : 0;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(taken.load(), 10000);  // 40000 tries: every trace taken once, none twice
  EXPECT_EQ(budget.remaining(), 0);
}

TEST(TraceSamplingTest, ABudgetStopsTracingOnceSpentAndOnlySampledRequestsTakeFromIt) {
  auto budget = std::make_shared<TraceBudget>(2);
  const TraceSampling sampling{true, true, 1.0, budget};
  EXPECT_FALSE(sampling.traced(kNotSampled));  // the rule says no: nothing taken
  EXPECT_EQ(budget->remaining(), 2);
  EXPECT_TRUE(sampling.traced(""));
  EXPECT_TRUE(sampling.traced(kSampled));
  EXPECT_FALSE(sampling.traced(""));
  EXPECT_FALSE(sampling.traced(kSampled));
  // Another rule sharing the budget (a republished snapshot) finds it spent.
  EXPECT_FALSE((TraceSampling{true, false, 1.0, budget}.traced("")));
}

}  // namespace
}  // namespace inferd
