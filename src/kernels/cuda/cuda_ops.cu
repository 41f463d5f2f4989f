// Norms, RoPE, elementwise ops, the MoE router and weighted combine, the DSA indexer scores and the deterministic
// top-k select. Each op rounds at exactly the points of the ref backend (src/kernels/ref) and uses the same
// precision for its statistics and transcendentals (double), so bf16-mode values match the ref backend's.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace latent::cuda {

namespace {

constexpr int kNormThreads = 256;

// One block per row: y = x · rsqrt(mean(x²) + eps) · w (statistics in double, the ref's points).
__device__ __forceinline__ void rms_norm_row(TView x, const float* w, int64_t m, int64_t D, float eps, TView y,
                                             double* sh) {
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const double v = tget(x, m, i);
    ss += v * v;
  }
  ss = block_sum_d(ss, sh);
  const double r = 1.0 / sqrt(ss / static_cast<double>(D) + static_cast<double>(eps));
  const bool bf16 = y.bf16 != 0;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float n = static_cast<float>(tget(x, m, i) * r);
    if (bf16) n = bf16r(n);
    tset(y, m, i, __fmul_rn(n, w[i]));
  }
}

// PER elements of row m per thread (element threadIdx.x + j · kNormThreads; 0 past D), the dtype branch taken once:
// all loads are issued before the first use (a branch per element around load and conversion makes each load wait
// for the one before it).
template <int PER>
__device__ __forceinline__ void load_row_reg(TView t, int64_t m, int64_t D, float (&v)[PER]) {
  if (t.bf16) {
    const uint16_t* p = static_cast<const uint16_t*>(t.p) + m * t.ld;
    uint16_t raw[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kNormThreads;
      raw[j] = i < D ? p[i] : uint16_t{0};
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) v[j] = bf16_bits_to_f(raw[j]);
  } else {
    const float* p = static_cast<const float*>(t.p) + m * t.ld;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kNormThreads;
      v[j] = i < D ? p[i] : 0.0f;
    }
  }
}

// Stores v to row m (rounded to the view's dtype), the dtype branch taken once.
template <int PER>
__device__ __forceinline__ void store_row_reg(TView t, int64_t m, int64_t D, const float (&v)[PER]) {
  if (t.bf16) {
    uint16_t* p = static_cast<uint16_t*>(t.p) + m * t.ld;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kNormThreads;
      if (i < D) p[i] = f_to_bf16_bits(v[j]);
    }
  } else {
    float* p = static_cast<float*>(t.p) + m * t.ld;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kNormThreads;
      if (i < D) p[i] = v[j];
    }
  }
}

// The same row with its elements held in registers (PER per thread: D <= PER · kNormThreads): the row, the norm
// weight (and with ADD the delta) are loaded up front, before the reduction, where the loop above waits for each
// load in turn (a one-row norm is all latency: 16-23 us for a 6,144-wide row on an H100 before, ncu). The same
// per-thread order of the sums and the same products: the same bits. ADD: h = R(h + delta) first (stored, and
// normalized from the rounded registers, as the loop form reads h back).
template <int PER, bool ADD>
__device__ __forceinline__ void rms_norm_row_reg(TView x, TView delta, const float* w, int64_t m, int64_t D, float eps,
                                                 TView y, double* sh) {
  float v[PER], wv[PER];
  load_row_reg<PER>(x, m, D, v);
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kNormThreads;
    wv[j] = i < D ? w[i] : 0.0f;
  }
  if constexpr (ADD) {
    float d[PER];
    load_row_reg<PER>(delta, m, D, d);
    const bool hb = x.bf16 != 0;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const float s = __fadd_rn(v[j], d[j]);
      v[j] = hb ? bf16r(s) : s;
    }
    store_row_reg<PER>(x, m, D, v);  // (h rounded to its dtype: the same value the loop form stores)
  }
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const double d = v[j];
    if (threadIdx.x + static_cast<int64_t>(j) * kNormThreads < D) ss += d * d;
  }
  ss = block_sum_d(ss, sh);
  const double r = 1.0 / sqrt(ss / static_cast<double>(D) + static_cast<double>(eps));
  const bool bf16 = y.bf16 != 0;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    float n = static_cast<float>(v[j] * r);
    if (bf16) n = bf16r(n);
    v[j] = __fmul_rn(n, wv[j]);
  }
  store_row_reg<PER>(y, m, D, v);
}

__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(TView x, const float* w, int64_t D, float eps, TView y) {
  __shared__ double sh[32];
  rms_norm_row(x, w, blockIdx.x, D, eps, y, sh);
}
template <int PER>
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_reg_kernel(TView x, const float* w, int64_t D, float eps, TView y) {
  __shared__ double sh[32];
  rms_norm_row_reg<PER, false>(x, TView{}, w, blockIdx.x, D, eps, y, sh);
}

// h = R(h + delta), then y = rms_norm(h): each thread first updates its own elements of h (read back below by the
// same thread after the block's reduction barrier).
__global__ void __launch_bounds__(kNormThreads)
    add_rms_norm_kernel(TView h, TView delta, const float* w, int64_t D, float eps, TView y) {
  __shared__ double sh[32];
  const int64_t m = blockIdx.x;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) tset(h, m, i, __fadd_rn(tget(h, m, i), tget(delta, m, i)));
  rms_norm_row(h, w, m, D, eps, y, sh);
}
template <int PER>
__global__ void __launch_bounds__(kNormThreads)
    add_rms_norm_reg_kernel(TView h, TView delta, const float* w, int64_t D, float eps, TView y) {
  __shared__ double sh[32];
  rms_norm_row_reg<PER, true>(h, delta, w, blockIdx.x, D, eps, y, sh);
}

__global__ void __launch_bounds__(kNormThreads)
    layer_norm_kernel(TView x, const float* w, const float* b, int64_t D, float eps, TView y) {
  __shared__ double sh[32];
  const int64_t m = blockIdx.x;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += tget(x, m, i);
  const double mean = block_sum_d(s, sh) / static_cast<double>(D);
  double v2 = 0.0;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const double d = tget(x, m, i) - mean;
    v2 += d * d;
  }
  const double var = block_sum_d(v2, sh) / static_cast<double>(D);
  const double r = 1.0 / sqrt(var + static_cast<double>(eps));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const double xi = tget(x, m, i);
    tset(y, m, i, static_cast<float>(__dadd_rn(__dmul_rn(__dmul_rn(xi - mean, r), w[i]), b ? b[i] : 0.0f)));
  }
}

// The RoPE of one (a, b) pair with the ref's points (bf16: cos/sin and products rounded).
__device__ __forceinline__ void rope_pair(float a, float b, float c, float s, bool bf16, float& ya, float& yb) {
  if (bf16) {
    ya = bf16r(__fsub_rn(bf16r(__fmul_rn(a, c)), bf16r(__fmul_rn(b, s))));
    yb = bf16r(__fadd_rn(bf16r(__fmul_rn(b, c)), bf16r(__fmul_rn(a, s))));
  } else {
    ya = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    yb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}
__device__ __forceinline__ void rope_cs(int64_t pos, const float* inv_freq, int64_t i, float attention_factor,
                                        bool bf16, float& c, float& s) {
  const float ang = __fmul_rn(static_cast<float>(pos), inv_freq[i]);
  c = __fmul_rn(static_cast<float>(cos(static_cast<double>(ang))), attention_factor);
  s = __fmul_rn(static_cast<float>(sin(static_cast<double>(ang))), attention_factor);
  if (bf16) {
    c = bf16r(c);
    s = bf16r(s);
  }
}

// One thread per (token, head, pair).
__global__ void rope_kernel(TView x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, const int64_t* pos,
                            const float* inv_freq, int64_t half, float attention_factor, bool interleaved) {
  const int64_t n = n_tokens * n_heads * half;
  const bool bf16 = x.bf16 != 0;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half, h = (idx / half) % n_heads, t = idx / (half * n_heads);
    float c, s;
    rope_cs(pos[t], inv_freq, i, attention_factor, bf16, c, s);
    const int64_t ia = h * head_stride + (interleaved ? 2 * i : i);
    const int64_t ib = h * head_stride + (interleaved ? 2 * i + 1 : i + half);
    float ya, yb;
    rope_pair(tget(x, t, ia), tget(x, t, ib), c, s, bf16, ya, yb);
    tset(x, t, ia, ya);
    tset(x, t, ib, yb);
  }
}

// The tail of the MLA query / latent path (Backend::mla_qkv after its matmuls), blocks (token, part): part 0
// normalizes c = RMSNorm(c) (the register form of launch_rms_norm, PER ≥ its elements per thread: the same
// per-thread sums), rotates k_pe and stores [c | k_pe] to the pool at the token's slot (none for a slot < 0); parts
// 1.. rotate q_pe, one (head, pair) per thread (one block per token did all of it, its loads one after another:
// 14 µs a layer at batch 1 on the GLM-5 shape, H100). The four kernels' arithmetic element for element (rope_cs /
// rope_pair, rms_norm_row_reg, the store's tget / tset): the same bits as the primitives, in one launch instead of
// four.
template <int PER>
__global__ void __launch_bounds__(kNormThreads)
    mla_qkv_tail_kernel(TView q, int64_t q_col0, int64_t n_heads, int64_t head_stride, TView kv, int64_t dc,
                        const float* norm_w, float eps, const int64_t* pos, const int64_t* slots, KvPool pool,
                        const float* inv_freq, int64_t half, float attention_factor, bool interleaved) {
  __shared__ double sh[32];
  const int64_t t = blockIdx.x, p = pos[t];
  if (blockIdx.y > 0) {
    const bool qb = q.bf16 != 0;
    for (int64_t idx = (blockIdx.y - 1) * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n_heads * half;
         idx += static_cast<int64_t>(gridDim.y - 1) * blockDim.x) {
      const int64_t i = idx % half, h = idx / half;
      float c, s;
      rope_cs(p, inv_freq, i, attention_factor, qb, c, s);
      const int64_t ia = q_col0 + h * head_stride + (interleaved ? 2 * i : i);
      const int64_t ib = q_col0 + h * head_stride + (interleaved ? 2 * i + 1 : i + half);
      float ya, yb;
      rope_pair(tget(q, t, ia), tget(q, t, ib), c, s, qb, ya, yb);
      tset(q, t, ia, ya);
      tset(q, t, ib, yb);
    }
    return;
  }
  const bool kb = kv.bf16 != 0;
  rms_norm_row_reg<PER, false>(kv, TView{}, norm_w, t, dc, eps, kv, sh);  // c: columns 0 .. dc-1
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {              // k_pe: columns dc .. dc + 2·half - 1
    float c, s;
    rope_cs(p, inv_freq, i, attention_factor, kb, c, s);
    const int64_t ia = dc + (interleaved ? 2 * i : i), ib = dc + (interleaved ? 2 * i + 1 : i + half);
    float ya, yb;
    rope_pair(tget(kv, t, ia), tget(kv, t, ib), c, s, kb, ya, yb);
    tset(kv, t, ia, ya);
    tset(kv, t, ib, yb);
  }
  __syncthreads();
  const int64_t slot = slots[t];
  if (slot < 0) return;  // a padding row of a graph step
  const TView dst{pool.data, pool.width, pool.dtype == DType::BF16 ? 1 : 0};
  for (int64_t i = threadIdx.x; i < dc + 2 * half; i += blockDim.x) tset(dst, slot, i, tget(kv, t, i));
}

__global__ void silu_mul_kernel(TView gate, TView up, int64_t rows, int64_t cols, TView out) {
  const bool bf16 = out.bf16 != 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    tset(out, r, c, silu_mul_value(tget(gate, r, c), tget(up, r, c), bf16));
  }
}

__global__ void add_kernel(TView y, TView x, int64_t rows, int64_t cols) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    tset(y, r, c, __fadd_rn(tget(y, r, c), tget(x, r, c)));
  }
}

__global__ void convert_kernel(TView src, TView dst, int64_t rows, int64_t cols) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    tset(dst, r, c, tget(src, r, c));
  }
}

// The linear epilogue of backend.h over fp32 accumulators, one thread per output element.
__global__ void epilogue_kernel(const float* acc, const float* gacc, const float* bias, TView gate, TView residual,
                                int64_t M, int64_t N, TView y, const int64_t* row_lo, const int64_t* row_hi) {
  const bool bf16 = y.bf16 != 0;
  const int64_t lo = row_lo ? *row_lo : 0, hi = row_hi ? *row_hi : M;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < M * N;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / N, j = i % N;
    if (m < lo || m >= hi) continue;
    const float v = epi_value(acc[i], bias, gacc ? gacc + i : nullptr, gate, residual, m, j, bf16);
    tset(y, m, j, v);
  }
}

// One block per token: sigmoid + bias in parallel; with groups, each group's score (the sum of its two largest) by
// its own thread (the ref's scan within a group), thread 0 keeps the topk_group best groups, and the experts of the
// other groups are masked in parallel; warp 0 then selects the experts: K rounds of a warp arg-max (larger score,
// ties to the lower index), which is exactly the ref's repeated scan with strict '>' (the first maximum among the
// experts not yet taken). A score that is NaN breaks that equivalence (the scan's comparisons are not a total order),
// so a token with one takes the ref's serial scan; so do more than 64 experts per lane (E > 2048). The selected ids
// stay in shared memory until the weights are written (sel[K]).
__global__ void router_kernel(const float* logits, const float* bias, int64_t E, int64_t G, int64_t topk_group,
                              int64_t K, bool norm, float scaling, int32_t* ids, float* weights) {
  extern __shared__ float sm[];
  float* s = sm;                                              // [E]
  float* b = sm + E;                                          // [E]
  float* gs = sm + 2 * E;                                     // [G]
  int32_t* sel = reinterpret_cast<int32_t*>(sm + 2 * E + G);  // [K]
  const int64_t m = blockIdx.x;
  const float* lg = logits + m * E;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    s[e] = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(lg[e]))));
    b[e] = __fadd_rn(s[e], bias ? bias[e] : 0.0f);
  }
  __syncthreads();
  const float kNegInf = __uint_as_float(0xFF800000u);
  const int64_t gsize = E / G;
  if (G > 1 && topk_group < G) {  // (uniform over the block: the barriers below are reached by every thread)
    for (int64_t g = threadIdx.x; g < G; g += blockDim.x) {
      float top1 = kNegInf, top2 = kNegInf;
      for (int64_t e = g * gsize; e < (g + 1) * gsize; ++e) {
        if (b[e] > top1) {
          top2 = top1;
          top1 = b[e];
        } else if (b[e] > top2) {
          top2 = b[e];
        }
      }
      gs[g] = gsize >= 2 ? __fadd_rn(top1, top2) : top1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // keep the topk_group best groups (stable: ties to the lower group); a kept group's score becomes NaN.
      for (int64_t j = 0; j < topk_group; ++j) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; ++g) {
          if (gs[g] != gs[g]) continue;  // taken (NaN marker)
          if (best < 0 || gs[g] > gs[best]) best = g;
        }
        if (best >= 0) gs[best] = f_nan();
      }
    }
    __syncthreads();
    const int gs32 = static_cast<int>(gsize);
    for (int e = static_cast<int>(threadIdx.x); e < E; e += static_cast<int>(blockDim.x))
      if (gs[e / gs32] == gs[e / gs32]) b[e] = kNegInf;  // group not kept
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int lane = static_cast<int>(threadIdx.x);
  bool nan = false;
  for (int64_t e = lane; e < E; e += 32) nan |= b[e] != b[e];
  float sum = 0.0f;
  const bool serial = __any_sync(0xffffffffu, nan) || E > 64 * 32;
  if (serial) {
    if (lane != 0) return;
    for (int64_t k = 0; k < K; ++k) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t j = 0; j < k; ++j) taken |= sel[j] == e;
        if (taken) continue;
        if (best < 0 || b[e] > b[best]) best = e;
      }
      sel[k] = static_cast<int32_t>(best);
      sum = __fadd_rn(sum, s[best]);
    }
  } else {
    uint64_t taken = 0;  // bit j: expert lane + 32 j taken
    for (int64_t k = 0; k < K; ++k) {
      float bv = kNegInf;
      int bi = -1;
      int j = 0;
      for (int64_t e = lane; e < E; e += 32, ++j) {
        if ((taken >> j) & 1u) continue;
        if (bi < 0 || b[e] > bv) {
          bv = b[e];
          bi = static_cast<int>(e);
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
          bv = ov;
          bi = oi;
        }
      }
      if (bi >= 0 && bi % 32 == lane) taken |= uint64_t{1} << (bi / 32);
      if (lane == 0) sel[k] = bi;
      sum = __fadd_rn(sum, s[bi]);
    }
    __syncwarp();
  }
  // The K ids and weights: lane 0 after the serial scan, else a lane each (every lane holds the same sum of all K,
  // accumulated in order above).
  for (int64_t k = serial ? 0 : lane; k < K; k += serial ? 1 : 32) {
    float wv = s[sel[k]];
    if (norm) wv = __fdiv_rn(wv, __fadd_rn(sum, 1e-20f));
    ids[m * K + k] = sel[k];
    weights[m * K + k] = __fmul_rn(wv, scaling);
  }
}

// One thread per column: pairs applied in order i = 0..n-1 (deterministic, the ref's order).
__global__ void scatter_add_kernel(TView x, const int32_t* token, const float* weight, int64_t n, int64_t D, TView y) {
  const bool bf16 = y.bf16 != 0;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < D;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = token[i];
      const float p = __fmul_rn(weight[i], tget(x, i, j));
      tset(y, r, j, __fadd_rn(tget(y, r, j), bf16 ? bf16r(p) : p));
    }
  }
}

// Block per (query s, 128 keys); q[s] (all heads) in shared memory.
__global__ void indexer_kernel(TView q, TView w, TView k, int64_t T, int64_t n_heads, int64_t head_dim, float scale,
                               const int64_t* q_pos, float* scores) {
  extern __shared__ float qs[];  // [n_heads * head_dim]
  const int64_t s = blockIdx.y;
  for (int64_t i = threadIdx.x; i < n_heads * head_dim; i += blockDim.x) qs[i] = tget(q, s, i);
  __syncthreads();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  if (t > q_pos[s]) {
    scores[s * T + t] = __uint_as_float(0xFF800000u);
    return;
  }
  double total = 0.0;
  for (int64_t j = 0; j < n_heads; ++j) {
    const float* qj = qs + j * head_dim;
    float dot = 0.0f;
    for (int64_t x = 0; x < head_dim; ++x) dot = fmaf(qj[x], tget(k, t, x), dot);
    const double d = static_cast<double>(dot) * scale;
    if (d > 0.0) total += static_cast<double>(tget(w, s, j)) * d;
  }
  scores[s * T + t] = static_cast<float>(total);
}

// Paged: block per (token of the step, 128 keys of its sequence); the block's key rows staged in shared memory
// (coalesced 16-byte copies from the pool), q of the token and its head weights too; thread = key.
constexpr int kIdxKeys = 128;
// Shared-memory row stride of a staged key: head_dim + 4 when rows can be read as float4 (conflict-free: a quarter
// warp's 16-byte reads start 4 banks apart), else head_dim + 1.
__host__ __device__ inline int64_t idx_key_ld(int64_t head_dim) {
  return head_dim % 4 == 0 ? head_dim + 4 : head_dim + 1;
}
__global__ void __launch_bounds__(kIdxKeys)
    indexer_paged_kernel(TView q, TView w, KvPool pool, StepSeqs seqs, int64_t r0, int64_t n_heads, int64_t head_dim,
                         float scale, const int64_t* q_pos, int64_t T, float* scores) {
  extern __shared__ __align__(16) float ish[];  // q [n_heads · head_dim] | w [n_heads] (rounded up to 4) | keys
  float* qs = ish;
  float* ws = qs + n_heads * head_dim;
  float* ks = ws + (n_heads + 3) / 4 * 4;  // [kIdxKeys · idx_key_ld(head_dim)]
  const int64_t row = blockIdx.y, i = r0 + row, t0 = static_cast<int64_t>(blockIdx.x) * kIdxKeys;
  const int64_t s = seq_of_token(seqs, i), last = q_pos[row] < seqs.ctx_len[s] - 1 ? q_pos[row] : seqs.ctx_len[s] - 1;
  if (t0 > last) {  // the whole tile is past the token's position
    for (int64_t t = t0 + threadIdx.x; t < t0 + kIdxKeys && t < T; t += blockDim.x)
      scores[row * T + t] = __uint_as_float(0xFF800000u);
    return;
  }
#pragma unroll 8
  for (int64_t e = threadIdx.x; e < n_heads * head_dim; e += blockDim.x) qs[e] = tget(q, row, e);
  for (int64_t e = threadIdx.x; e < n_heads; e += blockDim.x) ws[e] = tget(w, row, e);
  const TView kp{pool.data, pool.width, pool.dtype == DType::BF16 ? 1 : 0};
  const int32_t* blocks = seqs.block_table + s * seqs.max_blocks;
  const int64_t bt = pool.block_tokens, ld = idx_key_ld(head_dim);
  // Each thread finds one key's pool row (-1 past the token's position); then the rows are staged: 16-byte copies of
  // 8 bf16 values when the pool is bf16 with rows of whole chunks, else element-wise.
  __shared__ int64_t krow[kIdxKeys];
  {
    const int64_t t = t0 + threadIdx.x;
    krow[threadIdx.x] = t <= last ? static_cast<int64_t>(blocks[t / bt]) * bt + t % bt : -1;
  }
  __syncthreads();
  if (kp.bf16 && head_dim % 8 == 0 && pool.width % 8 == 0) {
    const int cpk = static_cast<int>(head_dim / 8);
#pragma unroll 4
    for (int e = threadIdx.x; e < kIdxKeys * cpk; e += blockDim.x) {
      const int j = e / cpk, ch = e % cpk;
      uint4 raw = make_uint4(0u, 0u, 0u, 0u);
      if (krow[j] >= 0)
        raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(pool.data) + krow[j] * pool.width + ch * 8);
      bf16x8_to_f(raw, ks + j * ld + ch * 8);
    }
  } else {
    for (int64_t e = threadIdx.x; e < kIdxKeys * head_dim; e += blockDim.x) {
      const int64_t j = e / head_dim, x = e % head_dim;
      ks[j * ld + x] = krow[j] >= 0 ? tget(kp, krow[j], x) : 0.0f;
    }
  }
  __syncthreads();
  const int64_t t = t0 + threadIdx.x;
  if (t >= T) return;
  if (t > last) {
    scores[row * T + t] = __uint_as_float(0xFF800000u);
    return;
  }
  const float* kt = ks + threadIdx.x * ld;
  double total = 0.0;
  const bool vec = head_dim % 4 == 0;  // (then qs and every key row are 16-byte aligned: idx_key_ld)
  for (int64_t jh = 0; jh < n_heads; ++jh) {
    const float* qj = qs + jh * head_dim;
    float dot = 0.0f;
    if (vec) {
      for (int64_t x = 0; x < head_dim; x += 4) {  // the same order of fmas as the scalar loop
        const float4 a = *reinterpret_cast<const float4*>(qj + x), b = *reinterpret_cast<const float4*>(kt + x);
        dot = fmaf(a.x, b.x, dot);
        dot = fmaf(a.y, b.y, dot);
        dot = fmaf(a.z, b.z, dot);
        dot = fmaf(a.w, b.w, dot);
      }
    } else {
      for (int64_t x = 0; x < head_dim; ++x) dot = fmaf(qj[x], kt[x], dot);
    }
    const double dd = static_cast<double>(dot) * scale;
    if (dd > 0.0) total += static_cast<double>(ws[jh]) * dd;
  }
  scores[row * T + t] = static_cast<float>(total);
}

// ---- deterministic top-k ----
// Every candidate t gets a unique 64-bit key: order-preserving score bits (NaN lowest) above ~t, so that a larger
// key = higher score, ties to the lower index. Per row (one block): radix-select the kk-th largest key (8 passes of
// 8 bits), gather the keys ≥ it (exactly kk), bitonic-sort them descending, write the indices.
__device__ __forceinline__ uint64_t topk_key(float v, int64_t t) {
  uint32_t b = __float_as_uint(v);
  if (v == 0.0f) b = 0;  // -0 ties with +0, as in the ref's comparison
  uint32_t o;
  if ((b & 0x7FFFFFFFu) > 0x7F800000u)
    o = 0;  // NaN sorts last
  else
    o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(o) << 32) | static_cast<uint64_t>(0xFFFFFFFFu - static_cast<uint32_t>(t));
}

constexpr int kTopkThreads = 1024;

__global__ void __launch_bounds__(kTopkThreads)
    topk_kernel(const float* scores, int64_t T, int64_t k, const int64_t* q_pos, int32_t* sel, int32_t* count,
                uint64_t* scratch, int64_t cap) {
  extern __shared__ uint64_t sm_keys[];
  __shared__ uint32_t hist[256];
  __shared__ uint64_t prefix_sh;
  __shared__ int64_t remaining_sh;
  __shared__ uint32_t n_out;
  const int64_t s = blockIdx.x;
  const float* row = scores + s * T;
  int64_t n = q_pos[s] + 1;
  if (n > T) n = T;
  if (n < 0) n = 0;
  const int64_t kk = k < n ? k : n;
  if (threadIdx.x == 0) count[s] = static_cast<int32_t>(kk);
  if (kk == 0) return;
  uint64_t* keys = scratch ? scratch + s * cap : sm_keys;
  // Threshold: the kk-th largest key (all of them when kk == n).
  uint64_t prefix = 0;
  if (kk < n) {
    int64_t remaining = kk;  // how many of the wanted keys lie at or below the current prefix's subtree
    for (int pass = 7; pass >= 0; --pass) {
      const int shift = pass * 8;
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint64_t hi_mask = pass == 7 ? 0 : (~0ULL << (shift + 8));
      for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
        const uint64_t key = topk_key(row[t], t);
        if ((key & hi_mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], 1u);
      }
      __syncthreads();
      // The digit: scanning from 255 down, the first whose cumulative count reaches `remaining` (digit 0 when none
      // does). Warp 0: lane l sums digits 255 − 8l .. 248 − 8l, a scan over the lanes finds the lane, which scans
      // its eight digits (the result of the serial scan, in a few steps).
      if (threadIdx.x < 32) {
        const int lane = static_cast<int>(threadIdx.x);
        uint32_t cnt[8];
        int64_t ls = 0;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          cnt[u] = hist[255 - 8 * lane - u];
          ls += cnt[u];
        }
        int64_t inc = ls;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const int64_t v = __shfl_up_sync(0xFFFFFFFFu, inc, off);
          if (lane >= off) inc += v;
        }
        const unsigned hit = __ballot_sync(0xFFFFFFFFu, inc >= remaining);
        const int found = hit ? __ffs(static_cast<int>(hit)) - 1 : 31;
        if (lane == found) {
          int64_t acc = inc - ls;
          int digit = 0;
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const int d = 255 - 8 * lane - u;
            if (d == 0 || acc + cnt[u] >= remaining) {
              digit = d;
              break;
            }
            acc += cnt[u];
          }
          prefix_sh = prefix | (static_cast<uint64_t>(digit) << shift);
          remaining_sh = remaining - acc;
        }
      }
      __syncthreads();
      prefix = prefix_sh;
      remaining = remaining_sh;
      __syncthreads();
    }
  }
  // Gather keys ≥ threshold (kk of them; keys are unique). Pad to a power of two with 0 (below every real key:
  // real keys have a non-zero low half because t ≤ 2^32 - 2).
  int64_t p2 = 1;
  while (p2 < kk) p2 <<= 1;
  if (threadIdx.x == 0) n_out = 0;
  __syncthreads();
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
    const uint64_t key = topk_key(row[t], t);
    if (kk == n || key >= prefix) keys[atomicAdd(&n_out, 1u)] = key;
  }
  __syncthreads();
  for (int64_t i = kk + threadIdx.x; i < p2; i += blockDim.x) keys[i] = 0;
  __syncthreads();
  // Bitonic sort, descending.
  for (int64_t size = 2; size <= p2; size <<= 1) {
    for (int64_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (int64_t i = threadIdx.x; i < p2; i += blockDim.x) {
        const int64_t j = i ^ stride;
        if (j > i) {
          const bool desc = (i & size) == 0;
          const uint64_t a = keys[i], b = keys[j];
          if (desc ? a < b : a > b) {
            keys[i] = b;
            keys[j] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int64_t i = threadIdx.x; i < kk; i += blockDim.x)
    sel[s * k + i] = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(keys[i] & 0xFFFFFFFFu));
}

constexpr int64_t kTopkSharedKeys = 4096;  // 32 KB of keys in shared memory

int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

// Rows of up to 32 · kNormThreads elements (8,192: every hidden size of the supported models) take the register
// form, with as few registers per thread as the row needs.
void launch_rms_norm(TView x, const float* w, int64_t M, int64_t D, float eps, TView y, cudaStream_t st) {
  if (M <= 0 || D <= 0) return;
  const unsigned g = static_cast<unsigned>(M);
  if (D <= 4 * kNormThreads)
    rms_norm_reg_kernel<4><<<g, kNormThreads, 0, st>>>(x, w, D, eps, y);
  else if (D <= 8 * kNormThreads)
    rms_norm_reg_kernel<8><<<g, kNormThreads, 0, st>>>(x, w, D, eps, y);
  else if (D <= 32 * kNormThreads)
    rms_norm_reg_kernel<32><<<g, kNormThreads, 0, st>>>(x, w, D, eps, y);
  else
    rms_norm_kernel<<<g, kNormThreads, 0, st>>>(x, w, D, eps, y);
}

void launch_add_rms_norm(TView h, TView delta, const float* w, int64_t M, int64_t D, float eps, TView y,
                         cudaStream_t st) {
  if (M <= 0 || D <= 0) return;
  const unsigned g = static_cast<unsigned>(M);
  if (D <= 8 * kNormThreads)
    add_rms_norm_reg_kernel<8><<<g, kNormThreads, 0, st>>>(h, delta, w, D, eps, y);
  else if (D <= 32 * kNormThreads)
    add_rms_norm_reg_kernel<32><<<g, kNormThreads, 0, st>>>(h, delta, w, D, eps, y);
  else
    add_rms_norm_kernel<<<g, kNormThreads, 0, st>>>(h, delta, w, D, eps, y);
}

bool mla_qkv_tail_ok(int64_t dc, int64_t dr) { return dc > 0 && dc <= 32 * kNormThreads && dr > 0 && dr % 2 == 0; }

void launch_mla_qkv_tail(TView q, int64_t q_col0, int64_t n_heads, int64_t head_stride, TView kv, int64_t dc,
                         const float* norm_w, float eps, const int64_t* pos, const int64_t* slots, int64_t n,
                         const KvPool& pool, const RopeParams& rp, cudaStream_t st) {
  if (n <= 0) return;
  const int64_t half = rp.dim / 2;
  // Part 0 the latent; 1 .. the q_pe pairs, one per thread (at most 64 parts: a loop beyond).
  const int64_t q_parts = std::min<int64_t>((n_heads * half + kNormThreads - 1) / kNormThreads, 64);
  const dim3 g(static_cast<unsigned>(n), static_cast<unsigned>(1 + q_parts));
#define LATENT_QKV_TAIL(PER)                                                                                      \
  mla_qkv_tail_kernel<PER><<<g, kNormThreads, 0, st>>>(q, q_col0, n_heads, head_stride, kv, dc, norm_w, eps, pos, \
                                                       slots, pool, rp.inv_freq, half, rp.attention_factor,       \
                                                       rp.interleaved)
  if (dc <= 4 * kNormThreads)
    LATENT_QKV_TAIL(4);
  else if (dc <= 8 * kNormThreads)
    LATENT_QKV_TAIL(8);
  else
    LATENT_QKV_TAIL(32);
#undef LATENT_QKV_TAIL
}

void launch_layer_norm(TView x, const float* w, const float* b, int64_t M, int64_t D, float eps, TView y,
                       cudaStream_t st) {
  if (M <= 0 || D <= 0) return;
  layer_norm_kernel<<<static_cast<unsigned>(M), kNormThreads, 0, st>>>(x, w, b, D, eps, y);
}

void launch_rope(TView x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, const int64_t* pos,
                 const RopeParams& p, cudaStream_t st) {
  const int64_t half = p.dim / 2, n = n_tokens * n_heads * half;
  if (n <= 0) return;
  rope_kernel<<<grid_for(n, 256), 256, 0, st>>>(x, n_tokens, n_heads, head_stride, pos, p.inv_freq, half,
                                                p.attention_factor, p.interleaved);
}

void launch_silu_mul(TView gate, TView up, int64_t rows, int64_t cols, TView out, cudaStream_t st) {
  if (rows * cols <= 0) return;
  silu_mul_kernel<<<grid_for(rows * cols, 256), 256, 0, st>>>(gate, up, rows, cols, out);
}

void launch_add(TView y, TView x, int64_t rows, int64_t cols, cudaStream_t st) {
  if (rows * cols <= 0) return;
  add_kernel<<<grid_for(rows * cols, 256), 256, 0, st>>>(y, x, rows, cols);
}

void launch_convert(TView src, TView dst, int64_t rows, int64_t cols, cudaStream_t st) {
  if (rows * cols <= 0) return;
  convert_kernel<<<grid_for(rows * cols, 256), 256, 0, st>>>(src, dst, rows, cols);
}

void launch_epilogue(const float* acc, const float* gacc, const float* bias, TView gate, TView residual, int64_t M,
                     int64_t N, TView y, const int64_t* row_lo, const int64_t* row_hi, cudaStream_t st) {
  if (M * N <= 0) return;
  epilogue_kernel<<<grid_for(M * N, 256), 256, 0, st>>>(acc, gacc, bias, gate, residual, M, N, y, row_lo, row_hi);
}

void launch_router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
                   float* weights, cudaStream_t st) {
  if (M <= 0) return;
  const int64_t G = p.n_group > 1 ? p.n_group : 1;
  const size_t smem = static_cast<size_t>(2 * p.n_experts + G + p.top_k) * sizeof(float);  // + sel[K]
  router_kernel<<<static_cast<unsigned>(M), 128, smem, st>>>(logits, bias, p.n_experts, G, p.topk_group, p.top_k,
                                                             p.norm_topk_prob, p.routed_scaling_factor, ids, weights);
}

void launch_scatter_add_weighted(TView x, const int32_t* token, const float* weight, int64_t n, int64_t D, TView y,
                                 cudaStream_t st) {
  if (n <= 0 || D <= 0) return;
  scatter_add_kernel<<<grid_for(D, 128), 128, 0, st>>>(x, token, weight, n, D, y);
}

size_t topk_scratch_bytes(int64_t S, int64_t k) {
  const int64_t p2 = pow2_at_least(k);
  if (p2 <= kTopkSharedKeys) return 0;
  return static_cast<size_t>(S * p2) * sizeof(uint64_t);
}

void launch_topk_select(const float* scores, int64_t S, int64_t T, int64_t k, const int64_t* q_pos, int32_t* sel,
                        int32_t* count, void* scratch, cudaStream_t st) {
  if (S <= 0) return;
  const int64_t p2 = pow2_at_least(k < 1 ? 1 : k);
  const bool shared = p2 <= kTopkSharedKeys;
  const size_t smem = shared ? static_cast<size_t>(p2) * sizeof(uint64_t) : 0;
  topk_kernel<<<static_cast<unsigned>(S), kTopkThreads, smem, st>>>(
      scores, T, k, q_pos, sel, count, shared ? nullptr : static_cast<uint64_t*>(scratch), p2);
}

void launch_indexer_scores_paged(TView q, TView w, const KvPool& pool, const StepSeqs& seqs, int64_t r0, int64_t n,
                                 int64_t n_heads, int64_t head_dim, float scale, const int64_t* q_pos, int64_t T,
                                 float* scores, cudaStream_t st) {
  if (n <= 0 || T <= 0) return;
  const size_t smem =
      static_cast<size_t>(n_heads * head_dim + (n_heads + 3) / 4 * 4 + kIdxKeys * idx_key_ld(head_dim)) * sizeof(float);
  static const cudaError_t attr =
      cudaFuncSetAttribute(indexer_paged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  (void)attr;
  const dim3 grid(static_cast<unsigned>((T + kIdxKeys - 1) / kIdxKeys), static_cast<unsigned>(n));
  indexer_paged_kernel<<<grid, kIdxKeys, smem, st>>>(q, w, pool, seqs, r0, n_heads, head_dim, scale, q_pos, T, scores);
}

void launch_indexer_scores(TView q, TView w, TView k, int64_t S, int64_t T, int64_t n_heads, int64_t head_dim,
                           float scale, const int64_t* q_pos, float* scores, cudaStream_t st) {
  if (S <= 0 || T <= 0) return;
  const dim3 grid(static_cast<unsigned>((T + 127) / 128), static_cast<unsigned>(S));
  const size_t smem = static_cast<size_t>(n_heads * head_dim) * sizeof(float);
  indexer_kernel<<<grid, 128, smem, st>>>(q, w, k, T, n_heads, head_dim, scale, q_pos, scores);
}

}  // namespace latent::cuda
