// Scalar reference ops: linear, norms, RoPE, elementwise, router. See ref_backend.h.
#include "kernels/ref/ref_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "quant/float_formats.h"

namespace latent {

namespace ref {
float bf16r(float x) { return bf16_to_f32(f32_to_bf16(x)); }
}  // namespace ref

using ref::bf16r;

RefBackend::RefBackend(int threads) : pool_(threads) {}

std::unique_ptr<Backend> make_ref_backend(int threads) { return std::make_unique<RefBackend>(threads); }

// ---------------------------------------------------------------------------------------------------------------
// Linear
// ---------------------------------------------------------------------------------------------------------------
void RefBackend::matmul_f32(const QuantWeight& w, const float* x, int64_t M, float* y) {
  const int64_t N = w.rows, K = w.cols;
  if (M <= 0 || N <= 0) return;
  // Grain: enough rows per task that a task is not dominated by scheduling.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, K * M));
  pool_.parallel_for(N, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t r = r0; r < r1; ++r) {
      dequant_row_ref(w, r, row.data());
      for (int64_t m = 0; m < M; ++m) {
        const float* xm = x + m * K;
        double acc = 0.0;
        for (int64_t i = 0; i < K; ++i) acc += static_cast<double>(xm[i]) * row[i];
        y[m * N + r] = static_cast<float>(acc);
      }
    }
  });
}

void RefBackend::grouped_matmul_f32(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets,
                                    const float* x, float* y) {
  for (int64_t g = 0; g < n_groups; ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    if (rows <= 0) continue;
    const QuantWeight& wg = *w[g];
    matmul_f32(wg, x + offsets[g] * wg.cols, rows, y + offsets[g] * wg.rows);
  }
}

void RefBackend::embedding_f32(const QuantWeight& table, const int32_t* ids, int64_t M, float* out) {
  pool_.parallel_for(M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) dequant_row_ref(table, ids[m], out + m * table.cols);
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Norms and elementwise
// ---------------------------------------------------------------------------------------------------------------
void RefBackend::rms_norm_f32(const float* x, const float* w, int64_t M, int64_t D, float eps, float* y, bool bf16) {
  pool_.parallel_for(M, 8, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* xm = x + m * D;
      float* ym = y + m * D;
      double ss = 0.0;
      for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(xm[i]) * xm[i];
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(D) + static_cast<double>(eps));
      for (int64_t i = 0; i < D; ++i) {
        float n = static_cast<float>(xm[i] * r);
        if (bf16) n = bf16r(n);
        float v = n * w[i];
        ym[i] = bf16 ? bf16r(v) : v;
      }
    }
  });
}

void RefBackend::layer_norm_f32(const float* x, const float* w, const float* b, int64_t M, int64_t D, float eps,
                                float* y, bool bf16) {
  pool_.parallel_for(M, 8, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) ref::layer_norm_row(x + m * D, w, b, D, eps, y + m * D, bf16);
  });
}

void ref::layer_norm_row(const float* x, const float* w, const float* b, int64_t D, float eps, float* y, bool bf16) {
  double mean = 0.0;
  for (int64_t i = 0; i < D; ++i) mean += x[i];
  mean /= static_cast<double>(D);
  double var = 0.0;
  for (int64_t i = 0; i < D; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<double>(D);
  const double r = 1.0 / std::sqrt(var + static_cast<double>(eps));
  for (int64_t i = 0; i < D; ++i) {
    const float v = static_cast<float>((x[i] - mean) * r * w[i] + (b ? b[i] : 0.0f));
    y[i] = bf16 ? bf16r(v) : v;
  }
}

void RefBackend::rope_f32(float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
                          const int64_t* pos, const RopeParams& p, bool bf16) {
  const int64_t half = p.dim / 2;
  pool_.parallel_for(n_tokens, 4, [&](int64_t t0, int64_t t1) {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int64_t t = t0; t < t1; ++t) {
      const float fp = static_cast<float>(pos[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float ang = fp * p.inv_freq[i];  // fp32, as HF computes freqs
        float c = static_cast<float>(std::cos(static_cast<double>(ang))) * p.attention_factor;
        float s = static_cast<float>(std::sin(static_cast<double>(ang))) * p.attention_factor;
        cs[i] = bf16 ? bf16r(c) : c;
        sn[i] = bf16 ? bf16r(s) : s;
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + t * token_stride + h * head_stride;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t ia = p.interleaved ? 2 * i : i;
          const int64_t ib = p.interleaved ? 2 * i + 1 : i + half;
          const float a = v[ia], b = v[ib];
          float ya, yb;
          if (bf16) {
            ya = bf16r(bf16r(a * cs[i]) - bf16r(b * sn[i]));
            yb = bf16r(bf16r(b * cs[i]) + bf16r(a * sn[i]));
          } else {
            ya = a * cs[i] - b * sn[i];
            yb = b * cs[i] + a * sn[i];
          }
          v[ia] = ya;
          v[ib] = yb;
        }
      }
    }
  });
}

void RefBackend::silu_mul_f32(const float* gate, const float* up, int64_t n, float* out, bool bf16) {
  pool_.parallel_for(n, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const double g = gate[i];
      float s = static_cast<float>(g / (1.0 + std::exp(-g)));
      if (bf16) s = bf16r(s);
      const float v = s * up[i];
      out[i] = bf16 ? bf16r(v) : v;
    }
  });
}

void RefBackend::add_f32(float* y, const float* x, int64_t n, bool bf16) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = y[i] + x[i];
    y[i] = bf16 ? bf16r(v) : v;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// MoE
// ---------------------------------------------------------------------------------------------------------------
void RefBackend::router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
                        float* weights) {
  const int64_t E = p.n_experts, K = p.top_k;
  const int64_t G = std::max<int64_t>(1, p.n_group);
  const int64_t gsize = E / G;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  pool_.parallel_for(M, 8, [&](int64_t m0, int64_t m1) {
    std::vector<float> s(static_cast<size_t>(E)), b(static_cast<size_t>(E));
    std::vector<float> gscore(static_cast<size_t>(G));
    std::vector<int32_t> order(static_cast<size_t>(std::max(E, G)));
    for (int64_t m = m0; m < m1; ++m) {
      const float* lg = logits + m * E;
      for (int64_t e = 0; e < E; ++e) {
        s[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(lg[e]))));
        b[e] = s[e] + (bias ? bias[e] : 0.0f);
      }
      if (G > 1 && p.topk_group < G) {
        for (int64_t g = 0; g < G; ++g) {
          // Sum of the two largest biased scores of the group (one if the group has a single expert).
          float top1 = kNegInf, top2 = kNegInf;
          for (int64_t e = g * gsize; e < (g + 1) * gsize; ++e) {
            if (b[e] > top1) {
              top2 = top1;
              top1 = b[e];
            } else if (b[e] > top2) {
              top2 = b[e];
            }
          }
          gscore[g] = gsize >= 2 ? top1 + top2 : top1;
        }
        std::iota(order.begin(), order.begin() + G, 0);
        std::stable_sort(order.begin(), order.begin() + G, [&](int32_t a, int32_t c) { return gscore[a] > gscore[c]; });
        std::vector<char> keep(static_cast<size_t>(G), 0);
        for (int64_t j = 0; j < p.topk_group; ++j) keep[order[j]] = 1;
        for (int64_t e = 0; e < E; ++e)
          if (!keep[e / gsize]) b[e] = kNegInf;
      }
      std::iota(order.begin(), order.begin() + E, 0);
      std::partial_sort(order.begin(), order.begin() + K, order.begin() + E,
                        [&](int32_t a, int32_t c) { return b[a] > b[c] || (b[a] == b[c] && a < c); });
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) sum += s[order[k]];
      for (int64_t k = 0; k < K; ++k) {
        float wv = s[order[k]];
        if (p.norm_topk_prob) wv = wv / (sum + 1e-20f);
        ids[m * K + k] = order[k];
        weights[m * K + k] = wv * p.routed_scaling_factor;
      }
    }
  });
}

void RefBackend::scatter_add_weighted_f32(const float* x, const int32_t* token, const float* weight, int64_t n,
                                          int64_t D, float* y, bool bf16) {
  for (int64_t i = 0; i < n; ++i) {
    float* yr = y + static_cast<int64_t>(token[i]) * D;
    const float* xr = x + i * D;
    for (int64_t j = 0; j < D; ++j) {
      if (bf16)
        yr[j] = bf16r(yr[j] + bf16r(weight[i] * xr[j]));
      else
        yr[j] += weight[i] * xr[j];
    }
  }
}

}  // namespace latent
