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
#include <algorithm>
#include <type_traits>

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
  // 128-column blocks per scale block (block_cols % 128 == 0): kb's scale is srow[kb >> kbs_shift] when that is a
  // power of two (always so far: 128 / 128), else srow[kb / kbs].
  const int kbs = blockscale ? w.block_cols / 128 : 1;
  const int kbs_shift = (kbs & (kbs - 1)) == 0 ? __ffs(kbs) - 1 : -1;
  const bool nan_free = kBf16 || w.nan_free != 0;
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
    // Whether any code of a round is NaN (a warp vote: uniform over the warp).
    auto unit_nan = [&](const uint4(&wa)[4], const uint4(&wb)[4]) {
      uint32_t any = 0;
#pragma unroll
      for (int u = 0; u < kBlocksPerUnit * kPieces; ++u)
#pragma unroll
        for (int i = 0; i < 4; ++i) any |= fp8_nan_marks(word_of(wa[u], i)) | fp8_nan_marks(word_of(wb[u], i));
      return __any_sync(0xFFFFFFFFu, (any & 0x80808080u) != 0u);
    };
    // A round's MMAs, compiled once per value of nan_tag (no branch per code word): with true, NaN codes become NaN.
    auto run_unit = [&](int64_t kb0, const uint4(&wa)[4], const uint4(&wb)[4], auto nan_tag) {
      constexpr bool nan = decltype(nan_tag)::value;
      (void)nan;  // (unused by the BF16 copy)
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
        const float sc = blockscale ? srow[kbs_shift >= 0 ? (kb >> kbs_shift) : kb / kbs] : 1.0f;
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
      if (!nan_free && unit_nan(wa, wb))
        run_unit(kb0, wa, wb, std::true_type{});
      else
        run_unit(kb0, wa, wb, std::false_type{});
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
template <int NT, int kMinBlocks = 1>
__global__ void __launch_bounds__(kStcThreads, kMinBlocks)
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

// ---- The tiled kernel: 128 weight rows × 64 tokens per block, both operands in shared memory ----
// A stage holds one 128-column block of the 128 rows (FP8 16 KB / BF16 32 KB) and of the 64 tokens (16 KB), filled
// by cp.async kStages - 1 stages ahead. FP8 codes are converted once per stage by the whole block into a bf16 copy
// of the W tile (each code's exact bf16 value: fp8_word; NaN codes NaN), BF16 weights are used as loaded. Warp w
// computes rows 32·(w % 4) .. +31 (two m16 tiles) × tokens 32·(w / 4) .. +31 (four n8 tiles) with mma.sync
// m16n8k16, A and B fragments by ldmatrix from rows of 256 bytes whose 16-byte chunks are XOR-swizzled by the row's
// low three bits (eight rows of one chunk land on eight bank groups). FP8 block scales multiply each 128-column
// block's fp32 partial sums. K may be split over gridDim.z parts (tile_splits): each part's sums are stored to a
// fp32 workspace and added in part order by tile_reduce_kernel (deterministic for a given M).
constexpr int kTileRows = 128, kTileToks = 64, kTileStages = 3;
// A stage's W bytes: BF16 rows of 256 bytes, FP8 of 128, MXFP4 64 bytes of codes (+ 4 scale bytes per row after
// the codes).
template <int FMT>
__host__ __device__ constexpr int tile_w_bytes() {
  return FMT == kFmtBF16 ? kTileRows * 256 : FMT == kFmtMxfp4 ? kTileRows * (64 + 4) : kTileRows * 128;
}
constexpr int kTileXBytes = kTileToks * 128 * 2;
constexpr int kTileWbBytes = kTileRows * 256;  // the bf16 copy of an FP8 / MXFP4 W tile
template <int FMT, int kStages = kTileStages>
__host__ __device__ constexpr int tile_smem() {
  return kStages * (tile_w_bytes<FMT>() + kTileXBytes) + (FMT == kFmtBF16 ? 0 : kTileWbBytes);
}

__device__ __forceinline__ uint4 lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ int swz(int chunk, int row) { return chunk ^ (row & 7); }  // 16-byte chunk of a 256-B row

// One finished sum (row r, token m) of a tiled block: into the K part's workspace (ws), or, for FMT kFmtFp8, times
// the per-tensor / per-channel scale, then through the epilogue.
template <int FMT>
__device__ __forceinline__ void tile_store(const WDesc& w, const SmallOut& out, float* ws, int64_t m, int64_t r,
                                           int64_t N, float v) {
  if (ws) {
    ws[m * N + r] = v;
    return;
  }
  if constexpr (FMT == kFmtFp8) {
    if (w.format == kFmtFp8Tensor) v *= static_cast<const float*>(w.scale)[0];
    if (w.format == kFmtFp8Channel) v *= static_cast<const float*>(w.scale)[r];
  }
  small_store(out, m, r, N, v);
}

// FMT: kFmtBF16, kFmtFp8Block, or kFmtFp8 (per tensor / per channel: the scale on the finished sum).
// One block's tile: weight rows rbase .. rbase+127 × tokens mbase .. mbase+63 (tokens ≥ m_end not stored; rows of
// x read clamped to m_end - 1) over the 128-column blocks [kb_begin, kb_end); ws: the part's fp32 sums ([m][N]
// from row 0 of x) instead of the epilogue store. Ends with the block synchronized (shared memory free for reuse).
template <int FMT, int kStages = kTileStages>
__device__ __forceinline__ void tile_block(uint8_t* smem, const WDesc& w, int64_t mbase, int64_t m_end, int64_t rbase,
                                           int64_t kb_begin, int64_t kb_end, const uint16_t* x, int64_t ldx,
                                           const SmallOut& out, float* ws) {
  constexpr bool kBf16 = FMT == kFmtBF16, kMx = FMT == kFmtMxfp4, kFp8 = !kBf16 && !kMx, kBlock = FMT == kFmtFp8Block;
  constexpr int kRowBytes = kBf16 ? 256 : kMx ? 64 : 128, kChunks = kRowBytes / 16, kWBytes = tile_w_bytes<FMT>();
  constexpr int kStageBytes = kWBytes + kTileXBytes;
  uint8_t* const wb = smem + kStages * kStageBytes;  // FP8: the bf16 copy of the stage's W tile
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int wr = warp & 3, wm = warp >> 2;
  const int64_t N = w.rows, M = m_end;
  const int n_kb = static_cast<int>(kb_end - kb_begin);
  const bool nan_free = w.nan_free != 0;

  // This thread's cp.async chunks: W chunk i = threadIdx.x + 256·q (row i / kChunks), x chunk likewise (16 a row).
  // BF16 W and x rows are stored swizzled for ldmatrix; FP8 rows of 128 codes with chunk ^ 4 on odd rows (the
  // conversion's reads of two rows at once spread over the banks).
  constexpr int kWPer = kTileRows * kChunks / kStcThreads, kXPer = kTileToks * 16 / kStcThreads;
  const uint8_t* wsrc[kWPer];
  int wdst[kWPer];
#pragma unroll
  for (int q = 0; q < kWPer; ++q) {
    const int i = threadIdx.x + kStcThreads * q, row = i / kChunks, c = i % kChunks;
    const int64_t gr = rbase + row < N ? rbase + row : N - 1;
    wsrc[q] = kMx ? mx_code_ptr(w, gr, 16 * c) : static_cast<const uint8_t*>(w.data) + gr * w.row_bytes + 16 * c;
    wdst[q] = row * kRowBytes + 16 * (kBf16 ? swz(c, row) : kMx ? c : c ^ ((row & 1) << 2));
  }
  const uint16_t* xsrc[kXPer];
  int xdst[kXPer];
#pragma unroll
  for (int q = 0; q < kXPer; ++q) {
    const int i = threadIdx.x + kStcThreads * q, row = i >> 4, c = i & 15;
    const int64_t tok = mbase + row < M ? mbase + row : M - 1;
    xsrc[q] = x + tok * ldx + 8 * c;
    xdst[q] = kWBytes + row * 256 + 16 * swz(c, row);
  }
  // A row's next 128-column block of W: kRowBytes on, or for tile-major MXFP4 codes the next 1 KiB chunk.
  const int64_t wstep = kMx ? mx_chunk_stride(w) : kRowBytes;
  auto load_stage = [&](int i) {
    if (i < n_kb) {
      uint8_t* st = smem + (i % kStages) * kStageBytes;
      const int64_t kb = kb_begin + i;
#pragma unroll
      for (int q = 0; q < kWPer; ++q) cp_async16(st + wdst[q], wsrc[q] + kb * wstep, true);
#pragma unroll
      for (int q = 0; q < kXPer; ++q) cp_async16(st + xdst[q], xsrc[q] + kb * 128, true);
      if constexpr (kMx) {  // the rows' 4 scale bytes of this block, after the codes
        if (threadIdx.x < kTileRows) {
          const int64_t gr = rbase + threadIdx.x < N ? rbase + threadIdx.x : N - 1;
          cp_async4(st + kTileRows * 64 + 4 * threadIdx.x,
                    static_cast<const uint8_t*>(w.scale) + gr * w.scale_cols + 4 * kb);
        }
      }
    }
    cp_async_commit();
  };

  float c[2][4][4] = {};
  // ldmatrix row addresses of this lane: A rows 32·wr + 16i + (lane & 15), chunk half lane >> 4; B tokens
  // 32·wm + 16jp + (lane & 7) + 8·(lane >> 4), chunk half (lane >> 3) & 1.
  const int arow = 32 * wr + (lane & 15), ahalf = lane >> 4;
  const int btok = 32 * wm + (lane & 7) + 8 * (lane >> 4), bhalf = (lane >> 3) & 1;

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) load_stage(i);
  for (int it = 0; it < n_kb; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    load_stage(it + kStages - 1);
    const uint8_t* st = smem + (it % kStages) * kStageBytes;
    if constexpr (kFp8) {
      // The W tile's codes into bf16 (natural column order, swizzled rows): thread chunk q → row, 16 codes; a
      // quarter warp takes 4 chunks of 2 rows.
#pragma unroll
      for (int j = 0; j < kTileRows * 8 / kStcThreads; ++j) {
        const int q = threadIdx.x + kStcThreads * j, pr = q >> 3, k = q & 7;
        const int row = 2 * (pr >> 1) + (k >> 2), cc = (k & 3) + 4 * (pr & 1);
        const uint4 v = lds128(st + row * 128 + 16 * (cc ^ ((row & 1) << 2)));
        uint32_t o[8];
        if (nan_free) {  // (uniform: the weight has no NaN code, QuantWeight::fp8_nan_free)
#pragma unroll
          for (int u = 0; u < 4; ++u) fp8_word(word_of(v, u), false, o[2 * u], o[2 * u + 1]);
        } else {
          uint32_t any = 0;
#pragma unroll
          for (int u = 0; u < 4; ++u) any |= fp8_nan_marks(word_of(v, u));
          const bool nan = (any & 0x80808080u) != 0u;
#pragma unroll
          for (int u = 0; u < 4; ++u) fp8_word(word_of(v, u), nan, o[2 * u], o[2 * u + 1]);
        }
        *reinterpret_cast<uint4*>(wb + row * 256 + 16 * swz(2 * cc, row)) = make_uint4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<uint4*>(wb + row * 256 + 16 * swz(2 * cc + 1, row)) = make_uint4(o[4], o[5], o[6], o[7]);
      }
      __syncthreads();
    }
    if constexpr (kMx) {
      // The W tile's e2m1 codes times their blocks' scales into bf16 (exact; scale 0xFF: NaN): thread chunk q → row
      // q / 4, its 32 codes (one scale block) → 4 bf16 chunks.
#pragma unroll
      for (int j = 0; j < kTileRows * 4 / kStcThreads; ++j) {
        const int q = threadIdx.x + kStcThreads * j, row = q >> 2, cc = q & 3;
        const uint4 v = lds128(st + row * 64 + 16 * cc);
        uint32_t post;
        const uint32_t m = mx_mult(st[kTileRows * 64 + 4 * row + cc], post);
#pragma unroll
        for (int u = 0; u < 4; ++u) {  // word u: columns 8u .. 8u+7 of the chunk, pair-swizzled (mx_layout.h)
          const uint32_t w = word_of(v, u);
          *reinterpret_cast<uint4*>(wb + row * 256 + 16 * swz(4 * cc + u, row)) =
              make_uint4(mx_swz_a<0>(w, m, post), mx_swz_a<1>(w, m, post), mx_swz_a<2>(w, m, post),
                         mx_swz_a<3>(w, m, post));  // columns (0, 1), (2, 3), (4, 5), (6, 7)
        }
      }
      __syncthreads();
    }
    const uint8_t* wt = kBf16 ? st : wb;
    const uint8_t* xt = st + kWBytes;
    float p[2][4][4] = {};
#pragma unroll
    for (int s = 0; s < 8; ++s) {  // k16 steps: chunks 2s, 2s + 1
      uint32_t a[2][4], b[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = arow + 16 * i;
        ldsm_x4(a[i], wt + r * 256 + 16 * swz(2 * s + ahalf, r));
      }
#pragma unroll
      for (int jp = 0; jp < 2; ++jp) {
        const int tk = btok + 16 * jp;
        ldsm_x4(b[jp], xt + tk * 256 + 16 * swz(2 * s + bhalf, tk));
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          mma_bf16_16816(p[i][j], a[i][0], a[i][1], a[i][2], a[i][3], b[j >> 1][2 * (j & 1)],
                         b[j >> 1][2 * (j & 1) + 1]);
    }
    // The block's partial sums into the accumulators (block scales: times the m16 tile's scale of this block).
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sc = 1.0f;
      if constexpr (kBlock) {
        const int64_t r0 = rbase + 32 * wr + 16 * i < N ? rbase + 32 * wr + 16 * i : N - 1;
        sc = static_cast<const float*>(
            w.scale)[(r0 / w.block_rows) * w.scale_cols + ((kb_begin + it) * 128) / w.block_cols];
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[i][j][e] = kBlock ? fmaf(p[i][j][e], sc, c[i][j][e]) : c[i][j][e] + p[i][j][e];
    }
  }
  cp_async_wait<0>();
  // Store: (row rbase + 32wr + 16i + g + 8(e / 2), token mbase + 32wm + 8j + 2t + e % 2).
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t r = rbase + 32 * wr + 16 * i + g + 8 * (e >> 1), m = mbase + 32 * wm + 8 * j + 2 * t + (e & 1);
        if (r >= N || m >= M) continue;
        tile_store<FMT>(w, out, ws, m, r, N, c[i][j][e]);
      }
  __syncthreads();
}

extern __shared__ __align__(128) uint8_t tile_smem_buf[];

// Single weight: block (row tile x, token tile y, K part z).
template <int FMT, int kStages, int kMinBlocks>
__global__ void __launch_bounds__(kStcThreads, kMinBlocks)
    tile_kernel(WDesc w, int64_t M, const uint16_t* x, int64_t ldx, SmallOut out, float* ws, int kb_per_part) {
  const int64_t nkb = w.cols / 128, kb_begin = static_cast<int64_t>(blockIdx.z) * kb_per_part;
  const int64_t kb_end = kb_begin + kb_per_part < nkb ? kb_begin + kb_per_part : nkb;
  tile_block<FMT, kStages>(tile_smem_buf, w, static_cast<int64_t>(blockIdx.y) * kTileToks, M,
                           static_cast<int64_t>(blockIdx.x) * kTileRows, kb_begin, kb_end, x, ldx, out,
                           ws ? ws + static_cast<int64_t>(blockIdx.z) * M * w.rows : nullptr);
}

// ---- The tiled kernel on wgmma (sm_90a): FP8 weights converted straight into the A operand registers ----
// 128 weight rows × 64 tokens per block, two warpgroups of 64 rows. A stage holds the 128 rows' 128-column block of
// FP8 codes (16 KB; 16-byte chunk c of row r at chunk c ^ (r & 7)) and the 64 tokens' 128 columns of x in the
// K-major 128-byte-swizzled layout wgmma reads B in (two 64-column halves of 64 rows × 128 bytes, chunk c of row r
// at c ^ (r & 7), 1 KiB-aligned), filled by cp.async kStages - 1 stages ahead. Per k16 step a warp makes its A
// fragment (rows g, g + 8 of its 16; columns 2t, 2t + 1 and 2t + 8, 2t + 9) from two 32-bit shared loads and one byte
// permute per row and converts the four codes exactly (fp8_word); then the warpgroup runs wgmma.m64n64k16 with B
// from shared memory. Per 128-column block the partial sums (scale-d off at the block's first step) are multiplied
// by the block scale into the accumulators, as tile_block does: no weight is rounded. No bf16 copy of the W tile,
// no second barrier per stage, and B is read by the tensor cores once per warpgroup instead of by ldmatrix per warp.
constexpr int kWgWBytes = kTileRows * 128;
// Where the wgmma form runs (measured faster than mma.sync there, cuda_bench skinny / ctx on an H100): single-weight
// calls up to 256 tokens and grouped calls of up to 1,024 (token, expert) pairs (a decode step of 128 tokens at
// top-8). Above, mma.sync: a 128-token wgmma form with the conversion overlapping the MMAs ran slower at prefill
// sizes (bench/README.md), and the 64-token form is not timed there yet.
constexpr int64_t kWgMaxRows = 256, kWgMaxPairs = 1024;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LATENT_WGMMA 1
// K-major, 128-byte swizzle: start address >> 4 (bits 0-13), leading byte offset unused (1), stride byte offset
// between 8-row groups 1024 >> 4 (bits 32-45), base offset 0 (the atoms are 1 KiB aligned), layout 1 (bits 62-63).
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// The accumulators as seen by the compiler: written at this point (after a wait), so no read moves above it.
template <int R>
__device__ __forceinline__ void wg_touch(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// d (+)= A (registers, bf16 m64k16) · B (shared memory, bf16 k16n64, K-major); scale_d 0: d = A · B.
__device__ __forceinline__ void wgmma_64n64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
#endif

// FMT: kFmtFp8Block or kFmtFp8 (per tensor / per channel: the scale on the finished sum); kNan: NaN codes become NaN
// (weights not NaN-free). Three stages, two blocks per SM. The same tile rows and tokens, K range, workspace and
// store as tile_block.
constexpr int kWgStages = 3, kWgStageBytes = kWgWBytes + kTileToks * 256, kWgSmem = kWgStages * kWgStageBytes + 1024;
template <int FMT, bool kNan>
__device__ __forceinline__ void wg_block(uint8_t* smem_raw, const WDesc& w, int64_t mbase, int64_t m_end, int64_t rbase,
                                         int64_t kb_begin, int64_t kb_end, const uint16_t* x, int64_t ldx,
                                         const SmallOut& out, float* ws) {
#ifdef LATENT_WGMMA
  constexpr bool kBlock = FMT == kFmtFp8Block;
  constexpr int kToks = kTileToks, kStages = kWgStages, kStageBytes = kWgStageBytes, kAcc = kToks / 2;
  uint8_t* const smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wgi = warp >> 2, wq = warp & 3, g = lane >> 2,
            t = lane & 3;
  const int64_t N = w.rows, M = m_end;
  const int n_kb = static_cast<int>(kb_end - kb_begin);

  // cp.async chunks of this thread (sources computed per stage: fewer live registers): W rows wrow + 32·q, chunk
  // wc; x rows xrow + 16·q, chunk xc (both swizzles depend on the row only through row % 8, the same for every q).
  constexpr int kWPer = kTileRows * 8 / kStcThreads, kXPer = kToks * 16 / kStcThreads;
  const int wrow = threadIdx.x >> 3, wc = threadIdx.x & 7, xrow = threadIdx.x >> 4, xc = threadIdx.x & 15;
  const int wdst = wrow * 128 + 16 * (wc ^ (wrow & 7));
  const int xdst = kWgWBytes + (xc >> 3) * (kToks * 128) + xrow * 128 + 16 * ((xc & 7) ^ (xrow & 7));
  const uint8_t* const wbase = static_cast<const uint8_t*>(w.data) + 16 * wc;
  const uint16_t* const xbase = x + 8 * xc;
  auto load_stage = [&](int i) {
    if (i < n_kb) {
      uint8_t* st = smem + (i % kStages) * kStageBytes;
      const int64_t kb = kb_begin + i;
#pragma unroll
      for (int q = 0; q < kWPer; ++q) {
        const int64_t gr = rbase + wrow + 32 * q < N ? rbase + wrow + 32 * q : N - 1;
        cp_async16(st + wdst + q * 32 * 128, wbase + gr * w.row_bytes + kb * 128, true);
      }
#pragma unroll
      for (int q = 0; q < kXPer; ++q) {
        const int64_t tok = mbase + xrow + 16 * q < M ? mbase + xrow + 16 * q : M - 1;
        cp_async16(st + xdst + q * 16 * 128, xbase + tok * ldx + kb * 128, true);
      }
    }
    cp_async_commit();
  };

  float c[kAcc], p[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) c[i] = 0.0f;
  // This lane's A bytes of a k16 step s: row lr (and lr + 8), chunk s at s ^ g (lr % 8 == g), words t / 2 and
  // t / 2 + 2 of it, the half t % 2 of each.
  const int lr = 64 * wgi + 16 * wq + g;
  const uint32_t sel = (t & 1) ? 0x7632u : 0x5410u;
  const int wofs = 4 * (t >> 1);
  const int64_t r16 = rbase + 64 * wgi + 16 * wq < N ? rbase + 64 * wgi + 16 * wq : N - 1;
  const float* srow = kBlock ? static_cast<const float*>(w.scale) + (r16 / w.block_rows) * w.scale_cols : nullptr;
  // 128-column blocks per scale block: kb's scale is srow[kb >> kbs_shift] when that is a power of two.
  const int kbs = kBlock ? w.block_cols / 128 : 1;
  const int kbs_shift = (kbs & (kbs - 1)) == 0 ? __ffs(kbs) - 1 : -1;

  auto convert = [&](int it, uint32_t(&a)[8][4]) {
    const uint8_t* st = smem + (it % kStages) * kStageBytes;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const uint8_t* p0 = st + lr * 128 + 16 * (s ^ g) + wofs;
      const uint32_t l0 = *reinterpret_cast<const uint32_t*>(p0), h0 = *reinterpret_cast<const uint32_t*>(p0 + 8);
      const uint32_t l1 = *reinterpret_cast<const uint32_t*>(p0 + 8 * 128),
                     h1 = *reinterpret_cast<const uint32_t*>(p0 + 8 * 128 + 8);
      fp8_word(__byte_perm(l0, h0, sel), kNan, a[s][0], a[s][2]);
      fp8_word(__byte_perm(l1, h1, sel), kNan, a[s][1], a[s][3]);
    }
  };
  auto issue = [&](int it, const uint32_t(&a)[8][4]) {
    const uint32_t xs = smem_addr(smem + (it % kStages) * kStageBytes + kWgWBytes);
    wg_fence();
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const uint64_t d = wg_desc(xs + (s >> 2) * (kToks * 128) + (s & 3) * 32);
      wgmma_64n64(p, a[s], d, s);
    }
    wg_commit();
  };
  auto finish = [&](int it) {
    wg_wait0();
    wg_touch(p);
    float sc = 1.0f;
    if constexpr (kBlock) {
      const int kb = static_cast<int>(kb_begin) + it;
      sc = srow[kbs_shift >= 0 ? kb >> kbs_shift : kb / kbs];
    }
#pragma unroll
    for (int i = 0; i < kAcc; ++i) c[i] = kBlock ? fmaf(p[i], sc, c[i]) : c[i] + p[i];
  };

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) load_stage(i);
  for (int it = 0; it < n_kb; ++it) {
    // Stage it's cp.async writes done (this thread's), seen by wgmma's reads (the async proxy), then by every thread.
    cp_async_wait<kStages - 2>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    load_stage(it + kStages - 1);
    uint32_t a[8][4];
    convert(it, a);
    issue(it, a);
    finish(it);
  }
  cp_async_wait<0>();
  // Store: accumulator 4j + e is (row lr + 8 (e / 2), token mbase + 8j + 2t + e % 2).
#pragma unroll
  for (int j = 0; j < kToks / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t r = rbase + lr + 8 * (e >> 1), m = mbase + 8 * j + 2 * t + (e & 1);
      if (r >= N || m >= M) continue;
      tile_store<FMT>(w, out, ws, m, r, N, c[4 * j + e]);
    }
  __syncthreads();
#else
  __trap();  // launched only on sm_90 devices (wg_tile_ok), which run the sm_90a code
#endif
}

// Grouped (class 2 of classify_groups_kernel: groups of more than 16 tokens): a persistent grid over (listed group,
// 64-token tile, 128-row tile) items, row tiles innermost (blocks running together share a token tile and the
// group's weights in L2). The listed groups' token-tile prefix sums are made once per block in shared memory after
// the stages (n_listed + 1 entries, at most kTileMaxGroups). FMT: the table's one format (two stages, two blocks
// per SM, as the single kernel), or kTileMixed: each item takes its weight's format (three stages, one block).
constexpr int kTileMaxGroups = 1024, kTileMixed = -2;
template <int FMT>
__host__ __device__ constexpr int tile_grouped_stages() {
  return FMT == kTileMixed ? 3 : 2;
}
// kWg (FP8 tables): each item on wg_block (wgmma) instead of tile_block.
template <int FMT, bool kWg = false>
__host__ __device__ constexpr int tile_grouped_smem() {
  constexpr int st = tile_grouped_stages<FMT>();
  constexpr int stages =
      kWg                 ? kWgSmem
      : FMT == kTileMixed ? (tile_smem<kFmtBF16, st>() > tile_smem<kFmtFp8Block, st>() ? tile_smem<kFmtBF16, st>()
                                                                                       : tile_smem<kFmtFp8Block, st>())
                          : tile_smem<FMT, st>();
  return stages + (kTileMaxGroups + 1) * 4;
}
template <int FMT, bool kWg = false>
__global__ void __launch_bounds__(kStcThreads, FMT == kTileMixed ? 1 : 2)
    tile_grouped_kernel(const WDesc* table, const int64_t* offsets, const int32_t* list, const int32_t* count,
                        int64_t rows, const uint16_t* x, int64_t ldx, SmallOut out) {
  constexpr int kSt = tile_grouped_stages<FMT>();
  int32_t* prefix =
      reinterpret_cast<int32_t*>(tile_smem_buf + tile_grouped_smem<FMT, kWg>() - (kTileMaxGroups + 1) * 4);
  const int n_listed = *count;
  if (threadIdx.x == 0) {
    int32_t acc = 0;
    for (int i = 0; i < n_listed; ++i) {
      prefix[i] = acc;
      const int64_t g = list[i];
      acc += static_cast<int32_t>((offsets[g + 1] - offsets[g] + kTileToks - 1) / kTileToks);
    }
    prefix[n_listed] = acc;
  }
  __syncthreads();
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows, items = prefix[n_listed] * row_tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t tt = item / row_tiles, rt = item % row_tiles;
    int lo = 0, hi = n_listed - 1;  // the listed group holding token tile tt: the last i with prefix[i] <= tt
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (prefix[mid] <= tt)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int64_t g = list[lo], m0 = offsets[g] + (tt - prefix[lo]) * kTileToks, m1 = offsets[g + 1];
    const WDesc& w = table[g];
    if constexpr (kWg) {
      if (w.nan_free)
        wg_block<FMT, false>(tile_smem_buf, w, m0, m1, rt * kTileRows, 0, w.cols / 128, x, ldx, out, nullptr);
      else
        wg_block<FMT, true>(tile_smem_buf, w, m0, m1, rt * kTileRows, 0, w.cols / 128, x, ldx, out, nullptr);
    } else if constexpr (FMT != kTileMixed) {
      tile_block<FMT, kSt>(tile_smem_buf, w, m0, m1, rt * kTileRows, 0, w.cols / 128, x, ldx, out, nullptr);
    } else {
      if (w.format == kFmtBF16)
        tile_block<kFmtBF16, kSt>(tile_smem_buf, w, m0, m1, rt * kTileRows, 0, w.cols / 128, x, ldx, out, nullptr);
      else if (w.format == kFmtFp8Block)
        tile_block<kFmtFp8Block, kSt>(tile_smem_buf, w, m0, m1, rt * kTileRows, 0, w.cols / 128, x, ldx, out, nullptr);
      else
        tile_block<kFmtFp8, kSt>(tile_smem_buf, w, m0, m1, rt * kTileRows, 0, w.cols / 128, x, ldx, out, nullptr);
    }
  }
}

// Single weight: block x = (row tile, token tile) with token tiles innermost (blocks running together share a row
// tile in L2; x of a prefill chunk stays in L2), y = K part.
template <int FMT, bool kNan>
__global__ void __launch_bounds__(kStcThreads, 2)
    wg_tile_kernel(WDesc w, int64_t M, const uint16_t* x, int64_t ldx, SmallOut out, float* ws, int kb_per_part) {
  const int64_t tok_tiles = (M + kTileToks - 1) / kTileToks;
  const int64_t tt = blockIdx.x % tok_tiles, rt = blockIdx.x / tok_tiles;
  const int64_t nkb = w.cols / 128, kb_begin = static_cast<int64_t>(blockIdx.y) * kb_per_part;
  const int64_t kb_end = kb_begin + kb_per_part < nkb ? kb_begin + kb_per_part : nkb;
  wg_block<FMT, kNan>(tile_smem_buf, w, tt * kTileToks, M, rt * kTileRows, kb_begin, kb_end, x, ldx, out,
                      ws ? ws + static_cast<int64_t>(blockIdx.y) * M * w.rows : nullptr);
}

// The K parts of a split tiled matmul added in part order, then the per-tensor / per-channel scale and the store.
__global__ void tile_reduce_kernel(const float* ws, int parts, int64_t M, WDesc w, SmallOut out) {
  const int64_t N = w.rows, total = M * N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = ws[i];
    for (int z = 1; z < parts; ++z) v += ws[z * total + i];
    tile_store<kFmtFp8>(w, out, nullptr, i / N, i % N, N, v);
  }
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

// The K split of a tiled matmul: the smallest part count minimizing (waves of blocks at two blocks per SM, as
// tile_kernel<FMT, 2, 2> runs) × (128-column blocks per part) plus the workspace's write and read (a part's 64 × 128
// fp32 sums, twice, in units of a weight stage), parts of at least two column blocks, at most 32. (At one block per
// SM, the rule before: o_proj [7168 × 16384] at 64 tokens split in 2 parts, 112 blocks on 132 SMs, 12.5 % achieved
// occupancy under ncu on an H100.)
int tile_splits(const WDesc& w, int64_t M) {
  const int64_t sms = 2 * stc_sm_count(),
                nb = ((w.rows + kTileRows - 1) / kTileRows) * ((M + kTileToks - 1) / kTileToks);
  const int64_t nkb = w.cols / 128;
  if (nb >= sms || nkb < 4) return 1;
  const double ws_units = 2.0 * kTileToks * kTileRows * 4 /
                          (w.format == kFmtBF16 ? tile_w_bytes<kFmtBF16>() : tile_w_bytes<kFmtFp8Block>());
  int best = 1;
  double best_t = 1e300;
  for (int s = 1; s <= 32 && nkb / s >= 2; ++s) {
    const int64_t per = (nkb + s - 1) / s;
    if ((nkb + per - 1) / per != s) continue;  // s parts of `per` blocks leave one empty
    const double t = static_cast<double>((nb * s + sms - 1) / sms * per) + (s > 1 ? ws_units * nb * s / sms : 0.0);
    if (t < best_t - 1e-9) {
      best_t = t;
      best = s;
    }
  }
  return best;
}

size_t tile_ws_bytes(const WDesc& w, int64_t M) {
  const int s = tile_splits(w, M);
  return s > 1 ? static_cast<size_t>(s) * static_cast<size_t>(M * w.rows) * sizeof(float) : 0;
}

bool wg_tile_ok() {
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0;
  }();
  return ok;
}

void launch_matmul_tile(const WDesc& w, TView x, int64_t M, TView y, const LinEpi& e, float* ws, cudaStream_t st,
                        bool wgmma) {
  if (M <= 0 || w.rows <= 0) return;
  SmallOut out;
  out.y = y;
  out.bias = e.bias;
  out.gate = e.gate;
  out.residual = e.residual;
  const int parts = tile_splits(w, M);
  const int64_t nkb = w.cols / 128, per = (nkb + parts - 1) / parts;
  if (wgmma && w.format != kFmtBF16 && M <= kWgMaxRows && wg_tile_ok()) {
    const dim3 grid(static_cast<unsigned>(((w.rows + kTileRows - 1) / kTileRows) * ((M + kTileToks - 1) / kTileToks)),
                    static_cast<unsigned>(parts));
    const auto* xb = static_cast<const uint16_t*>(x.p);
    float* part_ws = parts > 1 ? ws : nullptr;
#define LATENT_WG_LAUNCH(FMT, NAN)                                                                                     \
  {                                                                                                                    \
    static const cudaError_t attr =                                                                                    \
        cudaFuncSetAttribute(wg_tile_kernel<FMT, NAN>, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgSmem);          \
    (void)attr;                                                                                                        \
    wg_tile_kernel<FMT, NAN><<<grid, kStcThreads, kWgSmem, st>>>(w, M, xb, x.ld, out, part_ws, static_cast<int>(per)); \
  }
    const bool nan = w.nan_free == 0;
    if (w.format == kFmtFp8Block) {
      if (nan)
        LATENT_WG_LAUNCH(kFmtFp8Block, true)
      else
        LATENT_WG_LAUNCH(kFmtFp8Block, false)
    } else {
      if (nan)
        LATENT_WG_LAUNCH(kFmtFp8, true)
      else
        LATENT_WG_LAUNCH(kFmtFp8, false)
    }
#undef LATENT_WG_LAUNCH
    if (parts > 1) {
      const int64_t total = M * w.rows;
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, stc_sm_count() * 8));
      tile_reduce_kernel<<<blocks, 256, 0, st>>>(ws, parts, M, w, out);
    }
    return;
  }
  const dim3 grid(static_cast<unsigned>((w.rows + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>((M + kTileToks - 1) / kTileToks), static_cast<unsigned>(parts));
  const auto* xb = static_cast<const uint16_t*>(x.p);
  float* part_ws = parts > 1 ? ws : nullptr;
  // Two stages at two blocks per SM (≤ 128 registers): faster than three or four stages at one block per SM at
  // every size measured (cuda_bench skinny, H100, 2026-12-06).
#define LATENT_TILE_LAUNCH(FMT, BF16)                                                                          \
  {                                                                                                            \
    static const cudaError_t attr = cudaFuncSetAttribute(                                                      \
        tile_kernel<FMT, 2, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, tile_smem<FMT, 2>());             \
    (void)attr;                                                                                                \
    tile_kernel<FMT, 2, 2>                                                                                     \
        <<<grid, kStcThreads, tile_smem<FMT, 2>(), st>>>(w, M, xb, x.ld, out, part_ws, static_cast<int>(per)); \
  }
  if (w.format == kFmtBF16)
    LATENT_TILE_LAUNCH(kFmtBF16, true)
  else if (w.format == kFmtFp8Block)
    LATENT_TILE_LAUNCH(kFmtFp8Block, false)
  else
    LATENT_TILE_LAUNCH(kFmtFp8, false)
#undef LATENT_TILE_LAUNCH
  if (parts > 1) {
    const int64_t total = M * w.rows;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, stc_sm_count() * 8));
    tile_reduce_kernel<<<blocks, 256, 0, st>>>(ws, parts, M, w, out);
  }
}

bool launch_grouped_tile(const WDesc* table, int64_t n_groups, int64_t rows, const int64_t* offsets, TView x,
                         const SmallOut& out, const int32_t* lists, const int32_t* counts, cudaStream_t st,
                         int tile_fmt, bool wgmma) {
  if (n_groups > kTileMaxGroups) return false;
  const unsigned sms = static_cast<unsigned>(stc_sm_count());
  const auto* xb = static_cast<const uint16_t*>(x.p);
  const int32_t* l2 = lists + 2 * n_groups;
  const int32_t* c2 = counts + 2;
#define LATENT_TILE_GROUPED(FMT, BLOCKS, WG)                                                                      \
  {                                                                                                               \
    static const cudaError_t attr = cudaFuncSetAttribute(                                                         \
        tile_grouped_kernel<FMT, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize, tile_grouped_smem<FMT, WG>()); \
    (void)attr;                                                                                                   \
    tile_grouped_kernel<FMT, WG><<<sms*(BLOCKS), kStcThreads, tile_grouped_smem<FMT, WG>(), st>>>(                \
        table, offsets, l2, c2, rows, xb, x.ld, out);                                                             \
  }
  // tile_fmt: the table's one format; the per-tensor / per-channel FP8 kernel also takes mixed FP8 kinds. FP8
  // tables on wgmma where it runs (wgmma, wg_tile_ok).
  const bool wg = wgmma && wg_tile_ok();
  if (tile_fmt == kFmtBF16)
    LATENT_TILE_GROUPED(kFmtBF16, 2, false)
  else if (tile_fmt == kFmtFp8Block && wg)
    LATENT_TILE_GROUPED(kFmtFp8Block, 2, true)
  else if (tile_fmt == kFmtFp8Block)
    LATENT_TILE_GROUPED(kFmtFp8Block, 2, false)
  else if ((tile_fmt == kFmtFp8Tensor || tile_fmt == kFmtFp8Channel) && wg)
    LATENT_TILE_GROUPED(kFmtFp8, 2, true)
  else if (tile_fmt == kFmtFp8Tensor || tile_fmt == kFmtFp8Channel)
    LATENT_TILE_GROUPED(kFmtFp8, 2, false)
  else if (tile_fmt == kFmtMxfp4)
    LATENT_TILE_GROUPED(kFmtMxfp4, 2, false)
  else
    LATENT_TILE_GROUPED(kTileMixed, 1, false)
#undef LATENT_TILE_GROUPED
  return true;
}

void launch_grouped_stc(const WDesc* table, int64_t n_groups, int64_t rows, const int64_t* offsets, TView x, TView y,
                        const LinEpi& e, const int32_t* lists, const int32_t* counts, cudaStream_t st, bool tile,
                        int tile_fmt, int64_t pairs, bool wgmma) {
  SmallOut out;
  out.y = y;
  out.bias = e.bias;
  out.gate = e.gate;
  out.residual = e.residual;
  const unsigned grid = static_cast<unsigned>(stc_sm_count() * 4);
  const auto* xb = static_cast<const uint16_t*>(x.p);
  const int64_t tiles = (rows + 15) / 16;
  // Class 1 (2 .. 16 tokens: one pass of 16; class 0 is the caller's), class 2 (the tiled kernel, or passes of 32).
  // FP8 tables at two blocks per SM (≤ 128 registers), BF16 at one (729 -> 909 us at three). H100, 128 experts x 4
  // tokens, [4096 x 7168] / [7168 x 2048] (cuda_bench skinny grouped, 2026-12-07): two blocks 1,606 / 960 us, three
  // (80 registers, 192 bytes spilled) 2,121 / 1,697, three with one 128-column block per round 2,028 / 1,505, one
  // block 2,376 / 1,515.
  const bool fp8 = tile_fmt == kFmtFp8Block || tile_fmt == kFmtFp8Tensor || tile_fmt == kFmtFp8Channel;
  if (fp8)
    stc_grouped_kernel<2, 2>
        <<<grid, kStcThreads, 0, st>>>(table, offsets, lists, counts, n_groups, 1, 2, tiles, xb, x.ld, out);
  else
    stc_grouped_kernel<2>
        <<<grid, kStcThreads, 0, st>>>(table, offsets, lists, counts, n_groups, 1, 2, tiles, xb, x.ld, out);
  if (!may_have_class2(pairs)) return;
  const bool wg = wgmma && pairs >= 0 && pairs <= kWgMaxPairs;
  if (!tile || !launch_grouped_tile(table, n_groups, rows, offsets, x, out, lists, counts, st, tile_fmt, wg))
    stc_grouped_kernel<4>
        <<<grid, kStcThreads, 0, st>>>(table, offsets, lists, counts, n_groups, 2, 3, tiles, xb, x.ld, out);
}

}  // namespace latent::cuda
