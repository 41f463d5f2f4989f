// Sampling on the device (Backend::sample_rows): one block of 1024 threads per row. The row is masked, edited and
// divided by the temperature in place; greedy rows take a block argmax. Sampled rows find their kept set's cut in
// the sorted order (backend/sampling.h) with radix selects over the 64-bit sort key (8 digits of 8 bits; a
// histogram of counts for top_k, of integer weights for top_p), then draw in ascending id order: per-warp weight
// sums over contiguous segments pick the segment, one warp scans it. Every sum is an exact uint64 sum of the same
// integer weights the host computes, so the ids equal the host Sampler's bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/sampling.h"
#include "kernels/cuda/cuda_ops.h"

namespace latent::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
using u64 = unsigned long long;

struct SampleShared {
  u64 hist[256];
  u64 red_u[kWarps];
  float red_f[kWarps];
  int red_i[kWarps];
  u64 bc_u[2];
  int bc_i;
};

__device__ __forceinline__ u64 umax(u64 a, u64 b) { return a > b ? a : b; }
__device__ __forceinline__ u64 umin(u64 a, u64 b) { return a < b ? a : b; }
__device__ __forceinline__ float neg_inf() { return __uint_as_float(0xFF800000u); }
__device__ __forceinline__ bool bit_set(const uint32_t* m, int64_t i) { return (m[i >> 5] >> (i & 31)) & 1u; }

// Block reductions: every thread gets the result (32 warps: the warp partials reduce in every warp).
__device__ u64 block_sum(u64 v, SampleShared& sh) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_u[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh.red_u[threadIdx.x & 31];
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ u64 block_max(u64 v, SampleShared& sh) {
  for (int o = 16; o; o >>= 1) v = umax(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_u[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh.red_u[threadIdx.x & 31];
  for (int o = 16; o; o >>= 1) v = umax(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
__device__ u64 block_min(u64 v, SampleShared& sh) {
  for (int o = 16; o; o >>= 1) v = umin(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_u[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh.red_u[threadIdx.x & 31];
  for (int o = 16; o; o >>= 1) v = umin(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
__device__ float block_fmax(float v, SampleShared& sh) {
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_f[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh.red_f[threadIdx.x & 31];
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
// (value, id) argmax, ties to the lower id; id < 0 = none.
__device__ __forceinline__ void arg_combine(float& bv, int& bi, float v, int i) {
  if (i < 0) return;
  if (bi < 0 || v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}
__device__ int block_argmax(float bv, int bi, SampleShared& sh) {
  for (int o = 16; o; o >>= 1)
    arg_combine(bv, bi, __shfl_xor_sync(0xFFFFFFFFu, bv, o), __shfl_xor_sync(0xFFFFFFFFu, bi, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    sh.red_f[threadIdx.x >> 5] = bv;
    sh.red_i[threadIdx.x >> 5] = bi;
  }
  __syncthreads();
  bv = sh.red_f[threadIdx.x & 31];
  bi = sh.red_i[threadIdx.x & 31];
  for (int o = 16; o; o >>= 1)
    arg_combine(bv, bi, __shfl_xor_sync(0xFFFFFFFFu, bv, o), __shfl_xor_sync(0xFFFFFFFFu, bi, o));
  return bi;
}

// Four direct-mapped per-thread histogram slots in front of the shared-memory atomics: the first digits of the
// key fall into a handful of bins for every element, which would serialize the atomics.
struct SlotCache {
  int b0 = -1, b1 = -1, b2 = -1, b3 = -1;
  u64 v0 = 0, v1 = 0, v2 = 0, v3 = 0;
  __device__ __forceinline__ static void put(int& b, u64& v, int bin, u64 add, u64* h) {
    if (b != bin) {
      if (b >= 0) atomicAdd(&h[b], v);
      b = bin;
      v = 0;
    }
    v += add;
  }
  __device__ __forceinline__ void add(int bin, u64 a, u64* h) {
    switch (bin & 3) {
      case 0: put(b0, v0, bin, a, h); break;
      case 1: put(b1, v1, bin, a, h); break;
      case 2: put(b2, v2, bin, a, h); break;
      default: put(b3, v3, bin, a, h); break;
    }
  }
  __device__ __forceinline__ void flush(u64* h) {
    if (b0 >= 0) atomicAdd(&h[b0], v0);
    if (b1 >= 0) atomicAdd(&h[b1], v1);
    if (b2 >= 0) atomicAdd(&h[b2], v2);
    if (b3 >= 0) atomicAdd(&h[b3], v3);
  }
};

// The key of the element of the sorted order at which the running count (mass = false) or weight (mass = true)
// first reaches `target` (>= 1, at most the candidates' total).
__device__ u64 radix_select(const float* x, int64_t V, float xm, bool mass, u64 target, SampleShared& sh) {
  __syncthreads();
  if (threadIdx.x == 0) {
    sh.bc_u[0] = 0;
    sh.bc_u[1] = target;
  }
  for (int d = 0; d < 8; ++d) {
    const int shift = 56 - 8 * d;
    const u64 hi_mask = d == 0 ? 0ull : (~0ull << (64 - 8 * d));
    for (int b = threadIdx.x; b < 256; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    const u64 prefix = sh.bc_u[0];
    SlotCache c;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float v = x[i];
      if (!(v > neg_inf())) continue;
      const u64 k = sample_key(v, static_cast<int32_t>(i));
      if ((k & hi_mask) != prefix) continue;
      const u64 a = mass ? sample_weight(sample_fsub(v, xm)) : 1ull;
      if (a) c.add(static_cast<int>((k >> shift) & 255u), a, sh.hist);
    }
    c.flush(sh.hist);
    __syncthreads();
    if (threadIdx.x == 0) {
      u64 t = sh.bc_u[1], p = prefix;
      int b = 255;
      for (; b > 0; --b) {
        if (t <= sh.hist[b]) break;
        t -= sh.hist[b];
      }
      sh.bc_u[0] = p | (static_cast<u64>(b) << shift);
      sh.bc_u[1] = t;
    }
    __syncthreads();
  }
  return sh.bc_u[0];
}

__global__ __launch_bounds__(kThreads) void sample_kernel(float* logits, int64_t V, const SampleRowParams* params,
                                                          const SampleEdit* edits, const uint32_t* allow,
                                                          const uint32_t* banned, int32_t* ids) {
  __shared__ SampleShared sh;
  const int64_t row = blockIdx.x;
  const SampleRowParams p = params[row];
  float* x = logits + row * V;
  const uint32_t* a = p.allow_offset >= 0 && allow ? allow + p.allow_offset : nullptr;
  const int tid = threadIdx.x;
  for (int64_t i = tid; i < V; i += kThreads)
    if ((banned && bit_set(banned, i)) || (a && !bit_set(a, i))) x[i] = neg_inf();
  __syncthreads();
  for (int e = tid; e < p.n_edits; e += kThreads) {
    const SampleEdit ed = edits[p.edit_begin + e];
    if (ed.token >= 0 && ed.token < V) x[ed.token] = sample_apply_edit(x[ed.token], ed, p);
  }
  __syncthreads();
  const bool greedy = p.temperature <= 0.0f, divide = !greedy && p.temperature != 1.0f;
  float bv = neg_inf(), xm = neg_inf();
  int bi = -1;
  u64 nc = 0;
  for (int64_t i = tid; i < V; i += kThreads) {
    float v = x[i];
    if (divide) {
      v = sample_fdiv(v, p.temperature);
      x[i] = v;
    }
    if (!(banned && bit_set(banned, i)) && (bi < 0 || v > bv)) {
      bv = v;
      bi = static_cast<int>(i);
    }
    if (v > neg_inf()) {
      xm = fmaxf(xm, v);
      ++nc;
    }
  }
  bi = block_argmax(bv, bi, sh);
  xm = block_fmax(xm, sh);
  nc = block_sum(nc, sh);
  if (greedy || nc == 0) {
    if (tid == 0) ids[row] = bi < 0 ? 0 : bi;
    return;
  }
  __syncthreads();  // every thread has read its row values before the selects

  u64 cut = 0;  // kept: candidates with key >= cut
  if (p.top_k > 0 && static_cast<u64>(p.top_k) < nc) cut = radix_select(x, V, xm, false, static_cast<u64>(p.top_k), sh);
  if (p.top_p < 1.0f) {
    u64 s = 0;
    for (int64_t i = tid; i < V; i += kThreads) {
      const float v = x[i];
      if (v > neg_inf() && sample_key(v, static_cast<int32_t>(i)) >= cut) s += sample_weight(sample_fsub(v, xm));
    }
    const u64 T = sample_top_p_target(p.top_p, block_sum(s, sh));
    const u64 kp = radix_select(x, V, xm, true, T, sh);
    cut = kp > cut ? kp : cut;
  }
  if (p.min_p > 0.0f) {
    const u64 T = sample_min_p_threshold(p.min_p);
    u64 kf = 0;
    for (int64_t i = tid; i < V; i += kThreads) {
      const float v = x[i];
      if (v > neg_inf() && sample_weight(sample_fsub(v, xm)) < T) kf = umax(kf, sample_key(v, static_cast<int32_t>(i)));
    }
    kf = block_max(kf, sh);
    if (kf != 0) {  // the element before the first one below the threshold (none: the top element)
      u64 kmin = ~0ull, ktop = 0;
      for (int64_t i = tid; i < V; i += kThreads) {
        const float v = x[i];
        if (!(v > neg_inf())) continue;
        const u64 k = sample_key(v, static_cast<int32_t>(i));
        if (k > kf) kmin = umin(kmin, k);
        ktop = umax(ktop, k);
      }
      kmin = block_min(kmin, sh);
      ktop = block_max(ktop, sh);
      const u64 km = kmin == ~0ull ? ktop : kmin;
      cut = km > cut ? km : cut;
    }
  }
  // The draw, in ascending id order over the kept set.
  const int warp = tid >> 5, lane = tid & 31;
  const int64_t seg = ((V + kWarps - 1) / kWarps + 31) / 32 * 32;
  const int64_t s0 = warp * seg, s1 = s0 + seg < V ? s0 + seg : V;
  auto weight_of = [&](int64_t i) -> u64 {
    if (i >= V) return 0;
    const float v = x[i];
    if (!(v > neg_inf()) || sample_key(v, static_cast<int32_t>(i)) < cut) return 0;
    return sample_weight(sample_fsub(v, xm));
  };
  u64 ws = 0;
  for (int64_t i = s0 + lane; i < s1; i += 32) ws += weight_of(i);
  const u64 W = block_sum(ws, sh);  // (also leaves each warp's sum in sh.red_u)
  if (tid == 0) {
    const u64 r = sample_mulhi(sample_random(p.rng_key, p.rng_counter), W);
    u64 cum = 0;
    int sel = kWarps - 1;
    for (int w = 0; w < kWarps; ++w) {
      if (r < cum + sh.red_u[w]) {
        sel = w;
        break;
      }
      cum += sh.red_u[w];
    }
    sh.bc_i = sel;
    sh.bc_u[1] = r - cum;
  }
  __syncthreads();
  if (warp != sh.bc_i) return;
  u64 rr = sh.bc_u[1];
  int32_t out = static_cast<int32_t>(s1 > s0 ? s1 - 1 : 0);
  for (int64_t c = s0; c < s1; c += 32) {
    u64 v = weight_of(c + lane);
    for (int o = 1; o < 32; o <<= 1) {
      const u64 y = __shfl_up_sync(0xFFFFFFFFu, v, o);
      if (lane >= o) v += y;
    }
    const u64 tot = __shfl_sync(0xFFFFFFFFu, v, 31);
    if (rr < tot) {
      const unsigned m = __ballot_sync(0xFFFFFFFFu, v > rr);
      out = static_cast<int32_t>(c + __ffs(static_cast<int>(m)) - 1);
      break;
    }
    rr -= tot;
  }
  if (lane == 0) ids[row] = out;
}

}  // namespace

void launch_sample_rows(float* logits, int64_t rows, int64_t V, const SampleRowParams* params, const SampleEdit* edits,
                        const uint32_t* allow, const uint32_t* banned, int32_t* ids, cudaStream_t st) {
  if (rows <= 0 || V <= 0) return;
  sample_kernel<<<static_cast<unsigned>(rows), kThreads, 0, st>>>(logits, V, params, edits, allow, banned, ids);
}

}  // namespace latent::cuda
