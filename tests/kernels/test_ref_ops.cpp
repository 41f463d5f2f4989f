// Unit tests of the scalar reference ops (src/kernels/ref) against direct formulas written in the test.
#include <gtest/gtest.h>

#include <algorithm>
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

Tensor T32(std::vector<float>& v, int64_t rows, int64_t cols) { return Tensor(v.data(), DType::F32, rows, cols); }
Tensor T32(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return Tensor(const_cast<float*>(v.data()), DType::F32, rows, cols);
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
  be->matmul(f32_weight(w, N, K), T32(x, M, K), T32(y, M, N));
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
  be->matmul(qb, T32(x, M, K), T32(yb, M, N));
  be->matmul(f32_weight(wd, N, K), T32(x, M, K), T32(yd, M, N));
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
  be->grouped_matmul(ws, 3, off, T32(x, 7, K), T32(y, 7, N));
  be->matmul(q0, T32(x, 3, K), T32(r, 3, N));
  be->matmul(q2, Tensor(x.data() + 3 * K, DType::F32, 4, K), Tensor(r.data() + 3 * N, DType::F32, 4, N));
  EXPECT_EQ(maxdiff(y, r), 0.0);
}

TEST(RefOps, EmbeddingGathersRows) {
  auto be = make_ref_backend(1);
  auto t = randn(10 * 4, 7);
  const int32_t ids[3] = {9, 0, 9};
  std::vector<float> out(12);
  be->embedding(f32_weight(t, 10, 4), ids, T32(out, 3, 4));
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
  be->rms_norm(T32(x, M, D), w.data(), 1e-6f, T32(y, M, D));
  be->layer_norm(T32(x, M, D), w.data(), b.data(), 1e-6f, T32(z, M, D));
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
  // BF16 output: bf16(w · bf16(normalized)).
  std::vector<uint16_t> yb(M * D);
  be->rms_norm(T32(x, M, D), w.data(), 1e-6f, Tensor(yb.data(), DType::BF16, M, D));
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(x[m * D + i]) * x[m * D + i];
    const double r = 1.0 / std::sqrt(ss / D + 1e-6);
    for (int64_t i = 0; i < D; ++i) {
      const float n = bf16_to_f32(f32_to_bf16(static_cast<float>(x[m * D + i] * r)));
      EXPECT_EQ(yb[m * D + i], f32_to_bf16(n * w[i])) << m << " " << i;
    }
  }
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
    be->rope(T32(y, 2, heads * hs), heads, hs, pos, p);
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
  be->silu_mul(T32(g, 1, 4), T32(u, 1, 4), T32(o, 1, 4));
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(o[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
  // BF16 out: bf16(bf16(SiLU(g)) · u).
  std::vector<uint16_t> ob(4);
  be->silu_mul(T32(g, 1, 4), T32(u, 1, 4), Tensor(ob.data(), DType::BF16, 1, 4));
  for (int i = 0; i < 4; ++i) {
    const float sg = bf16_to_f32(f32_to_bf16(static_cast<float>(g[i] / (1 + std::exp(-double(g[i]))))));
    EXPECT_EQ(ob[i], f32_to_bf16(sg * u[i])) << i;
  }
  std::vector<float> y = {1.0f, 2.0f}, x = {0.5f, 1e-3f};
  be->add(T32(y, 1, 2), T32(x, 1, 2));
  EXPECT_EQ(y[0], 1.5f);
  EXPECT_EQ(y[1], 2.001f);
  // convert rounds to nearest even (a tie goes to the even code) and keeps NaN.
  std::vector<float> r = {1.00390625f + 1e-4f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, std::nanf("")};
  std::vector<uint16_t> rb(4);
  be->convert(T32(r, 1, 4), Tensor(rb.data(), DType::BF16, 1, 4));
  EXPECT_EQ(rb[0], f32_to_bf16(1.00390625f + 1e-4f));
  EXPECT_EQ(bf16_to_f32(rb[1]), 1.0f);
  EXPECT_EQ(bf16_to_f32(rb[2]), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_f32(rb[3])));
  // scale and fill round to the dtype; gather_rows converts; views with ld > cols leave the padding alone.
  std::vector<float> sv = {1.0f, -2.0f, 7.0f, 3.0f, 99.0f, 5.0f};
  be->scale(Tensor(sv.data(), DType::F32, 2, 2, 3), 0.5f);
  EXPECT_EQ(sv, (std::vector<float>{0.5f, -1.0f, 7.0f, 1.5f, 49.5f, 5.0f}));
  be->fill(Tensor(sv.data(), DType::F32, 2, 1, 3), -4.0f);
  EXPECT_EQ(sv, (std::vector<float>{-4.0f, -1.0f, 7.0f, -4.0f, 49.5f, 5.0f}));
  std::vector<uint16_t> fb(3);
  be->fill(Tensor(fb.data(), DType::BF16, 1, 3), 1.0f / 3.0f);
  EXPECT_EQ(fb[2], f32_to_bf16(1.0f / 3.0f));
  const int32_t rows[3] = {1, 1, 0};
  std::vector<float> gd(6);
  be->gather_rows(Tensor(sv.data(), DType::F32, 2, 2, 3), rows, T32(gd, 3, 2));
  EXPECT_EQ(gd, (std::vector<float>{-4.0f, 49.5f, -4.0f, 49.5f, -4.0f, -1.0f}));
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
  be->indexer_scores(T32(q, S, nH * dI), T32(w, S, nH), T32(k, T, dI), nH, 0.5f, pos, sc.data());
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
  std::vector<float> scores = {5, 1, 1, 9, -1, 3, 7,   // row 0, pos 6
                               2, 2, 2, 2, 2,  2, 2};  // row 1, pos 1 (only 2 visible)
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
  be->matmul(kv_b, T32(c, T, d.latent), T32(kvb, T, d.n_heads * dkv));
  const int64_t pos[4] = {5, 6, 7, 8};
  std::vector<int32_t> sel = {0, 5, 3, 1, 6, 2, 7, 4, 0, 8, 2, 6};  // 3 per row
  std::vector<int32_t> cnt = {3, 3, 3, 2};
  for (int variant = 0; variant < 2; ++variant) {
    KeySelection ks;
    if (variant == 1) ks = {sel.data(), cnt.data(), 3};
    std::vector<float> on(S * d.n_heads * d.v), oa(on.size());
    be->mla_attention_naive(d, T32(q, S, d.n_heads * d.qk()), T32(kvb, T, d.n_heads * dkv), T32(kpe, T, d.rope), T, pos,
                            ks, 0.3f, T32(on, S, d.n_heads * d.v));
    be->mla_attention_absorbed(d, T32(q, S, d.n_heads * d.qk()), kv_b, T32(c, T, d.latent), T32(kpe, T, d.rope), T, pos,
                               ks, 0.3f, T32(oa, S, d.n_heads * d.v));
    EXPECT_LE(maxdiff(on, oa), 1e-5) << "variant " << variant;
  }
  // Direct formula for one (s, h) with the selection: query 3 (pos 8) sees keys {8, 2} (count 2).
  KeySelection ks{sel.data(), cnt.data(), 3};
  std::vector<float> on(S * d.n_heads * d.v);
  be->mla_attention_naive(d, T32(q, S, d.n_heads * d.qk()), T32(kvb, T, d.n_heads * dkv), T32(kpe, T, d.rope), T, pos,
                          ks, 0.3f, T32(on, S, d.n_heads * d.v));
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

// The linear ops' epilogue against its definition (backend.h "Epilogue"), F32 and BF16 y: bias, SwiGLU with a
// second weight, a gate tensor, a residual (also y itself), in that order, R = round to y's dtype.
TEST(RefOps, MatmulEpilogueFormulas) {
  auto be = make_ref_backend(2);
  const int64_t M = 3, N = 5, K = 9;
  auto x = randn(M * K, 30), w = randn(N * K, 31), wg = randn(N * K, 32), bias = randn(N, 33), gate = randn(M * N, 34),
       res = randn(M * N, 35);
  const QuantWeight qw = f32_weight(w, N, K), qg = f32_weight(wg, N, K);
  const QuantWeight* gp[1] = {&qg};
  auto dot = [&](const std::vector<float>& W, int64_t m, int64_t n) {
    double a = 0;
    for (int64_t k = 0; k < K; ++k) a += double(x[m * K + k]) * W[n * K + k];
    return static_cast<float>(a);
  };
  auto silu = [](float g) { return static_cast<float>(double(g) / (1.0 + std::exp(-double(g)))); };
  for (DType t : {DType::F32, DType::BF16}) {
    auto R = [&](float v) { return t == DType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : v; };
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<uint8_t> ybuf(static_cast<size_t>(M * N) * Tensor::size_of(t));
      const Tensor y(ybuf.data(), t, M, N);
      std::vector<float> gq = gate, rq = res;  // the gate / residual tensors in y's dtype
      for (auto& v : gq) v = R(v);
      for (auto& v : rq) v = R(v);
      std::vector<uint8_t> gb(ybuf.size()), rb(ybuf.size());
      const Tensor gt(gb.data(), t, M, N), rt(rb.data(), t, M, N);
      be->convert(T32(gq, M, N), gt);
      be->convert(T32(rq, M, N), rt);
      Epilogue e;
      if (kind == 0) e.bias = bias.data();
      if (kind == 1) e.glu = gp;
      if (kind == 2) e.gate = &gt;
      if (kind == 3) {
        be->convert(T32(rq, M, N), y);  // y += x·Wᵀ
        e.residual = &y;
      }
      be->matmul(qw, T32(x, M, K), y, e);
      std::vector<float> got(M * N);
      be->convert(y, T32(got, M, N));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          const float a = dot(w, m, n);
          float want = 0;
          if (kind == 0) want = R(a + bias[n]);
          if (kind == 1) want = R(R(silu(R(dot(wg, m, n)))) * R(a));
          if (kind == 2) want = R(R(silu(gq[m * N + n])) * R(a));
          if (kind == 3) want = R(rq[m * N + n] + R(a));
          EXPECT_EQ(got[m * N + n], want) << "kind " << kind << " dtype " << int(t) << " m " << m << " n " << n;
        }
    }
  }
}

// kv_gather follows the block table; kv_copy_block copies the first n rows of a block; kv_store converts to the
// pool's dtype (bf16: nearest even).
TEST(RefOps, KvGatherCopyBlock) {
  auto be = make_ref_backend(1);
  const int64_t blocks = 3, bt = 2, width = 3;
  std::vector<float> data(blocks * bt * width);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i);
  KvPool pool{data.data(), DType::F32, blocks, bt, width};
  const int32_t table[2] = {2, 0};
  std::vector<float> g(3 * 2);
  be->kv_gather(pool, table, 1, T32(g, 3, 2));  // tokens 0, 1 in block 2, token 2 in block 0; columns 1..2
  EXPECT_EQ(g, (std::vector<float>{13, 14, 16, 17, 1, 2}));
  be->kv_copy_block(pool, 2, 1, 1);  // block 2's first row into block 1
  EXPECT_EQ(std::vector<float>(data.begin() + 6, data.begin() + 12), (std::vector<float>{12, 13, 14, 9, 10, 11}));
  std::vector<uint16_t> b16(blocks * bt * width, 0);
  KvPool pb{b16.data(), DType::BF16, blocks, bt, width};
  const int64_t slot = 4;
  const std::vector<float> src = {1.0f + 1.0f / 256, 3.0f, -0.1f};
  be->kv_store(pb, &slot, T32(src, 1, 3), 0);
  EXPECT_EQ(b16[12], f32_to_bf16(1.0f));
  EXPECT_EQ(b16[14], f32_to_bf16(-0.1f));
}

// The default moe_ffn (moe_route, moe_experts) against the MoE formula in double: sigmoid routing with the bias
// (selection only), weights normalized and scaled, y = Σ_k w_k · W_down(SiLU(W_gate x) ⊙ W_up x) + shared(x).
TEST(RefOps, MoeFfnFormula) {
  auto be = make_ref_backend(2);
  const int64_t D = 8, I = 6, E = 4, K = 2, M = 3, Is = 5;
  std::vector<std::vector<float>> g(E), u(E), d(E);
  std::vector<QuantWeight> qg(E), qu(E), qd(E);
  std::vector<const QuantWeight*> pg(E), pu(E), pd(E);
  for (int64_t e = 0; e < E; ++e) {
    g[e] = randn(I * D, 40 + e);
    u[e] = randn(I * D, 50 + e);
    d[e] = randn(D * I, 60 + e);
    qg[e] = f32_weight(g[e], I, D);
    qu[e] = f32_weight(u[e], I, D);
    qd[e] = f32_weight(d[e], D, I);
    pg[e] = &qg[e];
    pu[e] = &qu[e];
    pd[e] = &qd[e];
  }
  auto wr = randn(E * D, 70), sgw = randn(Is * D, 71), suw = randn(Is * D, 72), sdw = randn(D * Is, 73);
  auto bias = randn(E, 74, 0.2f), x = randn(M * D, 75);
  const QuantWeight qr = f32_weight(wr, E, D), qsg = f32_weight(sgw, Is, D), qsu = f32_weight(suw, Is, D),
                    qsd = f32_weight(sdw, D, Is);
  MoeLayer L;
  L.router = RouterParams{E, 1, 1, K, true, 1.5f};
  L.gate = &qr;
  L.score_bias = bias.data();
  L.w_gate = pg.data();
  L.w_up = pu.data();
  L.w_down = pd.data();
  L.expert0 = 0;
  L.expert1 = E;
  L.inter = I;
  L.shared_gate = &qsg;
  L.shared_up = &qsu;
  L.shared_down = &qsd;
  L.shared_inter = Is;
  std::vector<float> logits(M * E), wts(M * K), pw(M * K), xs(M * K * D), eg(M * K * I), ed(M * K * D), sh(M * Is),
      y(M * D);
  std::vector<int32_t> ids(M * K), tok(M * K);
  std::vector<int64_t> off(E + 1);
  MoeScratch s{logits.data(), ids.data(),        wts.data(),        off.data(),        tok.data(),
               pw.data(),     T32(xs, M * K, D), T32(eg, M * K, I), T32(ed, M * K, D), T32(sh, M, Is)};
  be->moe_ffn(L, T32(x, M, D), s, T32(y, M, D), true);
  auto mlp = [&](const std::vector<float>& G, const std::vector<float>& U, const std::vector<float>& Dw, int64_t n,
                 int64_t m, int64_t j) {
    double o = 0;
    for (int64_t i = 0; i < n; ++i) {
      double a = 0, b = 0;
      for (int64_t k = 0; k < D; ++k)
        a += double(G[i * D + k]) * x[m * D + k], b += double(U[i * D + k]) * x[m * D + k];
      o += double(Dw[j * n + i]) * (a / (1 + std::exp(-a))) * b;
    }
    return o;
  };
  for (int64_t m = 0; m < M; ++m) {
    std::vector<double> sc(E);
    std::vector<int> order(E);
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t k = 0; k < D; ++k) l += double(wr[e * D + k]) * x[m * D + k];
      sc[e] = 1 / (1 + std::exp(-l));
      order[e] = int(e);
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) { return sc[a] + bias[a] > sc[b] + bias[b]; });
    const double sum = sc[order[0]] + sc[order[1]];
    for (int k = 0; k < K; ++k) {
      EXPECT_EQ(ids[m * K + k], order[k]) << m;
      EXPECT_NEAR(wts[m * K + k], sc[order[k]] / sum * 1.5, 1e-6);
    }
    for (int64_t j = 0; j < D; ++j) {
      double want = mlp(sgw, suw, sdw, Is, m, j);
      for (int k = 0; k < K; ++k)
        want += sc[order[k]] / sum * 1.5 * mlp(g[order[k]], u[order[k]], d[order[k]], I, m, j);
      EXPECT_NEAR(y[m * D + j], want, 1e-4 * (1 + std::fabs(want))) << m << " " << j;
    }
  }
}

TEST(RefOps, ScatterAddWeighted) {
  auto be = make_ref_backend(1);
  std::vector<float> x = {1, 2, 3, 4, 5, 6}, y(4, 1.0f);
  const int32_t tok[3] = {1, 0, 1};
  const float w[3] = {0.5f, 2.0f, -1.0f};
  be->scatter_add_weighted(T32(x, 3, 2), tok, w, T32(y, 2, 2));
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
  be->kv_store(pool, slots.data(), T32(src, 3, 3), 0);
  const std::vector<float> want{7, 8, 9, -7, -7, -7, 1, 2, 3, -7, -7, -7};
  EXPECT_EQ(data, want);
  EXPECT_FALSE(be->graphs_supported());
  EXPECT_THROW(be->graph_begin(), std::exception);
  EXPECT_FALSE(be->device_lost());
}

TEST(RefOps, DecodeGraphBuckets) {
  const std::vector<std::pair<int64_t, int64_t>> cases{{1, 1},  {2, 2},   {3, 4},   {4, 4},   {5, 8},  {8, 8},
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
