// Scalar CPU kernels: the fallback level when neither AVX2 nor AVX-512 is available (and the level the op
// harness checks on every machine). Plain C++ with fp32 accumulation in natural column order; the weight row is
// decoded into a small buffer once and reused across the M activation rows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "quant/float_formats.h"

namespace latent::cpu {

namespace {

float bf16r(float x) { return bf16_to_f32(f32_to_bf16(x)); }

float load_f32(const void* base, int64_t i) {
  float v;
  std::memcpy(&v, static_cast<const uint8_t*>(base) + i * 4, 4);
  return v;
}

void dequant_row(const QuantWeight& w, int64_t r, float* out) {
  const int64_t K = w.cols;
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes();
  switch (w.format) {
    case WeightFormat::F32: std::memcpy(out, row, static_cast<size_t>(K) * 4); return;
    case WeightFormat::BF16:
      for (int64_t c = 0; c < K; ++c) {
        uint16_t h;
        std::memcpy(&h, row + 2 * c, 2);
        out[c] = bf16_to_f32(h);
      }
      return;
    case WeightFormat::F16:
      for (int64_t c = 0; c < K; ++c) {
        uint16_t h;
        std::memcpy(&h, row + 2 * c, 2);
        out[c] = f16_to_f32(h);
      }
      return;
    case WeightFormat::FP8_E4M3_BLOCK:
    case WeightFormat::FP8_E4M3_TENSOR:
    case WeightFormat::FP8_E4M3_CHANNEL: {
      const float* t = w.fnuz ? kE4M3FnuzToF32.data() : kE4M3FnToF32.data();
      const int64_t bc = w.format == WeightFormat::FP8_E4M3_BLOCK ? w.block_cols : K;
      const int64_t s0 = w.format == WeightFormat::FP8_E4M3_BLOCK     ? (r / w.block_rows) * w.scale_cols()
                         : w.format == WeightFormat::FP8_E4M3_CHANNEL ? r
                                                                      : 0;
      for (int64_t c0 = 0, j = 0; c0 < K; c0 += bc, ++j) {
        const float s = load_f32(w.scale, s0 + j);
        const int64_t c1 = c0 + bc < K ? c0 + bc : K;
        for (int64_t c = c0; c < c1; ++c) out[c] = t[row[c]] * s;
      }
      return;
    }
    case WeightFormat::MXFP4: {
      const uint8_t* sc = static_cast<const uint8_t*>(w.scale) + r * (K / 32);
      for (int64_t b = 0; b < K / 32; ++b) {
        const float s = kE8M0ToF32[sc[b]];
        for (int j = 0; j < 16; ++j) {
          const uint8_t q = row[b * 16 + j];
          out[b * 32 + 2 * j] = kE2M1ToF32[q & 0xF] * s;
          out[b * 32 + 2 * j + 1] = kE2M1ToF32[q >> 4] * s;
        }
      }
      return;
    }
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

bool permutes(WeightFormat) { return false; }
void prep_x(WeightFormat, const float* x, int64_t M, int64_t K, float* xp) {
  std::memcpy(xp, x, sizeof(float) * static_cast<size_t>(M * K));
}

void matmul_rows(const QuantWeight& w, const float* x, int64_t M, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t K = w.cols;
  thread_local std::vector<float> row;  // reused: no allocation per call once grown
  if (static_cast<int64_t>(row.size()) < K) row.resize(static_cast<size_t>(K));
  for (int64_t r = r0; r < r1; ++r) {
    dequant_row(w, r, row.data());
    for (int64_t m = 0; m < M; ++m) y[m * ldy + (r - r0)] = dot(row.data(), x + m * K, K);
  }
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scaled_add(float a, const float* x, float* y, int64_t n, bool bf16) {
  if (bf16) {
    for (int64_t i = 0; i < n; ++i) y[i] = bf16r(y[i] + bf16r(a * x[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float p = a * x[i];
      y[i] = y[i] + p;
    }
  }
}

float exp_sub_sum(float* x, int64_t n, float sub) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - sub);
    s += x[i];
  }
  return s;
}

void rms_norm_row(const float* x, const float* w, int64_t D, float eps, float* y, bool bf16) {
  double ss = 0.0;
  for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(D) + static_cast<double>(eps));
  for (int64_t i = 0; i < D; ++i) {
    float nv = static_cast<float>(x[i] * r);
    if (bf16) nv = bf16r(nv);
    const float v = nv * w[i];
    y[i] = bf16 ? bf16r(v) : v;
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out, bool bf16) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    float s = static_cast<float>(g / (1.0 + std::exp(-g)));
    if (bf16) s = bf16r(s);
    const float v = s * up[i];
    out[i] = bf16 ? bf16r(v) : v;
  }
}

void add(float* y, const float* x, int64_t n, bool bf16) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = y[i] + x[i];
    y[i] = bf16 ? bf16r(v) : v;
  }
}

void round_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = bf16r(x[i]);
}

void rope_interleaved(float* v, const float* cc, const float* ss, int64_t dim, bool bf16) {
  for (int64_t i = 0; i + 1 < dim; i += 2) {
    const float a = v[i], b = v[i + 1];
    const float c = cc[i], s = ss[i + 1];
    if (bf16) {
      v[i] = bf16r(bf16r(a * c) - bf16r(b * s));
      v[i + 1] = bf16r(bf16r(b * c) + bf16r(a * s));
    } else {
      v[i] = a * c - b * s;
      v[i + 1] = b * c + a * s;
    }
  }
}

void rope_half(float* v, const float* c, const float* s, int64_t half, bool bf16) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    if (bf16) {
      v[i] = bf16r(bf16r(a * c[i]) - bf16r(b * s[i]));
      v[i + half] = bf16r(bf16r(b * c[i]) + bf16r(a * s[i]));
    } else {
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
}

void attn_qk_tile(const float* q, int64_t ldq, int64_t nq, const float* kt, int64_t d, float* s) {
  for (int64_t i = 0; i < nq; ++i) {
    float acc[kAttnKeyTile] = {};
    for (int64_t x = 0; x < d; ++x) {
      const float qx = q[i * ldq + x];
      for (int64_t j = 0; j < kAttnKeyTile; ++j) acc[j] += qx * kt[x * kAttnKeyTile + j];
    }
    std::memcpy(s + i * kAttnKeyTile, acc, sizeof(acc));
  }
}

void attn_pack_kt(const float* const* rows, int64_t d, float* kt) {
  for (int64_t x = 0; x < d; ++x)
    for (int64_t j = 0; j < kAttnKeyTile; ++j) kt[x * kAttnKeyTile + j] = rows[j][x];
}

void attn_pv_tile(const float* p, int64_t nq, const float* v, int64_t ldv, int64_t nk, int64_t dv, float* o) {
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t j = 0; j < nk; ++j) {
      const float pj = p[i * kAttnKeyTile + j];
      for (int64_t c = 0; c < dv; ++c) o[i * dv + c] += pj * v[j * ldv + c];
    }
}

void attn_softmax_tile(float* s, int64_t nq, const uint32_t* mask, float scale, int mode, float* mx, float* sum,
                       float* acc, int64_t dv) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < nq; ++i) {
    float* row = s + i * kAttnKeyTile;
    const uint32_t m = mask[i];
    if (!m) {
      for (int64_t j = 0; j < kAttnKeyTile; ++j) row[j] = 0.0f;
      continue;
    }
    float tmax = kNegInf;
    for (int64_t j = 0; j < kAttnKeyTile; ++j) {
      const float sc = mode == kSoftmaxOnline ? row[j] * scale : bf16r(bf16r(row[j]) * scale);
      row[j] = (m >> j) & 1u ? sc : kNegInf;
      tmax = std::max(tmax, row[j]);
    }
    if (mode == kSoftmaxFinal) {
      for (int64_t j = 0; j < kAttnKeyTile; ++j) row[j] = bf16r(std::exp(row[j] - mx[i]) / sum[i]);
      continue;
    }
    const float m_new = std::max(mx[i], tmax);
    if (m_new > mx[i]) {
      const float alpha = mx[i] == kNegInf ? 0.0f : std::exp(mx[i] - m_new);
      sum[i] *= alpha;
      if (mode == kSoftmaxOnline && alpha != 1.0f)
        for (int64_t c = 0; c < dv; ++c) acc[i * dv + c] *= alpha;
      mx[i] = m_new;
    }
    float add = 0.0f;
    for (int64_t j = 0; j < kAttnKeyTile; ++j) {
      const float e = std::exp(row[j] - m_new);
      add += e;
      if (mode == kSoftmaxOnline) row[j] = e;
    }
    sum[i] += add;
  }
}

inline float elem(const float* p, int64_t x) { return p[x]; }
inline float elem(const uint16_t* p, int64_t x) {  // bf16 rows may be unaligned (checkpoint weights)
  uint16_t h;
  std::memcpy(&h, reinterpret_cast<const uint8_t*>(p) + 2 * x, 2);
  return bf16_to_f32(h);
}

template <class B>
void dot_rows(const float* a, int64_t lda, int64_t na, const B* const* b1, const B* const* b2, int64_t n1, int64_t n2,
              int64_t nb, float* s, int64_t lds, PrefetchCursor*) {
  for (int64_t i = 0; i < na; ++i)
    for (int64_t j = 0; j < nb; ++j) {
      const float* ai = a + i * lda;
      float acc = 0.0f;
      for (int64_t x = 0; x < n1; ++x) acc += ai[x] * elem(b1[j], x);
      for (int64_t x = 0; x < n2; ++x) acc += ai[n1 + x] * elem(b2[j], x);
      s[i * lds + j] = acc;
    }
}

template <class B>
void dot_rows_t(const float* qt, int64_t ldt, int64_t na, const B* const* b1, const B* const* b2, int64_t n1,
                int64_t n2, int64_t nb, float* s, int64_t lds, PrefetchCursor*) {
  for (int64_t i = 0; i < na; ++i)
    for (int64_t j = 0; j < nb; ++j) {
      float acc = 0.0f;
      for (int64_t x = 0; x < n1; ++x) acc += qt[x * ldt + i] * elem(b1[j], x);
      for (int64_t x = 0; x < n2; ++x) acc += qt[(n1 + x) * ldt + i] * elem(b2[j], x);
      s[i * lds + j] = acc;
    }
}

template <class B>
void axpy_rows(const float* a, int64_t lda, int64_t na, const B* const* b, int64_t nb, int64_t n, float* c, int64_t ldc,
               bool accumulate, PrefetchCursor*) {
  for (int64_t i = 0; i < na; ++i) {
    float* ci = c + i * ldc;
    if (!accumulate) std::fill(ci, ci + n, 0.0f);
    for (int64_t j = 0; j < nb; ++j) {
      const float aij = a[i * lda + j];
      for (int64_t x = 0; x < n; ++x) ci[x] += aij * elem(b[j], x);
    }
  }
}

const Kernels kScalar = {
    "scalar",
    permutes,
    prep_x,
    matmul_rows,
    dequant_row,
    dot,
    axpy,
    scaled_add,
    exp_sub_sum,
    rms_norm_row,
    silu_mul,
    add,
    round_bf16,
    rope_interleaved,
    rope_half,
    attn_qk_tile,
    attn_pv_tile,
    attn_softmax_tile,
    attn_pack_kt,
    dot_rows<float>,
    dot_rows<uint16_t>,
    dot_rows_t<float>,
    dot_rows_t<uint16_t>,
    axpy_rows<float>,
    axpy_rows<uint16_t>,
};

}  // namespace

const Kernels& kernels_scalar() { return kScalar; }

}  // namespace latent::cpu
