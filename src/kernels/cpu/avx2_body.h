// Internal include fragment: the 256-bit kernels of the CPU backend. Included by kernels_avx2.cpp (target
// "avx2,fma,f16c") and by kernels_avx512.cpp (its AVX-512 target, which contains AVX2), after defining
// LATENT_CPU_TARGET. Everything here has internal linkage (anonymous namespace) and every function that uses
// intrinsics carries the target attribute, so each includer gets its own copy compiled for its own ISA and
// nothing compiled with wide instructions can be shared with (or picked by the linker for) baseline code.
//
// The matmul tiles and the prepared-x layouts are width-generic (mm_body.h, included at the end with vec_body.h);
// this file holds the 256-bit helpers, row ops, decoders and attention tiles, and V8, the 256-bit vector traits.
#pragma once
#ifndef LATENT_CPU_TARGET
#error "define LATENT_CPU_TARGET before including avx2_body.h"
#endif

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "quant/float_formats.h"

#define LT __attribute__((target(LATENT_CPU_TARGET), unused))
#define LTI __attribute__((target(LATENT_CPU_TARGET), always_inline)) inline

namespace latent::cpu {
namespace {

inline float bf16r_s(float x) { return bf16_to_f32(f32_to_bf16(x)); }

inline float load_f32u(const void* base, int64_t i) {
  float v;
  std::memcpy(&v, static_cast<const uint8_t*>(base) + i * 4, 4);
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Basic vector helpers
// ---------------------------------------------------------------------------------------------------------------
LTI float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

// Value barriers: keep a product rounded on its own so the compiler cannot contract `a*b + c` into an FMA (GCC
// contracts by default in C++ when FMA is enabled); used where the ref result is a separately rounded product.
LTI __m256 opaque8(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}
LTI float opaque1(float v) {
  __asm__("" : "+x"(v));
  return v;
}

LTI __m256 bf16r8(__m256 x) {  // RNE to bf16, NaN kept (quiet bit set), as f32_to_bf16
  const __m256i b = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), lsb);
  const __m256i hm = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  r = _mm256_and_si256(r, hm);
  const __m256i q = _mm256_and_si256(_mm256_or_si256(b, _mm256_set1_epi32(0x00400000)), hm);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan);
}

// exp(x) in fp32 (Cephes expf polynomial, ~1 ulp); x < -87.3 → 0, x > 88.3 → exp(88.3); NaN → NaN.
LTI __m256 exp8(__m256 x0) {
  const __m256 x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x0));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  const __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  const __m256 tiny = _mm256_cmp_ps(x0, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  return _mm256_andnot_ps(tiny, res);
}

LT float v2_dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

LT void v2_axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

LT void v2_scaled_add(float a, const float* x, float* y, int64_t n, bool bf16) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  if (bf16) {
    for (; i + 8 <= n; i += 8) {
      const __m256 p = bf16r8(_mm256_mul_ps(av, _mm256_loadu_ps(x + i)));
      _mm256_storeu_ps(y + i, bf16r8(_mm256_add_ps(_mm256_loadu_ps(y + i), p)));
    }
    for (; i < n; ++i) y[i] = bf16r_s(y[i] + bf16r_s(a * x[i]));
  } else {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(y + i,
                       _mm256_add_ps(_mm256_loadu_ps(y + i), opaque8(_mm256_mul_ps(av, _mm256_loadu_ps(x + i)))));
    for (; i < n; ++i) y[i] = y[i] + opaque1(a * x[i]);
  }
}

LT float v2_exp_sub_sum(float* x, int64_t n, float sub) {
  const __m256 sv = _mm256_set1_ps(sub);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sv));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float s = hsum8(acc);
  if (i < n) {
    alignas(32) float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = i; j < n; ++j) t[j - i] = x[j] - sub;
    const __m256 e = exp8(_mm256_load_ps(t));
    _mm256_store_ps(t, e);
    for (int64_t j = i; j < n; ++j) {
      x[j] = t[j - i];
      s += t[j - i];
    }
  }
  return s;
}

LT void v2_rms_norm_row(const float* x, const float* w, int64_t D, float eps, float* y, bool bf16) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0;
  int64_t i = 0;
  for (; i + 8 <= D; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  alignas(32) double t[4];
  _mm256_store_pd(t, _mm256_add_pd(a0, a1));
  double ss = (t[0] + t[1]) + (t[2] + t[3]);
  for (; i < D; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(D) + static_cast<double>(eps));
  const __m256d rv = _mm256_set1_pd(r);
  i = 0;
  for (; i + 8 <= D; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), rv));
    const __m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), rv));
    __m256 nv = _mm256_set_m128(hi, lo);
    if (bf16) nv = bf16r8(nv);
    __m256 o = _mm256_mul_ps(nv, _mm256_loadu_ps(w + i));
    if (bf16) o = bf16r8(o);
    _mm256_storeu_ps(y + i, o);
  }
  for (; i < D; ++i) {
    float nv = static_cast<float>(x[i] * r);
    if (bf16) nv = bf16r_s(nv);
    const float v = nv * w[i];
    y[i] = bf16 ? bf16r_s(v) : v;
  }
}

LT void v2_silu_mul8(const float* g8, const float* u8, float* o8, bool bf16) {
  const __m256 g = _mm256_loadu_ps(g8);
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
  __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  if (bf16) s = bf16r8(s);
  __m256 v = _mm256_mul_ps(s, _mm256_loadu_ps(u8));
  if (bf16) v = bf16r8(v);
  _mm256_storeu_ps(o8, v);
}

// Every element through the same vector arithmetic (the tail padded into a full vector), so that a value does not
// depend on where a call's range starts or ends (thread splits, the row-wise fused epilogue).
LT void v2_silu_mul(const float* gate, const float* up, int64_t n, float* out, bool bf16) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) v2_silu_mul8(gate + i, up + i, out + i, bf16);
  if (i < n) {
    alignas(32) float g8[8] = {}, u8[8] = {}, o8[8];
    for (int64_t j = i; j < n; ++j) {
      g8[j - i] = gate[j];
      u8[j - i] = up[j];
    }
    v2_silu_mul8(g8, u8, o8, bf16);
    for (int64_t j = i; j < n; ++j) out[j] = o8[j - i];
  }
}

LT void v2_add(float* y, const float* x, int64_t n, bool bf16) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i));
    if (bf16) v = bf16r8(v);
    _mm256_storeu_ps(y + i, v);
  }
  for (; i < n; ++i) {
    const float v = y[i] + x[i];
    y[i] = bf16 ? bf16r_s(v) : v;
  }
}

LT void v2_round_bf16(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, bf16r8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] = bf16r_s(x[i]);
}

LT void v2_rope_interleaved(float* v, const float* cc, const float* ss, int64_t dim, bool bf16) {
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    const __m256 x = _mm256_loadu_ps(v + i);
    const __m256 sw = _mm256_permute_ps(x, 0xB1);  // swap the two elements of every pair
    __m256 p1 = opaque8(_mm256_mul_ps(x, _mm256_loadu_ps(cc + i)));
    __m256 p2 = opaque8(_mm256_mul_ps(sw, _mm256_loadu_ps(ss + i)));
    if (bf16) {
      p1 = bf16r8(p1);
      p2 = bf16r8(p2);
    }
    __m256 o = _mm256_add_ps(p1, p2);
    if (bf16) o = bf16r8(o);
    _mm256_storeu_ps(v + i, o);
  }
  for (; i + 1 < dim; i += 2) {
    const float a = v[i], b = v[i + 1], c = cc[i], s = ss[i + 1];
    if (bf16) {
      v[i] = bf16r_s(bf16r_s(a * c) - bf16r_s(b * s));
      v[i + 1] = bf16r_s(bf16r_s(b * c) + bf16r_s(a * s));
    } else {
      v[i] = opaque1(a * c) - opaque1(b * s);
      v[i + 1] = opaque1(b * c) + opaque1(a * s);
    }
  }
}

LT void v2_rope_half(float* v, const float* c, const float* s, int64_t half, bool bf16) {
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + half + i);
    const __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
    __m256 ac = opaque8(_mm256_mul_ps(a, cv)), bs = opaque8(_mm256_mul_ps(b, sv)), bc = opaque8(_mm256_mul_ps(b, cv)),
           as = opaque8(_mm256_mul_ps(a, sv));
    if (bf16) {
      ac = bf16r8(ac);
      bs = bf16r8(bs);
      bc = bf16r8(bc);
      as = bf16r8(as);
    }
    __m256 ya = _mm256_sub_ps(ac, bs), yb = _mm256_add_ps(bc, as);
    if (bf16) {
      ya = bf16r8(ya);
      yb = bf16r8(yb);
    }
    _mm256_storeu_ps(v + i, ya);
    _mm256_storeu_ps(v + half + i, yb);
  }
  for (; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    if (bf16) {
      v[i] = bf16r_s(bf16r_s(a * c[i]) - bf16r_s(b * s[i]));
      v[i + half] = bf16r_s(bf16r_s(b * c[i]) + bf16r_s(a * s[i]));
    } else {
      v[i] = opaque1(a * c[i]) - opaque1(b * s[i]);
      v[i + half] = opaque1(b * c[i]) + opaque1(a * s[i]);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Weight decoders (256-bit)
// ---------------------------------------------------------------------------------------------------------------
// e2m1 code -> bytes 2 and 3 of its fp32 value (bytes 0 and 1 are zero for every e2m1 value).
alignas(16) inline constexpr uint8_t kMxLo[16] = {0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0,
                                                  0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0};
alignas(16) inline constexpr uint8_t kMxHi[16] = {0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40,
                                                  0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0};
inline constexpr int kMxOff[4] = {0, 2, 16, 18};

struct Mx2Const {
  __m256i tlo, thi, m0f, sh, hm;
};
LTI Mx2Const mx2_const() {
  Mx2Const c;
  c.tlo = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxLo)));
  c.thi = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxHi)));
  c.m0f = _mm256_set1_epi8(0x0F);
  c.sh = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  c.hm = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  return c;
}
// One 32-element MXFP4 block (16 bytes) -> f0..f3 (unscaled e2m1 values) in the MXFP4 xp order.
LTI void mx2_decode(const uint8_t* q, const Mx2Const& c, __m256& f0, __m256& f1, __m256& f2, __m256& f3) {
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  const __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(b, c.sh), c.m0f);
  const __m256i lb = _mm256_shuffle_epi8(c.tlo, codes), hb = _mm256_shuffle_epi8(c.thi, codes);
  const __m256i wa = _mm256_unpacklo_epi8(lb, hb), wb = _mm256_unpackhi_epi8(lb, hb);
  f0 = _mm256_castsi256_ps(_mm256_slli_epi32(wa, 16));
  f1 = _mm256_castsi256_ps(_mm256_and_si256(wa, c.hm));
  f2 = _mm256_castsi256_ps(_mm256_slli_epi32(wb, 16));
  f3 = _mm256_castsi256_ps(_mm256_and_si256(wb, c.hm));
}

// 16 e4m3 codes -> 16 floats equal to value / 256 (fn) or value / 128 (fnuz): the code's sign|exp|mantissa bits
// placed as an f16 (exact, subnormals included) and converted with F16C. NaN codes decode as finite numbers; the
// caller ORs `nan` with the NaN-code mask and takes a slow path when it is set.
LTI void fp8_decode16(__m128i v, bool fnuz, __m256& lo, __m256& hi, __m128i& nan) {
  const __m256i t = _mm256_slli_epi16(_mm256_cvtepu8_epi16(v), 8);
  const __m256i h = _mm256_and_si256(_mm256_srai_epi16(t, 1), _mm256_set1_epi16(static_cast<short>(0xBF80)));
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  const __m128i m = fnuz ? _mm_cmpeq_epi8(v, _mm_set1_epi8(static_cast<char>(0x80)))
                         : _mm_cmpeq_epi8(_mm_and_si128(v, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F));
  nan = _mm_or_si128(nan, m);
}

inline bool is_fp8(WeightFormat f) {
  return f == WeightFormat::FP8_E4M3_BLOCK || f == WeightFormat::FP8_E4M3_TENSOR || f == WeightFormat::FP8_E4M3_CHANNEL;
}

// Column-block scale structure of a natural-format row: blocks of `bc` columns, scale(j) = scale[s0 + j].
struct RowScales {
  int64_t bc;
  int64_t s0;
  const void* scale;
  float mult;  // fp8 decoders return value / mult
  LTI float at(int64_t j) const { return scale ? load_f32u(scale, s0 + j) : 1.0f; }
};
inline RowScales row_scales(const QuantWeight& w, int64_t r) {
  RowScales s{w.cols, 0, nullptr, 1.0f};
  if (is_fp8(w.format)) {
    s.scale = w.scale;
    s.mult = w.fnuz ? 128.0f : 256.0f;
    if (w.format == WeightFormat::FP8_E4M3_BLOCK) {
      s.bc = w.block_cols;
      s.s0 = (r / w.block_rows) * w.scale_cols();
    } else if (w.format == WeightFormat::FP8_E4M3_CHANNEL) {
      s.s0 = r;
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Matmul helpers (the tiles themselves are width-generic: mm_body.h)
// ---------------------------------------------------------------------------------------------------------------
LTI float fma1(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

// A prefetch hint for an address that may lie past the end of the weight (the next tile of the last one): an
// integer address, so no out-of-range pointer is ever formed; prefetches never fault.
LTI void prefetch_at(uintptr_t a) { _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0); }

LT void v2_dequant_row(const QuantWeight& w, int64_t r, float* out) {
  const int64_t K = w.cols;
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes();
  int64_t c = 0;
  switch (w.format) {
    case WeightFormat::BF16:
      for (; c + 8 <= K; c += 8) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
        _mm256_storeu_ps(out + c, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
      }
      for (; c < K; ++c) {
        uint16_t h;
        std::memcpy(&h, row + 2 * c, 2);
        out[c] = bf16_to_f32(h);
      }
      return;
    case WeightFormat::F16:
      for (; c + 8 <= K; c += 8)
        _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c))));
      for (; c < K; ++c) {
        uint16_t h;
        std::memcpy(&h, row + 2 * c, 2);
        out[c] = f16_to_f32(h);
      }
      return;
    case WeightFormat::FP8_E4M3_BLOCK:
    case WeightFormat::FP8_E4M3_TENSOR:
    case WeightFormat::FP8_E4M3_CHANNEL: {
      const RowScales rs = row_scales(w, r);
      const float* t = w.fnuz ? kE4M3FnuzToF32.data() : kE4M3FnToF32.data();
      for (int64_t c0 = 0, j = 0; c0 < K; c0 += rs.bc, ++j) {
        const int64_t c1 = c0 + rs.bc < K ? c0 + rs.bc : K;
        const float s = rs.at(j);
        const __m256 sv = _mm256_set1_ps(s * rs.mult);
        c = c0;
        for (; c + 16 <= c1; c += 16) {
          __m256 lo, hi;
          __m128i nan = _mm_setzero_si128();
          fp8_decode16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c)), w.fnuz, lo, hi, nan);
          _mm256_storeu_ps(out + c, _mm256_mul_ps(lo, sv));
          _mm256_storeu_ps(out + c + 8, _mm256_mul_ps(hi, sv));
          if (!_mm_testz_si128(nan, nan))
            for (int64_t i = c; i < c + 16; ++i) out[i] = t[row[i]] * s;
        }
        for (; c < c1; ++c) out[c] = t[row[c]] * s;
      }
      return;
    }
    default: kernels_scalar().dequant_row(w, r, out); return;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Attention tiles: S = Q·Ktᵀ over one tile of 16 keys (R rows × 2 vectors of accumulators, q broadcast per
// element), O += P·V (R rows × C vectors of output columns, p broadcast per key).
// ---------------------------------------------------------------------------------------------------------------
template <int R>
LTI void v2_qk_rows(const float* q, int64_t ldq, const float* kt, int64_t d, float* s) {
  __m256 a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
  for (int64_t x = 0; x < d; ++x) {
    const __m256 k0 = _mm256_loadu_ps(kt + x * kAttnKeyTile), k1 = _mm256_loadu_ps(kt + x * kAttnKeyTile + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(q + r * ldq + x);
      a0[r] = _mm256_fmadd_ps(b, k0, a0[r]);
      a1[r] = _mm256_fmadd_ps(b, k1, a1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(s + r * kAttnKeyTile, a0[r]);
    _mm256_storeu_ps(s + r * kAttnKeyTile + 8, a1[r]);
  }
}

LT void v2_attn_qk_tile(const float* q, int64_t ldq, int64_t nq, const float* kt, int64_t d, float* s) {
  static_assert(kAttnKeyTile == 16, "the AVX2 tile holds 16 keys in two vectors");
  int64_t i = 0;
  for (; i + 6 <= nq; i += 6) v2_qk_rows<6>(q + i * ldq, ldq, kt, d, s + i * kAttnKeyTile);
  switch (nq - i) {
    case 5: v2_qk_rows<5>(q + i * ldq, ldq, kt, d, s + i * kAttnKeyTile); break;
    case 4: v2_qk_rows<4>(q + i * ldq, ldq, kt, d, s + i * kAttnKeyTile); break;
    case 3: v2_qk_rows<3>(q + i * ldq, ldq, kt, d, s + i * kAttnKeyTile); break;
    case 2: v2_qk_rows<2>(q + i * ldq, ldq, kt, d, s + i * kAttnKeyTile); break;
    case 1: v2_qk_rows<1>(q + i * ldq, ldq, kt, d, s + i * kAttnKeyTile); break;
    default: break;
  }
}

// Columns [c, c + 8·C) of R output rows (C full vectors), or with `mask` a last partial vector (C = 1).
template <int R, int C, bool kMasked>
LTI void v2_pv_block(const float* p, const float* v, int64_t ldv, int64_t nk, int64_t dv, float* o, __m256i mask) {
  __m256 a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      a[r][c] = kMasked ? _mm256_maskload_ps(o + r * dv + 8 * c, mask) : _mm256_loadu_ps(o + r * dv + 8 * c);
  for (int64_t j = 0; j < nk; ++j) {
    __m256 vv[C];
    for (int c = 0; c < C; ++c)
      vv[c] = kMasked ? _mm256_maskload_ps(v + j * ldv + 8 * c, mask) : _mm256_loadu_ps(v + j * ldv + 8 * c);
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(p + r * kAttnKeyTile + j);
      for (int c = 0; c < C; ++c) a[r][c] = _mm256_fmadd_ps(b, vv[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      if (kMasked)
        _mm256_maskstore_ps(o + r * dv + 8 * c, mask, a[r][c]);
      else
        _mm256_storeu_ps(o + r * dv + 8 * c, a[r][c]);
    }
}

template <int R>
LTI void v2_pv_rows(const float* p, const float* v, int64_t ldv, int64_t nk, int64_t dv, float* o) {
  const __m256i none = _mm256_setzero_si256();
  int64_t c = 0;
  for (; c + 32 <= dv; c += 32) v2_pv_block<R, 4, false>(p, v + c, ldv, nk, dv, o + c, none);
  for (; c + 8 <= dv; c += 8) v2_pv_block<R, 1, false>(p, v + c, ldv, nk, dv, o + c, none);
  if (c < dv) {
    const __m256i mask =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(dv - c)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    v2_pv_block<R, 1, true>(p, v + c, ldv, nk, dv, o + c, mask);
  }
}

LT void v2_attn_pv_tile(const float* p, int64_t nq, const float* v, int64_t ldv, int64_t nk, int64_t dv, float* o) {
  int64_t i = 0;
  for (; i + 3 <= nq; i += 3) v2_pv_rows<3>(p + i * kAttnKeyTile, v, ldv, nk, dv, o + i * dv);
  if (nq - i == 2) v2_pv_rows<2>(p + i * kAttnKeyTile, v, ldv, nk, dv, o + i * dv);
  if (nq - i == 1) v2_pv_rows<1>(p + i * kAttnKeyTile, v, ldv, nk, dv, o + i * dv);
}

LTI float hmax8(__m256 v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

LT void v2_attn_softmax_tile(float* s, int64_t nq, const uint32_t* mask, float scale, int mode, float* mx, float* sum,
                             float* acc, int64_t dv) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY), sv = _mm256_set1_ps(scale);
  const __m256i bits0 = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i bits1 = _mm256_slli_epi32(bits0, 8);
  for (int64_t i = 0; i < nq; ++i) {
    float* row = s + i * kAttnKeyTile;
    const uint32_t m = mask[i];
    if (!m) {
      _mm256_storeu_ps(row, _mm256_setzero_ps());
      _mm256_storeu_ps(row + 8, _mm256_setzero_ps());
      continue;
    }
    const __m256i mv = _mm256_set1_epi32(static_cast<int>(m));
    const __m256 ok0 = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(mv, bits0), bits0));
    const __m256 ok1 = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(mv, bits1), bits1));
    __m256 x0 = _mm256_loadu_ps(row), x1 = _mm256_loadu_ps(row + 8);
    if (mode == kSoftmaxOnline) {
      x0 = _mm256_mul_ps(x0, sv);
      x1 = _mm256_mul_ps(x1, sv);
    } else {
      x0 = bf16r8(_mm256_mul_ps(bf16r8(x0), sv));
      x1 = bf16r8(_mm256_mul_ps(bf16r8(x1), sv));
    }
    x0 = _mm256_blendv_ps(ninf, x0, ok0);
    x1 = _mm256_blendv_ps(ninf, x1, ok1);
    if (mode == kSoftmaxFinal) {
      const __m256 mxv = _mm256_set1_ps(mx[i]), smv = _mm256_set1_ps(sum[i]);
      _mm256_storeu_ps(row, bf16r8(_mm256_div_ps(exp8(_mm256_sub_ps(x0, mxv)), smv)));
      _mm256_storeu_ps(row + 8, bf16r8(_mm256_div_ps(exp8(_mm256_sub_ps(x1, mxv)), smv)));
      continue;
    }
    const float m_new = std::max(mx[i], hmax8(_mm256_max_ps(x0, x1)));
    if (m_new > mx[i]) {
      const float alpha = mx[i] == -INFINITY ? 0.0f : std::exp(mx[i] - m_new);
      sum[i] *= alpha;
      if (mode == kSoftmaxOnline && alpha != 1.0f) {
        float* a = acc + i * dv;
        const __m256 av = _mm256_set1_ps(alpha);
        int64_t c = 0;
        for (; c + 8 <= dv; c += 8) _mm256_storeu_ps(a + c, _mm256_mul_ps(_mm256_loadu_ps(a + c), av));
        for (; c < dv; ++c) a[c] *= alpha;
      }
      mx[i] = m_new;
    }
    const __m256 mn = _mm256_set1_ps(m_new);
    const __m256 e0 = exp8(_mm256_sub_ps(x0, mn)), e1 = exp8(_mm256_sub_ps(x1, mn));
    sum[i] += hsum8(_mm256_add_ps(e0, e1));
    if (mode == kSoftmaxOnline) {
      _mm256_storeu_ps(row, e0);
      _mm256_storeu_ps(row + 8, e1);
    }
  }
}

// 8 rows × 8 columns transposed in registers (unpack / shuffle / permute2f128).
LTI void v2_transpose8(__m256& r0, __m256& r1, __m256& r2, __m256& r3, __m256& r4, __m256& r5, __m256& r6, __m256& r7) {
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r0 = _mm256_permute2f128_ps(u0, u4, 0x20);
  r1 = _mm256_permute2f128_ps(u1, u5, 0x20);
  r2 = _mm256_permute2f128_ps(u2, u6, 0x20);
  r3 = _mm256_permute2f128_ps(u3, u7, 0x20);
  r4 = _mm256_permute2f128_ps(u0, u4, 0x31);
  r5 = _mm256_permute2f128_ps(u1, u5, 0x31);
  r6 = _mm256_permute2f128_ps(u2, u6, 0x31);
  r7 = _mm256_permute2f128_ps(u3, u7, 0x31);
}

LT void v2_attn_pack_kt(const float* const* rows, int64_t d, float* kt) {
  int64_t x = 0;
  for (; x + 8 <= d; x += 8)
    for (int g = 0; g < 2; ++g) {
      const float* const* rg = rows + 8 * g;
      __m256 r0 = _mm256_loadu_ps(rg[0] + x), r1 = _mm256_loadu_ps(rg[1] + x), r2 = _mm256_loadu_ps(rg[2] + x),
             r3 = _mm256_loadu_ps(rg[3] + x), r4 = _mm256_loadu_ps(rg[4] + x), r5 = _mm256_loadu_ps(rg[5] + x),
             r6 = _mm256_loadu_ps(rg[6] + x), r7 = _mm256_loadu_ps(rg[7] + x);
      v2_transpose8(r0, r1, r2, r3, r4, r5, r6, r7);
      float* o = kt + x * kAttnKeyTile + 8 * g;
      _mm256_storeu_ps(o, r0);
      _mm256_storeu_ps(o + kAttnKeyTile, r1);
      _mm256_storeu_ps(o + 2 * kAttnKeyTile, r2);
      _mm256_storeu_ps(o + 3 * kAttnKeyTile, r3);
      _mm256_storeu_ps(o + 4 * kAttnKeyTile, r4);
      _mm256_storeu_ps(o + 5 * kAttnKeyTile, r5);
      _mm256_storeu_ps(o + 6 * kAttnKeyTile, r6);
      _mm256_storeu_ps(o + 7 * kAttnKeyTile, r7);
    }
  for (; x < d; ++x)
    for (int64_t j = 0; j < kAttnKeyTile; ++j) kt[x * kAttnKeyTile + j] = rows[j][x];
}

// ---------------------------------------------------------------------------------------------------------------
// 256-bit vector traits of the width-generic kernels (vec_body.h).
// ---------------------------------------------------------------------------------------------------------------
struct V8 {
  using F = __m256;
  static constexpr int W = 8;
  LTI static __m256i part_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  LTI static F zero() { return _mm256_setzero_ps(); }
  LTI static F set1(float v) { return _mm256_set1_ps(v); }
  LTI static F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  LTI static void bcast2(const float* p, F& b0, F& b1) {
    b0 = bcast(p);
    b1 = bcast(p + 1);
  }
  // Two bf16 values from one 32-bit broadcast: the low half shifted up, the high half masked (p may be unaligned).
  LTI static void bcast2(const uint16_t* p, F& b0, F& b1) {
    int32_t d;
    std::memcpy(&d, p, 4);
    const __m256i v = _mm256_set1_epi32(d);
    b0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    b1 = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  LTI static F bcast(const uint16_t* p) {  // a bf16 value (p may be unaligned: a checkpoint or pool row)
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(h) << 16)));
  }
  LTI static F load(const float* p) { return _mm256_loadu_ps(p); }
  LTI static F load(const uint16_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  LTI static F load_part(const float* p, int64_t n) { return _mm256_maskload_ps(p, part_mask(n)); }
  LTI static F load_part(const uint16_t* p, int64_t n) {
    alignas(16) uint16_t t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(t, p, static_cast<size_t>(n) * 2);
    return load(t);
  }
  LTI static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  LTI static void store_part(float* p, F v, int64_t n) { _mm256_maskstore_ps(p, part_mask(n), v); }
  LTI static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  LTI static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  LTI static F add(F a, F b) { return _mm256_add_ps(a, b); }
  LTI static F max(F a, F b) { return _mm256_max_ps(a, b); }
  LTI static float hsum(F v) { return hsum8(v); }

  // ---- matmul tiles (mm_body.h) ----
  static constexpr int kMt = 3;  // 16 ymm registers: tiles of up to 3 activation rows
  // bf16 M = 1: 2-row tiles, the weight stream prefetched 4 KiB ahead in memory order (TBf16::tile_pf; every
  // one-pass tile, M <= 3, prefetches as far): membw_bench --step, one thread, Zen 4, weights on huge pages, five
  // interleaved rounds, the step's matmuls 18.7-26.8 GB/s (best of 5) with 8-row tiles prefetching the next one
  // -> 25.2-30.2; 2 rows 8 / 16 KiB ahead 23.6-28.9 / 26.3-28.4, 4 rows 8 KiB 20.7-24.7, 8 rows 32 KiB ahead slower
  // than the base (bench/README.md, issue 26). The tile shape does not change a bit (one chain per output).
  static constexpr int nt_bf16(int mt) { return mt == 1 ? 2 : mt == 2 ? 4 : 3; }
  static constexpr int64_t kGemvAheadBytes = 4096;
  static constexpr int nt_mx(int mt) { return mt == 1 ? 8 : mt == 2 ? 4 : 3; }
  static constexpr int nt_nat(int mt) { return mt == 1 ? 6 : mt == 2 ? 4 : 2; }
  static constexpr int64_t kChunkM = 8 * kMt;
  // bf16 prefill tile (3 x 3): the activation vectors held in registers (measured ~75-80 % of the FMA peak at
  // M >= 64 on Zen 3, ~55-60 % with x as memory operands).
  static constexpr int kBf16HoldX = 3, kBf16HoldW = 99;
  static constexpr int kBf16HalvesMaxMt = 0;  // (V16 only: the one-pass tiles in 256-bit halves)
  using I = __m256i;
  LTI static I loadi(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  LTI static F bf16_lo(I d) { return _mm256_castsi256_ps(_mm256_slli_epi32(d, 16)); }
  LTI static F bf16_hi(I d) {
    return _mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  static constexpr int kMxBlocks = 1;
  using MxC = Mx2Const;
  LTI static MxC mx_const() { return mx2_const(); }
  LTI static void mx_decode(const uint8_t* q, const MxC& c, F& f0, F& f1, F& f2, F& f3) {
    mx2_decode(q, c, f0, f1, f2, f3);
  }
  LTI static F mx_scale(const float* e8, const uint8_t* sc) { return _mm256_broadcast_ss(e8 + sc[0]); }
  using Nan = __m128i;  // fp8 NaN codes seen (bytes 0xFF)
  LTI static Nan nan_none() { return _mm_setzero_si128(); }
  LTI static bool nan_any(Nan n) { return !_mm_testz_si128(n, n); }
  // 2W natural-order elements at p (F32, F16 or FP8: value / 256 or / 128 for fnuz, see fp8_decode16).
  template <int kFmt>
  LTI static void nat_load2(const uint8_t* p, bool fnuz, F& lo, F& hi, Nan& nan) {
    if constexpr (kFmt == 0) {
      lo = _mm256_loadu_ps(reinterpret_cast<const float*>(p));
      hi = _mm256_loadu_ps(reinterpret_cast<const float*>(p + 32));
    } else if constexpr (kFmt == 1) {
      lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    } else {
      fp8_decode16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), fnuz, lo, hi, nan);
    }
  }
  // The first n < W (or = W) of them, the rest zero.
  template <int kFmt>
  LTI static F nat_load_part(const uint8_t* p, int64_t n, bool fnuz, Nan& nan) {
    constexpr int kB = kFmt == 0 ? 4 : kFmt == 1 ? 2 : 1;
    alignas(32) uint8_t t[64] = {};
    std::memcpy(t, p, static_cast<size_t>(n * kB));
    F lo, hi;
    nat_load2<kFmt>(t, fnuz, lo, hi, nan);
    return lo;
  }

  // r[k] = ((v[k]_0 + v[k]_1) + (v[k]_2 + v[k]_3)) + ((v[k]_4 + v[k]_5) + (v[k]_6 + v[k]_7)) for every k.
  LTI static F reduce(const F* v) {
    const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
  }
};

}  // namespace
}  // namespace latent::cpu

#include "kernels/cpu/mm_body.h"
#include "kernels/cpu/vec_body.h"
