// Internal include fragment: SIMD kernels written once for any vector width, as templates over a vector traits
// type V (V8: 256-bit, defined in avx2_body.h; V16: 512-bit, defined in kernels_avx512.cpp). Included at the end
// of avx2_body.h, so each ISA translation unit instantiates them with its own target attribute (LT / LTI of the
// includer). A traits type provides:
//   F, W                      the vector type and its number of fp32 lanes;
//   zero, set1, bcast(p)      constants / broadcast of *p;
//   bcast2(p, b0, b1)         broadcasts of p[0] and p[1] (fp32 or bf16);
//   load(p), load_part(p, n)  W values (or the first n < W, the rest zero) from fp32 or bf16 (uint16_t) memory;
//   store, store_part         W values (or the first n) to fp32 memory;
//   fma(a, b, c) = a·b + c (one rounding), mul, add, max;
//   reduce(v)                 r[k] = the horizontal sum of v[k] for k < W, by a fixed tree (the same order of
//                             additions for every k, so a sum does not depend on which vector slot it used).
//
// Prefetch: both kernels take an optional PrefetchCursor (cpu_kernels.h) and issue its lines at a fixed rate of their
// inner steps; it never changes a result.
//
// Batch invariance: like the matmul tiles (avx2_body.h), every output is one fixed chain of operations whatever
// the tile shape or the position of its row or key in a tile: dot_rows reduces one accumulator per (row, key)
// pair over x in W-lane steps (a masked step for the tail of each part) then by reduce(); axpy_rows runs one
// chain per (row, column) over the b rows in order.
#pragma once

#include <algorithm>
#include <cstdint>

namespace latent::cpu {
namespace {

// One prefetch of the cursor's next line, then the cursor advanced (nothing once it is past its last row). dot_rows
// steps it once per W-column step of a tile, axpy_rows once per b row of a tile: for the decode attention's 64-key
// sub-blocks that spreads the next sub-block's lines over this one's scores and P·c (on a 2-core Zen 4 the first
// pass over keys from memory ran at about half the speed of the same pass from L2 without it; T1 measured a little
// ahead of T0 and T2).
LTI void pf_step(PrefetchCursor* pf) {
  if (pf == nullptr || pf->row >= pf->n_rows) return;
  const uintptr_t first = reinterpret_cast<uintptr_t>(pf->rows[pf->row]);
  const uintptr_t line = (first & ~uintptr_t{63}) + static_cast<uintptr_t>(pf->off);
  _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T1);
  pf->off += 64;
  if (line + 64 >= first + static_cast<uintptr_t>(pf->row_bytes)) {
    ++pf->row;
    pf->off = 0;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// dot_rows: s[i·lds + j] = Σ_{x<n1} a[i·lda + x]·b1[j][x] + Σ_{x<n2} a[i·lda + n1 + x]·b2[j][x]
// (a: fp32 rows; b: rows of fp32 or bf16 given by pointers, each key in two parts, e.g. latent c then k_pe).
// Register tile: RA rows of a held in registers per x step, RB keys streamed; RA·RB accumulators.
// ---------------------------------------------------------------------------------------------------------------
template <class V, class B, int RA, int RB>
LTI void vec_dot_part(const float* a, int64_t lda, const B* const* b, int64_t n, typename V::F (&acc)[RA][RB],
                      PrefetchCursor* pf) {
  using F = typename V::F;
  constexpr int W = V::W;
  int64_t x = 0;
  for (; x + W <= n; x += W) {
    pf_step(pf);
    F av[RA];
#pragma GCC unroll 8
    for (int i = 0; i < RA; ++i) av[i] = V::load(a + i * lda + x);
#pragma GCC unroll 8
    for (int j = 0; j < RB; ++j) {
      const F bv = V::load(b[j] + x);
#pragma GCC unroll 8
      for (int i = 0; i < RA; ++i) acc[i][j] = V::fma(av[i], bv, acc[i][j]);
    }
  }
  if (x < n) {
    const int64_t r = n - x;
    F av[RA];
#pragma GCC unroll 8
    for (int i = 0; i < RA; ++i) av[i] = V::load_part(a + i * lda + x, r);
#pragma GCC unroll 8
    for (int j = 0; j < RB; ++j) {
      const F bv = V::load_part(b[j] + x, r);
#pragma GCC unroll 8
      for (int i = 0; i < RA; ++i) acc[i][j] = V::fma(av[i], bv, acc[i][j]);
    }
  }
}

template <class V, class B, int RA, int RB>
LT void vec_dot_tile(const float* a, int64_t lda, const B* const* b1, const B* const* b2, int64_t n1, int64_t n2,
                     float* s, int64_t lds, PrefetchCursor* pf) {
  using F = typename V::F;
  constexpr int W = V::W;
  F acc[RA][RB];
#pragma GCC unroll 32
  for (int k = 0; k < RA * RB; ++k) acc[k / RB][k % RB] = V::zero();
  vec_dot_part<V, B, RA, RB>(a, lda, b1, n1, acc, pf);
  if (n2 > 0) vec_dot_part<V, B, RA, RB>(a + n1, lda, b2, n2, acc, pf);
  // Horizontal sums, W accumulators at a time (unused slots zero).
  constexpr int kN = RA * RB, kGroups = (kN + W - 1) / W;
#pragma GCC unroll 4
  for (int g = 0; g < kGroups; ++g) {
    F v[W];
#pragma GCC unroll 16
    for (int k = 0; k < W; ++k) v[k] = g * W + k < kN ? acc[(g * W + k) / RB][(g * W + k) % RB] : V::zero();
    alignas(64) float r[W];
    V::store(r, V::reduce(v));
#pragma GCC unroll 16
    for (int k = 0; k < W; ++k)
      if (g * W + k < kN) s[((g * W + k) / RB) * lds + (g * W + k) % RB] = r[k];
  }
}

// Rows [i, i + RA) against every key (groups of RB keys, then smaller): the RA query rows stay in L1 while the keys
// stream from L2.
template <class V, class B, int RA, int RB>
LTI void vec_dot_row_tile(const float* a, int64_t lda, const B* const* b1, const B* const* b2, int64_t n1, int64_t n2,
                          int64_t nb, float* s, int64_t lds, PrefetchCursor* pf) {
  int64_t j = 0;
  for (; j + RB <= nb; j += RB) vec_dot_tile<V, B, RA, RB>(a, lda, b1 + j, b2 + j, n1, n2, s + j, lds, pf);
  switch (nb - j) {
    case 1: vec_dot_tile<V, B, RA, 1>(a, lda, b1 + j, b2 + j, n1, n2, s + j, lds, pf); break;
    case 2:
      if constexpr (RB > 2) vec_dot_tile<V, B, RA, 2>(a, lda, b1 + j, b2 + j, n1, n2, s + j, lds, pf);
      break;
    case 3:
      if constexpr (RB > 3) vec_dot_tile<V, B, RA, 3>(a, lda, b1 + j, b2 + j, n1, n2, s + j, lds, pf);
      break;
    case 4:
      if constexpr (RB > 4) vec_dot_tile<V, B, RA, 4>(a, lda, b1 + j, b2 + j, n1, n2, s + j, lds, pf);
      break;
    case 5:
      if constexpr (RB > 5) vec_dot_tile<V, B, RA, 5>(a, lda, b1 + j, b2 + j, n1, n2, s + j, lds, pf);
      break;
    default: break;
  }
}

template <class V, class B, int RA, int RB>
LTI void vec_dot_rows_from(const float* a, int64_t lda, int64_t na, const B* const* b1, const B* const* b2, int64_t n1,
                           int64_t n2, int64_t nb, float* s, int64_t lds, PrefetchCursor* pf) {
  int64_t i = 0;
  for (; i + RA <= na; i += RA)
    vec_dot_row_tile<V, B, RA, RB>(a + i * lda, lda, b1, b2, n1, n2, nb, s + i * lds, lds, pf);
  if constexpr (RA > 1) {
    if (na - i > 0)  // fewer than RA rows left: the largest smaller tile, recursively
      vec_dot_rows_from<V, B, RA - 1, RB>(a + i * lda, lda, na - i, b1, b2, n1, n2, nb, s + i * lds, lds, pf);
  }
}

template <class V, class B, int RA, int RB>
LT void vec_dot_rows(const float* a, int64_t lda, int64_t na, const B* const* b1, const B* const* b2, int64_t n1,
                     int64_t n2, int64_t nb, float* s, int64_t lds, PrefetchCursor* pf) {
  vec_dot_rows_from<V, B, RA, RB>(a, lda, na, b1, b2, n1, n2, nb, s, lds, pf);
}

// ---------------------------------------------------------------------------------------------------------------
// dot_rows_t: s[i·lds + j] = Σ_{x<n1} qt[x·ldt + i]·b1[j][x] + Σ_{x<n2} qt[(n1 + x)·ldt + i]·b2[j][x]
// (qt: the query rows transposed, one row of ldt lanes per x, row i in lane i; b: key rows by pointers).
// The decode attention's scores as a GEMM with the heads in the vector lanes: per x, RH vectors of heads are
// loaded once and every key of the tile contributes one broadcast element and RH fmas, so each key element is
// read once per tile of heads and nothing is reduced horizontally (dot_rows keeps one accumulator per (head, key),
// re-reads each key once per tile of 3-6 heads and ends each tile with W-lane reductions). A one-thread
// microbenchmark (16 heads, 64-key sub-blocks, Zen 4): AVX2 87-93 -> 91-95 GFLOP/s with the keys in L2 and
// 67 -> 75-79 from memory with the prefetch cursor; AVX-512 within noise of dot_rows. Each (row, key) is one chain
// of fmas in x order whatever its lane or tile (batch invariant). Lanes past na are read (qt rows must be readable
// to lane ⌈na/W⌉·W) and dropped.
// ---------------------------------------------------------------------------------------------------------------
template <class V, class B, int RH, int RB>
LTI void vec_dott_part(const float* qt, int64_t ldt, const B* const* b, int64_t n, typename V::F (&acc)[RH][RB],
                       PrefetchCursor* pf) {
  using F = typename V::F;
  constexpr int W = V::W;
  const B* bp[RB];
#pragma GCC unroll 16
  for (int j = 0; j < RB; ++j) bp[j] = b[j];
  // Two x per step: a bf16 key gives both from one 32-bit broadcast (one x per step, with a scalar load, shift and
  // broadcast per element, ran AVX-512 bf16 scores at 73 GFLOP/s against ~100 for this). One prefetch line per
  // step: the 64-key sub-block's tiles of 4-6 keys issue the next sub-block's lines about once over.
  int64_t x = 0;
  for (; x + 2 <= n; x += 2) {
    pf_step(pf);
    F q0[RH], q1[RH];
#pragma GCC unroll 8
    for (int i = 0; i < RH; ++i) {
      q0[i] = V::load(qt + x * ldt + i * W);
      q1[i] = V::load(qt + (x + 1) * ldt + i * W);
    }
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) {
      F b0, b1;
      V::bcast2(bp[j] + x, b0, b1);
#pragma GCC unroll 8
      for (int i = 0; i < RH; ++i) acc[i][j] = V::fma(q1[i], b1, V::fma(q0[i], b0, acc[i][j]));
    }
  }
  if (x < n) {
    F qv[RH];
#pragma GCC unroll 8
    for (int i = 0; i < RH; ++i) qv[i] = V::load(qt + x * ldt + i * W);
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) {
      const F bv = V::bcast(bp[j] + x);
#pragma GCC unroll 8
      for (int i = 0; i < RH; ++i) acc[i][j] = V::fma(qv[i], bv, acc[i][j]);
    }
  }
}

// Heads [0, min(na, RH·W)) (lanes of RH vectors) against keys [0, RB).
template <class V, class B, int RH, int RB>
LT void vec_dott_tile(const float* qt, int64_t ldt, int64_t na, const B* const* b1, const B* const* b2, int64_t n1,
                      int64_t n2, float* s, int64_t lds, PrefetchCursor* pf) {
  using F = typename V::F;
  constexpr int W = V::W;
  F acc[RH][RB];
#pragma GCC unroll 32
  for (int k = 0; k < RH * RB; ++k) acc[k / RB][k % RB] = V::zero();
  vec_dott_part<V, B, RH, RB>(qt, ldt, b1, n1, acc, pf);
  if (n2 > 0) vec_dott_part<V, B, RH, RB>(qt + n1 * ldt, ldt, b2, n2, acc, pf);
  alignas(64) float r[W];
#pragma GCC unroll 8
  for (int i = 0; i < RH; ++i) {
    const int64_t rows = std::min<int64_t>(W, na - i * W);
#pragma GCC unroll 16
    for (int j = 0; j < RB; ++j) {
      V::store(r, acc[i][j]);
      for (int64_t l = 0; l < rows; ++l) s[(i * W + l) * lds + j] = r[l];
    }
  }
}

// The last nb < RB keys as one tile of nb.
template <class V, class B, int RH, int RB>
LTI void vec_dott_keys_tail(const float* qt, int64_t ldt, int64_t na, const B* const* b1, const B* const* b2,
                            int64_t n1, int64_t n2, int64_t nb, float* s, int64_t lds, PrefetchCursor* pf) {
  if constexpr (RB > 1) {
    if (nb == RB - 1) return vec_dott_tile<V, B, RH, RB - 1>(qt, ldt, na, b1, b2, n1, n2, s, lds, pf);
    vec_dott_keys_tail<V, B, RH, RB - 1>(qt, ldt, na, b1, b2, n1, n2, nb, s, lds, pf);
  }
}

// RH vectors of heads against every key: tiles of RB keys, then one tile of the rest.
template <class V, class B, int RH, int RB>
LTI void vec_dott_heads(const float* qt, int64_t ldt, int64_t na, const B* const* b1, const B* const* b2, int64_t n1,
                        int64_t n2, int64_t nb, float* s, int64_t lds, PrefetchCursor* pf) {
  int64_t j = 0;
  for (; j + RB <= nb; j += RB) vec_dott_tile<V, B, RH, RB>(qt, ldt, na, b1 + j, b2 + j, n1, n2, s + j, lds, pf);
  if (j < nb) vec_dott_keys_tail<V, B, RH, RB>(qt, ldt, na, b1 + j, b2 + j, n1, n2, nb - j, s + j, lds, pf);
}

template <class V, class B, int RH, int RB>
LTI void vec_dot_rows_t_from(const float* qt, int64_t ldt, int64_t na, const B* const* b1, const B* const* b2,
                             int64_t n1, int64_t n2, int64_t nb, float* s, int64_t lds, PrefetchCursor* pf) {
  constexpr int W = V::W;
  int64_t i = 0;
  for (; i + RH * W <= na; i += RH * W)
    vec_dott_heads<V, B, RH, RB>(qt + i, ldt, RH * W, b1, b2, n1, n2, nb, s + i * lds, lds, pf);
  if (i >= na) return;
  if constexpr (RH > 1) {
    if (na - i > (RH - 1) * W)  // the last, partly filled group of RH vectors
      vec_dott_heads<V, B, RH, RB>(qt + i, ldt, na - i, b1, b2, n1, n2, nb, s + i * lds, lds, pf);
    else
      vec_dot_rows_t_from<V, B, RH - 1, RB>(qt + i, ldt, na - i, b1, b2, n1, n2, nb, s + i * lds, lds, pf);
  } else {
    vec_dott_heads<V, B, 1, RB>(qt + i, ldt, na - i, b1, b2, n1, n2, nb, s + i * lds, lds, pf);
  }
}

template <class V, class B, int RH, int RB>
LT void vec_dot_rows_t(const float* qt, int64_t ldt, int64_t na, const B* const* b1, const B* const* b2, int64_t n1,
                       int64_t n2, int64_t nb, float* s, int64_t lds, PrefetchCursor* pf) {
  vec_dot_rows_t_from<V, B, RH, RB>(qt, ldt, na, b1, b2, n1, n2, nb, s, lds, pf);
}

// ---------------------------------------------------------------------------------------------------------------
// axpy_rows: c[i·ldc + x] = (accumulate ? c[i·ldc + x] : 0) + Σ_{j<nb} a[i·lda + j]·b[j][x], x < n, i < na
// (the chain over j in order, one fma per term; b rows fp32 or bf16 given by pointers).
// Register tile: RA rows × CV vectors of columns; per b row the RA coefficients are broadcast once.
// ---------------------------------------------------------------------------------------------------------------
template <class V, class B, int RA, int CV, bool kPart>
LT void vec_axpy_tile(const float* a, int64_t lda, const B* const* b, int64_t nb, int64_t x0, int64_t last, float* c,
                      int64_t ldc, bool accumulate, PrefetchCursor* pf) {
  // Columns x0 .. x0 + (CV−1)·W + (kPart ? last : W).
  using F = typename V::F;
  constexpr int W = V::W;
  F acc[RA][CV];
#pragma GCC unroll 32
  for (int k = 0; k < RA * CV; ++k) {
    const int i = k / CV, v = k % CV;
    float* p = c + i * ldc + x0 + v * W;
    if (!accumulate)
      acc[i][v] = V::zero();
    else if (kPart && v == CV - 1)
      acc[i][v] = V::load_part(p, last);
    else
      acc[i][v] = V::load(p);
  }
  for (int64_t j = 0; j < nb; ++j) {
    pf_step(pf);
    F p[RA];
#pragma GCC unroll 8
    for (int i = 0; i < RA; ++i) p[i] = V::bcast(a + i * lda + j);
    const B* bj = b[j] + x0;
#pragma GCC unroll 8
    for (int v = 0; v < CV; ++v) {
      const F bv = kPart && v == CV - 1 ? V::load_part(bj + v * W, last) : V::load(bj + v * W);
#pragma GCC unroll 8
      for (int i = 0; i < RA; ++i) acc[i][v] = V::fma(p[i], bv, acc[i][v]);
    }
  }
#pragma GCC unroll 32
  for (int k = 0; k < RA * CV; ++k) {
    const int i = k / CV, v = k % CV;
    float* q = c + i * ldc + x0 + v * W;
    if (kPart && v == CV - 1)
      V::store_part(q, acc[i][v], last);
    else
      V::store(q, acc[i][v]);
  }
}

// All rows of a in tiles of RA (then smaller), for the column block [x0, x0 + CV·W) (full) or the tail block.
template <class V, class B, int RA, int CV, bool kPart>
LTI void vec_axpy_block(const float* a, int64_t lda, int64_t na, const B* const* b, int64_t nb, int64_t x0,
                        int64_t last, float* c, int64_t ldc, bool accumulate, PrefetchCursor* pf) {
  int64_t i = 0;
  for (; i + RA <= na; i += RA)
    vec_axpy_tile<V, B, RA, CV, kPart>(a + i * lda, lda, b, nb, x0, last, c + i * ldc, ldc, accumulate, pf);
  if constexpr (RA > 1) {
    if (na - i > 0)
      vec_axpy_block<V, B, RA - 1, CV, kPart>(a + i * lda, lda, na - i, b, nb, x0, last, c + i * ldc, ldc, accumulate,
                                              pf);
  }
}

// The column tail after the full CV-vector blocks: CVt full vectors then (maybe) one partial one.
template <class V, class B, int RA, int CVt>
LTI void vec_axpy_tail(const float* a, int64_t lda, int64_t na, const B* const* b, int64_t nb, int64_t x0, int64_t rem,
                       float* c, int64_t ldc, bool accumulate, PrefetchCursor* pf) {
  constexpr int W = V::W;
  if constexpr (CVt > 0) {
    if (rem >= CVt * W) {
      if (rem == CVt * W) {
        vec_axpy_block<V, B, RA, CVt, false>(a, lda, na, b, nb, x0, W, c, ldc, accumulate, pf);
      } else {
        vec_axpy_block<V, B, RA, CVt + 1, true>(a, lda, na, b, nb, x0, rem - CVt * W, c, ldc, accumulate, pf);
      }
      return;
    }
    vec_axpy_tail<V, B, RA, CVt - 1>(a, lda, na, b, nb, x0, rem, c, ldc, accumulate, pf);
  } else {
    if (rem > 0) vec_axpy_block<V, B, RA, 1, true>(a, lda, na, b, nb, x0, rem, c, ldc, accumulate, pf);
  }
}

template <class V, class B, int RA, int CV>
LT void vec_axpy_rows(const float* a, int64_t lda, int64_t na, const B* const* b, int64_t nb, int64_t n, float* c,
                      int64_t ldc, bool accumulate, PrefetchCursor* pf) {
  constexpr int W = V::W;
  int64_t x = 0;
  for (; x + CV * W <= n; x += CV * W)
    vec_axpy_block<V, B, RA, CV, false>(a, lda, na, b, nb, x, W, c, ldc, accumulate, pf);
  if (x < n) vec_axpy_tail<V, B, RA, CV - 1>(a, lda, na, b, nb, x, n - x, c, ldc, accumulate, pf);
}

}  // namespace
}  // namespace latent::cpu
