// Tensor-core skinny kernels for BF16 and FP8 (e4m3fn) weights × bf16 activations: the dense matmuls and routed
// experts of decode and verify steps (M from 1 to a few hundred tokens), weights streamed once per pass of up to
// 64 tokens.
//
// Work: a block of 8 warps per 16-row tile of W (grouped: a persistent grid over (group, tile) items). The warps
// split K by 128-column blocks (warp w takes blocks w, w + 8, ...); each runs mma.sync m16n8k16 with the 16 weight
// rows as the M side and the tokens as N (8 per n-tile, NT n-tiles per pass), fp32 accumulators; the 8 warps' sums
// are added in shared memory in warp order (a fixed order: a token's result does not depend on the other tokens of
// the call, nor on NT) and stored through the linear epilogue.
//
// Per 128-column block, lane (g = lane / 4, t = lane % 4) loads rows g and g + 8 of the tile in 16-byte pieces:
// BF16 4 pieces per row, piece j at byte 16·(4j + t) of the row's block (columns 32j + 8t .. +7); FP8 2 pieces,
// piece j at byte 16·(4j + t) (columns 64j + 16t .. +15). The four lanes of a row read 64 contiguous bytes per
// piece. The mma's k slots are a permutation of the block's columns shared by A and B: each x piece (8 columns,
// one 16-byte load of the token's activations) feeds two k16 steps, lane t's slots {2t, 2t+1} / {2t+8, 2t+9} of step
// s being its columns 4s + {0, 1} / 4s + {2, 3} of the piece. So a BF16 A register is a stored word as it is, and an
// FP8 one two codes moved into bf16 bit places (sign to bit 15, exponent and mantissa bits to bits 4..10: a bf16
// equal to the e4m3 value times 2^-120, subnormal for e4m3 subnormals) and one exact bf16x2 multiply by 2^120; codes
// 0x7F / 0xFF become NaN (checked per 128 columns, a warp vote, off the common path). No weight is rounded: the
// e4m3 codes are exact bf16 values, FP8 block scales are applied to each 128-column block's fp32 partial sums (a
// 16-row tile lies in one scale block: block_rows % 16 == 0, block_cols % 128 == 0), per-tensor / per-channel
// scales to the finished sum.
#include "kernels/cuda/cuda_skinny.cuh"

namespace latent::cuda {

namespace {

constexpr int kStcWarps = 8;
constexpr int kStcThreads = kStcWarps * 32;
constexpr int kFmtFp8 = -1;  // the FP8 kernels' template tag (block / tensor / channel decided at run time)

// The A registers (half: 0 = rows g, registers 0 / 2; 1 = rows g + 8, registers 1 / 3) of an x piece's two k16
// steps from the row's two code words of the piece (columns 0..3 and 4..7).
__device__ __forceinline__ void fp8_word4(uint32_t w0, uint32_t w1, bool nan, uint32_t (&af)[2][4], int half) {
  fp8_word(w0, nan, af[0][half], af[0][half + 2]);
  fp8_word(w1, nan, af[1][half], af[1][half + 2]);
}

// Rows rbase .. rbase+15 of w times tokens m0 .. m1 of x (bf16 rows, 16-byte aligned, ld % 8 == 0), in passes of
// 8·NT tokens; red: the block's shared memory for the cross-warp sum.
template <int FMT, int NT>
__device__ __forceinline__ void stc_tile(const WDesc& w, int64_t m0, int64_t m1, int64_t rbase, const uint16_t* x,
                                         int64_t ldx, const SmallOut& out, float (*red)[32]) {
  constexpr bool kBf16 = FMT == kFmtBF16;
  constexpr int kBlocksPerUnit = kBf16 ? 1 : 2;  // 128-column blocks per round of loads (4 pieces per row)
  constexpr int kPieces = kBf16 ? 4 : 2;         // 16-byte pieces per row and block
  constexpr int64_t kBlockBytes = kBf16 ? 256 : 128;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t N = w.rows, nkb = w.cols / 128;
  const int64_t ra = rbase + g < N ? rbase + g : N - 1, rb = rbase + g + 8 < N ? rbase + g + 8 : N - 1;
  const uint8_t* pa = static_cast<const uint8_t*>(w.data) + ra * w.row_bytes + 16 * t;
  const uint8_t* pb = static_cast<const uint8_t*>(w.data) + rb * w.row_bytes + 16 * t;
  const bool blockscale = !kBf16 && w.format == kFmtFp8Block;
  const float* srow = blockscale ? static_cast<const float*>(w.scale) + (rbase / w.block_rows) * w.scale_cols : nullptr;
  for (int64_t mb = m0; mb < m1; mb += 8 * NT) {
    const uint16_t* xp[NT];
    bool has[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const int64_t tok = mb + 8 * n + g;
      has[n] = tok < m1;
      xp[n] = x + (has[n] ? tok : m0) * ldx;
    }
    float c[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[n][e] = 0.0f;
    // One round: the 16-byte pieces of kBlocksPerUnit blocks (kb0, kb0 + 8, ...) of rows g and g + 8.
    auto load_unit = [&](int64_t kb0, uint4(&wa)[4], uint4(&wb)[4]) {
#pragma unroll
      for (int q = 0; q < kBlocksPerUnit; ++q) {
        const int64_t kb = kb0 + kStcWarps * q < nkb ? kb0 + kStcWarps * q : kb0;  // clamped: loaded, not used
#pragma unroll
        for (int j = 0; j < kPieces; ++j) {
          wa[q * kPieces + j] = __ldcs(reinterpret_cast<const uint4*>(pa + kb * kBlockBytes + 64 * j));
          wb[q * kPieces + j] = __ldcs(reinterpret_cast<const uint4*>(pb + kb * kBlockBytes + 64 * j));
        }
      }
    };
    auto run_unit = [&](int64_t kb0, const uint4(&wa)[4], const uint4(&wb)[4]) {
      bool nan = false;
      if constexpr (!kBf16) {
        uint32_t any = 0;
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            any |=
                ((word_of(wa[u], i) & 0x7F7F7F7Fu) + 0x01010101u) | ((word_of(wb[u], i) & 0x7F7F7F7Fu) + 0x01010101u);
        nan = __any_sync(0xFFFFFFFFu, (any & 0x80808080u) != 0u);
      }
#pragma unroll
      for (int q = 0; q < kBlocksPerUnit; ++q) {
        const int64_t kb = kb0 + kStcWarps * q;
        if (kb >= nkb) break;
        float p[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) p[n][e] = 0.0f;
#pragma unroll
        for (int xc = 0; xc < 4; ++xc) {  // 8-column x pieces of the lane
          const int u = q * kPieces + (kBf16 ? xc : xc >> 1);
          const int64_t col = kb * 128 + (kBf16 ? 32 * xc + 8 * t : 64 * (xc >> 1) + 16 * t + 8 * (xc & 1));
          uint4 xv[NT];
#pragma unroll
          for (int n = 0; n < NT; ++n)
            xv[n] = has[n] ? __ldg(reinterpret_cast<const uint4*>(xp[n] + col)) : make_uint4(0u, 0u, 0u, 0u);
          uint32_t af[2][4];  // A registers of the piece's two k16 steps
          if constexpr (kBf16) {
#pragma unroll
            for (int st = 0; st < 2; ++st) {
              af[st][0] = word_of(wa[u], 2 * st);
              af[st][2] = word_of(wa[u], 2 * st + 1);
              af[st][1] = word_of(wb[u], 2 * st);
              af[st][3] = word_of(wb[u], 2 * st + 1);
            }
          } else {
            fp8_word4(word_of(wa[u], 2 * (xc & 1)), word_of(wa[u], 2 * (xc & 1) + 1), nan, af, 0);
            fp8_word4(word_of(wb[u], 2 * (xc & 1)), word_of(wb[u], 2 * (xc & 1) + 1), nan, af, 1);
          }
#pragma unroll
          for (int st = 0; st < 2; ++st)
#pragma unroll
            for (int n = 0; n < NT; ++n)
              mma_bf16_16816(p[n], af[st][0], af[st][1], af[st][2], af[st][3], word_of(xv[n], 2 * st),
                             word_of(xv[n], 2 * st + 1));
        }
        const float sc = blockscale ? srow[(kb * 128) / w.block_cols] : 1.0f;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) c[n][e] = blockscale ? fmaf(p[n][e], sc, c[n][e]) : c[n][e] + p[n][e];
      }
    };
    // One round of loads in flight per warp, then its MMAs (a register double buffer, the next round's loads issued
    // before this round's MMAs, measured slower on the H100: fewer blocks per SM; cuda_bench skinny, 2026-12-06).
    for (int64_t kb0 = warp; kb0 < nkb; kb0 += kStcWarps * kBlocksPerUnit) {
      uint4 wa[4], wb[4];
      load_unit(kb0, wa, wb);
      run_unit(kb0, wa, wb);
    }
    // The 8 warps' partial sums, added in warp order; then the epilogue store (per-tensor / per-channel scales).
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(warp * NT + n) * 4 + e][lane] = c[n][e];
    __syncthreads();
    for (int i = threadIdx.x; i < NT * 4 * 32; i += kStcThreads) {
      const int ne = i >> 5, ln = i & 31, n = ne >> 2, e = ne & 3;
      float v = red[ne][ln];
#pragma unroll
      for (int k = 1; k < kStcWarps; ++k) v += red[k * NT * 4 + ne][ln];
      const int64_t r = rbase + (ln >> 2) + (e >> 1) * 8, m = mb + 8 * n + 2 * (ln & 3) + (e & 1);
      if (r >= N || m >= m1) continue;
      if constexpr (!kBf16) {
        if (w.format == kFmtFp8Tensor) v *= static_cast<const float*>(w.scale)[0];
        if (w.format == kFmtFp8Channel) v *= static_cast<const float*>(w.scale)[r];
      }
      small_store(out, m, r, N, v);
    }
    __syncthreads();
  }
}

template <int NT>
__device__ __forceinline__ void stc_tile_any(const WDesc& w, int64_t m0, int64_t m1, int64_t rbase, const uint16_t* x,
                                             int64_t ldx, const SmallOut& out, float (*red)[32]) {
  if (w.format == kFmtBF16)
    stc_tile<kFmtBF16, NT>(w, m0, m1, rbase, x, ldx, out, red);
  else
    stc_tile<kFmtFp8, NT>(w, m0, m1, rbase, x, ldx, out, red);
}

// Single weight: a block per 16-row tile, tokens [0, M).
template <int NT>
__global__ void __launch_bounds__(kStcThreads)
    stc_kernel(WDesc w, int64_t M, const uint16_t* x, int64_t ldx, SmallOut out) {
  __shared__ float red[kStcWarps * NT * 4][32];
  stc_tile_any<NT>(w, 0, M, static_cast<int64_t>(blockIdx.x) * 16, x, ldx, out, red);
}

// Grouped: a persistent grid of blocks over (listed group, 16-row tile) items of the classes c0 .. c1-1 of
// classify_groups_kernel (cuda_linear.cu), each over all its group's tokens.
template <int NT>
__global__ void __launch_bounds__(kStcThreads)
    stc_grouped_kernel(const WDesc* table, const int64_t* offsets, const int32_t* lists, const int32_t* counts,
                       int64_t n_groups, int c0, int c1, int64_t tiles, const uint16_t* x, int64_t ldx, SmallOut out) {
  __shared__ float red[kStcWarps * NT * 4][32];
  int64_t n_listed = 0;
  for (int c = c0; c < c1; ++c) n_listed += counts[c];
  const int64_t n_items = n_listed * tiles;
  for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
    int64_t li = item / tiles;
    int c = c0;
    while (li >= counts[c]) li -= counts[c++];
    const int64_t g = lists[c * n_groups + li];
    stc_tile_any<NT>(table[g], offsets[g], offsets[g + 1], (item % tiles) * 16, x, ldx, out, red);
  }
}

int stc_sm_count() {
  static const int n = [] {
    int dev = 0, v = 132;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v;
  }();
  return n;
}

}  // namespace

bool stc_ok(const WDesc& w) {
  if (w.cols <= 0 || w.cols % 128 != 0 || w.data == nullptr || (reinterpret_cast<uintptr_t>(w.data) & 15) != 0)
    return false;
  switch (w.format) {
    case kFmtBF16: return w.row_bytes == 2 * w.cols;
    case kFmtFp8Block:
      if (w.block_rows <= 0 || w.block_rows % 16 != 0 || w.block_cols <= 0 || w.block_cols % 128 != 0) return false;
      [[fallthrough]];
    case kFmtFp8Tensor:
    case kFmtFp8Channel: return w.fnuz == 0 && w.row_bytes == w.cols && w.scale != nullptr;
    default: return false;
  }
}

bool stc_x_ok(TView x) { return x.bf16 && (reinterpret_cast<uintptr_t>(x.p) & 15) == 0 && x.ld % 8 == 0; }

void launch_matmul_stc(const WDesc& w, TView x, int64_t M, TView y, const LinEpi& e, cudaStream_t st) {
  if (M <= 0 || w.rows <= 0) return;
  SmallOut out;
  out.y = y;
  out.bias = e.bias;
  out.gate = e.gate;
  out.residual = e.residual;
  const unsigned blocks = static_cast<unsigned>((w.rows + 15) / 16);
  const auto* xb = static_cast<const uint16_t*>(x.p);
  if (M <= 8)
    stc_kernel<1><<<blocks, kStcThreads, 0, st>>>(w, M, xb, x.ld, out);
  else if (M <= 16)
    stc_kernel<2><<<blocks, kStcThreads, 0, st>>>(w, M, xb, x.ld, out);
  else if (M <= 32)
    stc_kernel<4><<<blocks, kStcThreads, 0, st>>>(w, M, xb, x.ld, out);
  else
    stc_kernel<8><<<blocks, kStcThreads, 0, st>>>(w, M, xb, x.ld, out);
}

void launch_grouped_stc(const WDesc* table, int64_t n_groups, int64_t rows, const int64_t* offsets, TView x, TView y,
                        const LinEpi& e, const int32_t* lists, const int32_t* counts, cudaStream_t st) {
  SmallOut out;
  out.y = y;
  out.bias = e.bias;
  out.gate = e.gate;
  out.residual = e.residual;
  const unsigned grid = static_cast<unsigned>(stc_sm_count() * 4);
  const auto* xb = static_cast<const uint16_t*>(x.p);
  const int64_t tiles = (rows + 15) / 16;
  // Classes 0 and 1 (≤ 16 tokens: one pass of 16), class 2 (passes of 32).
  stc_grouped_kernel<2>
      <<<grid, kStcThreads, 0, st>>>(table, offsets, lists, counts, n_groups, 0, 2, tiles, xb, x.ld, out);
  stc_grouped_kernel<4>
      <<<grid, kStcThreads, 0, st>>>(table, offsets, lists, counts, n_groups, 2, 3, tiles, xb, x.ld, out);
}

}  // namespace latent::cuda
