// Data movement and paged-cache ops on the GPU: expert grouping (stable counting sort), gather_rows, scale, fill,
// kv_store / kv_gather (fp32 or bf16 pools; typed views). Same semantics as the host implementations
// (src/kernels/ref/host_ops.cpp).
#include "kernels/cuda/cuda_common.cuh"

namespace latent::cuda {

namespace {

#define LATENT_GRID_STRIDE(i, n)                                                         \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

constexpr int kGroupThreads = 256;

// offsets[e+1] = number of pairs of expert e, then an exclusive scan (one block; E ≤ any).
__global__ void __launch_bounds__(kGroupThreads)
    moe_count_kernel(const int32_t* ids, int64_t n, int64_t E, int64_t* offsets) {
  extern __shared__ unsigned int cnt[];  // [E]
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&cnt[ids[i]], 1u);
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t acc = 0;
    offsets[0] = 0;
    for (int64_t e = 0; e < E; ++e) {
      acc += cnt[e];
      offsets[e + 1] = acc;
    }
  }
}

// Block per expert: scans the pairs in order, compacting its own pairs with an ordered block prefix (stable).
__global__ void __launch_bounds__(kGroupThreads)
    moe_place_kernel(const int32_t* ids, const float* weights, int64_t n, int64_t K, const int64_t* offsets,
                     int32_t* token, float* weight) {
  __shared__ unsigned int warp_cnt[kGroupThreads / 32];
  __shared__ int64_t base_sh;
  const int e = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) base_sh = offsets[e];
  __syncthreads();
  for (int64_t c0 = 0; c0 < n; c0 += blockDim.x) {
    const int64_t i = c0 + threadIdx.x;
    const bool mine = i < n && ids[i] == e;
    const unsigned int ball = __ballot_sync(0xFFFFFFFFu, mine);
    if (lane == 0) warp_cnt[warp] = __popc(ball);
    __syncthreads();
    int64_t before = base_sh;
    for (int w = 0; w < warp; ++w) before += warp_cnt[w];
    before += __popc(ball & ((1u << lane) - 1u));
    if (mine) {
      token[before] = static_cast<int32_t>(i / K);
      weight[before] = weights[i];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t tot = 0;
      for (int w = 0; w < kGroupThreads / 32; ++w) tot += warp_cnt[w];
      base_sh += tot;
    }
    __syncthreads();
  }
}

// moe_combine per token: block per (token m, column range). Pair (m, k) of expert e sits in e's group
// [offsets[e], offsets[e+1]), whose tokens ascend: at the lower bound of m there, plus the slots k' < k of m that
// chose e too. m's K positions, sorted ascending (= ascending expert, the grouped order), are added into a zero row
// exactly as scatter_add_weighted adds them (y = R(y + R(w · x)) per pair).
constexpr int kCombineMaxK = 64;
__global__ void __launch_bounds__(256)
    moe_combine_kernel(TView x, const int32_t* ids, int64_t K, const int64_t* offsets, const int32_t* token,
                       const float* weight, int64_t D, TView y) {
  __shared__ int64_t raw[kCombineMaxK], sorted[kCombineMaxK];
  const int64_t m = blockIdx.x;
  if (threadIdx.x < K) {
    const int64_t k = threadIdx.x;
    const int32_t e = ids[m * K + k];
    int64_t lo = offsets[e], hi = offsets[e + 1];
    while (lo < hi) {
      const int64_t mid = (lo + hi) >> 1;
      if (token[mid] < m)
        lo = mid + 1;
      else
        hi = mid;
    }
    for (int64_t k2 = 0; k2 < k; ++k2) lo += ids[m * K + k2] == e;
    raw[k] = lo;
  }
  __syncthreads();
  if (threadIdx.x < K) {
    const int64_t v = raw[threadIdx.x];
    int rank = 0;
    for (int64_t u = 0; u < K; ++u) rank += raw[u] < v;
    sorted[rank] = v;
  }
  __syncthreads();
  const bool bf16 = y.bf16 != 0;
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < D;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = sorted[k];
      const float p = __fmul_rn(weight[i], tget(x, i, j));
      acc = __fadd_rn(acc, bf16 ? bf16r(p) : p);
      if (bf16) acc = bf16r(acc);
    }
    tset(y, m, j, acc);
  }
}

__global__ void gather_rows_kernel(TView src, const int32_t* rows, int64_t n, int64_t D, TView dst) {
  LATENT_GRID_STRIDE(i, n * D) tset(dst, i / D, i % D, tget(src, rows[i / D], i % D));
}

__global__ void scale_kernel(TView x, int64_t rows, int64_t cols, float s) {
  LATENT_GRID_STRIDE(i, rows * cols) tset(x, i / cols, i % cols, __fmul_rn(tget(x, i / cols, i % cols), s));
}

__global__ void fill_kernel(TView x, int64_t rows, int64_t cols, float v) {
  LATENT_GRID_STRIDE(i, rows * cols) tset(x, i / cols, i % cols, v);
}

__global__ void kv_store_kernel(KvPool pool, const int64_t* slots, int64_t n, TView src, int64_t col0, int64_t width) {
  const TView dst{pool.data, pool.width, pool.dtype == DType::BF16 ? 1 : 0};
  LATENT_GRID_STRIDE(i, n * width) {
    const int64_t r = slots[i / width];
    if (r < 0) continue;  // a padding row of a graph step
    tset(dst, r, col0 + i % width, tget(src, i / width, i % width));
  }
}

__global__ void kv_gather_kernel(KvPool pool, const int32_t* blocks, int64_t n_tokens, int64_t col0, int64_t width,
                                 TView dst) {
  const int64_t bt = pool.block_tokens;
  const TView src{pool.data, pool.width, pool.dtype == DType::BF16 ? 1 : 0};
  LATENT_GRID_STRIDE(i, n_tokens * width) {
    const int64_t t = i / width;
    const int64_t r = static_cast<int64_t>(blocks[t / bt]) * bt + t % bt;
    tset(dst, t, i % width, tget(src, r, col0 + i % width));
  }
}

#undef LATENT_GRID_STRIDE

}  // namespace

void launch_moe_group(const int32_t* ids, const float* weights, int64_t M, int64_t K, int64_t E, int64_t* offsets,
                      int32_t* token, float* weight, cudaStream_t st) {
  if (E <= 0) return;
  const int64_t n = M * K;
  moe_count_kernel<<<1, kGroupThreads, static_cast<size_t>(E) * sizeof(unsigned int), st>>>(ids, n, E, offsets);
  if (n > 0)
    moe_place_kernel<<<static_cast<unsigned>(E), kGroupThreads, 0, st>>>(ids, weights, n, K, offsets, token, weight);
}

bool launch_moe_combine(TView x, const int32_t* ids, int64_t M, int64_t K, const int64_t* offsets, const int32_t* token,
                        const float* weight, int64_t D, TView y, cudaStream_t st) {
  if (K > kCombineMaxK || K < 1) return false;
  if (M <= 0 || D <= 0) return true;
  const dim3 grid(static_cast<unsigned>(M), static_cast<unsigned>(std::min<int64_t>((D + 255) / 256, 32)));
  moe_combine_kernel<<<grid, 256, 0, st>>>(x, ids, K, offsets, token, weight, D, y);
  return true;
}

void launch_gather_rows(TView src, const int32_t* rows, int64_t n, int64_t D, TView dst, cudaStream_t st) {
  if (n * D <= 0) return;
  gather_rows_kernel<<<grid_for(n * D, 256), 256, 0, st>>>(src, rows, n, D, dst);
}

void launch_scale(TView x, int64_t rows, int64_t cols, float s, cudaStream_t st) {
  if (rows * cols <= 0) return;
  scale_kernel<<<grid_for(rows * cols, 256), 256, 0, st>>>(x, rows, cols, s);
}

void launch_fill(TView x, int64_t rows, int64_t cols, float v, cudaStream_t st) {
  if (rows * cols <= 0) return;
  fill_kernel<<<grid_for(rows * cols, 256), 256, 0, st>>>(x, rows, cols, v);
}

void launch_kv_store(const KvPool& pool, const int64_t* slots, int64_t n, TView src, int64_t col0, int64_t width,
                     cudaStream_t st) {
  if (n * width <= 0) return;
  kv_store_kernel<<<grid_for(n * width, 256), 256, 0, st>>>(pool, slots, n, src, col0, width);
}

void launch_kv_gather(const KvPool& pool, const int32_t* blocks, int64_t n_tokens, int64_t col0, int64_t width,
                      TView dst, cudaStream_t st) {
  if (n_tokens * width <= 0) return;
  kv_gather_kernel<<<grid_for(n_tokens * width, 256), 256, 0, st>>>(pool, blocks, n_tokens, col0, width, dst);
}

}  // namespace latent::cuda
