#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "runtime/sampler.h"

namespace latent {
namespace {

std::vector<float> logits_of(std::vector<float> v) { return v; }

TEST(Sampler, GreedyTiesToLowestId) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 0);
  auto l = logits_of({1, 3, 3, 2});
  EXPECT_EQ(s.sample(l, {}, {}).token, 1);
}

TEST(Sampler, BannedIdsNeverSampled) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 0);
  std::vector<bool> banned = {false, true, false};
  auto l = logits_of({1, 9, 2});
  EXPECT_EQ(s.sample(l, {}, {}, &banned).token, 2);
}

TEST(Sampler, MaskedIdsAreNotTopLogprobAlternatives) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 3;
  Sampler s(p, 0);
  const float inf = std::numeric_limits<float>::infinity();
  auto l = logits_of({-inf, 1.0f, -inf, 0.0f});  // a constraint allowed ids 1 and 3 only
  const SampleResult r = s.sample(l, {}, {});
  EXPECT_EQ(r.token, 1);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].first, 1);
  EXPECT_EQ(r.top[1].first, 3);
  EXPECT_TRUE(std::isfinite(r.top[1].second));
}

TEST(Sampler, SeedIsReproduciblePerStream) {
  SamplingParams p;
  p.seed = 42;
  std::vector<int32_t> a, b, c;
  Sampler s1(p, 0), s2(p, 0), s3(p, 1);
  for (int i = 0; i < 50; ++i) {
    auto l1 = logits_of({0, 0.1f, 0.2f, 0.3f, 0.4f});
    auto l2 = l1, l3 = l1;
    a.push_back(s1.sample(l1, {}, {}).token);
    b.push_back(s2.sample(l2, {}, {}).token);
    c.push_back(s3.sample(l3, {}, {}).token);
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.top_k = 1;
  p.seed = 3;
  Sampler s(p, 0);
  for (int i = 0; i < 20; ++i) {
    auto l = logits_of({0.5f, 0.4f, 0.6f});
    EXPECT_EQ(s.sample(l, {}, {}).token, 2);
  }
}

TEST(Sampler, TopPAndMinPTruncate) {
  SamplingParams p;
  p.seed = 1;
  p.top_p = 0.5f;  // p(id 0) = e^5/(e^5+2) ≈ 0.987 -> only id 0 survives
  Sampler s(p, 0);
  for (int i = 0; i < 20; ++i) {
    auto l = logits_of({5, 0, 0});
    EXPECT_EQ(s.sample(l, {}, {}).token, 0);
  }
  SamplingParams q;
  q.seed = 1;
  q.min_p = 0.5f;  // ids 1, 2 have p/p_max = e^-1 < 0.5
  Sampler t(q, 0);
  for (int i = 0; i < 20; ++i) {
    auto l = logits_of({1, 0, 0});
    EXPECT_EQ(t.sample(l, {}, {}).token, 0);
  }
}

TEST(Sampler, DistributionFollowsSoftmax) {
  SamplingParams p;
  p.seed = 7;
  Sampler s(p, 0);
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    auto l = logits_of({0, std::log(3.0f)});
    ++counts[s.sample(l, {}, {}).token];
  }
  EXPECT_NEAR(counts[1] / double(n), 0.75, 0.02);
}

TEST(Sampler, PenaltiesAndBias) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{0, -100.0f}};
  Sampler s(p, 0);
  auto l = logits_of({10, 1, 2});
  EXPECT_EQ(s.sample(l, {}, {}).token, 2);
  SamplingParams r;
  r.temperature = 0;
  r.repetition_penalty = 2.0f;  // 4 -> 2 (< 3)
  Sampler s2(r, 0);
  auto l2 = logits_of({4, 3});
  std::vector<int32_t> prompt = {0};
  EXPECT_EQ(s2.sample(l2, prompt, {}).token, 1);
  SamplingParams f;
  f.temperature = 0;
  f.frequency_penalty = 1.0f;  // generated twice: 4 - 2 < 3
  Sampler s3(f, 0);
  auto l3 = logits_of({4, 3});
  std::vector<int32_t> gen = {0, 0};
  EXPECT_EQ(s3.sample(l3, {}, gen).token, 1);
  auto l4 = logits_of({4, 3});
  EXPECT_EQ(s3.sample(l4, gen, {}).token, 0);  // prompt tokens are not penalized by frequency
}

TEST(Sampler, Logprobs) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 2;
  Sampler s(p, 0);
  auto l = logits_of({0, std::log(3.0f), -50});
  auto r = s.sample(l, {}, {});
  EXPECT_EQ(r.token, 1);
  EXPECT_NEAR(r.logprob, std::log(0.75), 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].first, 1);
  EXPECT_EQ(r.top[1].first, 0);
  EXPECT_NEAR(r.top[1].second, std::log(0.25), 1e-5);
}

}  // namespace
}  // namespace latent
