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

// Block reductions: every thread gets the result (32 warps: the warp partials reduce in every warp; the partials
// stay in `red`, which block_sum's callers use).
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* red, Op op) {
  for (int o = 16; o; o >>= 1) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = red[threadIdx.x & 31];
  for (int o = 16; o; o >>= 1) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
__device__ u64 block_sum(u64 v, SampleShared& sh) {
  return block_reduce(v, sh.red_u, [](u64 a, u64 b) { return a + b; });
}
__device__ u64 block_max(u64 v, SampleShared& sh) {
  return block_reduce(v, sh.red_u, [](u64 a, u64 b) { return umax(a, b); });
}
__device__ u64 block_min(u64 v, SampleShared& sh) {
  return block_reduce(v, sh.red_u, [](u64 a, u64 b) { return umin(a, b); });
}
__device__ float block_fmax(float v, SampleShared& sh) {
  return block_reduce(v, sh.red_f, [](float a, float b) { return fmaxf(a, b); });
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

// f(i, x[i]) for this thread's elements of a row, in ascending i. Rows of a multiple of 4 floats on a 16-byte
// boundary are read as float4, four per thread in flight (a row pass is bound by the latency of its loads: one SM
// works on a row); others element by element.
template <class F>
__device__ __forceinline__ void for_row(const float* x, int64_t V, F&& f) {
  if ((V & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int64_t n4 = V >> 2;
    int64_t q = threadIdx.x;
    for (; q + 3 * kThreads < n4; q += 4 * kThreads) {
      float4 a[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) a[u] = x4[q + u * kThreads];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t i = 4 * (q + u * kThreads);
        f(i, a[u].x);
        f(i + 1, a[u].y);
        f(i + 2, a[u].z);
        f(i + 3, a[u].w);
      }
    }
    for (; q < n4; q += kThreads) {
      const float4 a = x4[q];
      f(4 * q, a.x);
      f(4 * q + 1, a.y);
      f(4 * q + 2, a.z);
      f(4 * q + 3, a.w);
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) f(i, x[i]);
  }
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
    for_row(x, V, [&](int64_t i, float v) {
      if (!(v > neg_inf())) return;
      const u64 k = sample_key(v, static_cast<int32_t>(i));
      if ((k & hi_mask) != prefix) return;
      const u64 a = mass ? sample_weight(sample_fsub(v, xm)) : 1ull;
      if (a) c.add(static_cast<int>((k >> shift) & 255u), a, sh.hist);
    });
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
  for_row(x, V, [&](int64_t i, float v) {
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
  });
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
    for_row(x, V, [&](int64_t i, float v) {
      if (v > neg_inf() && sample_key(v, static_cast<int32_t>(i)) >= cut) s += sample_weight(sample_fsub(v, xm));
    });
    const u64 T = sample_top_p_target(p.top_p, block_sum(s, sh));
    const u64 kp = radix_select(x, V, xm, true, T, sh);
    cut = kp > cut ? kp : cut;
  }
  if (p.min_p > 0.0f) {
    const u64 T = sample_min_p_threshold(p.min_p);
    u64 kf = 0;
    for_row(x, V, [&](int64_t i, float v) {
      if (v > neg_inf() && sample_weight(sample_fsub(v, xm)) < T) kf = umax(kf, sample_key(v, static_cast<int32_t>(i)));
    });
    kf = block_max(kf, sh);
    if (kf != 0) {  // the element before the first one below the threshold (none: the top element)
      u64 kmin = ~0ull, ktop = 0;
      for_row(x, V, [&](int64_t i, float v) {
        if (!(v > neg_inf())) return;
        const u64 k = sample_key(v, static_cast<int32_t>(i));
        if (k > kf) kmin = umin(kmin, k);
        ktop = umax(ktop, k);
      });
      kmin = block_min(kmin, sh);
      ktop = block_max(ktop, sh);
      const u64 km = kmin == ~0ull ? ktop : kmin;
      cut = km > cut ? km : cut;
    }
  }
  // The draw, in ascending id order over the kept set: each warp sums its segment (a multiple of 512 ids), the
  // segment holding r is scanned by its warp 512 ids at a time (each lane a float4 of each 128-id chunk).
  const int warp = tid >> 5, lane = tid & 31;
  const bool vec = (V & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const int64_t seg = ((V + kWarps - 1) / kWarps + 511) / 512 * 512;
  const int64_t s0 = warp * seg, s1 = s0 + seg < V ? s0 + seg : V;
  auto weight_of = [&](int64_t i, float v) -> u64 {
    if (!(v > neg_inf()) || sample_key(v, static_cast<int32_t>(i)) < cut) return 0;
    return sample_weight(sample_fsub(v, xm));
  };
  // The weights of the 4 ids from i (a multiple of 4; 0 beyond s1).
  struct Quad {
    u64 a, b, c, d;
  };
  auto quad = [&](int64_t i) -> Quad {
    if (vec) {
      if (i >= s1) return {0, 0, 0, 0};
      const float4 v = reinterpret_cast<const float4*>(x)[i >> 2];
      return {weight_of(i, v.x), weight_of(i + 1, v.y), weight_of(i + 2, v.z), weight_of(i + 3, v.w)};
    }
    return {i < s1 ? weight_of(i, x[i]) : 0, i + 1 < s1 ? weight_of(i + 1, x[i + 1]) : 0,
            i + 2 < s1 ? weight_of(i + 2, x[i + 2]) : 0, i + 3 < s1 ? weight_of(i + 3, x[i + 3]) : 0};
  };
  u64 ws = 0;
  for (int64_t c = s0; c < s1; c += 512) {
    Quad w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) w[u] = quad(c + 128 * u + 4 * lane);
#pragma unroll
    for (int u = 0; u < 4; ++u) ws += w[u].a + w[u].b + w[u].c + w[u].d;
  }
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
  bool found = false;
  for (int64_t c = s0; c < s1 && !found; c += 512) {
    Quad w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) w[u] = quad(c + 128 * u + 4 * lane);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (found) break;
      const u64 own = w[u].a + w[u].b + w[u].c + w[u].d;
      u64 incl = own;
      for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(0xFFFFFFFFu, incl, o);
        if (lane >= o) incl += y;
      }
      const u64 tot = __shfl_sync(0xFFFFFFFFu, incl, 31);
      if (rr < tot) {
        const unsigned m = __ballot_sync(0xFFFFFFFFu, incl > rr);
        const int l = __ffs(static_cast<int>(m)) - 1;
        // In lane l: the running sum before its 4 ids, then the first of them that passes rr.
        const u64 a0 = incl - own + w[u].a, a1 = a0 + w[u].b, a2 = a1 + w[u].c;
        const int j = a0 > rr ? 0 : a1 > rr ? 1 : a2 > rr ? 2 : 3;
        out = __shfl_sync(0xFFFFFFFFu, static_cast<int32_t>(c + 128 * u + 4 * lane + j), l);
        found = true;
      } else {
        rr -= tot;
      }
    }
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
