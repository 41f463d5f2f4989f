#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "runtime/sampler.h"
#include "truncated_softmax.h"

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

// ---------------------------------------------------------------------------------------------------------------
// The shared draw (backend/sampling.h): Backend::sample_rows' reference against the host Sampler, and the
// distribution of the draws.
// ---------------------------------------------------------------------------------------------------------------
namespace latent {
namespace {

TEST(SampleMath, WeightIsQuantizedExp) {
  EXPECT_EQ(sample_weight(0.0f), uint64_t{1} << 44);
  EXPECT_EQ(sample_weight(-0.0f), uint64_t{1} << 44);
  EXPECT_EQ(sample_weight(-30.0f), 0u);
  EXPECT_EQ(sample_weight(-std::numeric_limits<float>::infinity()), 0u);
  uint64_t prev = sample_weight(0.0f);
  for (float dx = -0.001f; dx > -29.0f; dx -= 0.0137f) {
    const uint64_t w = sample_weight(dx);
    const double e = std::exp(static_cast<double>(dx)) * 17592186044416.0;
    EXPECT_NEAR(static_cast<double>(w), e, 1.0 + 1e-6 * e) << dx;  // fp32 exp within a few ulp, then floor
    EXPECT_LE(w, prev) << dx;                                      // monotone on this grid
    prev = w;
  }
}

TEST(SampleMath, KeyOrdersByValueThenLowerId) {
  EXPECT_GT(sample_key(1.0f, 5), sample_key(0.5f, 1));
  EXPECT_GT(sample_key(-0.5f, 5), sample_key(-1.0f, 1));
  EXPECT_GT(sample_key(0.25f, 2), sample_key(0.25f, 3));
  EXPECT_GT(sample_key(0.0f, 9), sample_key(-1e-30f, 0));
}

TEST(SampleMath, RandomIsCounterBased) {
  const uint64_t k = sample_stream_key(42, 0);
  EXPECT_EQ(sample_random(k, 7), sample_random(sample_stream_key(42, 0), 7));
  EXPECT_NE(sample_random(k, 7), sample_random(k, 8));
  EXPECT_NE(sample_random(k, 7), sample_random(sample_stream_key(42, 1), 7));
  EXPECT_NE(sample_random(k, 7), sample_random(sample_stream_key(43, 0), 7));
}

struct RowCase {
  SamplingParams p;
  bool banned = false, mask = false, history = false;
};

std::vector<RowCase> row_cases() {
  std::vector<RowCase> c;
  auto add = [&](auto f, bool banned = false, bool mask = false, bool history = false) {
    RowCase r;
    r.p.seed = 11;
    f(r.p);
    r.banned = banned;
    r.mask = mask;
    r.history = history;
    c.push_back(r);
  };
  add([](SamplingParams& p) { p.temperature = 0; });
  add([](SamplingParams& p) { p.temperature = 0; }, true, true, true);
  add([](SamplingParams&) {});
  add([](SamplingParams& p) { p.temperature = 0.7f; });
  add([](SamplingParams& p) {
    p.temperature = 1.3f;
    p.top_k = 40;
  });
  add([](SamplingParams& p) { p.top_k = 1; });
  add([](SamplingParams& p) { p.top_p = 0.9f; });
  add([](SamplingParams& p) {
    p.top_p = 0.3f;
    p.temperature = 0.5f;
  });
  add([](SamplingParams& p) { p.min_p = 0.1f; });
  add([](SamplingParams& p) { p.min_p = 1.0f; });
  add([](SamplingParams& p) {
    p.top_k = 200;
    p.top_p = 0.95f;
    p.min_p = 0.02f;
    p.temperature = 0.8f;
  });
  add(
      [](SamplingParams& p) {
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.25f;
      },
      false, false, true);
  add(
      [](SamplingParams& p) {
        p.logit_bias = {{3, 5.0f}, {17, -100.0f}, {999, 2.5f}};
        p.repetition_penalty = 0.8f;
        p.top_k = 50;
      },
      true, false, true);
  add(
      [](SamplingParams& p) {
        p.top_p = 0.8f;
        p.frequency_penalty = -0.5f;
      },
      true, true, true);
  return c;
}

// Draws from the Sampler and from sample_rows_reference (the device op's reference) over the same logits agree
// for every parameter mix: same edits, same masks, same integer draw.
TEST(SampleRows, ReferenceEqualsSampler) {
  std::mt19937 g(5);
  const int64_t V = 1000;
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<bool> banned(static_cast<size_t>(V), false);
  for (int64_t i = 990; i < V; ++i) banned[static_cast<size_t>(i)] = true;
  const std::vector<uint32_t> banned_bits = sample_bitmask(banned);
  std::vector<bool> allowed(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) allowed[static_cast<size_t>(i)] = i % 3 != 1;
  const std::vector<uint32_t> allow_bits = sample_bitmask(allowed);
  const float ninf = -std::numeric_limits<float>::infinity();
  int rows = 0, diffs = 0;
  int64_t stream = 0;
  for (const RowCase& c : row_cases()) {
    Sampler host(c.p, static_cast<uint64_t>(stream)), dev(c.p, static_cast<uint64_t>(stream));
    ++stream;
    std::vector<int32_t> prompt, gen;
    if (c.history)
      for (int i = 0; i < 60; ++i) prompt.push_back(static_cast<int32_t>(g() % V));
    for (int step = 0; step < 25; ++step) {
      std::vector<float> l(static_cast<size_t>(V));
      for (auto& v : l) v = nd(g);
      if (step % 5 == 0) l[7] = l[8] = 9.0f;  // exact ties
      std::vector<float> a = l, b = l;
      if (c.mask)
        for (int64_t i = 0; i < V; ++i)
          if (!allowed[static_cast<size_t>(i)]) a[static_cast<size_t>(i)] = ninf;
      const int32_t t_host = host.sample(a, prompt, gen, c.banned ? &banned : nullptr).token;
      SampleRowParams row;
      std::vector<SampleEdit> edits;
      ASSERT_TRUE(dev.device_row(prompt, gen, V, row, edits));
      if (c.mask) row.allow_offset = 0;
      int32_t t_dev = -1;
      sample_rows_reference(b.data(), 1, V, &row, edits.data(), allow_bits.data(),
                            c.banned ? banned_bits.data() : nullptr, &t_dev);
      dev.advance();
      ++rows;
      diffs += t_host != t_dev;
      EXPECT_EQ(t_host, t_dev) << "case " << stream - 1 << " step " << step;
      EXPECT_EQ(a, b) << "final scores differ: case " << stream - 1;
      if (c.banned) {
        EXPECT_FALSE(banned[static_cast<size_t>(t_dev)]);
      }
      if (c.mask) {
        EXPECT_TRUE(allowed[static_cast<size_t>(t_dev)]);
      }
      if (c.history) gen.push_back(t_host);
    }
  }
  EXPECT_EQ(diffs, 0) << rows << " rows";
}

TEST(SampleRows, DeviceRowRefusesWhatItCannotDo) {
  SamplingParams p;
  p.logprobs = true;
  SampleRowParams row;
  std::vector<SampleEdit> e;
  EXPECT_FALSE(Sampler(p, 0).device_row({}, {}, 10, row, e));
  SamplingParams q;
  q.logit_bias = {{2, 1.0f}, {2, 1.0f}};  // one id twice: added twice on the host
  EXPECT_FALSE(Sampler(q, 0).device_row({}, {}, 10, row, e));
  EXPECT_FALSE(Sampler(SamplingParams{}, 0).device_row({}, {}, kSampleMaxVocab + 1, row, e));
  EXPECT_TRUE(e.empty());
  SamplingParams r;
  r.frequency_penalty = 1.0f;
  r.repetition_penalty = 1.2f;
  std::vector<int32_t> prompt = {4, 4, 2}, gen = {4, 9, 9, 9};
  ASSERT_TRUE(Sampler(r, 0).device_row(prompt, gen, 10, row, e));
  ASSERT_EQ(e.size(), 3u);  // one edit per distinct token, by id
  EXPECT_EQ(e[0].token, 2);
  EXPECT_EQ(e[0].count, 0);
  EXPECT_EQ(e[1].token, 4);
  EXPECT_EQ(e[1].count, 1);
  EXPECT_EQ(e[2].token, 9);
  EXPECT_EQ(e[2].count, 3);
  EXPECT_EQ(e[2].flags, kSampleEditSeen);
}

TEST(SampleRows, DrawsFollowTheTruncatedDistribution) {
  const std::vector<float> l = {2.0f, 1.5f, 1.4f, 0.3f, 0.0f, -0.5f, -1.0f, -3.0f, 1.45f, -7.0f};
  std::vector<SampleRowParams> cases(5);
  cases[0].temperature = 1.0f;
  cases[1].temperature = 0.7f;
  cases[1].top_k = 4;
  cases[2].temperature = 1.2f;
  cases[2].top_p = 0.8f;
  cases[3].temperature = 1.0f;
  cases[3].min_p = 0.2f;
  cases[4].temperature = 1.5f;
  cases[4].top_k = 6;
  cases[4].top_p = 0.9f;
  cases[4].min_p = 0.05f;
  const int n = 40000;
  for (size_t c = 0; c < cases.size(); ++c) {
    SampleRowParams p = cases[c];
    p.rng_key = sample_stream_key(99, c);
    const std::vector<double> q = truncated_softmax(l, p);
    std::vector<int> counts(l.size(), 0);
    for (int i = 0; i < n; ++i) {
      p.rng_counter = static_cast<uint64_t>(i);
      std::vector<float> x = l;
      int32_t id = -1;
      sample_rows_reference(x.data(), 1, static_cast<int64_t>(l.size()), &p, nullptr, nullptr, nullptr, &id);
      ++counts[static_cast<size_t>(id)];
    }
    for (size_t i = 0; i < l.size(); ++i) {
      const double f = counts[i] / double(n), sd = std::sqrt(q[i] * (1 - q[i]) / n);
      if (q[i] == 0.0)
        EXPECT_EQ(counts[i], 0) << "case " << c << " id " << i << " was truncated";
      else
        EXPECT_NEAR(f, q[i], 5 * sd + 1e-4) << "case " << c << " id " << i;
    }
  }
}

}  // namespace
}  // namespace latent
