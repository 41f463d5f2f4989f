// Linear ops on the GPU: matmul / grouped_matmul for every stored weight format, embedding.
//  * M ≤ kSmallRows (decode, skinny): one block computes kR output rows for up to kMC tokens at a time; its threads
//    split the rows (split-K) in 16-byte chunks of stored weight bytes, decoded in registers (bf16/f16: 8 values,
//    fp8: 16 through the hardware e4m3→f16 conversion, mxfp4: 32 as fp16 bit patterns), the chunk's scale applied
//    once to its partial sum, fp32 accumulation per thread, the cross-thread reduction (warp shuffles, then shared
//    memory in a fixed order) in fp64 in a fixed order. Rows whose bytes are not 16-byte aligned (odd sizes) take the
//    element-wise path (one value at a time).
//  * larger M (prefill): a 64×64 fp32 tiled kernel; weight tiles are dequantized element-wise into shared memory.
//  * larger M in the bf16 activation mode (x values are bf16): a 64×64 tensor-core kernel (bf16 wmma, fp32
//    accumulators) for the formats whose weight values, or codes, are exact bf16 values — BF16, MXFP4 (e2m1 × 2^e)
//    and FP8 (e4m3 codes): FP8 multiplies the raw codes and applies each 128×128 block's fp32 scale to that block's
//    fp32 partial sum (per-channel / per-tensor scales to the finished sum), so no weight is ever rounded.
//  * grouped: the group offsets live on the device, so both kernels are launched over all groups and each block
//    reads its group's row range; the small kernel takes groups of ≤ kSmallRows rows, the tiled one the others.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <mma.h>

#include "kernels/cuda/cuda_skinny.cuh"

namespace latent::cuda {

namespace {

constexpr int kWarps = 8;  // warps per block; they split the row (K) between them
constexpr int kThreads = kWarps * 32;
constexpr int kMC = 4;  // tokens per pass (M > 1)
// Output rows per block: 4 at M = 1 (activations reused over 4 rows), 2 for the 4-token passes (registers).
template <int MC>
__host__ __device__ constexpr int rows_per_block() {
  return MC == 1 ? 4 : 2;
}
constexpr int64_t kSmallRows = 16;
static_assert(!may_have_class2(kSmallRows) && may_have_class2(kSmallRows + 1), "class 2: groups above kSmallRows");
// Matrices of kWarpKernelMinRows .. kWarpKernelMaxRows rows take a warp per row (more independent work items than a
// block per 4 rows); fewer rows (kv_a's 576, the router's 256, the DSA indexer's 32 / 128) a block per 4 rows, each
// row split over the block's 8 warps (as for kWarpKernelMaxRows rows and more): a warp per row keeps too few
// loads in flight for so few rows (kv_a 576 x 6144 at M = 1 read at 15.7 % of the H200's bandwidth in the model's
// eager profile; split over a block, 28 % in `cuda_bench matmul`).
constexpr int64_t kWarpKernelMinRows = 1024;
constexpr int64_t kWarpKernelMaxRows = 4096;

// Elements per 16-byte chunk of stored weight bytes.
template <int FMT>
__host__ __device__ constexpr int chunk_elems() {
  return FMT == kFmtF32 ? 4 : (FMT == kFmtBF16 || FMT == kFmtF16) ? 8 : FMT == kFmtMxfp4 ? 32 : 16;
}
// Elements decoded per step (one or two float4 of activations).
template <int FMT>
__host__ __device__ constexpr int step_elems() {
  return FMT == kFmtMxfp4 ? 8 : 4;
}

__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t bits) {
  __half2_raw raw;
  raw.x = static_cast<unsigned short>(bits & 0xFFFFu);
  raw.y = static_cast<unsigned short>(bits >> 16);
  return __half22float2(__half2(raw));
}

// Step st of a chunk decoded into v[0 .. step_elems): v[e] pairs with activation st·step_elems + e. Values are the
// stored codes' values before the chunk's scale (mxfp4: times 2^-14, undone once per chunk).
template <int FMT>
__device__ __forceinline__ void decode_step(const uint4& raw, int st, bool fnuz, float (&v)[8]) {
  if constexpr (FMT == kFmtF32) {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = __uint_as_float(word_of(raw, e));
  } else if constexpr (FMT == kFmtBF16) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t w = word_of(raw, 2 * st + (e >> 1));
      v[e] = __uint_as_float((e & 1) ? (w & 0xFFFF0000u) : (w << 16));
    }
  } else if constexpr (FMT == kFmtF16) {
    const float2 a = half2_bits_to_float2(word_of(raw, 2 * st)), b = half2_bits_to_float2(word_of(raw, 2 * st + 1));
    v[0] = a.x;
    v[1] = a.y;
    v[2] = b.x;
    v[3] = b.y;
  } else if constexpr (FMT == kFmtMxfp4) {
    // Two nibbles (j, j+4) of the word at once as fp16 bits: magnitude (e1 e0 m) << 9, sign << 12 — an fp16 whose
    // value is e2m1 · 2^-14 (subnormal for e = 0), converted exactly to fp32.
    const uint32_t w = word_of(raw, st);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t x = w >> (4 * j);
      const float2 f = half2_bits_to_float2(((x & 0x00070007u) << 9) | ((x & 0x00080008u) << 12));
      v[j] = f.x;
      v[j + 4] = f.y;
    }
  } else {  // fp8 e4m3 (fn: hardware conversion; fnuz: bit decode)
    const uint32_t w = word_of(raw, st);
    if (!fnuz) {
      const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFFu), __NV_E4M3);
      const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
      const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
      v[0] = a.x;
      v[1] = a.y;
      v[2] = b.x;
      v[3] = b.y;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = e4m3_to_f(w >> (8 * e), true);
    }
  }
}

// Four consecutive activations as floats: fp32 (one 16-byte load) or bf16 storage (one 8-byte load).
__device__ __forceinline__ float4 load4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 load4(const uint16_t* p) {
  const uint2 q = __ldg(reinterpret_cast<const uint2*>(p));
  return make_float4(__uint_as_float(q.x << 16), __uint_as_float(q.x & 0xFFFF0000u), __uint_as_float(q.y << 16),
                     __uint_as_float(q.y & 0xFFFF0000u));
}
__device__ __forceinline__ float load1(const float* p) { return *p; }
__device__ __forceinline__ float load1(const uint16_t* p) { return bf16_bits_to_f(*p); }

// acc[i][m] += Σ_c W[r_i][c] · x[m][c] over this thread's chunks (chunk ch = tid, tid + kThreads, ...); row m of x
// at x + m·ldx.
template <int FMT, int MC, class XT, int kR = rows_per_block<MC>(), int STRIDE = kThreads>
__device__ __forceinline__ void rows_dot_vec(const WDesc& w, const int64_t (&r)[kR], const XT* x, int64_t K,
                                             int64_t ldx, int nm, float (&acc)[kR][MC], int tid) {
  constexpr int E = chunk_elems<FMT>(), U = step_elems<FMT>();
  constexpr bool kScaled = FMT == kFmtFp8Block || FMT == kFmtFp8Tensor || FMT == kFmtFp8Channel || FMT == kFmtMxfp4;
  const int64_t nch = K / E;
  const bool fnuz = w.fnuz != 0;
  const uint4* rowp[kR];
  float rs[kR];
  const float* srow[kR];  // block FP8: the row's scale row
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    rowp[i] = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w.data) + r[i] * w.row_bytes);
    rs[i] = 1.0f;
    srow[i] = nullptr;
    if constexpr (FMT == kFmtFp8Tensor) rs[i] = static_cast<const float*>(w.scale)[0];
    if constexpr (FMT == kFmtFp8Channel) rs[i] = static_cast<const float*>(w.scale)[r[i]];
    if constexpr (FMT == kFmtFp8Block)
      srow[i] = static_cast<const float*>(w.scale) + (r[i] / w.block_rows) * w.scale_cols;
  }
  // Block FP8: chunk ch lies in scale block ch / cpb (vec_ok: block_cols % 16 == 0), a shift when cpb is a power of
  // two (no 64-bit division per chunk).
  const int cpb = FMT == kFmtFp8Block ? w.block_cols / E : 1;
  const int cshift = (cpb & (cpb - 1)) == 0 ? __ffs(cpb) - 1 : -1;
#pragma unroll 2
  for (int64_t ch = tid; ch < nch; ch += STRIDE) {
    uint4 raw[kR];
    if (FMT == kFmtMxfp4 && w.tiled) {  // 16-byte piece ch of each row in the tile-major order
#pragma unroll
      for (int i = 0; i < kR; ++i) raw[i] = __ldcs(reinterpret_cast<const uint4*>(mx_code_ptr(w, r[i], 16 * ch)));
    } else {
#pragma unroll
      for (int i = 0; i < kR; ++i) raw[i] = __ldcs(rowp[i] + ch);
    }
    if constexpr (FMT == kFmtMxfp4)
      if (w.swz)
#pragma unroll
        for (int i = 0; i < kR; ++i)
          raw[i] = make_uint4(mx_unswizzle(raw[i].x), mx_unswizzle(raw[i].y), mx_unswizzle(raw[i].z),
                              mx_unswizzle(raw[i].w));
    float sc[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      sc[i] = rs[i];
      if constexpr (FMT == kFmtFp8Block) sc[i] = srow[i][cshift >= 0 ? (ch >> cshift) : ch / cpb];
      if constexpr (FMT == kFmtMxfp4) sc[i] = e8m0_to_f(static_cast<const uint8_t*>(w.scale)[r[i] * w.scale_cols + ch]);
    }
    float part[kR][MC];
#pragma unroll
    for (int i = 0; i < kR; ++i)
#pragma unroll
      for (int m = 0; m < MC; ++m) part[i][m] = 0.0f;
#pragma unroll
    for (int st = 0; st < E / U; ++st) {
      float xv[MC][8];
#pragma unroll
      for (int m = 0; m < MC; ++m) {
#pragma unroll
        for (int h = 0; h < U / 4; ++h) {
          float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          if (m < nm) q = load4(x + m * ldx + ch * E + st * U + 4 * h);
          xv[m][4 * h] = q.x;
          xv[m][4 * h + 1] = q.y;
          xv[m][4 * h + 2] = q.z;
          xv[m][4 * h + 3] = q.w;
        }
      }
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        float v[8];
        decode_step<FMT>(raw[i], st, fnuz, v);
#pragma unroll
        for (int m = 0; m < MC; ++m)
#pragma unroll
          for (int e = 0; e < U; ++e) part[i][m] = fmaf(v[e], xv[m][e], part[i][m]);
      }
    }
#pragma unroll
    for (int i = 0; i < kR; ++i)
#pragma unroll
      for (int m = 0; m < MC; ++m) {
        if constexpr (FMT == kFmtMxfp4)
          acc[i][m] = fmaf(part[i][m] * 16384.0f, sc[i], acc[i][m]);
        else if constexpr (kScaled)
          acc[i][m] = fmaf(part[i][m], sc[i], acc[i][m]);
        else
          acc[i][m] += part[i][m];
      }
  }
}

template <int MC, class XT, int kR = rows_per_block<MC>(), int STRIDE = kThreads>
__device__ __forceinline__ void rows_dot_generic(const WDesc& w, const int64_t (&r)[kR], const XT* x, int64_t K,
                                                 int64_t ldx, int nm, float (&acc)[kR][MC], int tid) {
  for (int64_t c = tid; c < K; c += STRIDE) {
    float xv[MC];
#pragma unroll
    for (int m = 0; m < MC; ++m) xv[m] = m < nm ? load1(x + m * ldx + c) : 0.0f;
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const float wv = wget(w, r[i], c);
#pragma unroll
      for (int m = 0; m < MC; ++m) acc[i][m] = fmaf(wv, xv[m], acc[i][m]);
    }
  }
}

template <class XT>
__device__ __forceinline__ bool vec_ok(const WDesc& w, const XT* x, int64_t ldx) {
  int e = 16;
  switch (w.format) {
    case kFmtF32: e = 4; break;
    case kFmtBF16:
    case kFmtF16: e = 8; break;
    case kFmtMxfp4: e = 32; break;
    case kFmtFp8Block:
      if (w.block_cols % 16 != 0) return false;
      break;
    default: break;
  }
  return w.row_bytes % 16 == 0 && (reinterpret_cast<uintptr_t>(w.data) & 15) == 0 && w.cols % e == 0 &&
         (reinterpret_cast<uintptr_t>(x) & (4 * sizeof(XT) - 1)) == 0 && ldx % 4 == 0;
}

// Grouped matmuls classify their groups on the device by row count — class 0: one row, 1: 2 .. kSmallRows rows,
// 2: more — into ordered lists (lists[c * n_groups + i], counts[c]); the kernels below then run persistent grids
// over (listed group, row tile) items, so that empty groups cost nothing. One block.
__global__ void __launch_bounds__(256) classify_groups_kernel(const int64_t* offsets, const WDesc* table,
                                                              int64_t n_groups, int32_t* lists, int32_t* counts) {
  __shared__ unsigned int wc[3][8];
  __shared__ int base[3];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x < 3) base[threadIdx.x] = 0;
  __syncthreads();
  for (int64_t c0 = 0; c0 < n_groups; c0 += blockDim.x) {
    const int64_t g = c0 + threadIdx.x;
    int cls = -1;
    if (g < n_groups && table[g].data != nullptr) {
      const int64_t cnt = offsets[g + 1] - offsets[g];
      cls = cnt <= 0 ? -1 : cnt == 1 ? 0 : cnt <= kSmallRows ? 1 : 2;
    }
    unsigned int ball[3];
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      ball[c] = __ballot_sync(0xFFFFFFFFu, cls == c);
      if (lane == 0) wc[c][warp] = __popc(ball[c]);
    }
    __syncthreads();
    if (cls >= 0) {
      int pos = base[cls] + __popc(ball[cls] & ((1u << lane) - 1u));
      for (int w = 0; w < warp; ++w) pos += static_cast<int>(wc[cls][w]);
      lists[cls * n_groups + pos] = static_cast<int32_t>(g);
    }
    __syncthreads();
    if (threadIdx.x < 3)
      for (int w = 0; w < 8; ++w) base[threadIdx.x] += static_cast<int>(wc[threadIdx.x][w]);
    __syncthreads();
  }
  if (threadIdx.x < 3) counts[threadIdx.x] = base[threadIdx.x];
}

// Rows rbase .. rbase+kR of W times tokens m0 .. m1 of x (kThreads threads split each row).
template <int MC, class XT>
__device__ __forceinline__ void small_rows(const WDesc& w, int64_t m0, int64_t m1, int64_t rbase, const XT* x,
                                           int64_t ldx, const SmallOut& out,
                                           double (&red)[kWarps][rows_per_block<MC>() * MC]) {
  constexpr int kR = rows_per_block<MC>();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t N = w.rows, K = w.cols;
  int64_t r[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) r[i] = rbase + i < N ? rbase + i : N - 1;  // clamped: loads stay in bounds
  const bool vec = vec_ok(w, x + m0 * ldx, ldx);
  for (int64_t mb = m0; mb < m1; mb += MC) {
    const int nm = static_cast<int>(m1 - mb < MC ? m1 - mb : MC);
    float acc[kR][MC];
#pragma unroll
    for (int i = 0; i < kR; ++i)
#pragma unroll
      for (int m = 0; m < MC; ++m) acc[i][m] = 0.0f;
    const XT* xb = x + mb * ldx;
    if (vec) {
      switch (w.format) {
        case kFmtF32: rows_dot_vec<kFmtF32, MC>(w, r, xb, K, ldx, nm, acc, tid); break;
        case kFmtBF16: rows_dot_vec<kFmtBF16, MC>(w, r, xb, K, ldx, nm, acc, tid); break;
        case kFmtF16: rows_dot_vec<kFmtF16, MC>(w, r, xb, K, ldx, nm, acc, tid); break;
        case kFmtFp8Block: rows_dot_vec<kFmtFp8Block, MC>(w, r, xb, K, ldx, nm, acc, tid); break;
        case kFmtFp8Tensor: rows_dot_vec<kFmtFp8Tensor, MC>(w, r, xb, K, ldx, nm, acc, tid); break;
        case kFmtFp8Channel: rows_dot_vec<kFmtFp8Channel, MC>(w, r, xb, K, ldx, nm, acc, tid); break;
        case kFmtMxfp4: rows_dot_vec<kFmtMxfp4, MC>(w, r, xb, K, ldx, nm, acc, tid); break;
        default: break;
      }
    } else {
      rows_dot_generic<MC>(w, r, xb, K, ldx, nm, acc, tid);
    }
#pragma unroll
    for (int i = 0; i < kR; ++i)
#pragma unroll
      for (int m = 0; m < MC; ++m) {
        const double v = warp_sum_d(static_cast<double>(acc[i][m]));
        if (lane == 0) red[warp][i * MC + m] = v;
      }
    __syncthreads();
    if (tid < kR * MC) {
      const int i = tid / MC, m = tid % MC;
      double v = 0.0;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) v += red[k][tid];
      if (rbase + i < N && m < nm) small_store(out, mb + m, rbase + i, N, static_cast<float>(v));
    }
    __syncthreads();
  }
}

// Single weight: grid = row tiles, tokens [0, M). MC = tokens per pass (1 for M = 1, else kMC).
template <int MC, class XT>
__global__ void __launch_bounds__(kThreads) small_kernel(WDesc w, int64_t M, const XT* x, int64_t ldx, SmallOut out) {
  __shared__ double red[kWarps][rows_per_block<MC>() * MC];
  small_rows<MC>(w, 0, M, static_cast<int64_t>(blockIdx.x) * rows_per_block<MC>(), x, ldx, out, red);
}

// Grouped: a persistent grid over (group of `list`, row tile) items; tokens offsets[g] .. offsets[g+1].
template <int MC, class XT>
__global__ void __launch_bounds__(kThreads)
    small_grouped_kernel(const WDesc* table, const int64_t* offsets, const int32_t* list, const int32_t* list_count,
                         int64_t tiles, const XT* x, int64_t ldx, SmallOut out) {
  __shared__ double red[kWarps][rows_per_block<MC>() * MC];
  const int64_t n_items = static_cast<int64_t>(*list_count) * tiles;
  for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
    const int64_t g = list[item / tiles];
    small_rows<MC>(table[g], offsets[g], offsets[g + 1], (item % tiles) * rows_per_block<MC>(), x, ldx, out, red);
  }
}

// One warp per tile of KR rows of W (tokens m0 .. m1 in passes of MC): the lanes split each row in 16-byte chunks,
// the fp64 reduction is a warp shuffle (no block barrier), so that matrices with few rows and expert groups of few
// tokens get many independent work items.
template <int MC, class XT, int KR>
__device__ __forceinline__ void warp_rows(const WDesc& w, int64_t m0, int64_t m1, int64_t rbase, const XT* x,
                                          int64_t ldx, const SmallOut& out, int lane) {
  const int64_t N = w.rows, K = w.cols;
  int64_t r[KR];
#pragma unroll
  for (int i = 0; i < KR; ++i) r[i] = rbase + i < N ? rbase + i : N - 1;
  const bool vec = vec_ok(w, x + m0 * ldx, ldx);
  for (int64_t mb = m0; mb < m1; mb += MC) {
    const int nm = static_cast<int>(m1 - mb < MC ? m1 - mb : MC);
    float acc[KR][MC];
#pragma unroll
    for (int i = 0; i < KR; ++i)
#pragma unroll
      for (int m = 0; m < MC; ++m) acc[i][m] = 0.0f;
    const XT* xb = x + mb * ldx;
    if (vec) {
      switch (w.format) {
        case kFmtF32: rows_dot_vec<kFmtF32, MC, XT, KR, 32>(w, r, xb, K, ldx, nm, acc, lane); break;
        case kFmtBF16: rows_dot_vec<kFmtBF16, MC, XT, KR, 32>(w, r, xb, K, ldx, nm, acc, lane); break;
        case kFmtF16: rows_dot_vec<kFmtF16, MC, XT, KR, 32>(w, r, xb, K, ldx, nm, acc, lane); break;
        case kFmtFp8Block: rows_dot_vec<kFmtFp8Block, MC, XT, KR, 32>(w, r, xb, K, ldx, nm, acc, lane); break;
        case kFmtFp8Tensor: rows_dot_vec<kFmtFp8Tensor, MC, XT, KR, 32>(w, r, xb, K, ldx, nm, acc, lane); break;
        case kFmtFp8Channel: rows_dot_vec<kFmtFp8Channel, MC, XT, KR, 32>(w, r, xb, K, ldx, nm, acc, lane); break;
        case kFmtMxfp4: rows_dot_vec<kFmtMxfp4, MC, XT, KR, 32>(w, r, xb, K, ldx, nm, acc, lane); break;
        default: break;
      }
    } else {
      rows_dot_generic<MC, XT, KR, 32>(w, r, xb, K, ldx, nm, acc, lane);
    }
#pragma unroll
    for (int i = 0; i < KR; ++i)
#pragma unroll
      for (int m = 0; m < MC; ++m) {
        const double v = warp_sum_d(static_cast<double>(acc[i][m]));
        if (lane == i * MC + m && rbase + i < N && m < nm)
          small_store(out, mb + m, rbase + i, N, static_cast<float>(v));
      }
  }
}

template <int MC, class XT, int KR>
__global__ void __launch_bounds__(256) warp_kernel(WDesc w, int64_t M, const XT* x, int64_t ldx, SmallOut out) {
  const int64_t rbase = (static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5)) * KR;
  if (rbase >= w.rows) return;
  warp_rows<MC, XT, KR>(w, 0, M, rbase, x, ldx, out, threadIdx.x & 31);
}

// Grouped: a persistent grid of warps over (group of `list`, tile of KR rows) items.
// kMinBlocks: one token (MC 1) at two blocks per SM by default (≤ 128 registers; at one the compiler takes 237 and
// halves the warps in flight).
template <int MC, class XT, int KR, int kMinBlocks = MC == 1 ? 2 : 1>
__global__ void __launch_bounds__(256, kMinBlocks)
    warp_grouped_kernel(const WDesc* table, const int64_t* offsets, const int32_t* list, const int32_t* list_count,
                        int64_t tiles, const XT* x, int64_t ldx, SmallOut out) {
  const int64_t n_items = static_cast<int64_t>(*list_count) * tiles;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * 8;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5); item < n_items; item += warps) {
    const int64_t g = list[item / tiles];
    warp_rows<MC, XT, KR>(table[g], offsets[g], offsets[g + 1], (item % tiles) * KR, x, ldx, out, threadIdx.x & 31);
  }
}

// ---- tensor-core skinny kernels: MXFP4 weights × bf16 activations (decode, expert groups) ----
// One warp per tile of 16 weight rows, tokens in passes of 8·NT (mma.sync m16n8k16, bf16 in, fp32 accumulators).
// Lane (g = lane/4, t = lane%4) loads, per 128 columns, the 16-byte MXFP4 block t of rows g and g+8 (the 4 lanes
// of a row read its 64 contiguous bytes) and the 32 activations of that block for token g of each n-tile. The mma's
// k slots are a permutation of the 128 columns shared by A and B: in step s (of 8) lane t's slots {2t, 2t+1} hold
// the columns 4s, 4s+1 and slots {2t+8, 2t+9} the columns 4s+2, 4s+3 of its block. The codes are pair-swizzled on
// the device (mx_layout.h): word s/2 of the block gives those two column pairs as bf16 bit patterns with one shift
// and one AND each (pairs 0, 1 in even steps, 2, 3 in odd ones), and each B register is one activation word as
// loaded. One bf16x2 multiply by 2^(e-1) then gives the exact e2m1 · 2^(e-127) of each value (scale bytes above
// 128: by 2^126, then by the scale; 0xFF: NaN), products and sums in the tensor cores' fp32.
constexpr int kMxChunks = 4;  // 128-column chunks of weights in flight per lane

// The A fragments of one 16-column step s of a chunk (rows g and g + 8 of a 16-row tile) and its mma with every
// n-tile's activations.
// POST false: no lane's scale byte of this chunk is above 128 (the usual case: weights well under 2 in magnitude),
// so the second multiply is left out — the same values.
template <int NT, bool POST = true>
__device__ __forceinline__ void mx_tc_step(int s, const uint4& wa, const uint4& wb, uint32_t ma, uint32_t posta,
                                           uint32_t mbm, uint32_t postb, const uint32_t (&xr)[NT][16],
                                           float (&c)[NT][4]) {
  const uint32_t wwa = word_of(wa, s >> 1), wwb = word_of(wb, s >> 1);
  uint32_t a0, a1, a2, a3;
  if (s & 1) {
    a0 = mx_swz_a<2, POST>(wwa, ma, posta);
    a1 = mx_swz_a<2, POST>(wwb, mbm, postb);
    a2 = mx_swz_a<3, POST>(wwa, ma, posta);
    a3 = mx_swz_a<3, POST>(wwb, mbm, postb);
  } else {
    a0 = mx_swz_a<0, POST>(wwa, ma, posta);
    a1 = mx_swz_a<0, POST>(wwb, mbm, postb);
    a2 = mx_swz_a<1, POST>(wwa, ma, posta);
    a3 = mx_swz_a<1, POST>(wwb, mbm, postb);
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) mma_bf16_16816(c[n], a0, a1, a2, a3, xr[n][2 * s], xr[n][2 * s + 1]);
}

// The activations of 128-column chunk kb for the lanes' tokens (zero where a lane's token is past the pass).
template <int NT>
__device__ __forceinline__ void mx_tc_load_x(const uint4* const (&xp)[NT], const bool (&has)[NT], int64_t kb,
                                             uint32_t (&xr)[NT][16]) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 v = has[n] ? __ldg(xp[n] + 16 * kb + q) : make_uint4(0u, 0u, 0u, 0u);
      xr[n][4 * q] = v.x;
      xr[n][4 * q + 1] = v.y;
      xr[n][4 * q + 2] = v.z;
      xr[n][4 * q + 3] = v.w;
    }
}

// One 128-column chunk: the 8 mma steps of the up (or only) weight's slices wa / wb (scale bytes ea / eb), and with
// GLU of the gate's ga / gb (fa / fb) into cg.
template <int NT, bool GLU>
__device__ __forceinline__ void mx_tc_chunk(const uint4& wa, const uint4& wb, uint32_t ea, uint32_t eb, const uint4& ga,
                                            const uint4& gb, uint32_t fa, uint32_t fb, const uint32_t (&xr)[NT][16],
                                            float (&c)[NT][4], float (&cg)[NT][4]) {
  uint32_t posta, postb;
  const uint32_t ma = mx_mult(ea, posta), mbm = mx_mult(eb, postb);
  // (One token pass only: two copies of the steps cost the NT = 2 kernel its second block per SM.)
  if (NT > 1 || __any_sync(0xFFFFFFFFu, (posta | postb) != 0u)) {
#pragma unroll
    for (int s = 0; s < 8; ++s) mx_tc_step<NT, true>(s, wa, wb, ma, posta, mbm, postb, xr, c);
  } else {
#pragma unroll
    for (int s = 0; s < 8; ++s) mx_tc_step<NT, false>(s, wa, wb, ma, posta, mbm, postb, xr, c);
  }
  if constexpr (GLU) {
    uint32_t pga, pgb;
    const uint32_t mga = mx_mult(fa, pga), mgb = mx_mult(fb, pgb);
    if (NT > 1 || __any_sync(0xFFFFFFFFu, (pga | pgb) != 0u)) {
#pragma unroll
      for (int s = 0; s < 8; ++s) mx_tc_step<NT, true>(s, ga, gb, mga, pga, mgb, pgb, xr, cg);
    } else {
#pragma unroll
      for (int s = 0; s < 8; ++s) mx_tc_step<NT, false>(s, ga, gb, mga, pga, mgb, pgb, xr, cg);
    }
  }
}

// One pass of the tokens mb .. min(mb + 8·NT, m1) (of a group's m0 .. m1) over all of K for the 16-row tile at
// rbase: its fp32 accumulators c and, GLU (wg non-null), cg of the same tile of the gate weight wg (same shape).
template <int NT, bool GLU>
__device__ __forceinline__ void mx_tc_pass(const WDesc& w, int64_t m0, int64_t m1, int64_t mb, int64_t rbase,
                                           const uint16_t* x, int64_t ldx, int lane, const WDesc* wg, float (&c)[NT][4],
                                           float (&cg)[NT][4]) {
  const int g = lane >> 2, t = lane & 3;
  const int64_t N = w.rows, nkb = w.cols / 128;
  const int64_t ra = rbase + g < N ? rbase + g : N - 1, rb = rbase + g + 8 < N ? rbase + g + 8 : N - 1;
  // Chunk kb of a row at p + ks · kb (uint4 units): ks 4 row-major, 64 tile-major (mx_layout.h).
  const int64_t ks = mx_chunk_stride(w) / 16, kgs = GLU ? mx_chunk_stride(*wg) / 16 : ks;
  const uint4* pa = reinterpret_cast<const uint4*>(mx_code_ptr(w, ra, 16 * t));
  const uint4* pb = reinterpret_cast<const uint4*>(mx_code_ptr(w, rb, 16 * t));
  const uint8_t* sa = static_cast<const uint8_t*>(w.scale) + ra * w.scale_cols + t;
  const uint8_t* sb = static_cast<const uint8_t*>(w.scale) + rb * w.scale_cols + t;
  const uint4 *qa = pa, *qb = pb;
  const uint8_t *ta = sa, *tb = sb;
  if constexpr (GLU) {
    qa = reinterpret_cast<const uint4*>(mx_code_ptr(*wg, ra, 16 * t));
    qb = reinterpret_cast<const uint4*>(mx_code_ptr(*wg, rb, 16 * t));
    ta = static_cast<const uint8_t*>(wg->scale) + ra * wg->scale_cols + t;
    tb = static_cast<const uint8_t*>(wg->scale) + rb * wg->scale_cols + t;
  }
  const uint4* xp[NT];
  bool has[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int64_t tok = mb + 8 * n + g;
    has[n] = tok < m1;
    xp[n] = reinterpret_cast<const uint4*>(x + (has[n] ? tok : m0) * ldx) + 4 * t;
  }
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) c[n][e] = cg[n][e] = 0.0f;
  for (int64_t kb0 = 0; kb0 < nkb; kb0 += kMxChunks) {
    uint4 wa[kMxChunks], wb[kMxChunks], ga[GLU ? kMxChunks : 1], gb[GLU ? kMxChunks : 1];
    uint32_t ea[kMxChunks], eb[kMxChunks], fa[GLU ? kMxChunks : 1], fb[GLU ? kMxChunks : 1];
#pragma unroll
    for (int j = 0; j < kMxChunks; ++j) {
      const int64_t kb = kb0 + j < nkb ? kb0 + j : nkb - 1;  // clamped: loads stay in bounds, results unused
      wa[j] = __ldcs(pa + ks * kb);
      wb[j] = __ldcs(pb + ks * kb);
      ea[j] = __ldg(sa + 4 * kb);
      eb[j] = __ldg(sb + 4 * kb);
      if constexpr (GLU) {
        ga[j] = __ldcs(qa + kgs * kb);
        gb[j] = __ldcs(qb + kgs * kb);
        fa[j] = __ldg(ta + 4 * kb);
        fb[j] = __ldg(tb + 4 * kb);
      }
    }
#pragma unroll
    for (int j = 0; j < kMxChunks; ++j) {
      if (kb0 + j >= nkb) break;
      uint32_t xr[NT][16];
      mx_tc_load_x<NT>(xp, has, kb0 + j, xr);
      constexpr bool kG = GLU;  // (the gate arrays have one element without GLU: index 0 then, unused)
      mx_tc_chunk<NT, GLU>(wa[j], wb[j], ea[j], eb[j], ga[kG ? j : 0], gb[kG ? j : 0], fa[kG ? j : 0], fb[kG ? j : 0],
                           xr, c, cg);
    }
  }
}

// The store of one pass: GLU applies SiLU(gate) · up as the unfused path does (the gate's accumulator rounded to
// the output dtype first: epi_value's gacc).
template <int NT, bool GLU>
__device__ __forceinline__ void mx_tc_store(int64_t N, int64_t m1, int64_t mb, int64_t rbase, const SmallOut& out,
                                            int lane, const float (&c)[NT][4], const float (&cg)[NT][4]) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t r = rbase + g + (e >> 1) * 8, m = mb + 8 * n + 2 * t + (e & 1);
      if (r >= N || m >= m1) continue;
      if constexpr (GLU) {
        const bool bf16 = out.yf == nullptr && out.y.bf16 != 0;
        const float v = epi_value(c[n][e], out.bias, &cg[n][e], TView{}, out.residual, m, r, bf16);
        if (out.yf)
          out.yf[m * N + r] = v;
        else
          tset(out.y, m, r, v);
      } else {
        small_store(out, m, r, N, c[n][e]);
      }
    }
}

// A 16-row tile at rbase over the tokens m0 .. m1 in passes of 8·NT, all of K.
template <int NT, bool GLU = false>
__device__ __forceinline__ void mx_tc_rows(const WDesc& w, int64_t m0, int64_t m1, int64_t rbase, const uint16_t* x,
                                           int64_t ldx, const SmallOut& out, int lane, const WDesc* wg = nullptr) {
  for (int64_t mb = m0; mb < m1; mb += 8 * NT) {
    float c[NT][4], cg[NT][4];
    mx_tc_pass<NT, GLU>(w, m0, m1, mb, rbase, x, ldx, lane, wg, c, cg);
    mx_tc_store<NT, GLU>(w.rows, m1, mb, rbase, out, lane, c, cg);
  }
}

// Single weight: a warp per 16-row tile, tokens [0, M).
template <int NT>
__global__ void __launch_bounds__(256) mx_tc_kernel(WDesc w, int64_t M, const uint16_t* x, int64_t ldx, SmallOut out) {
  const int64_t rbase = (static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5)) * 16;
  if (rbase >= w.rows) return;
  mx_tc_rows<NT>(w, 0, M, rbase, x, ldx, out, threadIdx.x & 31);
}

// Grouped: a persistent grid of warps over (group, 16-row tile) items of the listed groups of classes c0 .. c1-1
// (classify_groups_kernel), each over all its group's tokens.
template <int NT, bool GLU = false>
__global__ void __launch_bounds__(256)
    mx_tc_grouped_kernel(const WDesc* table, const int64_t* offsets, const int32_t* lists, const int32_t* counts,
                         int64_t n_groups, int c0, int c1, int64_t tiles, const uint16_t* x, int64_t ldx, SmallOut out,
                         const WDesc* gtable = nullptr) {
  int64_t n_listed = 0;
  for (int c = c0; c < c1; ++c) n_listed += counts[c];
  const int64_t n_items = n_listed * tiles, warps = static_cast<int64_t>(gridDim.x) * 8;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5); item < n_items; item += warps) {
    int64_t li = item / tiles;
    int c = c0;
    while (li >= counts[c]) li -= counts[c++];
    const int64_t g = lists[c * n_groups + li];
    mx_tc_rows<NT, GLU>(table[g], offsets[g], offsets[g + 1], (item % tiles) * 16, x, ldx, out, threadIdx.x & 31,
                        GLU ? &gtable[g] : nullptr);
  }
}

// The work items of the tiled kernels. Single weight (list == null): grid (row tiles, m-tile strides), tokens
// [0, M). Grouped: a persistent grid over (group of `list`, row tile) items, each looping over all m tiles of its
// group (tokens offsets[g] .. offsets[g+1]).
struct TileItem {
  WDesc w;
  int64_t m1, n0, mstart, mstep;  // tokens below m1; weight rows from n0; m tiles mstart, mstart + mstep, ...
};
__device__ __forceinline__ int64_t tile_items(const int32_t* list, const int32_t* list_count, int64_t ntiles) {
  return list ? static_cast<int64_t>(*list_count) * ntiles : ntiles;
}
__device__ __forceinline__ TileItem tile_item(const WDesc& single, const WDesc* table, const int64_t* offsets,
                                              const int32_t* list, int64_t item, int64_t ntiles, int64_t M, int tm,
                                              int tn) {
  const int64_t g = list ? list[item / ntiles] : 0;
  TileItem t{list ? table[g] : single, list ? offsets[g + 1] : M, (item % ntiles) * tn, 0, 0};
  t.mstart = (list ? offsets[g] : 0) + (list ? 0 : static_cast<int64_t>(blockIdx.y) * tm);
  t.mstep = (list ? 1 : static_cast<int64_t>(gridDim.y)) * tm;
  return t;
}

constexpr int kTM = 64, kTN = 64, kTK = 16;

// Single weight (list == null): grid (row tiles, m-tile strides). Grouped: a persistent grid over (group of `list`,
// row tile) items, each looping over all m tiles of its group.
__global__ void __launch_bounds__(256)
    tiled_kernel(WDesc single, const WDesc* table, const int64_t* offsets, const int32_t* list,
                 const int32_t* list_count, int64_t ntiles, int64_t M, const float* x, float* y) {
  __shared__ float xs[kTK][kTM + 4];
  __shared__ float ws[kTK][kTN + 4];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  for (int64_t item = blockIdx.x; item < tile_items(list, list_count, ntiles); item += list ? gridDim.x : ntiles) {
    const TileItem it = tile_item(single, table, offsets, list, item, ntiles, M, kTM, kTN);
    const WDesc& w = it.w;
    const int64_t m1 = it.m1, N = w.rows, K = w.cols, n0 = it.n0, mstart = it.mstart, mstep = it.mstep;
    for (int64_t mt = mstart; mt < m1; mt += mstep) {
      float acc[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
      for (int64_t k0 = 0; k0 < K; k0 += kTK) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int idx = tid + 256 * q, a = idx / kTK, kk = idx % kTK;
          const int64_t m = mt + a, n = n0 + a, k = k0 + kk;
          xs[kk][a] = (m < m1 && k < K) ? x[m * K + k] : 0.0f;
          ws[kk][a] = (n < N && k < K) ? wget(w, n, k) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTK; ++kk) {
          float av[4], bv[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) av[i] = xs[kk][ty + 16 * i];
#pragma unroll
          for (int j = 0; j < 4; ++j) bv[j] = ws[kk][tx + 16 * j];
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t m = mt + ty + 16 * i, n = n0 + tx + 16 * j;
          if (m < m1 && n < N) y[m * N + n] = acc[i][j];
        }
    }
  }
}

// ---- tensor-core tiles (bf16 activation mode) ----
constexpr int kCM = 128, kCN = 128, kCK = 32;  // block tile: tokens × weight rows × K step
constexpr int kCLd = kCK + 8;                  // shared-memory leading dimension (wmma: a multiple of 8 bf16)
constexpr int kCThreads = 256;                 // 8 warps: 4 (tokens) × 2 (weight rows), 32 × 64 each

// The bf16 value a weight element enters the tensor cores with: BF16 and MXFP4 their (exact) value, FP8 its code's
// value (the scale comes later). Callers check tc_format() first.
__device__ __forceinline__ float tc_weight(const WDesc& w, int64_t r, int64_t c) {
  if (w.format == kFmtFp8Block || w.format == kFmtFp8Tensor || w.format == kFmtFp8Channel)
    return e4m3_to_f(static_cast<const uint8_t*>(w.data)[r * w.row_bytes + c], w.fnuz);
  return wget(w, r, c);
}

__device__ __forceinline__ uint32_t bf162_bits(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Weight rows n0 .. n0+kCN, columns k0 .. k0+kCK into ws as bf16 (zero outside the matrix). Vector paths for
// aligned rows: BF16 16-byte copies, FP8 (fn) 4 codes per 32-bit load through the hardware e4m3→f16 conversion,
// MXFP4 16 codes per 8-byte load with the step's one E8M0 scale; else element by element.
__device__ __forceinline__ void tc_load_w(const WDesc& w, int64_t n0, int64_t k0, __nv_bfloat16 (*ws)[kCLd], int tid) {
  const int64_t N = w.rows, K = w.cols;
  const uintptr_t base = reinterpret_cast<uintptr_t>(w.data);
  const uint8_t* data = static_cast<const uint8_t*>(w.data);
  if (w.format == kFmtBF16 && (base & 15) == 0 && w.row_bytes % 16 == 0) {
#pragma unroll
    for (int q = 0; q < kCN * kCK / 8 / kCThreads; ++q) {
      const int idx = tid + kCThreads * q, a = idx >> 2, c = (idx & 3) * 8;
      const int64_t n = n0 + a, k = k0 + c;
      uint4 u = make_uint4(0, 0, 0, 0);
      if (n < N && k < K) u = *reinterpret_cast<const uint4*>(data + n * w.row_bytes + k * 2);
      *reinterpret_cast<uint4*>(&ws[a][c]) = u;
    }
  } else if ((w.format == kFmtFp8Block || w.format == kFmtFp8Tensor || w.format == kFmtFp8Channel) && !w.fnuz &&
             (base & 3) == 0 && w.row_bytes % 4 == 0) {
#pragma unroll
    for (int q = 0; q < kCN * kCK / 4 / kCThreads; ++q) {
      const int idx = tid + kCThreads * q, a = idx >> 3, c = (idx & 7) * 4;
      const int64_t n = n0 + a, k = k0 + c;
      uint2 o = make_uint2(0, 0);
      if (n < N && k < K) {
        const uint32_t u = *reinterpret_cast<const uint32_t*>(data + n * w.row_bytes + k);
        const float2 lo = __half22float2(
            __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u & 0xFFFFu), __NV_E4M3)));
        const float2 hi =
            __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u >> 16), __NV_E4M3)));
        o = make_uint2(bf162_bits(lo.x, lo.y), bf162_bits(hi.x, hi.y));
      }
      *reinterpret_cast<uint2*>(&ws[a][c]) = o;
    }
  } else if (w.format == kFmtMxfp4 && (base & 7) == 0 && w.row_bytes % 16 == 0 && K % 32 == 0) {
    const int a = tid >> 1, c = (tid & 1) * 16;  // 2 threads per row, 16 codes each
    const int64_t n = n0 + a, k = k0 + c;
    uint4 o0 = make_uint4(0, 0, 0, 0), o1 = o0;
    if (n < N && k < K) {
      uint2 u = *reinterpret_cast<const uint2*>(mx_code_ptr(w, n, k / 2));
      if (w.swz) u = make_uint2(mx_unswizzle(u.x), mx_unswizzle(u.y));
      const float s = e8m0_to_f(static_cast<const uint8_t*>(w.scale)[n * w.scale_cols + k / 32]);
      float v[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const uint32_t word = e < 8 ? u.x : u.y;
        v[e] = __fmul_rn(e2m1_to_f(word >> (4 * (e & 7))), s);
      }
      o0 = make_uint4(bf162_bits(v[0], v[1]), bf162_bits(v[2], v[3]), bf162_bits(v[4], v[5]), bf162_bits(v[6], v[7]));
      o1 = make_uint4(bf162_bits(v[8], v[9]), bf162_bits(v[10], v[11]), bf162_bits(v[12], v[13]),
                      bf162_bits(v[14], v[15]));
    }
    *reinterpret_cast<uint4*>(&ws[a][c]) = o0;
    *reinterpret_cast<uint4*>(&ws[a][c + 8]) = o1;
  } else {
#pragma unroll 4
    for (int q = 0; q < kCN * kCK / kCThreads; ++q) {
      const int idx = tid + kCThreads * q, a = idx / kCK, kk = idx % kCK;
      const int64_t n = n0 + a, k = k0 + kk;
      ws[a][kk] = __float2bfloat16_rn((n < N && k < K) ? tc_weight(w, n, k) : 0.0f);
    }
  }
}

// Tokens mt .. mt+kCM (below m1), columns k0 .. k0+kCK of x into xs as bf16 (exact for bf16-mode activations).
__device__ __forceinline__ void tc_load_x(const float* x, int64_t mt, int64_t m1, int64_t K, int64_t k0, bool vec,
                                          __nv_bfloat16 (*xs)[kCLd], int tid) {
  if (vec) {
#pragma unroll
    for (int q = 0; q < kCM * kCK / 4 / kCThreads; ++q) {
      const int idx = tid + kCThreads * q, a = idx >> 3, c = (idx & 7) * 4;
      const int64_t m = mt + a, k = k0 + c;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (m < m1 && k < K) v = *reinterpret_cast<const float4*>(x + m * K + k);
      *reinterpret_cast<uint2*>(&xs[a][c]) = make_uint2(bf162_bits(v.x, v.y), bf162_bits(v.z, v.w));
    }
  } else {
#pragma unroll 4
    for (int q = 0; q < kCM * kCK / kCThreads; ++q) {
      const int idx = tid + kCThreads * q, a = idx / kCK, kk = idx % kCK;
      const int64_t m = mt + a, k = k0 + kk;
      xs[a][kk] = __float2bfloat16_rn((m < m1 && k < K) ? x[m * K + k] : 0.0f);
    }
  }
}

// Same structure as tiled_kernel (single weight or persistent grouped grid). Each warp a 32×64 part of the tile as
// 2×4 wmma 16×16×16 fragments. FP8 block scales: the fragments' partial sums over one scale block (the K steps of
// kCK inside block_cols) are scaled into the accumulators when the block ends; a fragment's 16 weight rows lie in
// one scale block (block_rows % 16 == 0, checked on the host), so its scale is uniform over the fragment.
__global__ void __launch_bounds__(kCThreads)
    tc_kernel(WDesc single, const WDesc* table, const int64_t* offsets, const int32_t* list, const int32_t* list_count,
              int64_t ntiles, int64_t M, const float* x, float* y) {
  using namespace nvcuda;
  __shared__ __align__(32) __nv_bfloat16 xs[kCM][kCLd];
  __shared__ __align__(32) __nv_bfloat16 ws[kCN][kCLd];
  __shared__ __align__(32) float st[kCThreads / 32][16][20];  // per-warp epilogue staging
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
  for (int64_t item = blockIdx.x; item < tile_items(list, list_count, ntiles); item += list ? gridDim.x : ntiles) {
    const TileItem it = tile_item(single, table, offsets, list, item, ntiles, M, kCM, kCN);
    const WDesc& w = it.w;
    const int64_t m1 = it.m1, N = w.rows, K = w.cols, n0 = it.n0, mstart = it.mstart, mstep = it.mstep;
    const bool blk = w.format == kFmtFp8Block;
    const bool xvec = K % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
    const float* sc = static_cast<const float*>(w.scale);
    for (int64_t mt = mstart; mt < m1; mt += mstep) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][4], part[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          wmma::fill_fragment(acc[i][j], 0.0f);
          wmma::fill_fragment(part[i][j], 0.0f);
        }
      for (int64_t k0 = 0; k0 < K; k0 += kCK) {
        tc_load_x(x, mt, m1, K, k0, xvec, xs, tid);
        tc_load_w(w, n0, k0, ws, tid);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kCK; kk += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[4];
#pragma unroll
          for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &xs[wm * 32 + i * 16][kk], kCLd);
#pragma unroll
          for (int j = 0; j < 4; ++j) wmma::load_matrix_sync(fb[j], &ws[wn * 64 + j * 16][kk], kCLd);
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if (blk)
                wmma::mma_sync(part[i][j], fa[i], fb[j], part[i][j]);
              else
                wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
            }
        }
        __syncthreads();
        const int64_t kend = k0 + kCK;
        if (blk && (kend % w.block_cols == 0 || kend >= K)) {
          const int64_t kb = k0 / w.block_cols;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int64_t nf = n0 + wn * 64 + j * 16;
            const float s = nf < N ? sc[(nf / w.block_rows) * w.scale_cols + kb] : 0.0f;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
#pragma unroll
              for (int t = 0; t < acc[i][j].num_elements; ++t)
                acc[i][j].x[t] = fmaf(s, part[i][j].x[t], acc[i][j].x[t]);
              wmma::fill_fragment(part[i][j], 0.0f);
            }
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          wmma::store_matrix_sync(&st[warp][0][0], acc[i][j], 20, wmma::mem_row_major);
          __syncwarp();
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const int idx = lane + 32 * e, r = idx >> 4, c = idx & 15;
            const int64_t m = mt + wm * 32 + i * 16 + r, n = n0 + wn * 64 + j * 16 + c;
            if (m < m1 && n < N) {
              float v = st[warp][r][c];
              if (w.format == kFmtFp8Channel)
                v *= sc[n];
              else if (w.format == kFmtFp8Tensor)
                v *= sc[0];
              y[m * N + n] = v;
            }
          }
          __syncwarp();
        }
    }
  }
}

// ---- bf16 operands of the cuBLASLt path (cuda_lt.cpp) ----
__device__ __forceinline__ uint32_t bf16_bits(float f) { return __float_as_uint(bf16r(f)) >> 16; }
__device__ __forceinline__ uint4 pack_bf16x8(const float (&v)[8]) {
  return make_uint4(bf16_bits(v[0]) | (bf16_bits(v[1]) << 16), bf16_bits(v[2]) | (bf16_bits(v[3]) << 16),
                    bf16_bits(v[4]) | (bf16_bits(v[5]) << 16), bf16_bits(v[6]) | (bf16_bits(v[7]) << 16));
}

// out [M, Kp] bf16 = x [M, K] rounded to nearest even (exact for bf16-mode activations); columns K..Kp zero.
// One thread per 8 outputs (one 16-byte store); vec: K % 4 == 0 and x 16-byte aligned (two float4 loads).
__global__ void to_bf16_kernel(const float* x, int64_t M, int64_t K, int64_t Kp, bool vec, uint4* out) {
  const int64_t groups = Kp / 8, n = M * groups;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / groups, c0 = (i % groups) * 8;
    const float* row = x + m * K;
    float v[8];
    if (vec && c0 + 8 <= K) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(row + c0));
      const float4 b = __ldg(reinterpret_cast<const float4*>(row + c0 + 4));
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = c0 + e < K ? row[c0 + e] : 0.0f;
    }
    out[i] = pack_bf16x8(v);
  }
}

// out [N, Kp] bf16 = W dequantized exactly as wget (the ref's fp32 value), then rounded to nearest even (exact for
// bf16 and MXFP4; FP8 codes times fp32 scales round once); columns K..Kp zero. One thread per 8 outputs. fast: the
// 8 values share one scale and their codes are one aligned load (fp8: K % 8 == 0 and block_cols % 8 == 0;
// mxfp4: always, K % 32 == 0); otherwise element-wise through wget.
__global__ void dequant_bf16_kernel(WDesc w, int64_t Kp, bool fast, uint4* out) {
  const int64_t K = w.cols, groups = Kp / 8, n = w.rows * groups;
  const bool fnuz = w.fnuz != 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / groups, c0 = (i % groups) * 8;
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
    float v[8];
    if (fast && c0 + 8 <= K && w.format == kFmtMxfp4) {
      uint32_t codes = *reinterpret_cast<const uint32_t*>(mx_code_ptr(w, r, c0 / 2));
      if (w.swz) codes = mx_unswizzle(codes);
      const float s = e8m0_to_f(static_cast<const uint8_t*>(w.scale)[r * w.scale_cols + c0 / 32]);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = __fmul_rn(e2m1_to_f(codes >> (4 * e)), s);
    } else if (fast && c0 + 8 <= K && w.format != kFmtBF16) {  // fp8 block / tensor / channel
      const uint2 codes = *reinterpret_cast<const uint2*>(row + c0);
      const float* sc = static_cast<const float*>(w.scale);
      const float s = w.format == kFmtFp8Tensor    ? sc[0]
                      : w.format == kFmtFp8Channel ? sc[r]
                                                   : sc[(r / w.block_rows) * w.scale_cols + c0 / w.block_cols];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = __fmul_rn(e4m3_to_f((e < 4 ? codes.x : codes.y) >> (8 * (e & 3)), fnuz), s);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = c0 + e < K ? wget(w, r, c0 + e) : 0.0f;
    }
    out[i] = pack_bf16x8(v);
  }
}

__global__ void mx_swizzle_kernel(uint32_t* words, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    words[i] = mx_swizzle(words[i]);
}

// Any NaN code (e4m3fn: magnitude 0x7F) among the n bytes: 16 bytes per thread and step, the tail bytewise.
__global__ void fp8_nan_scan_kernel(const uint8_t* data, int64_t n, uint32_t* flag) {
  const int64_t n16 = n / 16, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t i0 = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  uint32_t any = 0;
  for (int64_t i = i0; i < n16; i += stride) {
    const uint4 v = reinterpret_cast<const uint4*>(data)[i];
    any |= fp8_nan_marks(v.x) | fp8_nan_marks(v.y) | fp8_nan_marks(v.z) | fp8_nan_marks(v.w);
  }
  for (int64_t i = 16 * n16 + i0; i < n; i += stride) any |= fp8_nan_marks(data[i]) & 0x80u;
  if (__any_sync(0xFFFFFFFFu, (any & 0x80808080u) != 0u) && (threadIdx.x & 31) == 0) atomicOr(flag, 1u);
}

// One thread per 16-byte piece of the source (row r, piece j) to its place in the tile-major order.
__global__ void mx_tile_major_kernel(const uint4* src, uint4* dst, int64_t rows, int64_t row_bytes) {
  const int64_t per_row = row_bytes / 16, n = rows * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, j = i % per_row;
    dst[mx_tile_major_offset(r, 16 * j, row_bytes) / 16] = src[i];
  }
}

__global__ void embedding_kernel(WDesc t, const int32_t* ids, int64_t M, TView out) {
  const int64_t D = t.cols, n = M * D;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / D, c = i % D;
    tset(out, m, c, wget(t, ids[m], c));
  }
}

}  // namespace

WDesc make_wdesc(const QuantWeight& w) {
  WDesc d;
  d.data = w.data;
  d.scale = w.scale;
  d.rows = w.rows;
  d.cols = w.cols;
  d.row_bytes = w.row_bytes();
  d.scale_cols = w.scale_cols();
  d.format = static_cast<int32_t>(w.format);
  d.fnuz = w.fnuz ? 1 : 0;
  d.block_rows = static_cast<int32_t>(w.block_rows);
  d.block_cols = static_cast<int32_t>(w.block_cols);
  d.swz = w.format == WeightFormat::MXFP4 && w.mx_swizzled ? 1 : 0;
  d.tiled = w.format == WeightFormat::MXFP4 && w.mx_tile_major ? 1 : 0;
  d.nan_free = w.fp8_nan_free ? 1 : 0;
  return d;
}

void launch_matmul(const WDesc& w, const float* x, int64_t M, float* y, cudaStream_t st) {
  if (M <= 0 || w.rows <= 0) return;
  if (M <= kSmallRows) {
    constexpr int r1 = rows_per_block<1>(), r4 = rows_per_block<kMC>();
    SmallOut out;
    out.yf = y;
    if (M == 1) {
      const int64_t tiles = (w.rows + r1 - 1) / r1;
      small_kernel<1, float><<<static_cast<unsigned>(tiles), kThreads, 0, st>>>(w, M, x, w.cols, out);
    } else {
      const int64_t tiles = (w.rows + r4 - 1) / r4;
      small_kernel<kMC, float><<<static_cast<unsigned>(tiles), kThreads, 0, st>>>(w, M, x, w.cols, out);
    }
  } else {
    const int64_t mt = (M + kTM - 1) / kTM, ntiles = (w.rows + kTN - 1) / kTN;
    const dim3 grid(static_cast<unsigned>(ntiles), static_cast<unsigned>(mt < 65535 ? mt : 65535), 1);
    tiled_kernel<<<grid, 256, 0, st>>>(w, nullptr, nullptr, nullptr, nullptr, ntiles, M, x, y);
  }
}

bool tc_format(const WDesc& w) {
  switch (w.format) {
    case kFmtBF16:
    case kFmtMxfp4:
    case kFmtFp8Tensor:
    case kFmtFp8Channel: return true;
    case kFmtFp8Block: return w.block_rows > 0 && w.block_rows % 16 == 0 && w.block_cols > 0 && w.block_cols % kCK == 0;
    default: return false;  // F32 / F16 values are not bf16 values
  }
}

void launch_matmul_tc(const WDesc& w, const float* x, int64_t M, float* y, cudaStream_t st) {
  if (M <= 0 || w.rows <= 0) return;
  const int64_t mt = (M + kCM - 1) / kCM, ntiles = (w.rows + kCN - 1) / kCN;
  const dim3 grid(static_cast<unsigned>(ntiles), static_cast<unsigned>(mt < 65535 ? mt : 65535), 1);
  tc_kernel<<<grid, kCThreads, 0, st>>>(w, nullptr, nullptr, nullptr, nullptr, ntiles, M, x, y);
}

size_t grouped_scratch_bytes(int64_t n_groups) { return static_cast<size_t>(3 * n_groups + 3) * sizeof(int32_t); }

void launch_grouped_matmul(const WDesc* table, int64_t n_groups, int64_t rows, int64_t cols, const int64_t* offsets,
                           const float* x, float* y, void* scratch, cudaStream_t st, bool tc) {
  if (n_groups <= 0 || rows <= 0) return;
  int32_t* lists = static_cast<int32_t*>(scratch);
  int32_t* counts = lists + 3 * n_groups;
  classify_groups_kernel<<<1, 256, 0, st>>>(offsets, table, n_groups, lists, counts);
  int dev = 0, sms = 132;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const WDesc none{};
  constexpr int r1 = rows_per_block<1>(), r4 = rows_per_block<kMC>();
  SmallOut out;
  out.yf = y;
  small_grouped_kernel<1, float><<<static_cast<unsigned>(sms * 8), kThreads, 0, st>>>(
      table, offsets, lists, counts, (rows + r1 - 1) / r1, x, cols, out);
  small_grouped_kernel<kMC, float><<<static_cast<unsigned>(sms * 8), kThreads, 0, st>>>(
      table, offsets, lists + n_groups, counts + 1, (rows + r4 - 1) / r4, x, cols, out);
  if (tc)
    tc_kernel<<<static_cast<unsigned>(sms * 2), kCThreads, 0, st>>>(none, table, offsets, lists + 2 * n_groups,
                                                                    counts + 2, (rows + kCN - 1) / kCN, 0, x, y);
  else
    tiled_kernel<<<static_cast<unsigned>(sms * 4), 256, 0, st>>>(none, table, offsets, lists + 2 * n_groups, counts + 2,
                                                                 (rows + kTN - 1) / kTN, 0, x, y);
}

void launch_to_bf16(const float* x, int64_t M, int64_t K, int64_t Kp, void* out, cudaStream_t st) {
  if (M <= 0 || Kp <= 0) return;
  const bool vec = K % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  to_bf16_kernel<<<grid_for(M * (Kp / 8), 256), 256, 0, st>>>(x, M, K, Kp, vec, static_cast<uint4*>(out));
}

bool mx_swizzle_ok(int64_t cols, const void* data) {
  return cols > 0 && cols % 8 == 0 && (reinterpret_cast<uintptr_t>(data) & 3) == 0;
}
void launch_mx_swizzle(void* data, int64_t rows, int64_t cols, cudaStream_t st) {
  const int64_t n = rows * (cols / 8);
  if (n <= 0) return;
  mx_swizzle_kernel<<<grid_for(n, 256), 256, 0, st>>>(static_cast<uint32_t*>(data), n);
}

void launch_fp8_nan_scan(const void* data, int64_t n, uint32_t* flag, cudaStream_t st) {
  if (n <= 0) return;
  const int64_t n16 = n / 16;
  fp8_nan_scan_kernel<<<grid_for(n16 > 0 ? n16 : 1, 256), 256, 0, st>>>(static_cast<const uint8_t*>(data), n, flag);
}

void launch_mx_tile_major(const void* src, void* dst, int64_t rows, int64_t row_bytes, cudaStream_t st) {
  const int64_t n = rows * (row_bytes / 16);
  if (n <= 0) return;
  mx_tile_major_kernel<<<grid_for(n, 256), 256, 0, st>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), rows,
                                                         row_bytes);
}

void launch_dequant_bf16(const WDesc& w, int64_t Kp, void* out, cudaStream_t st) {
  if (w.rows <= 0 || Kp <= 0) return;
  const bool aligned8 = (reinterpret_cast<uintptr_t>(w.data) & 7) == 0 && w.row_bytes % 8 == 0;
  bool fast = false;
  switch (w.format) {
    case kFmtMxfp4:
      fast = (reinterpret_cast<uintptr_t>(w.data) & 3) == 0 && w.row_bytes % 4 == 0 && w.cols % 32 == 0;
      break;
    case kFmtFp8Block: fast = aligned8 && w.cols % 8 == 0 && w.block_cols % 8 == 0; break;
    case kFmtFp8Tensor:
    case kFmtFp8Channel: fast = aligned8 && w.cols % 8 == 0; break;
    default: break;
  }
  dequant_bf16_kernel<<<grid_for(w.rows * (Kp / 8), 256), 256, 0, st>>>(w, Kp, fast, static_cast<uint4*>(out));
}

namespace {
SmallOut small_out(TView y, const LinEpi& e) {
  SmallOut o;
  o.y = y;
  o.bias = e.bias;
  o.gate = e.gate;
  o.residual = e.residual;
  return o;
}
int sm_count() {
  static const int n = [] {
    int dev = 0, v = 132;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v;
  }();
  return n;
}
}  // namespace

namespace {
bool mx_tc_x(TView x) { return x.bf16 && (reinterpret_cast<uintptr_t>(x.p) & 15) == 0 && x.ld % 8 == 0; }

template <class XT>
void matmul_small_t(const WDesc& w, const XT* x, int64_t ldx, int64_t M, const SmallOut& out, cudaStream_t st) {
  constexpr int r1 = rows_per_block<1>(), r4 = rows_per_block<kMC>();
  if (w.rows >= kWarpKernelMaxRows || w.rows < kWarpKernelMinRows) {  // a block per tile of rows (8 warps per row)
    if (M == 1)
      small_kernel<1, XT><<<static_cast<unsigned>((w.rows + r1 - 1) / r1), kThreads, 0, st>>>(w, M, x, ldx, out);
    else
      small_kernel<kMC, XT><<<static_cast<unsigned>((w.rows + r4 - 1) / r4), kThreads, 0, st>>>(w, M, x, ldx, out);
    return;
  }
  const unsigned blocks = static_cast<unsigned>((w.rows + 7) / 8);  // a warp per row
  if (M == 1)
    warp_kernel<1, XT, 1><<<blocks, 256, 0, st>>>(w, M, x, ldx, out);
  else if (M <= 4)
    warp_kernel<4, XT, 1><<<blocks, 256, 0, st>>>(w, M, x, ldx, out);
  else
    warp_kernel<8, XT, 1><<<blocks, 256, 0, st>>>(w, M, x, ldx, out);
}

template <class XT>
void grouped_small_t(const WDesc* table, int64_t n_groups, int64_t rows, const int64_t* offsets, const XT* x,
                     int64_t ldx, const SmallOut& out, int32_t* lists, int32_t* counts, bool class2, cudaStream_t st) {
  const unsigned grid = static_cast<unsigned>(sm_count() * 16);
  // Class 0 (one token), 1 (2 .. 16), 2 (more): a warp per (group, 2 or 4 rows). Several rows per warp share each
  // load of the activations (one row per warp re-read x once per weight row: more bytes than the weights).
  warp_grouped_kernel<1, XT, 2><<<grid, 256, 0, st>>>(table, offsets, lists, counts, (rows + 1) / 2, x, ldx, out);
  warp_grouped_kernel<4, XT, 4>
      <<<grid, 256, 0, st>>>(table, offsets, lists + n_groups, counts + 1, (rows + 3) / 4, x, ldx, out);
  if (class2)
    warp_grouped_kernel<8, XT, 4>
        <<<grid, 256, 0, st>>>(table, offsets, lists + 2 * n_groups, counts + 2, (rows + 3) / 4, x, ldx, out);
}
}  // namespace

// (The scale rows 4-byte aligned too: the tiled kernel copies each row's 4 scale bytes of a 128-column block with one
// 4-byte cp.async.)
bool mx_tc_ok(const WDesc& w) {
  return w.format == kFmtMxfp4 && w.swz != 0 && w.cols > 0 && w.cols % 128 == 0 && w.row_bytes == w.cols / 2 &&
         w.scale_cols == w.cols / 32 && w.scale != nullptr && (reinterpret_cast<uintptr_t>(w.data) & 15) == 0 &&
         (reinterpret_cast<uintptr_t>(w.scale) & 3) == 0;
}

void launch_matmul_small(const WDesc& w, TView x, int64_t M, TView y, const LinEpi& e, cudaStream_t st, bool mx_tc) {
  if (M <= 0 || w.rows <= 0) return;
  const SmallOut out = small_out(y, e);
  if (mx_tc && mx_tc_x(x)) {
    const unsigned blocks = static_cast<unsigned>((w.rows + 127) / 128);  // 8 warps of 16 rows
    const auto* xb = static_cast<const uint16_t*>(x.p);
    if (M <= 8)
      mx_tc_kernel<1><<<blocks, 256, 0, st>>>(w, M, xb, x.ld, out);
    else
      mx_tc_kernel<2><<<blocks, 256, 0, st>>>(w, M, xb, x.ld, out);
    return;
  }
  if (x.bf16)
    matmul_small_t(w, static_cast<const uint16_t*>(x.p), x.ld, M, out, st);
  else
    matmul_small_t(w, static_cast<const float*>(x.p), x.ld, M, out, st);
}

void launch_grouped_small_glu(const WDesc* table, const WDesc* gtable, int64_t n_groups, int64_t rows, int64_t pairs,
                              const int64_t* offsets, TView x, TView y, const LinEpi& e, TView gtmp, void* scratch,
                              cudaStream_t st, bool tile, int tile_fmt, int gate_tile_fmt) {
  if (n_groups <= 0 || rows <= 0) return;
  if (!mx_tc_x(x)) {  // activations the tensor-core loads cannot take: the two passes on the exact kernels
    launch_grouped_small(gtable, n_groups, rows, pairs, offsets, x, gtmp, LinEpi{}, scratch, st, false);
    LinEpi eu = e;
    eu.gate = gtmp;
    launch_grouped_small(table, n_groups, rows, pairs, offsets, x, y, eu, scratch, st, false);
    return;
  }
  int32_t* lists = static_cast<int32_t*>(scratch);
  int32_t* counts = lists + 3 * n_groups;
  classify_groups_kernel<<<1, 256, 0, st>>>(offsets, table, n_groups, lists, counts);
  const unsigned grid = static_cast<unsigned>(sm_count() * 8);
  const auto* xb = static_cast<const uint16_t*>(x.p);
  const int64_t tiles = (rows + 15) / 16;
  // Classes 0 and 1: gate and up in one pass; class 2 (more than 16 tokens): the gate into gtmp, then up with it,
  // on the kernel launch_grouped_small gives class 2 (the tiled kernel where it takes the table), so that this call
  // equals the unfused pair (gate rows, then up with the gate epilogue) bit for bit.
  mx_tc_grouped_kernel<1, true>
      <<<grid, 256, 0, st>>>(table, offsets, lists, counts, n_groups, 0, 2, tiles, xb, x.ld, small_out(y, e), gtable);
  if (!may_have_class2(pairs)) return;
  auto class2 = [&](const WDesc* t, int fmt, const SmallOut& o) {
    if (!tile || fmt != kFmtMxfp4 || !stc_x_ok(x) ||
        !launch_grouped_tile(t, n_groups, rows, offsets, x, o, lists, counts, st, kFmtMxfp4))
      mx_tc_grouped_kernel<2><<<grid, 256, 0, st>>>(t, offsets, lists, counts, n_groups, 2, 3, tiles, xb, x.ld, o);
  };
  class2(gtable, gate_tile_fmt, small_out(gtmp, LinEpi{}));
  LinEpi eu = e;
  eu.gate = gtmp;
  class2(table, tile_fmt, small_out(y, eu));
}

void launch_grouped_small(const WDesc* table, int64_t n_groups, int64_t rows, int64_t pairs, const int64_t* offsets,
                          TView x, TView y, const LinEpi& e, void* scratch, cudaStream_t st, bool mx_tc, bool stc,
                          bool tile, int tile_fmt, bool wgmma) {
  if (n_groups <= 0 || rows <= 0) return;
  int32_t* lists = static_cast<int32_t*>(scratch);
  int32_t* counts = lists + 3 * n_groups;
  classify_groups_kernel<<<1, 256, 0, st>>>(offsets, table, n_groups, lists, counts);
  if (stc && stc_x_ok(x)) {
    // Class 0 (one token) on the warp kernel: it reads BF16 / FP8 rows at one token faster than a tensor-core
    // pass of 16 (H100, 8 FP8 experts [4096 x 7168]: 125 against 190 us); the other classes on the tensor cores.
    const auto* xb = static_cast<const uint16_t*>(x.p);
    // FP8 tables at three blocks per SM (80 registers, 56 bytes spilled): H100, 8 experts x 1 token, [4096 x 7168] /
    // [7168 x 2048] (cuda_bench skinny grouped, 2026-12-07): 115 / 72 us against 125 / 83 at two (122 registers)
    // and 209 / 139 at one (237 registers). Other tables at two (not measured at three).
    const unsigned wg = static_cast<unsigned>(sm_count() * 16);
    const bool fp8 = tile_fmt == kFmtFp8Block || tile_fmt == kFmtFp8Tensor || tile_fmt == kFmtFp8Channel;
    if (fp8)
      warp_grouped_kernel<1, uint16_t, 2, 3>
          <<<wg, 256, 0, st>>>(table, offsets, lists, counts, (rows + 1) / 2, xb, x.ld, small_out(y, e));
    else
      warp_grouped_kernel<1, uint16_t, 2>
          <<<wg, 256, 0, st>>>(table, offsets, lists, counts, (rows + 1) / 2, xb, x.ld, small_out(y, e));
    launch_grouped_stc(table, n_groups, rows, offsets, x, y, e, lists, counts, st, tile, tile_fmt, pairs, wgmma);
    return;
  }
  const SmallOut out = small_out(y, e);
  if (mx_tc && mx_tc_x(x)) {
    // Classes 0 and 1 (≤ 16 tokens: passes of 8), class 2 (the tiled kernel with `tile`, else passes of 16).
    const unsigned grid = static_cast<unsigned>(sm_count() * 8);
    const auto* xb = static_cast<const uint16_t*>(x.p);
    const int64_t tiles = (rows + 15) / 16;
    mx_tc_grouped_kernel<1><<<grid, 256, 0, st>>>(table, offsets, lists, counts, n_groups, 0, 2, tiles, xb, x.ld, out);
    if (!may_have_class2(pairs)) return;
    if (!tile || tile_fmt != kFmtMxfp4 || !stc_x_ok(x) ||
        !launch_grouped_tile(table, n_groups, rows, offsets, x, out, lists, counts, st, kFmtMxfp4))
      mx_tc_grouped_kernel<2>
          <<<grid, 256, 0, st>>>(table, offsets, lists, counts, n_groups, 2, 3, tiles, xb, x.ld, out);
    return;
  }
  if (x.bf16)
    grouped_small_t(table, n_groups, rows, offsets, static_cast<const uint16_t*>(x.p), x.ld, out, lists, counts,
                    may_have_class2(pairs), st);
  else
    grouped_small_t(table, n_groups, rows, offsets, static_cast<const float*>(x.p), x.ld, out, lists, counts,
                    may_have_class2(pairs), st);
}

void launch_embedding(const WDesc& table, const int32_t* ids, int64_t M, TView out, cudaStream_t st) {
  if (M <= 0 || table.cols <= 0) return;
  embedding_kernel<<<grid_for(M * table.cols, 256), 256, 0, st>>>(table, ids, M, out);
}

}  // namespace latent::cuda
