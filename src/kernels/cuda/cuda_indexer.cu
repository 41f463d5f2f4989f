// The DSA lightning indexer's scores on tensor cores (Backend::indexer_scores_paged for bf16 queries over a bf16
// key pool, head_dim 128, 32 or 64 index heads: GLM-5's and DeepSeek-V3.2's shapes). Scores are independent per
// (row, key) — no softmax — so a block takes a fixed slice of kIxSlice keys for kIxRows / NH... query rows:
//   S[(row, head), key] = q[row, head, :] · k[key, :]     (mma.sync m16n8k16, bf16 in, fp32 accumulators)
//   I[row, key]        = Σ_head w[row, head] · ReLU(scale · S)   (fp32, the heads of a row summed in a fixed order)
// The (row, head) pairs of the block are the MMA's m side (256 of them: 8 rows of 32 heads or 4 of 64), staged once
// in shared memory; keys come in tiles of 64 rows from the paged pool by cp.async (two stages). A block's rows may
// belong to several sequences (a decode step: one row per sequence): it walks them in runs of one sequence, the
// other rows masked. Keys past a row's position score −inf, as the CUDA-core kernel writes them. Against that kernel
// (fp32 FMAs in key order, heads summed in double) the scores differ by the order of fp32 sums only.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_skinny.cuh"

namespace latent::cuda {

namespace {

constexpr int kIxDim = 128;        // index head_dim
constexpr int kIxPairs = 256;      // (row, head) pairs per block
constexpr int kIxKeys = 64;        // keys per tile
constexpr int kIxSlice = 512;      // keys per block
constexpr int kIxThreads = 128;    // 4 warps, 64 pairs (4 m-tiles) each
constexpr int kIxLd = kIxDim + 8;  // smem row stride (bf16 elements): conflict-free ldmatrix
constexpr size_t kIxSmem = static_cast<size_t>(kIxPairs + 2 * kIxKeys) * kIxLd * 2;

template <int NH>
__global__ void __launch_bounds__(kIxThreads, 2)
    indexer_tc_kernel(TView q, TView w, KvPool pool, StepSeqs seqs, int64_t r0, int64_t n, float scale,
                      const int64_t* q_pos, int64_t T, float* scores) {
  constexpr int R = kIxPairs / NH;  // rows per block
  extern __shared__ __align__(16) uint16_t ix_buf[];
  uint16_t* qs = ix_buf;                 // [256][kIxLd]
  uint16_t* ks = qs + kIxPairs * kIxLd;  // [2][64][kIxLd]
  __shared__ float ws[kIxPairs];         // w[row, head] of the block's pairs
  __shared__ int64_t seq_sh[R], last_sh[R];
  __shared__ int32_t krow_sh[2][kIxKeys];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * R, k_lo = static_cast<int64_t>(blockIdx.x) * kIxSlice;
  const int64_t k_hi = k_lo + kIxSlice < T ? k_lo + kIxSlice : T;
  const auto* qp = static_cast<const uint16_t*>(q.p);
  const auto* kp = static_cast<const uint16_t*>(pool.data);
  const int64_t bt = pool.block_tokens;
  if (threadIdx.x < R) {
    const int64_t row = row0 + threadIdx.x;
    int64_t s = -1, last = -1;
    if (row < n) {
      s = seq_of_token(seqs, r0 + row);
      last = q_pos[row] < seqs.ctx_len[s] - 1 ? q_pos[row] : seqs.ctx_len[s] - 1;
    }
    seq_sh[threadIdx.x] = s;
    last_sh[threadIdx.x] = last;
  }
  for (int i = threadIdx.x; i < kIxPairs; i += kIxThreads) {
    const int64_t row = row0 + i / NH;
    ws[i] = row < n ? tget(w, row, i % NH) : 0.0f;
  }
  for (int i = threadIdx.x; i < kIxPairs * (kIxDim / 8); i += kIxThreads) {
    const int p = i / (kIxDim / 8), c = i % (kIxDim / 8);
    const int64_t row = row0 + p / NH;
    cp_async16(qs + p * kIxLd + 8 * c, qp + (row < n ? row : 0) * q.ld + (p % NH) * kIxDim + 8 * c, row < n);
  }
  cp_async_commit();
  __syncthreads();
  const float ninf = __uint_as_float(0xFF800000u);
  // This warp's pairs: 64 from 64 · warp; m-tile mt's rows are heads of row (64 · warp + 16 · mt) / NH.
  int64_t run_begin = 0;
  while (run_begin < R && seq_sh[run_begin] >= 0) {
    const int64_t s = seq_sh[run_begin];
    int64_t run_end = run_begin, run_last = -1;
    while (run_end < R && seq_sh[run_end] == s) {
      run_last = last_sh[run_end] > run_last ? last_sh[run_end] : run_last;
      ++run_end;
    }
    const int32_t* blocks = seqs.block_table + s * seqs.max_blocks;
    const int64_t c_hi = run_last + 1 < k_hi ? run_last + 1 : k_hi;  // keys computed: [k_lo, c_hi)
    // Keys of the slice past every row of the run: −inf without computing.
    for (int64_t e = threadIdx.x; e < (run_end - run_begin) * (k_hi - k_lo); e += kIxThreads) {
      const int64_t r = run_begin + e / (k_hi - k_lo), key = k_lo + e % (k_hi - k_lo);
      if (key >= c_hi || key > last_sh[r]) scores[(row0 + r) * T + key] = ninf;
    }
    auto stage = [&](int buf, int64_t k0) {
      if (threadIdx.x < kIxKeys) {
        const int64_t key = k0 + threadIdx.x;
        krow_sh[buf][threadIdx.x] =
            key < c_hi ? static_cast<int32_t>(static_cast<int64_t>(blocks[key / bt]) * bt + key % bt) : -1;
      }
      __syncthreads();
      for (int i = threadIdx.x; i < kIxKeys * (kIxDim / 8); i += kIxThreads) {
        const int r = i / (kIxDim / 8), c = i % (kIxDim / 8);
        const int32_t kr = krow_sh[buf][r];
        cp_async16(ks + (buf * kIxKeys + r) * kIxLd + 8 * c, kp + (kr >= 0 ? kr : 0) * pool.width + 8 * c, kr >= 0);
      }
      cp_async_commit();
    };
    if (k_lo < c_hi) stage(0, k_lo);
    int buf = 0;
    for (int64_t k0 = k_lo; k0 < c_hi; k0 += kIxKeys, buf ^= 1) {
      if (k0 + kIxKeys < c_hi) {
        stage(buf ^ 1, k0 + kIxKeys);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      float acc[4][8][4] = {};
      const uint16_t* kb = ks + buf * kIxKeys * kIxLd;
#pragma unroll
      for (int kk = 0; kk < kIxDim / 16; ++kk) {
        uint32_t bfr[4][4];
#pragma unroll
        for (int jp = 0; jp < 4; ++jp)
          ldsm_x4(bfr[jp], kb + (jp * 16 + (lane & 7) + 8 * (lane >> 4)) * kIxLd + kk * 16 + 8 * ((lane >> 3) & 1));
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          uint32_t a[4];
          ldsm_x4(a, qs + (warp * 64 + mt * 16 + (lane & 15)) * kIxLd + kk * 16 + 8 * (lane >> 4));
#pragma unroll
          for (int jp = 0; jp < 4; ++jp) {
            mma_bf16_16816(acc[mt][2 * jp], a[0], a[1], a[2], a[3], bfr[jp][0], bfr[jp][1]);
            mma_bf16_16816(acc[mt][2 * jp + 1], a[0], a[1], a[2], a[3], bfr[jp][2], bfr[jp][3]);
          }
        }
      }
      // Σ over heads: a lane's two heads, then the 8 lanes of one key column (g), then the m-tiles of one row.
      constexpr int kTilesPerRow = NH / 16;
#pragma unroll
      for (int r = 0; r < 4 / kTilesPerRow; ++r) {
        const int pr = warp * 64 + r * NH;  // the row's first pair
        const int64_t rr = pr / NH;         // row within the block
        float part[8][2] = {};
#pragma unroll
        for (int u = 0; u < kTilesPerRow; ++u) {
          const int mt = r * kTilesPerRow + u;
          const float w0 = ws[pr + u * 16 + g], w1 = ws[pr + u * 16 + g + 8];
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float v = w0 * fmaxf(acc[mt][j][e] * scale, 0.0f) + w1 * fmaxf(acc[mt][j][e + 2] * scale, 0.0f);
              v += __shfl_xor_sync(0xFFFFFFFFu, v, 4);
              v += __shfl_xor_sync(0xFFFFFFFFu, v, 8);
              v += __shfl_xor_sync(0xFFFFFFFFu, v, 16);
              part[j][e] += v;
            }
        }
        if (g == 0 && rr >= run_begin && rr < run_end) {
          const int64_t row = row0 + rr, last = last_sh[rr];
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int64_t key = k0 + 8 * j + 2 * t4 + e;
              if (key < c_hi && key <= last) scores[row * T + key] = part[j][e];
            }
        }
      }
      __syncthreads();  // the buffer is restaged next iteration but one
    }
    run_begin = run_end;
  }
  cp_async_wait<0>();  // a block that computed nothing still has its query rows in flight
}

}  // namespace

bool launch_indexer_tc(TView q, TView w, const KvPool& pool, const StepSeqs& seqs, int64_t r0, int64_t n,
                       int64_t n_heads, int64_t head_dim, float scale, const int64_t* q_pos, int64_t T, float* scores,
                       cudaStream_t st) {
  if (!q.bf16 || pool.dtype != DType::BF16 || head_dim != kIxDim || pool.width < kIxDim || pool.width % 8 != 0 ||
      (reinterpret_cast<uintptr_t>(q.p) & 15) != 0 || q.ld % 8 != 0 ||
      (reinterpret_cast<uintptr_t>(pool.data) & 15) != 0)
    return false;
  if (n_heads != 32 && n_heads != 64) return false;
  if (n <= 0 || T <= 0) return true;
  const int R = static_cast<int>(kIxPairs / n_heads);
  const dim3 grid(static_cast<unsigned>((T + kIxSlice - 1) / kIxSlice), static_cast<unsigned>((n + R - 1) / R));
  if (n_heads == 32) {
    static const cudaError_t a = cudaFuncSetAttribute(
        indexer_tc_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kIxSmem));
    (void)a;
    indexer_tc_kernel<32><<<grid, kIxThreads, kIxSmem, st>>>(q, w, pool, seqs, r0, n, scale, q_pos, T, scores);
  } else {
    static const cudaError_t a = cudaFuncSetAttribute(
        indexer_tc_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kIxSmem));
    (void)a;
    indexer_tc_kernel<64><<<grid, kIxThreads, kIxSmem, st>>>(q, w, pool, seqs, r0, n, scale, q_pos, T, scores);
  }
  return true;
}

}  // namespace latent::cuda
