#include <gtest/gtest.h>

#include <random>

#include "runtime/stop_strings.h"

namespace latent {
namespace {

// Feeds `text` split at the given cut points; returns (all emitted text, stopped, every emitted piece).
std::tuple<std::string, bool, std::vector<std::string>> run(const std::vector<std::string>& stops,
                                                            const std::vector<std::string>& pieces) {
  StopStringMatcher m(stops);
  std::string all;
  std::vector<std::string> emitted;
  bool stopped = false;
  for (const auto& p : pieces) {
    auto o = m.feed(p);
    all += o.emit;
    emitted.push_back(o.emit);
    if (o.stopped) {
      stopped = true;
      break;
    }
  }
  if (!stopped) {
    auto rest = m.finish();
    all += rest;
    emitted.push_back(rest);
  }
  return {all, stopped, emitted};
}

TEST(StopStrings, CutBeforeMatchAcrossPieces) {
  auto [all, stopped, em] = run({"END"}, {"hello E", "N", "D and more"});
  EXPECT_EQ(all, "hello ");
  EXPECT_TRUE(stopped);
  for (const auto& e : em) {
    EXPECT_EQ(e.find('E'), std::string::npos) << e;  // no partial stop string is ever emitted
  }
}

TEST(StopStrings, HeldBackTextIsFlushedWhenItCannotMatch) {
  auto [all, stopped, em] = run({"END"}, {"hello E", "N", "X"});
  EXPECT_EQ(all, "hello ENX");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(em[0], "hello ");
  EXPECT_EQ(em[1], "");
  EXPECT_EQ(em[2], "ENX");
}

TEST(StopStrings, EarliestOfSeveral) {
  auto [all, stopped, em] = run({"bb", "abc"}, {"xxab", "cbb"});
  EXPECT_EQ(all, "xx");
  EXPECT_TRUE(stopped);
}

TEST(StopStrings, HoldBackAtTheEndIsFlushed) {
  auto [all, stopped, em] = run({"</s>"}, {"text </"});
  EXPECT_EQ(all, "text </");
  EXPECT_FALSE(stopped);
}

TEST(StopStrings, NoStops) {
  auto [all, stopped, em] = run({}, {"a", "b"});
  EXPECT_EQ(all, "ab");
  EXPECT_EQ(em[0], "a");
}

TEST(StopStrings, RandomSplitsAgreeWithWholeText) {
  std::mt19937 rng(5);
  const std::string alphabet = "abcE ND";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    int n = 1 + rng() % 30;
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops = {"END", "cab"};
    size_t cut = std::string::npos;
    for (auto& s : stops) cut = std::min(cut, text.find(s));
    std::string expect = cut == std::string::npos ? text : text.substr(0, cut);
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      size_t len = 1 + rng() % 4;
      pieces.push_back(text.substr(i, len));
      i += len;
    }
    auto [all, stopped, em] = run(stops, pieces);
    ASSERT_EQ(all, expect) << text;
    ASSERT_EQ(stopped, cut != std::string::npos);
  }
}

}  // namespace
}  // namespace latent
