// Unit tests of the scalar reference ops (src/kernels/ref) against direct formulas written in the test.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "quant/float_formats.h"

namespace latent {
namespace {

std::vector<float> randn(size_t n, uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

QuantWeight f32_weight(const std::vector<float>& w, int64_t rows, int64_t cols) {
  QuantWeight q;
  q.format = WeightFormat::F32;
  q.rows = rows;
  q.cols = cols;
  q.data = w.data();
  return q;
}

double maxdiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

TEST(RefOps, MatmulF32AndBf16) {
  auto be = make_ref_backend(3);
  const int64_t M = 5, N = 37, K = 131;
  auto x = randn(M * K, 1), w = randn(N * K, 2);
  std::vector<float> y(M * N);
  be->matmul(f32_weight(w, N, K), x.data(), M, y.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(x[m * K + k]) * w[n * K + k];
      EXPECT_NEAR(y[m * N + n], acc, 1e-5 * (1 + std::fabs(acc)));
    }
  // bf16 weights: same as the f32 matmul of the bf16-decoded weights.
  std::vector<uint16_t> wb(w.size());
  std::vector<float> wd(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    wb[i] = f32_to_bf16(w[i]);
    wd[i] = bf16_to_f32(wb[i]);
  }
  QuantWeight qb = f32_weight(w, N, K);
  qb.format = WeightFormat::BF16;
  qb.data = wb.data();
  std::vector<float> yb(M * N), yd(M * N);
  be->matmul(qb, x.data(), M, yb.data());
  be->matmul(f32_weight(wd, N, K), x.data(), M, yd.data());
  EXPECT_EQ(maxdiff(yb, yd), 0.0);
}

TEST(RefOps, GroupedMatmulEqualsPerGroup) {
  auto be = make_ref_backend(2);
  const int64_t N = 9, K = 17;
  auto w0 = randn(N * K, 3), w1 = randn(N * K, 4), w2 = randn(N * K, 5);
  QuantWeight q0 = f32_weight(w0, N, K), q1 = f32_weight(w1, N, K), q2 = f32_weight(w2, N, K);
  const QuantWeight* ws[3] = {&q0, &q1, &q2};
  const int64_t off[4] = {0, 3, 3, 7};  // group 1 empty
  auto x = randn(7 * K, 6);
  std::vector<float> y(7 * N), r(7 * N);
  be->grouped_matmul(ws, 3, off, x.data(), y.data());
  be->matmul(q0, x.data(), 3, r.data());
  be->matmul(q2, x.data() + 3 * K, 4, r.data() + 3 * N);
  EXPECT_EQ(maxdiff(y, r), 0.0);
}

TEST(RefOps, EmbeddingGathersRows) {
  auto be = make_ref_backend(1);
  auto t = randn(10 * 4, 7);
  const int32_t ids[3] = {9, 0, 9};
  std::vector<float> out(12);
  be->embedding(f32_weight(t, 10, 4), ids, 3, out.data());
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(out[j], t[36 + j]);
    EXPECT_EQ(out[4 + j], t[j]);
    EXPECT_EQ(out[8 + j], t[36 + j]);
  }
}

TEST(RefOps, RmsNormAndLayerNorm) {
  auto be = make_ref_backend(1);
  const int64_t M = 3, D = 10;
  auto x = randn(M * D, 8), w = randn(D, 9), b = randn(D, 10);
  std::vector<float> y(M * D), z(M * D);
  be->rms_norm(x.data(), w.data(), M, D, 1e-6f, y.data(), false);
  be->layer_norm(x.data(), w.data(), b.data(), M, D, 1e-6f, z.data(), false);
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0, mean = 0, var = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(x[m * D + i]) * x[m * D + i], mean += x[m * D + i];
    mean /= D;
    for (int64_t i = 0; i < D; ++i) var += (x[m * D + i] - mean) * (x[m * D + i] - mean);
    var /= D;
    for (int64_t i = 0; i < D; ++i) {
      EXPECT_NEAR(y[m * D + i], x[m * D + i] / std::sqrt(ss / D + 1e-6) * w[i], 1e-5);
      EXPECT_NEAR(z[m * D + i], (x[m * D + i] - mean) / std::sqrt(var + 1e-6) * w[i] + b[i], 1e-5);
    }
  }
  // bf16 mode: outputs are bf16 values.
  be->rms_norm(x.data(), w.data(), M, D, 1e-6f, y.data(), true);
  for (float v : y) EXPECT_EQ(v, bf16_to_f32(f32_to_bf16(v)));
}

TEST(RefOps, RopeInterleavedAndHalfSplit) {
  auto be = make_ref_backend(1);
  const int64_t dim = 8, heads = 2, extra = 3;  // each head: 8 roped dims + 3 untouched
  const int64_t hs = dim + extra;
  std::vector<float> inv = {1.0f, 0.5f, 0.1f, 0.01f};
  const int64_t pos[2] = {3, 17};
  for (bool inter : {true, false}) {
    auto x = randn(2 * heads * hs, 11);
    auto y = x;
    RopeParams p{inv.data(), dim, 1.25f, inter};
    be->rope(y.data(), 2, heads, heads * hs, hs, pos, p, false);
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const float* a = x.data() + (t * heads + h) * hs;
        const float* r = y.data() + (t * heads + h) * hs;
        for (int64_t i = 0; i < dim / 2; ++i) {
          const int64_t i0 = inter ? 2 * i : i, i1 = inter ? 2 * i + 1 : i + dim / 2;
          const double ang = double(float(pos[t]) * inv[i]);
          const double c = std::cos(ang) * 1.25, s = std::sin(ang) * 1.25;
          EXPECT_NEAR(r[i0], a[i0] * c - a[i1] * s, 1e-5);
          EXPECT_NEAR(r[i1], a[i1] * c + a[i0] * s, 1e-5);
        }
        for (int64_t j = dim; j < hs; ++j) EXPECT_EQ(r[j], a[j]);
      }
  }
}

TEST(RefOps, SiluMulAddRound) {
  auto be = make_ref_backend(1);
  std::vector<float> g = {-3.0f, 0.0f, 0.7f, 5.0f}, u = {1.0f, 2.0f, -1.5f, 0.25f}, o(4);
  be->silu_mul(g.data(), u.data(), 4, o.data(), false);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(o[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
  std::vector<float> y = {1.0f, 2.0f}, x = {0.5f, 1e-3f};
  be->add(y.data(), x.data(), 2, false);
  EXPECT_EQ(y[0], 1.5f);
  EXPECT_EQ(y[1], 2.001f);
  std::vector<float> r = {1.00390625f + 1e-4f};
  be->round_bf16(r.data(), 1);
  EXPECT_EQ(r[0], bf16_to_f32(f32_to_bf16(1.00390625f + 1e-4f)));
}

TEST(RefOps, RouterGroupLimitedTopK) {
  auto be = make_ref_backend(1);
  // E = 8 in 4 groups of 2; keep 2 groups; K = 2.
  // logits chosen so that sigmoid order is e7 > e0 > e1 > ... but the bias moves e3 up.
  std::vector<float> logits = {2.0f, 1.5f, -1.0f, 0.0f, -2.0f, -2.5f, -3.0f, 3.0f};
  std::vector<float> bias = {0, 0, 0, 0.9f, 0, 0, 0, 0};
  RouterParams p{8, 4, 2, 2, true, 2.5f};
  int32_t ids[2];
  float w[2];
  be->router(logits.data(), bias.data(), 1, p, ids, w);
  auto sig = [](float v) { return 1.0 / (1.0 + std::exp(-double(v))); };
  // Group scores (sum of both biased scores): g0 = s0+s1, g1 = s2+s3+0.9, g3 = s6+s7. g0 ~1.70, g1 ~1.67, g3 ~0.999.
  // Kept groups: g0, g1. Top-2 of {s0, s1, s2, s3+0.9}: e3 (1.4) and e0 (0.88).
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 0);
  const double s3 = sig(0.0f), s0 = sig(2.0f);
  EXPECT_NEAR(w[0], s3 / (s3 + s0) * 2.5, 1e-6);
  EXPECT_NEAR(w[1], s0 / (s3 + s0) * 2.5, 1e-6);
  // No groups, no normalization.
  RouterParams q{8, 1, 1, 2, false, 1.0f};
  be->router(logits.data(), nullptr, 1, q, ids, w);
  EXPECT_EQ(ids[0], 7);
  EXPECT_EQ(ids[1], 0);
  EXPECT_NEAR(w[0], sig(3.0f), 1e-6);
}

TEST(RefOps, IndexerScoresAndTopK) {
  auto be = make_ref_backend(2);
  const int64_t S = 3, T = 7, nH = 4, dI = 6;
  auto q = randn(S * nH * dI, 12), w = randn(S * nH, 13), k = randn(T * dI, 14);
  const int64_t pos[3] = {2, 5, 6};
  std::vector<float> sc(S * T);
  be->indexer_scores(q.data(), w.data(), k.data(), S, T, nH, dI, 0.5f, pos, sc.data());
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = 0; t < T; ++t) {
      if (t > pos[s]) {
        EXPECT_TRUE(std::isinf(sc[s * T + t]) && sc[s * T + t] < 0);
        continue;
      }
      double tot = 0;
      for (int64_t j = 0; j < nH; ++j) {
        double d = 0;
        for (int64_t x = 0; x < dI; ++x) d += double(q[(s * nH + j) * dI + x]) * k[t * dI + x];
        tot += w[s * nH + j] * std::max(0.0, 0.5 * d);
      }
      EXPECT_NEAR(sc[s * T + t], tot, 1e-5);
    }
  std::vector<float> scores = {5, 1, 1, 9, -1, 3, 7,  // row 0, pos 6
                               2, 2, 2, 2, 2, 2, 2};  // row 1, pos 1 (only 2 visible)
  const int64_t p2[2] = {6, 1};
  int32_t sel[2 * 3], cnt[2];
  be->topk_select(scores.data(), 2, 7, 3, p2, sel, cnt);
  EXPECT_EQ(cnt[0], 3);
  EXPECT_EQ(sel[0], 3);
  EXPECT_EQ(sel[1], 6);
  EXPECT_EQ(sel[2], 0);
  EXPECT_EQ(cnt[1], 2);
  EXPECT_EQ(sel[3], 0);
  EXPECT_EQ(sel[4], 1);
}

// Naive attention on expanded K/V vs the absorbed form on the latent cache, with and without a selection.
TEST(RefOps, AbsorbedEqualsNaiveAttention) {
  auto be = make_ref_backend(3);
  MlaDims d{3, 10, 6, 7, 12};
  const int64_t S = 4, T = 9, dkv = d.nope + d.v;
  auto q = randn(S * d.n_heads * d.qk(), 15), c = randn(T * d.latent, 16), kpe = randn(T * d.rope, 17);
  auto wkvb = randn(d.n_heads * dkv * d.latent, 18, 0.3f);
  QuantWeight kv_b = f32_weight(wkvb, d.n_heads * dkv, d.latent);
  std::vector<float> kvb(T * d.n_heads * dkv);
  be->matmul(kv_b, c.data(), T, kvb.data());
  const int64_t pos[4] = {5, 6, 7, 8};
  std::vector<int32_t> sel = {0, 5, 3, 1, 6, 2, 7, 4, 0, 8, 2, 6};  // 3 per row
  std::vector<int32_t> cnt = {3, 3, 3, 2};
  for (int variant = 0; variant < 2; ++variant) {
    KeySelection ks;
    if (variant == 1) ks = {sel.data(), cnt.data(), 3};
    std::vector<float> on(S * d.n_heads * d.v), oa(on.size());
    be->mla_attention_naive(d, q.data(), kvb.data(), kpe.data(), S, T, pos, ks, 0.3f, on.data(), false);
    be->mla_attention_absorbed(d, q.data(), kv_b, c.data(), kpe.data(), S, T, pos, ks, 0.3f, oa.data(), false);
    EXPECT_LE(maxdiff(on, oa), 1e-5) << "variant " << variant;
  }
  // Direct formula for one (s, h) with the selection: query 3 (pos 8) sees keys {8, 2} (count 2).
  KeySelection ks{sel.data(), cnt.data(), 3};
  std::vector<float> on(S * d.n_heads * d.v);
  be->mla_attention_naive(d, q.data(), kvb.data(), kpe.data(), S, T, pos, ks, 0.3f, on.data(), false);
  const int64_t s = 3, h = 1;
  double sc[2], mx = -1e300, sum = 0;
  const int keys[2] = {2, 8};
  for (int j = 0; j < 2; ++j) {
    double dot = 0;
    for (int64_t x = 0; x < d.nope; ++x)
      dot += double(q[(s * d.n_heads + h) * d.qk() + x]) * kvb[(keys[j] * d.n_heads + h) * dkv + x];
    for (int64_t x = 0; x < d.rope; ++x)
      dot += double(q[(s * d.n_heads + h) * d.qk() + d.nope + x]) * kpe[keys[j] * d.rope + x];
    sc[j] = dot * 0.3;
    mx = std::max(mx, sc[j]);
  }
  for (double& v : sc) sum += v = std::exp(v - mx);
  for (int64_t x = 0; x < d.v; ++x) {
    double o = 0;
    for (int j = 0; j < 2; ++j) o += sc[j] / sum * kvb[(keys[j] * d.n_heads + h) * dkv + d.nope + x];
    EXPECT_NEAR(on[(s * d.n_heads + h) * d.v + x], o, 1e-5);
  }
}

TEST(RefOps, ScatterAddWeighted) {
  auto be = make_ref_backend(1);
  std::vector<float> x = {1, 2, 3, 4, 5, 6}, y(4, 1.0f);
  const int32_t tok[3] = {1, 0, 1};
  const float w[3] = {0.5f, 2.0f, -1.0f};
  be->scatter_add_weighted(x.data(), tok, w, 3, 2, y.data(), false);
  EXPECT_EQ(y[0], 1 + 2 * 3.0f);
  EXPECT_EQ(y[1], 1 + 2 * 4.0f);
  EXPECT_EQ(y[2], 1 + 0.5f - 5.0f);
  EXPECT_EQ(y[3], 1 + 1.0f - 6.0f);
}

// Padding rows of a graph step carry slot −1: kv_store skips them and writes the others.
TEST(RefOps, KvStoreSkipsNegativeSlots) {
  auto be = make_ref_backend(1);
  std::vector<float> data(4 * 3, -7.0f);
  KvPool pool{data.data(), DType::F32, 2, 2, 3};
  const std::vector<int64_t> slots{2, -1, 0};
  const std::vector<float> src{1, 2, 3, 4, 5, 6, 7, 8, 9};
  be->kv_store(pool, slots.data(), 3, src.data(), 0, 3);
  const std::vector<float> want{7, 8, 9, -7, -7, -7, 1, 2, 3, -7, -7, -7};
  EXPECT_EQ(data, want);
  EXPECT_FALSE(be->graphs_supported());
  EXPECT_THROW(be->graph_begin(), std::exception);
  EXPECT_FALSE(be->device_lost());
}

TEST(RefOps, DecodeGraphBuckets) {
  const std::vector<std::pair<int64_t, int64_t>> cases{{1, 1}, {2, 2}, {3, 4}, {4, 4}, {5, 8},  {8, 8},
                                                       {9, 16}, {16, 16}, {17, 17}, {24, 24}, {33, 33}};
  for (const auto& [n, b] : cases) EXPECT_EQ(decode_graph_bucket(n), b) << n;
}

TEST(RefOps, BackendRegistry) {
  EXPECT_STREQ(make_backend("ref", 1)->name(), "ref");
  EXPECT_NE(make_backend("cpu", 1), nullptr);
  EXPECT_ANY_THROW(make_backend("nope", 1));
}

// Backend::sample_rows on the host backends: the reference draw, with the mask, banned ids and edits applied in
// place (the final scores), greedy ties to the lower id, and a draw that only ever picks an allowed id.
TEST(RefOps, SampleRows) {
  for (const char* name : {"ref", "cpu"}) {
    std::unique_ptr<Backend> be = make_backend(name, 1);
    const int64_t V = 6;
    std::vector<float> x = {1.0f, 3.0f, 3.0f, 2.0f, 0.5f, 9.0f,   // greedy: 5 is banned, ties 1 / 2 -> 1
                            1.0f, 3.0f, 3.0f, 2.0f, 0.5f, 9.0f};  // sampled: only ids 0 and 4 allowed
    std::vector<SampleRowParams> p(2);
    p[0].temperature = 0.0f;
    p[1].temperature = 0.5f;
    p[1].allow_offset = 0;
    p[1].n_edits = 1;
    p[1].edit_begin = 0;
    const std::vector<SampleEdit> edits = {{4, 2.0f, 0, kSampleEditBias}};
    const std::vector<uint32_t> allow = {(1u << 0) | (1u << 4)}, banned = {1u << 5};
    std::vector<int32_t> ids(2, -1);
    be->sample_rows(x.data(), 2, V, p.data(), edits.data(), allow.data(), banned.data(), ids.data());
    EXPECT_EQ(ids[0], 1) << name;
    EXPECT_TRUE(ids[1] == 0 || ids[1] == 4) << name;
    const float ninf = -std::numeric_limits<float>::infinity();
    EXPECT_EQ(x[5], ninf);
    EXPECT_EQ(x[6 + 4], (0.5f + 2.0f) / 0.5f);  // bias, then temperature
    EXPECT_EQ(x[6 + 1], ninf);
    int n4 = 0;
    for (uint64_t c = 0; c < 2000; ++c) {
      std::vector<float> y(x.begin() + 6, x.end());
      SampleRowParams q = p[1];
      q.temperature = 1.0f;
      q.n_edits = 0;
      q.rng_counter = c;
      int32_t id = -1;
      be->sample_rows(y.data(), 1, V, &q, nullptr, allow.data(), banned.data(), &id);
      ASSERT_TRUE(id == 0 || id == 4);
      n4 += id == 4;
    }
    // y = final scores of row 1: x0 = 2, x4 = 5 -> p(4) = e^3 / (1 + e^3) = 0.9526
    EXPECT_NEAR(n4 / 2000.0, 0.9526, 0.02) << name;
  }
}

}  // namespace
}  // namespace latent
