#include "inferd/version_routing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace inferd {
namespace {

TEST(Fnv1a64, MatchesTheReferenceVectors) {
  // From the FNV reference (www.isthe.com/chongo/tech/comp/fnv): the offset basis, "a", "foobar".
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST(Fnv1a64, HashesBytesAboveAscii) {
  // Bytes are taken unsigned: a signed char would sign-extend into the xor.
  EXPECT_EQ(fnv1a64("\xff"), (0xcbf29ce484222325ULL ^ 0xffULL) * 1099511628211ULL);
}

TEST(WeightedChoice, RefusesNoWeightsZeroWeightsAndAnOverflowingSum) {
  EXPECT_THROW(WeightedChoice(std::vector<uint64_t>{}), std::invalid_argument);
  EXPECT_THROW(WeightedChoice(std::vector<uint64_t>{3, 0}), std::invalid_argument);
  // A sum that wraps would leave the cumulative weights unordered.
  EXPECT_THROW(WeightedChoice(std::vector<uint64_t>{UINT64_MAX, 10}), std::invalid_argument);
}

TEST(WeightedChoice, EachPointFallsInItsVersionsShare) {
  const WeightedChoice choice({90, 10});
  EXPECT_EQ(choice.total(), 100U);
  EXPECT_EQ(choice.at(0), 0U);
  EXPECT_EQ(choice.at(89), 0U);
  EXPECT_EQ(choice.at(90), 1U);
  EXPECT_EQ(choice.at(99), 1U);
}

TEST(WeightedChoice, ARoutingKeyPicksItsHashsPoint) {
  const WeightedChoice choice({90, 10});
  for (int i = 0; i < 1000; ++i) {
    const std::string key = "user-" + std::to_string(i);
    const size_t picked = choice.pick(key);
    EXPECT_EQ(picked, choice.at(fnv1a64(key) % 100)) << key;
    EXPECT_EQ(choice.pick(key), picked) << key;  // sticky
  }
}

TEST(WeightedChoice, RandomPicksFollowTheWeights) {
  // 100,000 picks at 90/10: the count of the 10% version is binomial, sigma = sqrt(n p (1-p))
  // ~ 94.9; the test allows 5 sigma either side of 10,000.
  const WeightedChoice choice({90, 10});
  constexpr int kPicks = 100000;
  int second = 0;
  for (int i = 0; i < kPicks; ++i) second += choice.pick_random() == 1 ? 1 : 0;
  const double sigma = std::sqrt(kPicks * 0.1 * 0.9);
  EXPECT_NEAR(second, kPicks * 0.1, 5 * sigma);
}

}  // namespace
}  // namespace inferd
