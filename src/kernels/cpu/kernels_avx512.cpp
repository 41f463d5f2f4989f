// AVX-512 (F + BW + VL) kernels of the CPU backend: V16, the 512-bit vector traits with which this translation unit
// instantiates the width-generic matmul tiles (mm_body.h) and small GEMMs (vec_body.h); the small row ops reuse the
// 256-bit code of avx2_body.h compiled for this target. LATENT_CPU_NO_AVX512 (CMake LATENT_CPU_AVX512=OFF) compiles
// the null stub below instead.
#if (defined(__x86_64__) || defined(__i386__)) && !defined(LATENT_CPU_NO_AVX512)
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

// 512-bit vector traits of the width-generic kernels (vec_body.h).
struct V16 {
  using F = __m512;
  static constexpr int W = 16;
  LTI static F zero() { return _mm512_setzero_ps(); }
  LTI static F set1(float v) { return _mm512_set1_ps(v); }
  LTI static F bcast(const float* p) { return _mm512_set1_ps(*p); }
  LTI static void bcast2(const float* p, F& b0, F& b1) {
    b0 = bcast(p);
    b1 = bcast(p + 1);
  }
  // Two bf16 values from one 32-bit broadcast: the low half shifted up, the high half masked (p may be unaligned).
  LTI static void bcast2(const uint16_t* p, F& b0, F& b1) {
    int32_t d;
    std::memcpy(&d, p, 4);
    const __m512i v = _mm512_set1_epi32(d);
    b0 = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    b1 = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  LTI static F bcast(const uint16_t* p) {  // a bf16 value (p may be unaligned: a checkpoint or pool row)
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(h) << 16)));
  }
  LTI static F load(const float* p) { return _mm512_loadu_ps(p); }
  LTI static F load(const uint16_t* p) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  LTI static F load_part(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
  LTI static F load_part(const uint16_t* p, int64_t n) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(tail_mask(n), p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  LTI static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  LTI static void store_part(float* p, F v, int64_t n) { _mm512_mask_storeu_ps(p, tail_mask(n), v); }
  LTI static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  LTI static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  LTI static F add(F a, F b) { return _mm512_add_ps(a, b); }
  LTI static F max(F a, F b) { return _mm512_max_ps(a, b); }
  LTI static float hsum(F v) { return hsum16(v); }

  // ---- matmul tiles (mm_body.h) ----
  static constexpr int kMt = 5;  // 32 zmm registers: tiles of up to 5 activation rows
  // M = 1 and 2 (one pass): 2-row and 2 x 4 tiles in 256-bit halves prefetching 8 KiB ahead (TBf16::gemv_halves;
  // M = 2 was 2 x 8 in 512-bit vectors prefetching the next tile).
  static constexpr int nt_bf16(int mt) { return mt == 1 ? 2 : 4; }
  static constexpr int kBf16HalvesMaxMt = 2;
  static constexpr int64_t kGemvAheadBytes = 8192;
  using Half = V8;
  LTI static __m256 low(F v) { return _mm512_castps512_ps256(v); }
  LTI static __m256 high(F v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
  static constexpr int nt_mx(int mt) { return mt == 1 ? 8 : mt == 2 ? 6 : 4; }
  static constexpr int nt_nat(int mt) { return mt == 1 ? 6 : mt == 2 ? 4 : 3; }
  static constexpr int64_t kChunkM = 4 * kMt;
  // bf16 prefill tiles (4-5 x 4): the decoded weights of a group held in registers, activation rows outer.
  static constexpr int kBf16HoldX = 99, kBf16HoldW = 4;
  using I = __m512i;
  LTI static I loadi(const uint8_t* p) { return _mm512_loadu_si512(p); }
  LTI static F bf16_lo(I d) { return _mm512_castsi512_ps(_mm512_slli_epi32(d, 16)); }
  LTI static F bf16_hi(I d) {
    return _mm512_castsi512_ps(_mm512_and_si512(d, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  static constexpr int kMxBlocks = 2;
  using MxC = Mx5Const;
  LTI static MxC mx_const() { return mx5_const(); }
  LTI static void mx_decode(const uint8_t* q, const MxC& c, F& f0, F& f1, F& f2, F& f3) {
    mx5_decode(q, c, f0, f1, f2, f3);
  }
  // Lanes 4-7 and 12-15 of the decoded vectors hold the second block.
  LTI static F mx_scale(const float* e8, const uint8_t* sc) {
    return _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(e8[sc[0]]), _mm512_set1_ps(e8[sc[1]]));
  }
  using Nan = __mmask32;  // fp8 NaN codes seen
  LTI static Nan nan_none() { return 0; }
  LTI static bool nan_any(Nan n) { return n != 0; }
  // n <= 16 natural-order elements at p (F32, F16 or FP8 / 256, / 128 for fnuz), the rest zero.
  template <int kFmt>
  LTI static F nat_load_part(const uint8_t* p, int64_t n, bool fnuz, Nan& nan) {
    const __mmask16 mk = tail_mask(n);
    if constexpr (kFmt == 0) {
      return _mm512_maskz_loadu_ps(mk, p);
    } else if constexpr (kFmt == 1) {
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, p));
    } else {
      const __m128i v = _mm_maskz_loadu_epi8(mk, p);
      const __m256i t = _mm256_slli_epi16(_mm256_cvtepu8_epi16(v), 8);
      const __m256i h = _mm256_and_si256(_mm256_srai_epi16(t, 1), _mm256_set1_epi16(static_cast<short>(0xBF80)));
      nan |= fnuz ? _mm_cmpeq_epi8_mask(v, _mm_set1_epi8(static_cast<char>(0x80)))
                  : _mm_cmpeq_epi8_mask(_mm_and_si128(v, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F));
      return _mm512_cvtph_ps(h);
    }
  }
  template <int kFmt>
  LTI static void nat_load2(const uint8_t* p, bool fnuz, F& lo, F& hi, Nan& nan) {
    constexpr int kB = kFmt == 0 ? 4 : kFmt == 1 ? 2 : 1;
    lo = nat_load_part<kFmt>(p, 16, fnuz, nan);
    hi = nat_load_part<kFmt>(p + 16 * kB, 16, fnuz, nan);
  }

  // r[k]: the two 256-bit halves of v[k] added lane by lane, then V8's tree (the same order for every k).
  LTI static F reduce(const F* v) {
    __m256 h[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k)
      h[k] = _mm256_add_ps(_mm512_castps512_ps256(v[k]),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v[k]), 1)));
    const __m256 lo = V8::reduce(h), hi = V8::reduce(h + 8);
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
  }
};

const Kernels kAvx512 = {
    "avx512",
    vec_permutes,
    vec_prep_x<V16>,
    vec_matmul_rows<V16>,
    v2_dequant_row,
    v5_dot,
    v5_axpy,
    v2_scaled_add,
    v2_exp_sub_sum,
    v2_rms_norm_row,
    v2_silu_mul,
    v2_add,
    v2_round_bf16,
    v2_rope_interleaved,
    v2_rope_half,
    v2_attn_qk_tile,
    v2_attn_pv_tile,
    v2_attn_softmax_tile,
    v2_attn_pack_kt,
    vec_dot_rows<V16, float, 6, 4>,
    vec_dot_rows<V16, uint16_t, 6, 4>,
    vec_dot_rows_t<V16, float, 3, 6>,
    vec_dot_rows_t<V16, uint16_t, 3, 6>,
    vec_axpy_rows<V16, float, 4, 4>,
    vec_axpy_rows<V16, uint16_t, 4, 4>,
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
