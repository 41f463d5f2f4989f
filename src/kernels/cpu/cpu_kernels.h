// Internal: the per-ISA kernel table of the CPU backend. Each ISA's kernels live in their own translation unit
// (kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512.cpp); SIMD code is compiled with GCC/Clang function
// attributes (target("avx2,fma,f16c"), target("avx512f,avx512bw,avx512vl,...")) so no global -march is needed.
// This header only declares plain data and function pointers (nothing inline that a SIMD TU could compile with
// wider instructions and hand to the linker as the shared copy).
//
// Prepared activations: a SIMD matmul kernel may read x in a permuted order within fixed groups of columns (so
// that dequantized weights need no shuffles, e.g. bf16 even/odd halves of a dword). prep_x writes that order;
// columns past the last full group keep their natural order. Kernels with no permutation for a format leave
// `permutes(f)` false and read x directly.
#pragma once
#include <cstdint>

#include "quant/weight_format.h"

namespace latent::cpu {

// A software-prefetch cursor over a list of rows (the decode attention's next block of keys). A kernel handed one
// issues a prefetch of the cursor's next cache line at a fixed rate of its inner steps and advances the cursor, so
// the next block's lines arrive from memory while this block computes. No effect on any result.
struct PrefetchCursor {
  const void* const* rows = nullptr;
  int64_t n_rows = 0, row_bytes = 0;
  int64_t row = 0, off = 0;  // the next line: byte `off` past the 64-byte line holding rows[row]'s first byte
};

struct Kernels {
  const char* name;

  bool (*permutes)(WeightFormat f);
  // xp [M, K] = x [M, K] in this ISA's order for format f.
  void (*prep_x)(WeightFormat f, const float* x, int64_t M, int64_t K, float* xp);
  // y[m*ldy + (r - r0)] = Σ_k W[r, k]·x[m, k] for r in [r0, r1), m < M; xp prepared (row stride K = w.cols).
  void (*matmul_rows)(const QuantWeight& w, const float* xp, int64_t M, int64_t r0, int64_t r1, float* y, int64_t ldy);
  // out[0..cols) = W[r, :] (natural order, exact).
  void (*dequant_row)(const QuantWeight& w, int64_t r, float* out);

  // ---- small vector helpers (fp32) ----
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);  // y += a·x
  // y = bf16(y + bf16(a·x)) when bf16, else y += a·x computed as a multiply then an add (bit-exact with ref).
  void (*scaled_add)(float a, const float* x, float* y, int64_t n, bool bf16);
  // x[i] = exp(x[i] - sub); returns Σ x[i] (fp32).
  float (*exp_sub_sum)(float* x, int64_t n, float sub);

  // ---- row ops ----
  // One row of RMSNorm, double accumulation (as ref).
  void (*rms_norm_row)(const float* x, const float* w, int64_t D, float eps, float* y, bool bf16);
  void (*silu_mul)(const float* gate, const float* up, int64_t n, float* out, bool bf16);
  void (*add)(float* y, const float* x, int64_t n, bool bf16);
  void (*round_bf16)(float* x, int64_t n);
  // Interleaved RoPE on v[0..dim): cc = [c0,c0,c1,c1,..], ss = [-s0,s0,-s1,s1,..] (dim entries each).
  void (*rope_interleaved)(float* v, const float* cc, const float* ss, int64_t dim, bool bf16);
  // Half-split RoPE: pairs (v[i], v[i+half]) with c[i], s[i].
  void (*rope_half)(float* v, const float* c, const float* s, int64_t half, bool bf16);

  // ---- attention tiles (flash-style prefill attention, kAttnKeyTile keys per tile) ----
  // s[i·kAttnKeyTile + j] = Σ_x q[i·ldq + x]·kt[x·kAttnKeyTile + j] for i < nq, j < kAttnKeyTile: one tile of
  // keys packed transposed (kt [d, kAttnKeyTile]), fp32 accumulation in x order.
  void (*attn_qk_tile)(const float* q, int64_t ldq, int64_t nq, const float* kt, int64_t d, float* s);
  // o[i·dv + c] += Σ_{j<nk} p[i·kAttnKeyTile + j]·v[j·ldv + c] for i < nq, c < dv (v: nk value rows).
  void (*attn_pv_tile)(const float* p, int64_t nq, const float* v, int64_t ldv, int64_t nk, int64_t dv, float* o);
  // The softmax step of one tile for rows i < nq: s [nq, kAttnKeyTile] raw dots, bit j of mask[i] = key j
  // allowed (a row with mask 0 becomes zeros and is left alone). Scores: dot·scale, or bf16(bf16(dot)·scale) when
  // mode != kSoftmaxOnline; masked ones −inf.
  //   kSoftmaxOnline (fp32): mx' = max(mx, scores), alpha = exp(mx − mx') (0 for mx = −inf), sum = sum·alpha +
  //     Σ exp(score − mx'), acc row [dv] *= alpha when alpha != 1, s = exp(score − mx');
  //   kSoftmaxStats (bf16 pass 1): mx and sum updated the same way, s and acc untouched;
  //   kSoftmaxFinal (bf16 pass 2): s = bf16(exp(score − mx) / sum) with the final mx and sum.
  void (*attn_softmax_tile)(float* s, int64_t nq, const uint32_t* mask, float scale, int mode, float* mx, float* sum,
                            float* acc, int64_t dv);
  // kt[x·kAttnKeyTile + j] = rows[j][x] for x < d, j < kAttnKeyTile (a key tile transposed; every pointer valid).
  void (*attn_pack_kt)(const float* const* rows, int64_t d, float* kt);

  // ---- small GEMMs over rows given by pointers (decode attention, the DSA indexer; vec_body.h) ----
  // s[i·lds + j] = Σ_{x<n1} a[i·lda + x]·b1[j][x] + Σ_{x<n2} a[i·lda + n1 + x]·b2[j][x]   (i < na, j < nb):
  // each key in two parts (the latent c then k_pe), fp32 or bf16 rows. One fixed chain per (i, j) whatever the
  // tile it falls in (batch invariant). pf (may be null): prefetches spread over the work (see PrefetchCursor).
  void (*dot_rows_f32)(const float* a, int64_t lda, int64_t na, const float* const* b1, const float* const* b2,
                       int64_t n1, int64_t n2, int64_t nb, float* s, int64_t lds, PrefetchCursor* pf);
  void (*dot_rows_bf16)(const float* a, int64_t lda, int64_t na, const uint16_t* const* b1, const uint16_t* const* b2,
                        int64_t n1, int64_t n2, int64_t nb, float* s, int64_t lds, PrefetchCursor* pf);
  // The same scores with the query rows transposed: a[i·lda + x] = qt[x·ldt + i] (x < n1 + n2). qt rows must be
  // readable up to lane ⌈na / 16⌉·16 (the lanes past na are computed and dropped). One fixed chain per (i, j): the
  // fmas in x order (the decode attention's scores, heads in the vector lanes; vec_body.h).
  void (*dot_rows_t_f32)(const float* qt, int64_t ldt, int64_t na, const float* const* b1, const float* const* b2,
                         int64_t n1, int64_t n2, int64_t nb, float* s, int64_t lds, PrefetchCursor* pf);
  void (*dot_rows_t_bf16)(const float* qt, int64_t ldt, int64_t na, const uint16_t* const* b1,
                          const uint16_t* const* b2, int64_t n1, int64_t n2, int64_t nb, float* s, int64_t lds,
                          PrefetchCursor* pf);
  // c[i·ldc + x] = (accumulate ? c[i·ldc + x] : 0) + Σ_{j<nb} a[i·lda + j]·b[j][x]   (i < na, x < n): one fma
  // per term in j order per (i, x). pf as for dot_rows.
  void (*axpy_rows_f32)(const float* a, int64_t lda, int64_t na, const float* const* b, int64_t nb, int64_t n, float* c,
                        int64_t ldc, bool accumulate, PrefetchCursor* pf);
  void (*axpy_rows_bf16)(const float* a, int64_t lda, int64_t na, const uint16_t* const* b, int64_t nb, int64_t n,
                         float* c, int64_t ldc, bool accumulate, PrefetchCursor* pf);
};

inline constexpr int kSoftmaxOnline = 0, kSoftmaxStats = 1, kSoftmaxFinal = 2;

inline constexpr int64_t kAttnKeyTile = 16;

const Kernels& kernels_scalar();
const Kernels* kernels_avx2();    // null when not compiled in
const Kernels* kernels_avx512();  // null when not compiled in

}  // namespace latent::cpu
