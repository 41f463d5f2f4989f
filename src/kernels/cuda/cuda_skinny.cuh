// Device pieces shared by the skinny (decode-sized) linear kernels of cuda_linear.cu (CUDA-core and MXFP4
// tensor-core kernels) and cuda_skinny_tc.cu (BF16 / FP8 tensor-core kernels): where they write (SmallOut and its
// epilogue store), the bf16 tensor-core MMA, the exact bf16x2 multiply, the FP8 code conversion and cp.async.
#pragma once
#include "kernels/cuda/cuda_common.cuh"

namespace latent::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, asynchronous (cp.async.cg: cached in L2 only); !valid: the 16 bytes zero-filled.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0: zero-fill
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 b16 matrices from shared memory (lanes 8i .. 8i+7 give matrix i's row addresses) into r[0..3].
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// The same, transposed (lane (g, t) gets rows 2t, 2t + 1 of column g of each matrix).
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Where the skinny kernels write: plain fp32 rows (y[m·N + r]), or a typed view through the linear epilogue
// (bias, gate tensor, residual; rounded to the view's dtype).
struct SmallOut {
  float* yf = nullptr;
  TView y{};
  const float* bias = nullptr;
  TView gate{}, residual{};
};
// Class 2 of classify_groups_kernel's lists (cuda_linear.cu) (groups of more than 16 tokens) on the tiled kernel for a
// table of one format (tile_fmt: BF16, FP8 — per tensor and per channel as one —, MXFP4 passing mx_tc_ok) or of BF16 /
// FP8 mixed (-2); false (nothing launched) above its group limit. wgmma: FP8 tables on the wgmma form where it runs.
bool launch_grouped_tile(const WDesc* table, int64_t n_groups, int64_t rows, const int64_t* offsets, TView x,
                         const SmallOut& out, const int32_t* lists, const int32_t* counts, cudaStream_t st,
                         int tile_fmt, bool wgmma = true);
__device__ __forceinline__ void small_store(const SmallOut& o, int64_t m, int64_t r, int64_t N, float v) {
  if (o.yf) {
    o.yf[m * N + r] = v;
    return;
  }
  tset(o.y, m, r, epi_value(v, o.bias, nullptr, o.gate, o.residual, m, r, o.y.bf16 != 0));
}

// a·b on bf16 pairs, exactly when the product is a bf16 value (fma with -0 added: the sign of a zero product kept).
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}
// c += A·B over one m16n8k16 tile (bf16 in, fp32 accumulators). A row-major 16×16 (a0: row g, k 2t..2t+1; a1: row
// g+8; a2: row g, k 2t+8..2t+9; a3: row g+8, k 2t+8..), B col-major 16×8 (b0: k 2t..2t+1, col g; b1: k 2t+8..),
// c: (row g, cols 2t, 2t+1), (row g+8, cols 2t, 2t+1) — g = lane / 4, t = lane % 4.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Bit 7 of each byte of the result is set where that byte of w is an e4m3fn NaN code (magnitude 0x7F); the other
// bits are noise. OR several words' marks, then test with & 0x80808080u.
__device__ __forceinline__ uint32_t fp8_nan_marks(uint32_t w) { return (w & 0x7F7F7F7Fu) + 0x01010101u; }

// Four e4m3fn codes (a word, column order = byte order) as two exact bf16 pairs: the high bytes H (sign and the
// exponent's bits 3..1 — (w >> 4) & 0x07 | w & 0x80 per byte) and the low bytes L (exponent bit 0 and mantissa:
// (w << 4) & 0xF0) interleaved by two byte permutes give each code as bf16 bits s 000 eeee mmm 0000 (its value times
// 2^-120, a subnormal for e4m3 subnormals), then one exact bf16x2 multiply by 2^120 each. NaN codes (magnitude
// 0x7F) become bf16 NaN when `nan` (a code's NaN-ness is checked per round by the caller).
__device__ __forceinline__ void fp8_word(uint32_t w, bool nan, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t k2p120 = 0x7B807B80u;
  const uint32_t H = ((w >> 4) & 0x07070707u) | (w & 0x80808080u), L = (w << 4) & 0xF0F0F0F0u;
  uint32_t rl = __byte_perm(L, H, 0x5140u), rh = __byte_perm(L, H, 0x7362u);
  if (nan) {
    const uint32_t nb = fp8_nan_marks(w) & 0x80808080u;  // 0x80 in the bytes of NaN codes
    rl |= ((__byte_perm(nb, 0u, 0x1404u) >> 15) & 0x00010001u) * 0x7FC0u;
    rh |= ((__byte_perm(nb, 0u, 0x3424u) >> 15) & 0x00010001u) * 0x7FC0u;
  }
  lo = bf16x2_mul(rl, k2p120);
  hi = bf16x2_mul(rh, k2p120);
}

// MXFP4 (codes pair-swizzled on the device, mx_layout.h): the bf16x2 multiplier(s) of a block's scale byte, and
// mx_swz_a: pair P of a swizzled word (columns 2P, 2P + 1 of its 8) as bf16 values, the exact e2m1 · 2^(e-127) of
// each code (the pattern e2m1 · 2^-126 times 2^(e-1); scale bytes above 128: by 2^126, then by the scale; 0xFF: NaN).
// The multiplier of a block's codes (both halves), and the second one for scale bytes above 128 (0: none).
__device__ __forceinline__ uint32_t mx_mult(uint32_t e, uint32_t& post) {
  e &= 0xFFu;
  post = 0;
  if (e == 0xFFu) return 0x7FC07FC0u;
  uint32_t m = 0x7E80u;  // 2^126
  if (e <= 128u)
    m = (e + 126u) << 7;  // 2^(e-1)
  else
    post = (e << 7) | (e << 23);  // 2^(e-127)
  return m | (m << 16);
}
// POST false: the caller knows no scale byte above 128 is in play (the second multiply left out — the same values).
template <int P, bool POST = true>
__device__ __forceinline__ uint32_t mx_swz_a(uint32_t w, uint32_t m, uint32_t post) {
  uint32_t v = bf16x2_mul(mx_swz_pair<P>(w), m);
  if constexpr (POST)
    if (post) v = bf16x2_mul(v, post);
  return v;
}

// 4 bytes global -> shared, asynchronous (cp.async.ca).
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src));
}

}  // namespace latent::cuda
