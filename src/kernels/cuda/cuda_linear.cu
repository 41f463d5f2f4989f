// Linear ops on the GPU: matmul / grouped_matmul for every stored weight format, embedding.
//  * M ≤ kSmallRows (decode, skinny): one warp computes kR output rows for kMC tokens at a time; lanes stride the
//    row in 16-byte chunks of stored weight bytes, decoded in registers (bf16/f16: 8 values, fp8: 16, mxfp4: 32 with
//    its one e8m0 scale), fp32 accumulation, warp-shuffle reduction. Rows whose bytes are not 16-byte aligned (odd
//    sizes) take the element-wise path (same arithmetic, one value at a time).
//  * larger M (prefill): a 64×64 fp32 tiled kernel; weight tiles are dequantized element-wise into shared memory.
//  * grouped: the group offsets live on the device, so both kernels are launched over all groups and each block
//    reads its group's row range; the small kernel takes groups of ≤ kSmallRows rows, the tiled one the others.
#include "kernels/cuda/cuda_common.cuh"

namespace latent::cuda {

namespace {

constexpr int kR = 4;       // output rows per warp
constexpr int kMC = 4;      // tokens per pass
constexpr int kWarps = 4;   // warps per block (small kernel)
constexpr int64_t kSmallRows = 16;

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int FMT>
struct ChunkInfo {
  static constexpr int kElems = FMT == kFmtF32 ? 4 : (FMT == kFmtBF16 || FMT == kFmtF16) ? 8 : FMT == kFmtMxfp4 ? 32 : 16;
};

// Element e (compile-time) of a 16-byte chunk, decoded (unscaled).
template <int FMT>
__device__ __forceinline__ float chunk_elem(const uint4& raw, int e, bool fnuz) {
  if constexpr (FMT == kFmtF32) {
    return __uint_as_float(word_of(raw, e));
  } else if constexpr (FMT == kFmtBF16) {
    return bf16_bits_to_f(word_of(raw, e >> 1) >> (16 * (e & 1)));
  } else if constexpr (FMT == kFmtF16) {
    return f16_bits_to_f(word_of(raw, e >> 1) >> (16 * (e & 1)));
  } else if constexpr (FMT == kFmtMxfp4) {
    return e2m1_to_f(word_of(raw, e >> 3) >> (4 * (e & 7)));
  } else {
    return e4m3_to_f(word_of(raw, e >> 2) >> (8 * (e & 3)), fnuz);
  }
}

template <int FMT>
__device__ __forceinline__ void rows_dot_vec(const WDesc& w, const int64_t (&r)[kR], const float* x, int64_t K,
                                             int nm, float (&acc)[kR][kMC], int lane) {
  constexpr int E = ChunkInfo<FMT>::kElems;
  constexpr bool kScaled = FMT == kFmtFp8Block || FMT == kFmtFp8Tensor || FMT == kFmtFp8Channel || FMT == kFmtMxfp4;
  const int64_t nch = K / E;
  const bool fnuz = w.fnuz != 0;
  const uint4* rowp[kR];
  float rs[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    rowp[i] = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w.data) + r[i] * w.row_bytes);
    rs[i] = 1.0f;
    if constexpr (FMT == kFmtFp8Tensor) rs[i] = static_cast<const float*>(w.scale)[0];
    if constexpr (FMT == kFmtFp8Channel) rs[i] = static_cast<const float*>(w.scale)[r[i]];
  }
#pragma unroll 2
  for (int64_t ch = lane; ch < nch; ch += 32) {
    uint4 raw[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) raw[i] = __ldcs(rowp[i] + ch);
    float sc[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      sc[i] = rs[i];
      if constexpr (FMT == kFmtFp8Block)
        sc[i] = static_cast<const float*>(w.scale)[(r[i] / w.block_rows) * w.scale_cols + (ch * E) / w.block_cols];
      if constexpr (FMT == kFmtMxfp4) sc[i] = e8m0_to_f(static_cast<const uint8_t*>(w.scale)[r[i] * w.scale_cols + ch]);
    }
#pragma unroll
    for (int st = 0; st < E / 4; ++st) {
      float4 xv[kMC];
#pragma unroll
      for (int m = 0; m < kMC; ++m)
        xv[m] = m < nm ? __ldg(reinterpret_cast<const float4*>(x + m * K + ch * E + 4 * st)) : make_float4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        float wv[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          wv[j] = chunk_elem<FMT>(raw[i], 4 * st + j, fnuz);
          if constexpr (kScaled) wv[j] = __fmul_rn(wv[j], sc[i]);
        }
#pragma unroll
        for (int m = 0; m < kMC; ++m)
          acc[i][m] += wv[0] * xv[m].x + wv[1] * xv[m].y + wv[2] * xv[m].z + wv[3] * xv[m].w;
      }
    }
  }
}

__device__ __forceinline__ void rows_dot_generic(const WDesc& w, const int64_t (&r)[kR], const float* x, int64_t K,
                                                 int nm, float (&acc)[kR][kMC], int lane) {
  for (int64_t c = lane; c < K; c += 32) {
    float xv[kMC];
#pragma unroll
    for (int m = 0; m < kMC; ++m) xv[m] = m < nm ? x[m * K + c] : 0.0f;
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const float wv = wget(w, r[i], c);
#pragma unroll
      for (int m = 0; m < kMC; ++m) acc[i][m] += wv * xv[m];
    }
  }
}

__device__ __forceinline__ bool vec_ok(const WDesc& w, const float* x) {
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
         (reinterpret_cast<uintptr_t>(x) & 15) == 0;
}

// Grid (ceil(rows / (kWarps·kR)), n_groups). Single weight: table == null, offsets == null, tokens [0, M).
__global__ void __launch_bounds__(kWarps * 32) small_kernel(WDesc single, const WDesc* table, const int64_t* offsets,
                                                             int64_t M, const float* x, float* y) {
  const int g = blockIdx.y;
  const WDesc w = table ? table[g] : single;
  int64_t m0 = 0, m1 = M;
  if (offsets) {
    m0 = offsets[g];
    m1 = offsets[g + 1];
    if (m1 - m0 > kSmallRows) return;  // the tiled kernel takes this group
  }
  if (m1 <= m0 || w.data == nullptr) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t N = w.rows, K = w.cols;
  const int64_t rbase = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kR;
  if (rbase >= N) return;
  int64_t r[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) r[i] = rbase + i < N ? rbase + i : N - 1;  // clamped: loads stay in bounds
  const bool vec = vec_ok(w, x + m0 * K);
  for (int64_t mb = m0; mb < m1; mb += kMC) {
    const int nm = static_cast<int>(m1 - mb < kMC ? m1 - mb : kMC);
    float acc[kR][kMC];
#pragma unroll
    for (int i = 0; i < kR; ++i)
#pragma unroll
      for (int m = 0; m < kMC; ++m) acc[i][m] = 0.0f;
    const float* xb = x + mb * K;
    if (vec) {
      switch (w.format) {
        case kFmtF32: rows_dot_vec<kFmtF32>(w, r, xb, K, nm, acc, lane); break;
        case kFmtBF16: rows_dot_vec<kFmtBF16>(w, r, xb, K, nm, acc, lane); break;
        case kFmtF16: rows_dot_vec<kFmtF16>(w, r, xb, K, nm, acc, lane); break;
        case kFmtFp8Block: rows_dot_vec<kFmtFp8Block>(w, r, xb, K, nm, acc, lane); break;
        case kFmtFp8Tensor: rows_dot_vec<kFmtFp8Tensor>(w, r, xb, K, nm, acc, lane); break;
        case kFmtFp8Channel: rows_dot_vec<kFmtFp8Channel>(w, r, xb, K, nm, acc, lane); break;
        case kFmtMxfp4: rows_dot_vec<kFmtMxfp4>(w, r, xb, K, nm, acc, lane); break;
        default: break;
      }
    } else {
      rows_dot_generic(w, r, xb, K, nm, acc, lane);
    }
#pragma unroll
    for (int i = 0; i < kR; ++i)
#pragma unroll
      for (int m = 0; m < kMC; ++m) {
        const float v = warp_sum(acc[i][m]);
        if (lane == i * kMC + m && rbase + i < N && m < nm) y[(mb + m) * N + rbase + i] = v;
      }
  }
}

constexpr int kTM = 64, kTN = 64, kTK = 16;

// Grid (ceil(rows / kTN), m-tile strides, n_groups). Each block loops over the m tiles of its group.
__global__ void __launch_bounds__(256) tiled_kernel(WDesc single, const WDesc* table, const int64_t* offsets,
                                                     int64_t M, const float* x, float* y) {
  const int g = blockIdx.z;
  const WDesc w = table ? table[g] : single;
  int64_t m0 = 0, m1 = M;
  if (offsets) {
    m0 = offsets[g];
    m1 = offsets[g + 1];
    if (m1 - m0 <= kSmallRows) return;  // the small kernel takes this group
  }
  if (m1 <= m0 || w.data == nullptr) return;
  const int64_t N = w.rows, K = w.cols;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTN;
  if (n0 >= N) return;
  __shared__ float xs[kTK][kTM + 4];
  __shared__ float ws[kTK][kTN + 4];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  for (int64_t mt = m0 + static_cast<int64_t>(blockIdx.y) * kTM; mt < m1; mt += static_cast<int64_t>(gridDim.y) * kTM) {
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

__global__ void embedding_kernel(WDesc t, const int32_t* ids, int64_t M, float* out) {
  const int64_t D = t.cols, n = M * D;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / D, c = i % D;
    out[i] = wget(t, ids[m], c);
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
  return d;
}

void launch_matmul(const WDesc& w, const float* x, int64_t M, float* y, cudaStream_t st) {
  if (M <= 0 || w.rows <= 0) return;
  if (M <= kSmallRows) {
    const dim3 grid(static_cast<unsigned>((w.rows + kWarps * kR - 1) / (kWarps * kR)), 1);
    small_kernel<<<grid, kWarps * 32, 0, st>>>(w, nullptr, nullptr, M, x, y);
  } else {
    const int64_t mt = (M + kTM - 1) / kTM;
    const dim3 grid(static_cast<unsigned>((w.rows + kTN - 1) / kTN), static_cast<unsigned>(mt < 65535 ? mt : 65535), 1);
    tiled_kernel<<<grid, 256, 0, st>>>(w, nullptr, nullptr, M, x, y);
  }
}

void launch_grouped_matmul(const WDesc* table, int64_t n_groups, int64_t rows, int64_t cols, const int64_t* offsets,
                           const float* x, float* y, cudaStream_t st) {
  if (n_groups <= 0 || rows <= 0) return;
  const WDesc none{};
  const dim3 g1(static_cast<unsigned>((rows + kWarps * kR - 1) / (kWarps * kR)), static_cast<unsigned>(n_groups));
  small_kernel<<<g1, kWarps * 32, 0, st>>>(none, table, offsets, 0, x, y);
  const dim3 g2(static_cast<unsigned>((rows + kTN - 1) / kTN), 8, static_cast<unsigned>(n_groups));
  tiled_kernel<<<g2, 256, 0, st>>>(none, table, offsets, 0, x, y);
}

void launch_embedding(const WDesc& table, const int32_t* ids, int64_t M, float* out, cudaStream_t st) {
  if (M <= 0 || table.cols <= 0) return;
  embedding_kernel<<<grid_for(M * table.cols, 256), 256, 0, st>>>(table, ids, M, out);
}

}  // namespace latent::cuda
