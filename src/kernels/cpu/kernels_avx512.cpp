// AVX-512 (F + BW + VL) kernels of the CPU backend: 512-bit matmul kernels; the small row ops reuse the 256-bit
// code of avx2_body.h compiled for this target.
//
// Layouts of prepared x, 512-bit:
//   BF16: groups of 32 columns: xp[j] = x[2j], xp[16+j] = x[2j+1] (j < 16); the rest natural.
//   MXFP4: pairs of blocks (64 columns): xp[16v + 4q + i] = x[32(q&1) + 4i + (q>>1) + {0,2,16,18}[v]] (128-bit
//          lane q of the decoded vectors: q&1 = which block, q>>1 = low/high nibble); a last odd block uses the
//          256-bit layout of avx2_body.h.
//   others: natural (tails by masked loads).
#if defined(__x86_64__) || defined(__i386__)
#define LATENT_CPU_TARGET "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
// GCC 12's avx512fintrin.h builds "undefined" vectors as `__m512 __Y = __Y;`, which -Wuninitialized flags at
// every inlined use (_mm512_reduce_add_ps, _mm512_broadcast_i32x4, ...).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "kernels/cpu/avx2_body.h"

namespace latent::cpu {
namespace {

LTI float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }  // n in [0, 16]

inline void perm_bf16_32(const float* x, float* xp) {
  for (int j = 0; j < 16; ++j) {
    xp[j] = x[2 * j];
    xp[16 + j] = x[2 * j + 1];
  }
}
inline void perm_mx_64(const float* x, float* xp) {
  for (int v = 0; v < 4; ++v)
    for (int q = 0; q < 4; ++q)
      for (int i = 0; i < 4; ++i) xp[16 * v + 4 * q + i] = x[32 * (q & 1) + 4 * i + (q >> 1) + kMxOff[v]];
}

bool v5_permutes(WeightFormat f) { return f == WeightFormat::BF16 || f == WeightFormat::MXFP4; }

void v5_prep_x(WeightFormat f, const float* x, int64_t M, int64_t K, float* xp) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    float* o = xp + m * K;
    int64_t k = 0;
    if (f == WeightFormat::BF16) {
      for (; k + 32 <= K; k += 32) perm_bf16_32(xm + k, o + k);
    } else if (f == WeightFormat::MXFP4) {
      for (; k + 64 <= K; k += 64) perm_mx_64(xm + k, o + k);
      for (; k + 32 <= K; k += 32) perm_mx_32(xm + k, o + k);
    }
    for (; k < K; ++k) o[k] = xm[k];
  }
}

// ---------------------------------------------------------------------------------------------------------------
// MXFP4
// ---------------------------------------------------------------------------------------------------------------
struct Mx5Const {
  __m512i tlo, thi, m0f, sh, hm;
};
LTI Mx5Const mx5_const() {
  Mx5Const c;
  c.tlo = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxLo)));
  c.thi = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxHi)));
  c.m0f = _mm512_set1_epi8(0x0F);
  c.sh = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
  c.hm = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  return c;
}
// Two consecutive blocks (32 bytes) -> f0..f3 in the 512-bit MXFP4 xp order.
LTI void mx5_decode(const uint8_t* q, const Mx5Const& c, __m512& f0, __m512& f1, __m512& f2, __m512& f3) {
  const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
  const __m512i codes = _mm512_and_si512(_mm512_srlv_epi32(b, c.sh), c.m0f);
  const __m512i lb = _mm512_shuffle_epi8(c.tlo, codes), hb = _mm512_shuffle_epi8(c.thi, codes);
  const __m512i wa = _mm512_unpacklo_epi8(lb, hb), wb = _mm512_unpackhi_epi8(lb, hb);
  f0 = _mm512_castsi512_ps(_mm512_slli_epi32(wa, 16));
  f1 = _mm512_castsi512_ps(_mm512_and_si512(wa, c.hm));
  f2 = _mm512_castsi512_ps(_mm512_slli_epi32(wb, 16));
  f3 = _mm512_castsi512_ps(_mm512_and_si512(wb, c.hm));
}

// ---------------------------------------------------------------------------------------------------------------
// Matmul kernels (512-bit): the register tiles of avx2_body.h (MT activation rows x NT weight rows, one
// accumulator chain per (m, r) pair, fixed order over k per format) with 512-bit vectors, so batch invariance holds
// the same way (see the comment there).
// ---------------------------------------------------------------------------------------------------------------

// BF16: per 32-column group, acc = fma(even, x_even, acc); acc = fma(odd, x_odd, acc); the columns past the last
// group in natural order by masked 16-column steps.
struct V5Bf16 {
  static constexpr int kMaxMt = 5;
  static constexpr int nt(int mt) { return mt == 1 ? 8 : mt == 2 ? 6 : 4; }
  template <int MT, int NT>
  LT static void tile(const QuantWeight& w, const float* x, int64_t r, float* y, int64_t ldy) {
    const int64_t K = w.cols, K32 = K & ~int64_t(31);
    const __m512i hm = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    const uint8_t* base = static_cast<const uint8_t*>(w.data) + r * 2 * K;
    __m512 acc[MT][NT];
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) acc[i / NT][i % NT] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K32; k += 32) {
      if constexpr (MT >= 4) {  // activation rows outer, the decoded weight vectors in registers
        __m512 e[NT], o[NT];
#pragma GCC unroll 8
        for (int n = 0; n < NT; ++n) {
          const __m512i d = _mm512_loadu_si512(base + n * 2 * K + 2 * k);
          e[n] = _mm512_castsi512_ps(_mm512_slli_epi32(d, 16));
          o[n] = _mm512_castsi512_ps(_mm512_and_si512(d, hm));
        }
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) {
          const __m512 xl = _mm512_loadu_ps(x + m * K + k), xh = _mm512_loadu_ps(x + m * K + k + 16);
#pragma GCC unroll 8
          for (int n = 0; n < NT; ++n) {
            acc[m][n] = _mm512_fmadd_ps(e[n], xl, acc[m][n]);
            acc[m][n] = _mm512_fmadd_ps(o[n], xh, acc[m][n]);
          }
        }
      } else {
#pragma GCC unroll 8
        for (int n = 0; n < NT; ++n) {
          const __m512i d = _mm512_loadu_si512(base + n * 2 * K + 2 * k);
          const __m512 e = _mm512_castsi512_ps(_mm512_slli_epi32(d, 16));
          const __m512 o = _mm512_castsi512_ps(_mm512_and_si512(d, hm));
#pragma GCC unroll 8
          for (int m = 0; m < MT; ++m) {
            acc[m][n] = _mm512_fmadd_ps(e, _mm512_loadu_ps(x + m * K + k), acc[m][n]);
            acc[m][n] = _mm512_fmadd_ps(o, _mm512_loadu_ps(x + m * K + k + 16), acc[m][n]);
          }
        }
      }
    }
    for (int64_t k = K32; k < K; k += 16) {  // natural-order tail (< 32 columns): masked loads
      const __mmask16 mk = tail_mask(K - k < 16 ? K - k : 16);
#pragma GCC unroll 8
      for (int n = 0; n < NT; ++n) {
        const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, base + n * 2 * K + 2 * k));
        const __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) acc[m][n] = _mm512_fmadd_ps(f, _mm512_maskz_loadu_ps(mk, x + m * K + k), acc[m][n]);
      }
    }
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) y[(i / NT) * ldy + (i % NT)] = hsum16(acc[i / NT][i % NT]);
  }
};

// MXFP4: per pair of blocks (64 elements) t = f0·x0 (+fma f1..f3), acc = fma(t, scales, acc); a last odd block
// by the 256-bit decode: odd = hsum8(t·scale); y = hsum16(acc) + odd.
struct V5Mxfp4 {
  static constexpr int kMaxMt = 5;
  static constexpr int nt(int mt) { return mt == 1 ? 8 : mt == 2 ? 6 : 4; }
  template <int MT, int NT>
  LT static void tile(const QuantWeight& w, const float* x, int64_t r, float* y, int64_t ldy) {
    const int64_t K = w.cols, nb = K / 32;
    const Mx5Const c = mx5_const();
    const float* e8 = kE8M0ToF32.data();
    const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (K / 2);
    const uint8_t* sc = static_cast<const uint8_t*>(w.scale) + r * nb;
    __m512 acc[MT][NT];
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) acc[i / NT][i % NT] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
#pragma GCC unroll 8
      for (int n = 0; n < NT; ++n) {
        __m512 f0, f1, f2, f3;
        mx5_decode(q + n * (K / 2) + b * 16, c, f0, f1, f2, f3);
        const uint8_t* sn = sc + n * nb + b;
        const __m512 s = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(e8[sn[0]]), _mm512_set1_ps(e8[sn[1]]));
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) {
          const float* xb = x + m * K + b * 32;
          __m512 t = _mm512_mul_ps(f0, _mm512_loadu_ps(xb));
          t = _mm512_fmadd_ps(f1, _mm512_loadu_ps(xb + 16), t);
          t = _mm512_fmadd_ps(f2, _mm512_loadu_ps(xb + 32), t);
          t = _mm512_fmadd_ps(f3, _mm512_loadu_ps(xb + 48), t);
          acc[m][n] = _mm512_fmadd_ps(t, s, acc[m][n]);
        }
      }
    }
    float odd[MT][NT];
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) odd[i / NT][i % NT] = 0.0f;
    if (b < nb) {  // last odd block: 256-bit decode and layout
      const Mx2Const c2 = mx2_const();
#pragma GCC unroll 8
      for (int n = 0; n < NT; ++n) {
        __m256 f0, f1, f2, f3;
        mx2_decode(q + n * (K / 2) + b * 16, c2, f0, f1, f2, f3);
        const __m256 s = _mm256_set1_ps(e8[sc[n * nb + b]]);
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) {
          const float* xb = x + m * K + b * 32;
          __m256 t = _mm256_mul_ps(f0, _mm256_loadu_ps(xb));
          t = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xb + 8), t);
          t = _mm256_fmadd_ps(f2, _mm256_loadu_ps(xb + 16), t);
          t = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xb + 24), t);
          odd[m][n] = hsum8(_mm256_mul_ps(t, s));
        }
      }
    }
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i)
      y[(i / NT) * ldy + (i % NT)] = hsum16(acc[i / NT][i % NT]) + odd[i / NT][i % NT];
  }
};

// F32 / F16 / FP8: natural order. Per scale block j: a = Σ fma over 32-column steps (low 16 then high 16), then
// masked 16-column steps; tot = fma(a, scale_j·mult, tot); y = hsum16(tot). NaN fp8 code in a row: exact scalar
// kernel for that row.
struct Dec5F32 {
  static constexpr int kBytes = 4;
  LTI static __m512 load(const uint8_t* p, __mmask16 mk, bool, __mmask16&) { return _mm512_maskz_loadu_ps(mk, p); }
};
struct Dec5F16 {
  static constexpr int kBytes = 2;
  LTI static __m512 load(const uint8_t* p, __mmask16 mk, bool, __mmask16&) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, p));
  }
};
struct Dec5Fp8 {
  static constexpr int kBytes = 1;
  LTI static __m512 load(const uint8_t* p, __mmask16 mk, bool fnuz, __mmask16& nan) {
    const __m128i v = _mm_maskz_loadu_epi8(mk, p);
    const __m256i t = _mm256_slli_epi16(_mm256_cvtepu8_epi16(v), 8);
    const __m256i h = _mm256_and_si256(_mm256_srai_epi16(t, 1), _mm256_set1_epi16(static_cast<short>(0xBF80)));
    nan |= fnuz ? _mm_cmpeq_epi8_mask(v, _mm_set1_epi8(static_cast<char>(0x80)))
                : _mm_cmpeq_epi8_mask(_mm_and_si128(v, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F));
    return _mm512_cvtph_ps(h);
  }
};

template <class Dec>
struct V5Nat {
  static constexpr int kMaxMt = 5;
  static constexpr int nt(int mt) { return mt == 1 ? 6 : mt == 2 ? 4 : 3; }
  template <int MT, int NT>
  LT static void tile(const QuantWeight& w, const float* x, int64_t r, float* y, int64_t ldy) {
    const int64_t K = w.cols;
    const bool fnuz = w.fnuz;
    const __mmask16 full = 0xFFFF;
    const uint8_t* base = static_cast<const uint8_t*>(w.data) + r * K * Dec::kBytes;
    RowScales rs[NT];
#pragma GCC unroll 8
    for (int n = 0; n < NT; ++n) rs[n] = row_scales(w, r + n);
    const int64_t bc = rs[0].bc;
    __m512 tot[MT][NT];
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) tot[i / NT][i % NT] = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t c0 = 0, j = 0; c0 < K; c0 += bc, ++j) {
      const int64_t c1 = c0 + bc < K ? c0 + bc : K;
      __m512 a[MT][NT];
#pragma GCC unroll 32
      for (int i = 0; i < MT * NT; ++i) a[i / NT][i % NT] = _mm512_setzero_ps();
      int64_t c = c0;
      for (; c + 32 <= c1; c += 32) {
#pragma GCC unroll 8
        for (int n = 0; n < NT; ++n) {
          const __m512 lo = Dec::load(base + (n * K + c) * Dec::kBytes, full, fnuz, nan);
          const __m512 hi = Dec::load(base + (n * K + c + 16) * Dec::kBytes, full, fnuz, nan);
#pragma GCC unroll 8
          for (int m = 0; m < MT; ++m) {
            a[m][n] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x + m * K + c), a[m][n]);
            a[m][n] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + m * K + c + 16), a[m][n]);
          }
        }
      }
      for (; c < c1; c += 16) {
        const __mmask16 mk = tail_mask(c1 - c < 16 ? c1 - c : 16);
#pragma GCC unroll 8
        for (int n = 0; n < NT; ++n) {
          const __m512 f = Dec::load(base + (n * K + c) * Dec::kBytes, mk, fnuz, nan);
#pragma GCC unroll 8
          for (int m = 0; m < MT; ++m) a[m][n] = _mm512_fmadd_ps(f, _mm512_maskz_loadu_ps(mk, x + m * K + c), a[m][n]);
        }
      }
#pragma GCC unroll 8
      for (int n = 0; n < NT; ++n) {
        const __m512 sv = _mm512_set1_ps(rs[n].at(j) * rs[n].mult);
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) tot[m][n] = _mm512_fmadd_ps(a[m][n], sv, tot[m][n]);
      }
    }
    if (nan) {  // a NaN code in one of the rows: redo row by row
#pragma GCC unroll 8
      for (int n = 0; n < NT; ++n) {
        if constexpr (NT > 1)
          tile<MT, 1>(w, x, r + n, y + n, ldy);
        else
          kernels_scalar().matmul_rows(w, x, MT, r, r + 1, y, ldy);
      }
      return;
    }
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) y[(i / NT) * ldy + (i % NT)] = hsum16(tot[i / NT][i % NT]);
  }
};

template <class F, int MT>
LT void v5_mm_rows(const QuantWeight& w, const float* x, int64_t rs, int64_t re, float* y, int64_t ldy) {
  constexpr int NT = F::nt(MT);
  int64_t r = rs;
  for (; r + NT <= re; r += NT) F::template tile<MT, NT>(w, x, r, y + (r - rs), ldy);
  for (; r < re; ++r) F::template tile<MT, 1>(w, x, r, y + (r - rs), ldy);
}

template <class F, int MT>
LT void v5_mm_tiles(const QuantWeight& w, const float* xp, int64_t m0, int64_t m1, int64_t rs, int64_t re, float* y,
                    int64_t ldy) {
  const int64_t K = w.cols;
  for (; m0 + MT <= m1; m0 += MT) v5_mm_rows<F, MT>(w, xp + m0 * K, rs, re, y + m0 * ldy, ldy);
  const float* x = xp + m0 * K;
  float* ym = y + m0 * ldy;
  switch (m1 - m0) {  // fewer than MT rows left
    case 1: v5_mm_rows<F, 1>(w, x, rs, re, ym, ldy); break;
    case 2: if constexpr (MT > 2) v5_mm_rows<F, 2>(w, x, rs, re, ym, ldy); break;
    case 3: if constexpr (MT > 3) v5_mm_rows<F, 3>(w, x, rs, re, ym, ldy); break;
    case 4: if constexpr (MT > 4) v5_mm_rows<F, 4>(w, x, rs, re, ym, ldy); break;
    default: break;
  }
}

// The loop structure of v2_mm_fmt (M <= kMaxMt one pass; larger M in chunks of activation rows against panels of
// weight rows); 32 vector registers allow tiles of up to 5 activation rows.
template <class F>
LT void v5_mm_fmt(const QuantWeight& w, const float* xp, int64_t M, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  constexpr int kMt = F::kMaxMt;
  constexpr int64_t kChunkM = 4 * kMt;
  const int64_t panel = M <= kMt ? r1 - r0 : tile_rows(w);
  for (int64_t c0 = 0; c0 < M; c0 += kChunkM) {
    const int64_t c1 = c0 + kChunkM < M ? c0 + kChunkM : M;
    for (int64_t rs = r0; rs < r1; rs += panel) {
      const int64_t re = rs + panel < r1 ? rs + panel : r1;
      v5_mm_tiles<F, kMt>(w, xp, c0, c1, rs, re, y + (rs - r0), ldy);
    }
  }
}

LT void v5_matmul_rows(const QuantWeight& w, const float* xp, int64_t M, int64_t r0, int64_t r1, float* y,
                       int64_t ldy) {
  if (M <= 0 || r1 <= r0) return;
  switch (w.format) {
    case WeightFormat::BF16: return v5_mm_fmt<V5Bf16>(w, xp, M, r0, r1, y, ldy);
    case WeightFormat::MXFP4: return v5_mm_fmt<V5Mxfp4>(w, xp, M, r0, r1, y, ldy);
    case WeightFormat::F32: return v5_mm_fmt<V5Nat<Dec5F32>>(w, xp, M, r0, r1, y, ldy);
    case WeightFormat::F16: return v5_mm_fmt<V5Nat<Dec5F16>>(w, xp, M, r0, r1, y, ldy);
    case WeightFormat::FP8_E4M3_BLOCK:
    case WeightFormat::FP8_E4M3_TENSOR:
    case WeightFormat::FP8_E4M3_CHANNEL: return v5_mm_fmt<V5Nat<Dec5Fp8>>(w, xp, M, r0, r1, y, ldy);
  }
}

LT float v5_dot(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i < n; i += 16) {
    const __mmask16 mk = tail_mask(n - i < 16 ? n - i : 16);
    s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + i), _mm512_maskz_loadu_ps(mk, b + i), s0);
  }
  return hsum16(_mm512_add_ps(s0, s1));
}

LT void v5_axpy(float a, const float* x, float* y, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mk = tail_mask(n - i < 16 ? n - i : 16);
    _mm512_mask_storeu_ps(y + i, mk,
                          _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mk, x + i), _mm512_maskz_loadu_ps(mk, y + i)));
  }
}

const Kernels kAvx512 = {
    "avx512",        v5_permutes,     v5_prep_x,      v5_matmul_rows,  v2_dequant_row, v5_dot,
    v5_axpy,         v2_scaled_add,   v2_exp_sub_sum, v2_rms_norm_row, v2_silu_mul,    v2_add,
    v2_round_bf16,   v2_rope_interleaved, v2_rope_half,
    v2_attn_qk_tile, v2_attn_pv_tile, v2_attn_softmax_tile, v2_attn_pack_kt,
};

}  // namespace
const Kernels* kernels_avx512() { return &kAvx512; }
}  // namespace latent::cpu

#else
#include "kernels/cpu/cpu_kernels.h"
namespace latent::cpu {
const Kernels* kernels_avx512() { return nullptr; }
}  // namespace latent::cpu
#endif
