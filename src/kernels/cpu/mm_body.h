// Internal include fragment: the matmul kernels of the CPU backend written once for any vector width — register
// tiles of MT activation rows x NT weight rows per stored format, the driver that walks a row range with them, and
// the prepared-x permutations — as templates over a vector traits type V (V8 in avx2_body.h, V16 in
// kernels_avx512.cpp); each ISA translation unit instantiates them with its own target attribute. What differs per
// ISA lives in the traits: the vector width W, the largest tile (kMt activation rows; nt_*(mt) weight rows), the
// register strategy of the bf16 prefill tile, and the decoders (bf16 halves, MXFP4 blocks, f16 / fp8 / f32 rows).
//
// Layouts of prepared x (see cpu_kernels.h), W lanes:
//   BF16: groups of 2W columns: xp[j] = x[2j], xp[W+j] = x[2j+1] (j < W) — a dword of two bf16 gives the even
//         element by a left shift and the odd one by a mask, no shuffle; the columns past the last group natural.
//   MXFP4: W = 8: per 32-element block, xp[8v + 4h + i] = x[4i + h + {0,2,16,18}[v]] — the order the nibble split
//          (lane 0 low nibbles, lane 1 high nibbles), two pshufb table look-ups and the byte unpacks produce;
//          W = 16: per pair of blocks, xp[16v + 4q + i] = x[32(q&1) + 4i + (q>>1) + {0,2,16,18}[v]] (128-bit lane q:
//          q&1 = which block, q>>1 = low/high nibble), a last odd block in the W = 8 layout.
//   others: natural.
//
// Batch invariance (the engine promises a sequence's logits do not depend on what else is in the step): every
// output y[m, r] is computed by exactly the same sequence of fp32 operations whatever the tile shape, M, the row
// range a thread got, or the position of row m in the batch:
//   * one accumulator chain per (m, r) pair — the instruction-level parallelism comes from the MT x NT pairs of a
//     tile, never from splitting one dot product over several accumulators, so a 1 x 1 tail tile does what a
//     5 x 4 tile does for each of its pairs;
//   * the order over k is fixed per format (2W-column groups, MXFP4 blocks, scale blocks, masked W-column steps for
//     the columns past the last group), the horizontal sum is V::hsum;
//   * K is never split across threads.
// Tiles differ only in which pair's operation is issued when (loop order, registers), which does not change any
// rounding. The batch-invariance tests of the op harness check this bit for bit.
#pragma once

#include <cstdint>

namespace latent::cpu {
namespace {

// Natural-order formats of TNat.
inline constexpr int kNatF32 = 0, kNatF16 = 1, kNatFp8 = 2;
// A tile's software prefetch: the weight rows `rows` past its own (0: none; kAheadDefault: the format's choice for
// one pass over the rows), on its column steps phase, phase + stride, ... (the activation tiles of a panel share the
// next panel's lines, so that none of them issues them all in a burst).
inline constexpr int64_t kAheadDefault = -1;
struct Ahead {
  int64_t rows = kAheadDefault, phase = 0, stride = 1;
};

// ---------------------------------------------------------------------------------------------------------------
// BF16: per 2W-column group, acc = fma(even, x_even, acc); acc = fma(odd, x_odd, acc) (prepared x order); the
// columns past the last group in natural order by masked W-column steps.
// ---------------------------------------------------------------------------------------------------------------
template <class V>
struct TBf16 {
  static constexpr int kMaxMt = V::kMt;
  static constexpr int nt(int mt) { return V::nt_bf16(mt); }
  using F = typename V::F;
  using I = typename V::I;

  // acc[m][n] = fma(half, x[m·K + 0..W), acc[m][n]) for one half (even / odd) of the group at k, the MT x vectors
  // loaded once into registers for the NT rows (the weight vector is loaded again for the odd half rather than
  // kept).
  template <int MT, int NT, bool kOdd>
  LTI static void half_x_held(const uint8_t* base, int64_t K, const float* x, int64_t k, F (&acc)[MT][NT]) {
    F xv[MT];
#pragma GCC unroll 8
    for (int m = 0; m < MT; ++m) xv[m] = V::load(x + m * K);
#pragma GCC unroll 8
    for (int n = 0; n < NT; ++n) {
      const I d = V::loadi(base + n * 2 * K + 2 * k);
      const F h = kOdd ? V::bf16_hi(d) : V::bf16_lo(d);
#pragma GCC unroll 8
      for (int m = 0; m < MT; ++m) acc[m][n] = V::fma(h, xv[m], acc[m][n]);
    }
  }

  // ah: see Ahead (kAheadDefault: decode tiles prefetch the next tile, prefill tiles nothing). The default keeps
  // its prefetch a compile-time choice (kShared false): a run-time test per group cost the M = 1 expert GEMV ~25 %
  // (membw_bench --ops, 1 thread, Zen 4).
  template <int MT, int NT>
  LT static void tile(const QuantWeight& w, const float* x, int64_t r, float* y, int64_t ldy, Ahead ah) {
    if constexpr (MT <= V::kBf16HalvesMaxMt) {
      if (ah.rows == kAheadDefault) return gemv_halves<MT, NT>(w, x, r, y, ldy);
    }
    if (ah.rows == kAheadDefault)
      tile_pf<MT, NT, false>(w, x, r, y, ldy, ah);
    else
      tile_pf<MT, NT, true>(w, x, r, y, ldy, ah);
  }

  // The one-pass tiles of up to V::kBf16HalvesMaxMt activation rows of V16 (M = 1 and 2): the same chain per output
  // as tile_pf's (lane j of the 16-lane accumulator is lane j mod 8 of the low or high 8-lane half, each group's even
  // then odd fma, and hsum(acc) = hsum8(low + high), the order of V16::hsum), computed with 256-bit loads and fmas,
  // and the weight stream prefetched V::kGemvAheadBytes ahead in the order of memory (whole tiles, spread over this
  // tile's groups). Measured on Zen 4 (membw_bench --step, one thread, the bench shape's decode matmuls from DRAM):
  // 512-bit loads ~3-5 % slower than two 256-bit ones; 8-row tiles prefetching the next tile (16 KiB at K = 1024)
  // ~12-18 % slower than 2-4 rows with 8-16 KiB ahead, 12-16 rows (a 24-32 KiB tile: the L1 is 32 KiB) half the
  // speed; prefetches in consumption order (each row's next line) as slow as none, to L2 only (T1 / T2 hints) ~15 %
  // slower (bench/README.md, "Issue 26, AVX-512 decode GEMV"). M = 2 (the routed experts at batch 16 get ~2 rows
  // each): 2 x 4 tiles, as the M = 1 one (bench/README.md, "Issue 26, batched decode").
  template <int MT, int NT>
  LTI static void gemv_halves(const QuantWeight& w, const float* x, int64_t r, float* y, int64_t ldy) {
    using H = typename V::Half;
    using HF = typename H::F;
    using HI = typename H::I;
    constexpr int W = V::W, G = 2 * W;
    const int64_t K = w.cols, KG = K / G * G;
    const uint8_t* base = static_cast<const uint8_t*>(w.data) + r * 2 * K;
    const int64_t ahead = gemv_ahead_rows<NT>(w) * 2 * K;  // whole tiles, as tile_pf's one-pass tiles
    const uintptr_t pn = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(ahead);
    HF lo[MT][NT], hi[MT][NT];
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) lo[i / NT][i % NT] = hi[i / NT][i % NT] = H::zero();
    for (int64_t k = 0; k < KG; k += G) {
#pragma GCC unroll 8
      for (int j = 0; j < NT * 2 * G; j += 64) prefetch_at(pn + static_cast<uintptr_t>(k / G * NT * 2 * G + j));
      HF x0[MT], x1[MT], x2[MT], x3[MT];
#pragma GCC unroll 8
      for (int m = 0; m < MT; ++m) {
        const float* xm = x + m * K + k;
        x0[m] = H::load(xm);
        x1[m] = H::load(xm + W / 2);
        x2[m] = H::load(xm + W);
        x3[m] = H::load(xm + W + W / 2);
      }
#pragma GCC unroll 8
      for (int n = 0; n < NT; ++n) {
        const HI d0 = H::loadi(base + n * 2 * K + 2 * k),
                 d1 = H::loadi(base + n * 2 * K + 2 * k + 2 * W);  // (W / 2 dwords on)
        const HF e0 = H::bf16_lo(d0), e1 = H::bf16_lo(d1), o0 = H::bf16_hi(d0), o1 = H::bf16_hi(d1);
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) {
          lo[m][n] = H::fma(e0, x0[m], lo[m][n]);
          hi[m][n] = H::fma(e1, x1[m], hi[m][n]);
          lo[m][n] = H::fma(o0, x2[m], lo[m][n]);
          hi[m][n] = H::fma(o1, x3[m], hi[m][n]);
        }
      }
    }
    for (int64_t k = KG; k < K; k += W) {  // natural-order tail (< 2W columns): tile_pf's masked W-lane steps
      const int64_t nn = K - k < W ? K - k : W;
#pragma GCC unroll 8
      for (int n = 0; n < NT; ++n) {
        const typename V::F f = V::load_part(reinterpret_cast<const uint16_t*>(base + n * 2 * K + 2 * k), nn);
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) {
          const typename V::F xv = V::load_part(x + m * K + k, nn);
          lo[m][n] = H::fma(V::low(f), V::low(xv), lo[m][n]);
          hi[m][n] = H::fma(V::high(f), V::high(xv), hi[m][n]);
        }
      }
    }
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i)
      y[(i / NT) * ldy + (i % NT)] = H::hsum(H::add(lo[i / NT][i % NT], hi[i / NT][i % NT]));
  }

  // The one-pass tiles' prefetch distance (M <= kMaxMt: no shared panel): V::kGemvAheadBytes rounded up to whole
  // NT-row tiles, at least the next tile.
  template <int NT>
  LTI static int64_t gemv_ahead_rows(const QuantWeight& w) {
    const int64_t tile_bytes = NT * 2 * w.cols;
    return V::kGemvAheadBytes > 0 ? (V::kGemvAheadBytes + tile_bytes - 1) / tile_bytes * NT : NT;
  }

  template <int MT, int NT, bool kShared>
  LTI static void tile_pf(const QuantWeight& w, const float* x, int64_t r, float* y, int64_t ldy, Ahead ah) {
    constexpr int W = V::W, G = 2 * W;
    const int64_t K = w.cols, KG = K / G * G;
    const uint8_t* base = static_cast<const uint8_t*>(w.data) + r * 2 * K;
    // One-pass tiles (M <= kMaxMt: decode, the routed experts' few rows each) prefetch the weight stream
    // V::kGemvAheadBytes ahead in whole tiles, spread over this tile's groups: an expert row is short (2 KiB at
    // K = 1024, 512 B for a down projection) and NT rows are NT streams at once, too little for the hardware
    // prefetcher to ramp up on. (Before: the next tile, and nothing for the hold tiles, V8's 3-row and V16's 4-5-row
    // ones: at batch 16 the routed experts took 11.5-14.0 ms per step against 9.7-11.6 now; bench/README.md, "Issue
    // 26, batched decode".) The activation tiles of a panel share the next panel's prefetch (ah).
    const int64_t ahead_rows = kShared ? ah.rows : gemv_ahead_rows<NT>(w);
    const uintptr_t pn = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(ahead_rows * 2 * K);
    [[maybe_unused]] int64_t wait = ah.phase;
    F acc[MT][NT];
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) acc[i / NT][i % NT] = V::zero();
    for (int64_t k = 0; k < KG; k += G) {
      if constexpr (kShared) {
        if (ah.rows > 0 && wait-- == 0) {
          wait = ah.stride - 1;
#pragma GCC unroll 8
          for (int j = 0; j < NT * 2 * G; j += 64) prefetch_at(pn + static_cast<uintptr_t>(k / G * NT * 2 * G + j));
        }
      } else {
#pragma GCC unroll 8
        for (int j = 0; j < NT * 2 * G; j += 64) prefetch_at(pn + static_cast<uintptr_t>(k / G * NT * 2 * G + j));
      }
      if constexpr (MT >= V::kBf16HoldX) {
        // Prefill tiles with few registers (V8: 3 x 3): the activation vectors of a half group held and reused by
        // the NT weight rows (MT·NT FMAs for MT + NT loads).
        half_x_held<MT, NT, false>(base, K, x + k, k, acc);
        half_x_held<MT, NT, true>(base, K, x + k + W, k, acc);
      } else if constexpr (MT >= V::kBf16HoldW) {
        // Prefill tiles with many registers (V16: 5 x 4): the decoded weights of the group held, activation rows
        // outer.
        F e[NT], o[NT];
#pragma GCC unroll 8
        for (int n = 0; n < NT; ++n) {
          const I d = V::loadi(base + n * 2 * K + 2 * k);
          e[n] = V::bf16_lo(d);
          o[n] = V::bf16_hi(d);
        }
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) {
          const F xl = V::load(x + m * K + k), xh = V::load(x + m * K + k + W);
#pragma GCC unroll 8
          for (int n = 0; n < NT; ++n) {
            acc[m][n] = V::fma(e[n], xl, acc[m][n]);
            acc[m][n] = V::fma(o[n], xh, acc[m][n]);
          }
        }
      } else {
        // Decode tiles: weight rows outer, each weight vector decoded once, activations read from L1.
#pragma GCC unroll 8
        for (int n = 0; n < NT; ++n) {
          const I d = V::loadi(base + n * 2 * K + 2 * k);
          const F e = V::bf16_lo(d), o = V::bf16_hi(d);
#pragma GCC unroll 8
          for (int m = 0; m < MT; ++m) {
            acc[m][n] = V::fma(e, V::load(x + m * K + k), acc[m][n]);
            acc[m][n] = V::fma(o, V::load(x + m * K + k + W), acc[m][n]);
          }
        }
      }
    }
    for (int64_t k = KG; k < K; k += W) {  // natural-order tail (< 2W columns)
      const int64_t nn = K - k < W ? K - k : W;
#pragma GCC unroll 8
      for (int n = 0; n < NT; ++n) {
        const F f = V::load_part(reinterpret_cast<const uint16_t*>(base + n * 2 * K + 2 * k), nn);
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) acc[m][n] = V::fma(f, V::load_part(x + m * K + k, nn), acc[m][n]);
      }
    }
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) y[(i / NT) * ldy + (i % NT)] = V::hsum(acc[i / NT][i % NT]);
  }
};

// ---------------------------------------------------------------------------------------------------------------
// MXFP4: per step of kMxBlocks 32-element blocks (W·4 elements), t = f0·x0 (+fma f1·x1, f2·x2, f3·x3);
// acc = fma(t, scales, acc). V16: a last odd block by the 256-bit decode (odd = hsum8(t·scale), y = hsum(acc) + odd).
// ---------------------------------------------------------------------------------------------------------------
template <class V>
struct TMx {
  static constexpr int kMaxMt = V::kMt;
  static constexpr int nt(int mt) { return V::nt_mx(mt); }
  using F = typename V::F;

  // ah: as TBf16's (the default: the next tile, a compile-time choice).
  template <int MT, int NT>
  LT static void tile(const QuantWeight& w, const float* x, int64_t r, float* y, int64_t ldy, Ahead ah) {
    if (ah.rows == kAheadDefault)
      tile_pf<MT, NT, false>(w, x, r, y, ldy, ah);
    else
      tile_pf<MT, NT, true>(w, x, r, y, ldy, ah);
  }

  template <int MT, int NT, bool kShared>
  LTI static void tile_pf(const QuantWeight& w, const float* x, int64_t r, float* y, int64_t ldy, Ahead ah) {
    constexpr int W = V::W, BS = V::kMxBlocks;
    const int64_t K = w.cols, nb = K / 32;
    const typename V::MxC c = V::mx_const();
    const float* e8 = kE8M0ToF32.data();
    const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * (K / 2);
    const uint8_t* sc = static_cast<const uint8_t*>(w.scale) + r * nb;
    // Software prefetch of the next tile's rows (codes and scales), spread over this tile's blocks: an expert row is
    // only K/2 bytes (8 cache lines at K = 1024), too short for the hardware stream prefetcher to ramp up on, and the
    // tile reads 2·NT short streams at once (measured 4-5 -> 7.8 GB/s per core on Zen 3 for DRAM-resident 256 x 1024
    // weights, M = 1).
    // (ah: the next tile by default, the next panel's rows shared by the activation tiles of a panel.)
    const int64_t ahead_rows = kShared ? ah.rows : NT;
    const uintptr_t pq = reinterpret_cast<uintptr_t>(q) + static_cast<uintptr_t>(ahead_rows * (K / 2));
    const uintptr_t ps = reinterpret_cast<uintptr_t>(sc) + static_cast<uintptr_t>(ahead_rows * nb);
    [[maybe_unused]] int64_t wait = ah.phase;
    F acc[MT][NT];
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) acc[i / NT][i % NT] = V::zero();
    int64_t b = 0;
    for (; b + BS <= nb; b += BS) {
      if (!kShared || (ah.rows > 0 && wait-- == 0)) {
        if (kShared) wait = ah.stride - 1;
#pragma GCC unroll 8
        for (int j = 0; j < NT * 16 * BS; j += 64) prefetch_at(pq + static_cast<uintptr_t>(b * NT * 16 + j));
#pragma GCC unroll 2
        for (int j = 0; j < BS; ++j)
          if ((b + j) * 64 < NT * nb) prefetch_at(ps + static_cast<uintptr_t>((b + j) * 64));
      }
#pragma GCC unroll 8
      for (int n = 0; n < NT; ++n) {
        F f0, f1, f2, f3;
        V::mx_decode(q + n * (K / 2) + b * 16, c, f0, f1, f2, f3);
        const F s = V::mx_scale(e8, sc + n * nb + b);
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) {
          const float* xb = x + m * K + b * 32;
          F t = V::mul(f0, V::load(xb));
          t = V::fma(f1, V::load(xb + W), t);
          t = V::fma(f2, V::load(xb + 2 * W), t);
          t = V::fma(f3, V::load(xb + 3 * W), t);
          acc[m][n] = V::fma(t, s, acc[m][n]);
        }
      }
    }
    float odd[MT][NT];
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) odd[i / NT][i % NT] = 0.0f;
    if constexpr (BS > 1) {
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
    }
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) y[(i / NT) * ldy + (i % NT)] = V::hsum(acc[i / NT][i % NT]) + odd[i / NT][i % NT];
  }
};

// ---------------------------------------------------------------------------------------------------------------
// F32 / F16 / FP8 (block, tensor, channel): natural order. Per scale block j: a = Σ fma over 2W-column steps (low W
// then high W), then masked W-column steps; tot = fma(a, scale_j·mult, tot); y = hsum(tot). A row holding a NaN fp8
// code takes the exact scalar kernel (per row, so the choice does not depend on the tile).
// ---------------------------------------------------------------------------------------------------------------
template <class V, int kFmt>
struct TNat {
  static constexpr int kMaxMt = V::kMt;
  static constexpr int nt(int mt) { return V::nt_nat(mt); }
  static constexpr int kBytes = kFmt == kNatF32 ? 4 : kFmt == kNatF16 ? 2 : 1;
  using F = typename V::F;

  template <int MT, int NT>
  LT static void tile(const QuantWeight& w, const float* x, int64_t r, float* y, int64_t ldy, Ahead /*ah*/) {
    constexpr int W = V::W;
    const int64_t K = w.cols;
    const bool fnuz = w.fnuz;
    const uint8_t* base = static_cast<const uint8_t*>(w.data) + r * K * kBytes;
    RowScales rs[NT];
#pragma GCC unroll 8
    for (int n = 0; n < NT; ++n) rs[n] = row_scales(w, r + n);
    const int64_t bc = rs[0].bc;
    F tot[MT][NT];
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) tot[i / NT][i % NT] = V::zero();
    typename V::Nan nan = V::nan_none();
    for (int64_t c0 = 0, j = 0; c0 < K; c0 += bc, ++j) {
      const int64_t c1 = c0 + bc < K ? c0 + bc : K;
      F a[MT][NT];
#pragma GCC unroll 32
      for (int i = 0; i < MT * NT; ++i) a[i / NT][i % NT] = V::zero();
      int64_t c = c0;
      for (; c + 2 * W <= c1; c += 2 * W) {
#pragma GCC unroll 8
        for (int n = 0; n < NT; ++n) {
          F lo, hi;
          V::template nat_load2<kFmt>(base + (n * K + c) * kBytes, fnuz, lo, hi, nan);
#pragma GCC unroll 8
          for (int m = 0; m < MT; ++m) {
            a[m][n] = V::fma(lo, V::load(x + m * K + c), a[m][n]);
            a[m][n] = V::fma(hi, V::load(x + m * K + c + W), a[m][n]);
          }
        }
      }
      for (; c < c1; c += W) {
        const int64_t nn = c1 - c < W ? c1 - c : W;
#pragma GCC unroll 8
        for (int n = 0; n < NT; ++n) {
          const F f = V::template nat_load_part<kFmt>(base + (n * K + c) * kBytes, nn, fnuz, nan);
#pragma GCC unroll 8
          for (int m = 0; m < MT; ++m) a[m][n] = V::fma(f, V::load_part(x + m * K + c, nn), a[m][n]);
        }
      }
#pragma GCC unroll 8
      for (int n = 0; n < NT; ++n) {
        const F sv = V::set1(rs[n].at(j) * rs[n].mult);
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) tot[m][n] = V::fma(a[m][n], sv, tot[m][n]);
      }
    }
    if (V::nan_any(nan)) {  // a NaN code in one of the rows: redo row by row
#pragma GCC unroll 8
      for (int n = 0; n < NT; ++n) {
        if constexpr (NT > 1)
          tile<MT, 1>(w, x, r + n, y + n, ldy, Ahead{0, 0, 1});
        else
          kernels_scalar().matmul_rows(w, x, MT, r, r + 1, y, ldy);
      }
      return;
    }
#pragma GCC unroll 32
    for (int i = 0; i < MT * NT; ++i) y[(i / NT) * ldy + (i % NT)] = V::hsum(tot[i / NT][i % NT]);
  }
};

// ---------------------------------------------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------------------------------------------
// Rows [rs, re) for MT activation rows: full NT tiles, then 1-row tiles, each tile prefetching as `ah` says.
template <class T, int MT>
LT void mm_rows(const QuantWeight& w, const float* x, int64_t rs, int64_t re, float* y, int64_t ldy, Ahead ah) {
  constexpr int NT = T::nt(MT);
  int64_t r = rs;
  for (; r + NT <= re; r += NT) T::template tile<MT, NT>(w, x, r, y + (r - rs), ldy, ah);
  for (; r < re; ++r) T::template tile<MT, 1>(w, x, r, y + (r - rs), ldy, ah);
}

// Weight rows per panel when M needs several activation tiles: ~48 KiB, so the panel stays in L1/L2 while every tile
// of a chunk streams it (a multiple of 24, so that panels split into whole NT tiles for every NT used).
inline int64_t tile_rows(const QuantWeight& w) {
  const int64_t rb = w.row_bytes() > 0 ? (48 * 1024) / w.row_bytes() : 1;
  return rb < 24 ? 24 : rb / 24 * 24;
}

// Activation rows [m0, m1) in tiles of at most MT rows, as even as possible: 16 rows at MT = 5 go as 4 + 4 + 4 + 4,
// not 5 + 5 + 5 + 1 (a 1-row tile streams the weight panel once more, as a GEMV, for a sixteenth of the work).
// The tile shapes never change a result (one chain per output).
// ahead: kAheadDefault (one pass over the rows: the tiles' own prefetch), or the panel's row count: the tiles
// prefetch the next panel, each a 1/nt share of its lines.
template <class T, int MT>
LT void mm_tiles(const QuantWeight& w, const float* xp, int64_t m0, int64_t m1, int64_t rs, int64_t re, float* y,
                 int64_t ldy, int64_t ahead) {
  static_assert(MT >= 1 && MT <= 5, "tiles of 1 to 5 activation rows");
  const int64_t K = w.cols, R = m1 - m0, nt = (R + MT - 1) / MT;
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t rows = R / nt + (t < R % nt ? 1 : 0);
    const Ahead ah = ahead == kAheadDefault ? Ahead{} : Ahead{ahead, t, nt};
    const float* x = xp + m0 * K;
    float* ym = y + m0 * ldy;
    switch (rows) {
      case 1: mm_rows<T, 1>(w, x, rs, re, ym, ldy, ah); break;
      case 2:
        if constexpr (MT >= 2) mm_rows<T, 2>(w, x, rs, re, ym, ldy, ah);
        break;
      case 3:
        if constexpr (MT >= 3) mm_rows<T, 3>(w, x, rs, re, ym, ldy, ah);
        break;
      case 4:
        if constexpr (MT >= 4) mm_rows<T, 4>(w, x, rs, re, ym, ldy, ah);
        break;
      case 5:
        if constexpr (MT >= 5) mm_rows<T, 5>(w, x, rs, re, ym, ldy, ah);
        break;
      default: break;
    }
    m0 += rows;
  }
}

// M <= kMaxMt: one pass over the rows. Larger M: chunks of V::kChunkM activation rows (kept in L2) against panels of
// weight rows (kept in L1/L2 while every tile of the chunk streams them); a weight row is read from memory once
// per chunk.
template <class V, class T>
LT void mm_fmt(const QuantWeight& w, const float* xp, int64_t M, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  constexpr int kMt = T::kMaxMt;
  constexpr int64_t kChunkM = V::kChunkM;
  const int64_t panel = M <= kMt ? r1 - r0 : tile_rows(w);
  for (int64_t c0 = 0; c0 < M; c0 += kChunkM) {
    const int64_t c1 = c0 + kChunkM < M ? c0 + kChunkM : M;
    for (int64_t rs = r0; rs < r1; rs += panel) {
      const int64_t re = rs + panel < r1 ? rs + panel : r1;
      // One pass (M <= kMt): the tiles' own prefetch. Panels: the activation tiles share the next panel's prefetch
      // (decode_bench, bf16 bench model, batch 16, 2-core Zen 4: the step's dense matmuls 15.7-19.7 -> 11.0-11.9 ms
      // against the first tile issuing all of it).
      mm_tiles<T, kMt>(w, xp, c0, c1, rs, re, y + (rs - r0), ldy, M <= kMt ? kAheadDefault : panel);
    }
  }
}

template <class V>
LT void vec_matmul_rows(const QuantWeight& w, const float* xp, int64_t M, int64_t r0, int64_t r1, float* y,
                        int64_t ldy) {
  if (M <= 0 || r1 <= r0) return;
  switch (w.format) {
    case WeightFormat::BF16: return mm_fmt<V, TBf16<V>>(w, xp, M, r0, r1, y, ldy);
    case WeightFormat::MXFP4: return mm_fmt<V, TMx<V>>(w, xp, M, r0, r1, y, ldy);
    case WeightFormat::F32: return mm_fmt<V, TNat<V, kNatF32>>(w, xp, M, r0, r1, y, ldy);
    case WeightFormat::F16: return mm_fmt<V, TNat<V, kNatF16>>(w, xp, M, r0, r1, y, ldy);
    case WeightFormat::FP8_E4M3_BLOCK:
    case WeightFormat::FP8_E4M3_TENSOR:
    case WeightFormat::FP8_E4M3_CHANNEL: return mm_fmt<V, TNat<V, kNatFp8>>(w, xp, M, r0, r1, y, ldy);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Prepared-x permutations
// ---------------------------------------------------------------------------------------------------------------
inline void perm_mx_32(const float* x, float* xp) {
  for (int v = 0; v < 4; ++v)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 4; ++i) xp[8 * v + 4 * h + i] = x[4 * i + h + kMxOff[v]];
}
inline void perm_mx_64(const float* x, float* xp) {
  for (int v = 0; v < 4; ++v)
    for (int q = 0; q < 4; ++q)
      for (int i = 0; i < 4; ++i) xp[16 * v + 4 * q + i] = x[32 * (q & 1) + 4 * i + (q >> 1) + kMxOff[v]];
}

[[maybe_unused]] bool vec_permutes(WeightFormat f) { return f == WeightFormat::BF16 || f == WeightFormat::MXFP4; }

template <class V>
void vec_prep_x(WeightFormat f, const float* x, int64_t M, int64_t K, float* xp) {
  constexpr int W = V::W;
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    float* o = xp + m * K;
    int64_t k = 0;
    if (f == WeightFormat::BF16) {
      for (; k + 2 * W <= K; k += 2 * W)
        for (int j = 0; j < W; ++j) {
          o[k + j] = xm[k + 2 * j];
          o[k + W + j] = xm[k + 2 * j + 1];
        }
    } else if (f == WeightFormat::MXFP4) {
      if constexpr (W == 16)
        for (; k + 64 <= K; k += 64) perm_mx_64(xm + k, o + k);
      for (; k + 32 <= K; k += 32) perm_mx_32(xm + k, o + k);
    }
    for (; k < K; ++k) o[k] = xm[k];
  }
}

}  // namespace
}  // namespace latent::cpu
