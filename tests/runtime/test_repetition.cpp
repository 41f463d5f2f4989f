#include <gtest/gtest.h>

#include <random>

#include "runtime/repetition.h"

namespace latent {
namespace {

std::vector<int32_t> cycle(std::vector<int32_t> prefix, std::vector<int32_t> unit, int reps) {
  for (int r = 0; r < reps; ++r) prefix.insert(prefix.end(), unit.begin(), unit.end());
  return prefix;
}

TEST(LoopDetector, FindsCycleWithPeriodAndSpan) {
  // "No, the user asked" x 5 after some normal text.
  auto s = cycle({1, 2, 3, 4, 5, 6, 7}, {10, 11, 12, 13}, 5);
  auto l = detect_loop(s);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->period, 4);
  EXPECT_EQ(l->span, 20);
  EXPECT_EQ(l->start, 7);
  EXPECT_DOUBLE_EQ(l->repeats(), 5.0);
}

TEST(LoopDetector, PartialLastCycleCounts) {
  auto s = cycle({9, 8}, {1, 2, 3, 4, 5}, 4);
  s.push_back(1);
  s.push_back(2);
  auto l = detect_loop(s);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->period, 5);
  EXPECT_EQ(l->span, 22);
}

TEST(LoopDetector, ShortestPeriodWins) {
  auto l = detect_loop(cycle({}, {7, 7}, 10));  // period 1 run of 20 tokens
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->period, 1);
  EXPECT_EQ(l->span, 20);
}

TEST(LoopDetector, NoLoopInRandomText) {
  std::mt19937 rng(1);
  std::vector<int32_t> s;
  for (int i = 0; i < 5000; ++i) s.push_back(static_cast<int32_t>(rng() % 5000));
  EXPECT_FALSE(detect_loop(s).has_value());
  EXPECT_FALSE(find_longest_loop(s).has_value());
}

TEST(LoopDetector, TooFewRepeatsOrTooShortIsNotALoop) {
  EXPECT_FALSE(detect_loop(cycle({1}, {2, 3, 4, 5, 6, 7}, 2)).has_value());  // two cycles < min_repeats 3
  EXPECT_FALSE(detect_loop(std::vector<int32_t>{5, 5, 5, 5}).has_value());   // span 4 < min_span 12
  LoopDetectorOptions o;
  o.min_span = 4;
  EXPECT_TRUE(detect_loop(std::vector<int32_t>{5, 5, 5, 5}, o).has_value());
}

TEST(LoopDetector, EndsWhenStreamMovesOn) {
  auto s = cycle({}, {1, 2, 3}, 6);
  LoopDetector d;
  std::optional<LoopInfo> last;
  for (auto t : s) last = d.push(t);
  ASSERT_TRUE(last.has_value());
  EXPECT_FALSE(d.push(99).has_value());
  // The longest loop anywhere is still found for reports.
  s.push_back(99);
  auto l = find_longest_loop(s);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->period, 3);
  EXPECT_EQ(l->span, 18);
  EXPECT_EQ(l->start, 0);
}

TEST(LoopDetector, LongPeriodUpToMax) {
  std::vector<int32_t> unit;
  for (int i = 0; i < 40; ++i) unit.push_back(100 + i);
  auto l = detect_loop(cycle({}, unit, 3));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->period, 40);
  LoopDetectorOptions o;
  o.max_period = 32;
  EXPECT_FALSE(detect_loop(cycle({}, unit, 3), o).has_value());
}

}  // namespace
}  // namespace latent
