// MLA attention on the GPU: the naive (prefill) form over expanded keys/values and the weight-absorbed (decode)
// form over the latent cache. One block per (query, head). The allowed keys (causal ∩ DSA selection) are a bitmap
// in shared memory; softmax statistics (running max and sum) come from one pass over the keys, the probabilities and
// the weighted sum of values from a second pass in tiles of kTile keys. bf16 mode rounds the scores, scaled scores,
// probabilities and outputs (and, absorbed, q_lat and o_lat) exactly where the ref backend does.
#include <cooperative_groups.h>

#include "kernels/cuda/cuda_skinny.cuh"

namespace latent::cuda {

namespace {

constexpr int kTile = 128;
constexpr int kMaxPerThread = 4;  // naive form: dv ≤ 4 · 128

// Marks the keys query s may attend to; returns last (keys t ≤ last are causal-allowed).
__device__ int64_t build_allowed(uint32_t* bits, int64_t s, int64_t T, const int64_t* q_pos, KeySelection sel) {
  int64_t last = q_pos[s] < T - 1 ? q_pos[s] : T - 1;
  const int64_t words = (T + 31) / 32;
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) bits[i] = sel.sel ? 0u : 0xFFFFFFFFu;
  __syncthreads();
  if (sel.sel) {
    const int32_t* row = sel.sel + s * sel.stride;
    const int32_t cnt = sel.count[s];
    for (int32_t j = threadIdx.x; j < cnt; j += blockDim.x) {
      const int32_t t = row[j];
      if (t >= 0 && t <= last) atomicOr(&bits[t >> 5], 1u << (t & 31));
    }
  }
  __syncthreads();
  return last;
}
__device__ __forceinline__ bool allowed(const uint32_t* bits, int64_t t) { return (bits[t >> 5] >> (t & 31)) & 1u; }

__device__ __forceinline__ float scaled(float dot, float scale, bool bf16) {
  return bf16 ? bf16r(__fmul_rn(bf16r(dot), scale)) : __fmul_rn(dot, scale);
}

// Combines per-thread (max, sum of exp(score - max)) over the block.
__device__ void block_softmax_stats(float m, float l, float* shm, float* shl, float& gm, float& gl) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xFFFFFFFFu, m, o), l2 = __shfl_xor_sync(0xFFFFFFFFu, l, o);
    const float mm = fmaxf(m, m2);
    l = (m == mm ? l : l * expf(m - mm)) + (m2 == mm ? l2 : l2 * expf(m2 - mm));
    m = mm;
  }
  __syncthreads();
  if (lane == 0) {
    shm[warp] = m;
    shl[warp] = l;
  }
  __syncthreads();
  float M = shm[0];
  for (int i = 1; i < nw; ++i) M = fmaxf(M, shm[i]);
  float L = 0.0f;
  for (int i = 0; i < nw; ++i) L += shm[i] == M ? shl[i] : shl[i] * expf(shm[i] - M);
  gm = M;
  gl = L;
}

__device__ __forceinline__ void online_add(float& m, float& l, float v) {
  if (v > m) {
    l = l * expf(m - v) + 1.0f;
    m = v;
  } else {
    l += expf(v - m);
  }
}

// ---- naive form: block per (s, h), 128 threads ----
__global__ void __launch_bounds__(128) mla_naive_kernel(MlaDims d, TView q, TView kvb, TView k_pe, int64_t T,
                                                        const int64_t* q_pos, KeySelection sel, float scale, TView o) {
  const bool bf16 = o.bf16 != 0;
  extern __shared__ uint32_t smem_u[];
  const int64_t H = d.n_heads, dn = d.nope, dr = d.rope, dv = d.v, dqk = dn + dr, dkv = dn + dv;
  const int64_t s = blockIdx.x / H, h = blockIdx.x % H;
  uint32_t* bits = smem_u;
  float* qs = reinterpret_cast<float*>(smem_u + (T + 31) / 32);
  __shared__ float p_sh[kTile];
  __shared__ int64_t t_sh[kTile];
  __shared__ float shm[32], shl[32];
  for (int64_t i = threadIdx.x; i < dqk; i += blockDim.x) qs[i] = tget(q, s, h * dqk + i);
  const int64_t last = build_allowed(bits, s, T, q_pos, sel);
  auto score = [&](int64_t t) {
    float dot = 0.0f;
    for (int64_t x = 0; x < dn; ++x) dot = fmaf(qs[x], tget(kvb, t, h * dkv + x), dot);
    for (int64_t x = 0; x < dr; ++x) dot = fmaf(qs[dn + x], tget(k_pe, t, x), dot);
    return scaled(dot, scale, bf16);
  };
  float m = __uint_as_float(0xFF800000u), l = 0.0f;
  for (int64_t t = threadIdx.x; t <= last; t += blockDim.x)
    if (allowed(bits, t)) online_add(m, l, score(t));
  float gm, gl;
  block_softmax_stats(m, l, shm, shl, gm, gl);
  float acc[kMaxPerThread];
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) acc[i] = 0.0f;
  for (int64_t t0 = 0; t0 <= last; t0 += kTile) {
    const int64_t t = t0 + threadIdx.x;
    float p = 0.0f;
    if (threadIdx.x < kTile && t <= last && allowed(bits, t)) {
      p = expf(score(t) - gm) / gl;
      if (bf16) p = bf16r(p);
    }
    if (threadIdx.x < kTile) {
      p_sh[threadIdx.x] = p;
      t_sh[threadIdx.x] = t <= last ? t : last;
    }
    __syncthreads();
    const int64_t nt = last - t0 + 1 < kTile ? last - t0 + 1 : kTile;
    for (int64_t j = 0; j < nt; ++j) {
      const float pj = p_sh[j];
      if (pj == 0.0f) continue;
      const int64_t tj = t_sh[j];
#pragma unroll
      for (int i = 0; i < kMaxPerThread; ++i) {
        const int64_t x = threadIdx.x + i * blockDim.x;
        if (x < dv) acc[i] = fmaf(pj, tget(kvb, tj, h * dkv + dn + x), acc[i]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    const int64_t x = threadIdx.x + i * blockDim.x;
    if (x < dv) tset(o, s, h * dv + x, acc[i]);
  }
}

// ---- DSA selection as a bitmap per query row: mask[s · words + t / 32] bit t % 32 set when key t is in row s's
// selection (0 <= t <= the row's causal limit); words = ceil(T / 32). Block per row.
__global__ void sel_mask_kernel(KeySelection sel, const int64_t* q_pos, int64_t T, int64_t words, uint32_t* mask) {
  const int64_t s = blockIdx.x;
  uint32_t* row = mask + s * words;
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) row[i] = 0u;
  __syncthreads();
  const int64_t last = q_pos[s] < T - 1 ? q_pos[s] : T - 1;
  const int32_t* sr = sel.sel + s * sel.stride;
  const int32_t cnt = sel.count[s];
  for (int32_t j = threadIdx.x; j < cnt; j += blockDim.x) {
    const int32_t t = sr[j];
    if (t >= 0 && t <= last) atomicOr(&row[t >> 5], 1u << (t & 31));
  }
}

// ---- naive form on tensor cores (bf16): block per (64 queries, head), 4 warps ----
// FlashAttention-2 style: Q (64 × DQK) staged once in shared memory, keys in tiles of 64 (K = k_nope ‖ k_pe rows
// and V rows by cp.async, zero past T), S = Q·Kᵀ and O += P·V on mma.sync m16n8k16 (ldmatrix; V transposed), the
// softmax online in fp32 per query row (running max and sum; rows g and g + 8 of each warp's 16 per lane). The
// scores are rounded as the ref rounds them (bf16 dot, bf16 scaled score); P enters the PV product as bf16 without
// the 1/sum (applied to O at the end), so a result differs from the ref's rounding of each probability by bf16
// rounding only. A query with no allowed key (position < 0, an empty selection) gets o = 0. Rows padded by 8
// elements (conflict-free ldmatrix). A DSA selection comes as the bitmap of sel_mask_kernel (mask, mwords; null: all
// causal keys): a key outside its row's selection scores -inf, and a 64-key tile no query of the block selects is
// not loaded.
constexpr int kFaQ = 64, kFaK = 64, kFaThreads = 128;
template <int DQK, int DV>
constexpr size_t fa_smem() {
  return static_cast<size_t>(2 * kFaQ * (DQK + 8) + kFaK * (DV + 8)) * 2;
}
template <int DQK, int DV>
__global__ void __launch_bounds__(kFaThreads)
    mla_flash_kernel(MlaDims d, TView q, TView kvb, TView k_pe, int64_t S, int64_t T, const int64_t* q_pos, float scale,
                     TView o, const uint32_t* mask, int64_t mwords) {
  constexpr int QS = DQK + 8, VS = DV + 8;
  extern __shared__ __align__(16) uint16_t fa_buf[];
  uint16_t* qs = fa_buf;          // [64][QS]
  uint16_t* ks = qs + kFaQ * QS;  // [64][QS]
  uint16_t* vs = ks + kFaK * QS;  // [64][VS]
  __shared__ int64_t lim_sh[kFaQ];
  __shared__ int64_t kmax_sh;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t h = blockIdx.y, s0 = static_cast<int64_t>(blockIdx.x) * kFaQ;
  const int64_t dn = d.nope, dkv = dn + DV;
  const auto* qp = static_cast<const uint16_t*>(q.p);
  const auto* kvp = static_cast<const uint16_t*>(kvb.p);
  const auto* kpp = static_cast<const uint16_t*>(k_pe.p);
  if (threadIdx.x < kFaQ) {
    const int64_t s = s0 + threadIdx.x;
    int64_t lim = -1;
    if (s < S) lim = q_pos[s] < T - 1 ? q_pos[s] : T - 1;
    lim_sh[threadIdx.x] = lim;
  }
  for (int i = threadIdx.x; i < kFaQ * (DQK / 8); i += kFaThreads) {
    const int r = i / (DQK / 8), c = i % (DQK / 8);
    const int64_t s = s0 + r;
    cp_async16(qs + r * QS + 8 * c, qp + (s < S ? s : 0) * q.ld + h * DQK + 8 * c, s < S);
  }
  cp_async_commit();
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t mx = -1;
    for (int i = 0; i < kFaQ; ++i) mx = lim_sh[i] > mx ? lim_sh[i] : mx;
    kmax_sh = mx;
  }
  __syncthreads();
  const int64_t kmax = kmax_sh, lim[2] = {lim_sh[warp * 16 + g], lim_sh[warp * 16 + g + 8]};
  const float ninf = __uint_as_float(0xFF800000u);
  float oacc[DV / 8][4] = {};
  float mrow[2] = {ninf, ninf}, lrow[2] = {0.0f, 0.0f};
  const int64_t mrow0 = s0 + warp * 16 + g;
  for (int64_t k0 = 0; k0 <= kmax; k0 += kFaK) {
    // The selection's 64 bits of this tile for this lane's two rows (rows g, g + 8 of the warp's 16).
    uint32_t mw[2][2] = {{~0u, ~0u}, {~0u, ~0u}};
    if (mask) {
      const int64_t w0 = k0 >> 5;
      bool mine = false;
      if (threadIdx.x < kFaQ && s0 + threadIdx.x < S && lim_sh[threadIdx.x] >= k0) {
        const uint32_t* mr = mask + (s0 + threadIdx.x) * mwords + w0;
        mine = (mr[0] | (w0 + 1 < mwords ? mr[1] : 0u)) != 0u;
      }
      if (!__syncthreads_or(mine)) continue;  // uniform: no query of the block selects a key of this tile
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t s = mrow0 + 8 * r;
        const uint32_t* mr = mask + (s < S ? s : 0) * mwords + w0;
        mw[r][0] = s < S ? mr[0] : 0u;
        mw[r][1] = s < S && w0 + 1 < mwords ? mr[1] : 0u;
      }
    }
    for (int i = threadIdx.x; i < kFaK * (DQK / 8); i += kFaThreads) {
      const int r = i / (DQK / 8), c = i % (DQK / 8);
      const int64_t tk = k0 + r, tt = tk < T ? tk : 0;
      const uint16_t* src = 8 * c < dn ? kvp + tt * kvb.ld + h * dkv + 8 * c : kpp + tt * k_pe.ld + (8 * c - dn);
      cp_async16(ks + r * QS + 8 * c, src, tk < T);
    }
    for (int i = threadIdx.x; i < kFaK * (DV / 8); i += kFaThreads) {
      const int r = i / (DV / 8), c = i % (DV / 8);
      const int64_t tk = k0 + r;
      cp_async16(vs + r * VS + 8 * c, kvp + (tk < T ? tk : 0) * kvb.ld + h * dkv + dn + 8 * c, tk < T);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float sc[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk) {
      uint32_t a[4];
      ldsm_x4(a, qs + (warp * 16 + (lane & 15)) * QS + kk * 16 + 8 * (lane >> 4));
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        uint32_t b[4];
        ldsm_x4(b, ks + (jp * 16 + (lane & 7) + 8 * (lane >> 4)) * QS + kk * 16 + 8 * ((lane >> 3) & 1));
        mma_bf16_16816(sc[2 * jp], a[0], a[1], a[2], a[3], b[0], b[1]);
        mma_bf16_16816(sc[2 * jp + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
      }
    }
    // Scores as the ref rounds them, masked; the running max and sum.
    float tmax[2] = {ninf, ninf};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int off = 8 * j + 2 * t + (e & 1);
        const int64_t key = k0 + off;
        float v = bf16r(__fmul_rn(bf16r(sc[j][e]), scale));
        if (key > lim[e >> 1] || !((mw[e >> 1][j >> 2] >> (off & 31)) & 1u)) v = ninf;
        sc[j][e] = v;
        tmax[e >> 1] = fmaxf(tmax[e >> 1], v);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xFFFFFFFFu, tmax[r], 1));
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xFFFFFFFFu, tmax[r], 2));
      const float mnew = fmaxf(mrow[r], tmax[r]);
      const float corr = mnew == ninf ? 1.0f : expf(mrow[r] - mnew);
      mrow[r] = mnew;
      lrow[r] *= corr;
#pragma unroll
      for (int j = 0; j < DV / 8; ++j) {
        oacc[j][2 * r] *= corr;
        oacc[j][2 * r + 1] *= corr;
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float m = mrow[e >> 1];
        const float p = m == ninf ? 0.0f : expf(sc[j][e] - m);
        sc[j][e] = p;
        lrow[e >> 1] += p;
      }
      // O += P·V (P as bf16 A fragments straight from the score accumulators).
#pragma unroll
    for (int kk = 0; kk < kFaK / 16; ++kk) {
      const uint32_t a0 = bf16x2_bits(sc[2 * kk][0], sc[2 * kk][1]), a1 = bf16x2_bits(sc[2 * kk][2], sc[2 * kk][3]),
                     a2 = bf16x2_bits(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                     a3 = bf16x2_bits(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
      for (int np = 0; np < DV / 16; ++np) {
        uint32_t b[4];
        ldsm_x4_t(b, vs + (16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1)) * VS + 16 * np + 8 * (lane >> 4));
        mma_bf16_16816(oacc[2 * np], a0, a1, a2, a3, b[0], b[1]);
        mma_bf16_16816(oacc[2 * np + 1], a0, a1, a2, a3, b[2], b[3]);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lrow[r] += __shfl_xor_sync(0xFFFFFFFFu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xFFFFFFFFu, lrow[r], 2);
    const int64_t s = s0 + warp * 16 + g + 8 * r;
    if (s >= S) continue;
    const float inv = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
#pragma unroll
    for (int j = 0; j < DV / 8; ++j) {
      tset(o, s, h * DV + 8 * j + 2 * t, oacc[j][2 * r] * inv);
      tset(o, s, h * DV + 8 * j + 2 * t + 1, oacc[j][2 * r + 1] * inv);
    }
  }
}

// ---- absorbed form: block per (s, h), 256 threads (8 warps) ----
// Keys: rows(t) gives key t's latent row (dc values) and rotated key (dr values); T is their element type
// (float, or uint16_t holding bf16 bits).
__device__ __forceinline__ float ld(const float* p, int64_t x) { return p[x]; }
__device__ __forceinline__ float ld(const uint16_t* p, int64_t x) { return bf16_bits_to_f(p[x]); }

struct ContiguousKeys {
  using Elem = float;
  const float* c;
  const float* k_pe;
  int64_t dc, dr;
  __device__ void rows(int64_t t, const float*& cr, const float*& kr) const {
    cr = c + t * dc;
    kr = k_pe + t * dr;
  }
};
template <class T>
struct PagedKeys {
  using Elem = T;
  const T* data;
  int64_t width, block_tokens;
  const int32_t* blocks;  // this sequence's block table
  int64_t dc;
  __device__ void rows(int64_t t, const T*& cr, const T*& kr) const {
    const int32_t tt = static_cast<int32_t>(t), bt = static_cast<int32_t>(block_tokens);  // 32-bit: cheap division
    const int64_t row = static_cast<int64_t>(blocks[tt / bt]) * bt + tt % bt;
    cr = data + row * width;
    kr = cr + dc;
  }
};

// One (query, head): q_row [dqk] in global memory, keys t ≤ last allowed by `bits` (already built), o_row [dv].
// Vector loads of key rows: 16 bytes (4 fp32 or 8 bf16) into floats.
template <class Elem>
struct KeyVec;
template <>
struct KeyVec<float> {
  static constexpr int kN = 4;
  __device__ static void load(const float* p, float (&v)[8]) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  }
};
template <>
struct KeyVec<uint16_t> {
  static constexpr int kN = 8;
  __device__ static void load(const uint16_t* p, float (&v)[8]) { bf16x8_to_f(*reinterpret_cast<const uint4*>(p), v); }
};

constexpr int kAbsThreads = 512;
constexpr int kAbsCluster = 4;  // blocks (one per SM) sharing one (token, head) when there are few work items
constexpr int kMaxChunksPerThread = 2;

// One (query, head): q_row [dqk] in global memory, keys t ≤ last allowed by `bits` (already built), o_row [dv].
// Shared memory (caller's): qs [dqk], qlat [dc], olat [dc], part [dc · groups], sc [last + 1] when `sc` is non-null
// (the scores of the first pass, reused by the second; null: recomputed).
// Pass 1 (warp per key, two keys per iteration, 16-byte loads when `vec`): scores and the softmax statistics.
// Pass 2 (tiles of kTile keys): probabilities (one thread per key), then Σ p·c with threads split into column
// chunks × key groups, the groups summed in a fixed order.
// With n_ranks > 1 the blocks of a thread-block cluster share the work item: rank r takes the r-th contiguous slice
// of the keys; the softmax statistics and the o_lat partials are combined over distributed shared memory in rank
// order (deterministic), and the ranks split the W_UV projection.
template <class Keys>
__device__ void absorbed_one(const MlaDims& d, const TView& q, int64_t qi, const WDesc& kv_b, const Keys& keys,
                             int64_t h, int64_t last, const uint32_t* bits, float* qs, float* qlat, float* olat,
                             float* part, float* sc, bool vec, float scale, const TView& o, bool bf16, int rank,
                             int n_ranks) {
  __shared__ float stat_sh[2];
  const int64_t per = (last + n_ranks) / n_ranks;  // ceil((last + 1) / n_ranks)
  const int64_t lo_t = rank * per, hi_t = lo_t + per - 1 < last ? lo_t + per - 1 : last;
  using Elem = typename Keys::Elem;
  using V = KeyVec<Elem>;
  __shared__ float p_sh[kTile];
  __shared__ const Elem* row_sh[kTile];
  __shared__ float shm[32], shl[32];
  const int64_t dn = d.nope, dr = d.rope, dv = d.v, dc = d.latent, dqk = dn + dr, dkv = dn + dv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int64_t i = threadIdx.x; i < dqk; i += blockDim.x) qs[i] = tget(q, qi, h * dqk + i);
  __syncthreads();
  // q_lat = W_UK[h]ᵀ · q_nope: the ranks of a cluster compute one slice each (8 weight loads in flight per thread,
  // bf16 weights read directly), then gather the other slices over distributed shared memory.
  const int64_t xper = (dc + n_ranks - 1) / n_ranks, x_lo = rank * xper, x_hi = x_lo + xper < dc ? x_lo + xper : dc;
  const bool wbf16 = kv_b.format == kFmtBF16;
  for (int64_t x = x_lo + threadIdx.x; x < x_hi; x += blockDim.x) {
    float a = 0.0f;
    for (int64_t j0 = 0; j0 < dn; j0 += 8) {
      float wv[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int64_t row = h * dkv + j0 + u;
        wv[u] = j0 + u >= dn ? 0.0f
                : wbf16      ? bf16_bits_to_f(reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(kv_b.data) +
                                                                           row * kv_b.row_bytes)[x])
                             : wget(kv_b, row, x);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (j0 + u < dn) a = fmaf(qs[j0 + u], wv[u], a);
    }
    qlat[x] = bf16 ? bf16r(a) : a;
  }
  if (n_ranks > 1) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every slice is written
    for (int r = 0; r < n_ranks; ++r) {
      if (r == rank) continue;
      const float* remote = cluster.map_shared_rank(qlat, r);
      const int64_t r_lo = r * xper, r_hi = r_lo + xper < dc ? r_lo + xper : dc;
      for (int64_t x = r_lo + threadIdx.x; x < r_hi; x += blockDim.x) qlat[x] = remote[x];
    }
    cluster.sync();  // nobody reads a remote slice any more
  }
  __syncthreads();
  // Warp per key: lanes over the latent dims.
  auto dot_of = [&](const Elem* cr, const Elem* kr) {
    float dot = 0.0f;
    if (vec) {
      float v[8];
      for (int64_t cch = lane; cch < dc / V::kN; cch += 32) {
        V::load(cr + cch * V::kN, v);
#pragma unroll
        for (int e = 0; e < V::kN; ++e) dot = fmaf(qlat[cch * V::kN + e], v[e], dot);
      }
      for (int64_t cch = lane; cch < dr / V::kN; cch += 32) {
        V::load(kr + cch * V::kN, v);
#pragma unroll
        for (int e = 0; e < V::kN; ++e) dot = fmaf(qs[dn + cch * V::kN + e], v[e], dot);
      }
    } else {
      for (int64_t x = lane; x < dc; x += 32) dot = fmaf(qlat[x], ld(cr, x), dot);
      for (int64_t x = lane; x < dr; x += 32) dot = fmaf(qs[dn + x], ld(kr, x), dot);
    }
    return dot;
  };
  // Pass 1.
  float m = __uint_as_float(0xFF800000u), l = 0.0f;
  for (int64_t t = lo_t + warp; t <= hi_t; t += 2 * nw) {
    const int64_t t2 = t + nw;
    const bool a1 = allowed(bits, t), a2 = t2 <= hi_t && allowed(bits, t2);
    const Elem *c1, *k1, *c2, *k2;
    keys.rows(t, c1, k1);
    keys.rows(a2 ? t2 : t, c2, k2);
    const float d1 = a1 ? dot_of(c1, k1) : 0.0f, d2 = a2 ? dot_of(c2, k2) : 0.0f;
    const float v1 = scaled(warp_sum(d1), scale, bf16), v2 = scaled(warp_sum(d2), scale, bf16);
    if (lane == 0) {
      if (a1) online_add(m, l, v1);
      if (a2) online_add(m, l, v2);
      if (sc) {
        sc[t] = v1;
        if (t2 <= hi_t) sc[t2] = v2;
      }
    }
  }
  float gm, gl;
  block_softmax_stats(m, l, shm, shl, gm, gl);  // (syncs: sc visible)
  if (n_ranks > 1) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) {
      stat_sh[0] = gm;
      stat_sh[1] = gl;
    }
    cluster.sync();
    float M = __uint_as_float(0xFF800000u), L = 0.0f;
    for (int r = 0; r < n_ranks; ++r) M = fmaxf(M, cluster.map_shared_rank(stat_sh, r)[0]);
    for (int r = 0; r < n_ranks; ++r) {
      const float* st = cluster.map_shared_rank(stat_sh, r);
      L += st[0] == M ? st[1] : st[1] * expf(st[0] - M);
    }
    gm = M;
    gl = L;
  }
  // Pass 2 layout: nch column chunks of cw values; groups of threads take interleaved keys.
  const int cw = vec ? V::kN : 1;
  const int64_t nch = dc / cw;
  const int groups = nch >= blockDim.x ? 1 : static_cast<int>(blockDim.x / nch);
  const int grp = static_cast<int>(threadIdx.x / (nch >= blockDim.x ? blockDim.x : nch));
  float acc[kMaxChunksPerThread][8];
#pragma unroll
  for (int u = 0; u < kMaxChunksPerThread; ++u)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[u][e] = 0.0f;
  for (int64_t t0 = lo_t; t0 <= hi_t; t0 += kTile) {
    if (sc) {
      for (int64_t j = threadIdx.x; j < kTile; j += blockDim.x) {
        const int64_t t = t0 + j;
        float p = 0.0f;
        if (t <= hi_t && allowed(bits, t)) {
          p = expf(sc[t] - gm) / gl;
          if (bf16) p = bf16r(p);
        }
        const Elem *cr, *kr;
        keys.rows(t <= hi_t ? t : hi_t, cr, kr);
        p_sh[j] = p;
        row_sh[j] = cr;
      }
    } else {
      for (int64_t j = warp; j < kTile; j += nw) {
        const int64_t t = t0 + j;
        const Elem *cr, *kr;
        keys.rows(t <= hi_t ? t : hi_t, cr, kr);
        float p = 0.0f;
        if (t <= hi_t && allowed(bits, t)) {
          p = expf(scaled(warp_sum(dot_of(cr, kr)), scale, bf16) - gm) / gl;
          if (bf16) p = bf16r(p);
        }
        if (lane == 0) {
          p_sh[j] = p;
          row_sh[j] = cr;
        }
      }
    }
    __syncthreads();
    const int64_t nt = hi_t - t0 + 1 < kTile ? hi_t - t0 + 1 : kTile;
    if (grp < groups) {
      for (int64_t j = grp; j < nt; j += groups) {
        const float pj = p_sh[j];
        if (pj == 0.0f) continue;
        const Elem* cr = row_sh[j];
#pragma unroll
        for (int u = 0; u < kMaxChunksPerThread; ++u) {
          const int64_t cch = (threadIdx.x % (nch >= blockDim.x ? blockDim.x : nch)) + u * blockDim.x;
          if (cch >= nch) break;
          if (vec) {
            float v[8];
            V::load(cr + cch * cw, v);
#pragma unroll
            for (int e = 0; e < V::kN; ++e) acc[u][e] = fmaf(pj, v[e], acc[u][e]);
          } else {
            acc[u][0] = fmaf(pj, ld(cr, cch), acc[u][0]);
          }
        }
      }
    }
    __syncthreads();
  }
  // Group partials to shared memory, then summed over the groups in order.
  if (grp < groups) {
#pragma unroll
    for (int u = 0; u < kMaxChunksPerThread; ++u) {
      const int64_t cch = (threadIdx.x % (nch >= blockDim.x ? blockDim.x : nch)) + u * blockDim.x;
      if (cch >= nch) break;
      for (int e = 0; e < cw; ++e) part[grp * dc + cch * cw + e] = acc[u][e];
    }
  }
  __syncthreads();
  for (int64_t x = threadIdx.x; x < dc; x += blockDim.x) {
    float a = 0.0f;
    for (int g = 0; g < groups; ++g) a += part[g * dc + x];
    olat[x] = n_ranks == 1 && bf16 ? bf16r(a) : a;
  }
  const float* fin = olat;  // the final o_lat
  if (n_ranks > 1) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every rank's partial is complete
    for (int64_t x = threadIdx.x; x < dc; x += blockDim.x) {
      float a = 0.0f;
      for (int r = 0; r < n_ranks; ++r) a += cluster.map_shared_rank(olat, r)[x];
      part[x] = bf16 ? bf16r(a) : a;
    }
    cluster.sync();  // nobody reads the partials any more
    fin = part;
  }
  __syncthreads();
  // o = W_UV[h] · o_lat: warp per output dim (the ranks take interleaved dims).
  for (int64_t j = rank * nw + warp; j < dv; j += nw * n_ranks) {
    float a = 0.0f;
    for (int64_t x0 = lane; x0 < dc; x0 += 32 * 8) {
      float wv[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int64_t x = x0 + 32 * u;
        wv[u] = x >= dc ? 0.0f
                : wbf16 ? bf16_bits_to_f(reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(kv_b.data) +
                                                                           (h * dkv + dn + j) * kv_b.row_bytes)[x])
                        : wget(kv_b, h * dkv + dn + j, x);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (x0 + 32 * u < dc) a = fmaf(fin[x0 + 32 * u], wv[u], a);
    }
    a = warp_sum(a);
    if (lane == 0) tset(o, qi, h * dv + j, a);
  }
  __syncthreads();
}

// Shared memory of the absorbed kernels: bitmap words, qs, qlat, olat, part (groups · dc), then the score cache.
struct AbsLayout {
  int64_t words, groups;
  size_t fixed_bytes;
};
__host__ __device__ inline AbsLayout abs_layout(const MlaDims& d, int64_t max_keys, bool vec, int64_t vec_n) {
  AbsLayout a;
  a.words = (max_keys + 31) / 32;
  const int64_t nch = d.latent / (vec ? vec_n : 1);
  a.groups = nch >= kAbsThreads ? 1 : kAbsThreads / nch;
  a.fixed_bytes = static_cast<size_t>(a.words * 4 + (d.nope + d.rope + 2 * d.latent + a.groups * d.latent) * 4);
  return a;
}
constexpr size_t kAbsSmemCap = 200 * 1024;  // opt-in dynamic shared memory per block (H200: up to 227 KB)

__global__ void __launch_bounds__(kAbsThreads)
    mla_absorbed_kernel(MlaDims d, TView q, WDesc kv_b, const float* c, const float* k_pe, int64_t T,
                        const int64_t* q_pos, KeySelection sel, float scale, TView o, bool vec, bool cache_scores,
                        int n_ranks) {
  const bool bf16 = o.bf16 != 0;
  extern __shared__ uint32_t smem_u[];
  const int64_t H = d.n_heads, dqk = d.nope + d.rope, dc = d.latent;
  const int64_t item = blockIdx.x / n_ranks;
  const int64_t s = item / H, h = item % H;
  const AbsLayout L = abs_layout(d, T, vec, KeyVec<float>::kN);
  uint32_t* bits = smem_u;
  float* qs = reinterpret_cast<float*>(smem_u + L.words);
  float* qlat = qs + dqk;
  float* olat = qlat + dc;
  float* part = olat + dc;
  float* sc = cache_scores ? part + L.groups * dc : nullptr;
  const int64_t last = build_allowed(bits, s, T, q_pos, sel);
  const ContiguousKeys keys{c, k_pe, dc, d.rope};
  absorbed_one(d, q, s, kv_b, keys, h, last, bits, qs, qlat, olat, part, sc, vec, scale, o, bf16,
               static_cast<int>(cooperative_groups::this_cluster().block_rank()), n_ranks);
}

// Persistent grid over (token, head) work items of the whole step; bitmap and score cache sized by max_ctx.
template <class Elem>
__global__ void __launch_bounds__(kAbsThreads)
    mla_absorbed_paged_kernel(MlaDims d, TView q, WDesc kv_b, KvPool pool, StepSeqs seqs, const int64_t* pos,
                              KeySelection sel, float scale, TView o, bool vec, bool cache_scores, int n_ranks) {
  const bool bf16 = o.bf16 != 0;
  extern __shared__ uint32_t smem_u[];
  const int64_t H = d.n_heads, dqk = d.nope + d.rope, dc = d.latent;
  const AbsLayout L = abs_layout(d, seqs.max_ctx, vec, KeyVec<Elem>::kN);
  uint32_t* bits = smem_u;
  float* qs = reinterpret_cast<float*>(smem_u + L.words);
  float* qlat = qs + dqk;
  float* olat = qlat + dc;
  float* part = olat + dc;
  float* sc = cache_scores ? part + L.groups * dc : nullptr;
  // The run's tokens only (q_begin[0] may be past 0: the step's other rows belong to other sequences).
  const int64_t N0 = seqs.q_begin[0], N = seqs.q_begin[seqs.n_seqs];
  const int rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
  for (int64_t item = N0 * H + blockIdx.x / n_ranks; item < N * H; item += gridDim.x / n_ranks) {
    const int64_t i = item / H, h = item % H;
    const int64_t s = seq_of_token(seqs, i), T = seqs.ctx_len[s];
    const int64_t last = pos[i] < T - 1 ? pos[i] : T - 1;
    for (int64_t w = threadIdx.x; w < L.words; w += blockDim.x) bits[w] = sel.sel ? 0u : 0xFFFFFFFFu;
    __syncthreads();
    if (sel.sel) {
      const int32_t* row = sel.sel + i * sel.stride;
      const int32_t cnt = sel.count[i];
      for (int32_t j = threadIdx.x; j < cnt; j += blockDim.x) {
        const int32_t t = row[j];
        if (t >= 0 && t <= last) atomicOr(&bits[t >> 5], 1u << (t & 31));
      }
    }
    __syncthreads();
    const PagedKeys<Elem> keys{static_cast<const Elem*>(pool.data), pool.width, pool.block_tokens,
                               seqs.block_table + s * seqs.max_blocks, dc};
    absorbed_one(d, q, i, kv_b, keys, h, last, bits, qs, qlat, olat, part, sc, vec, scale, o, bf16, rank, n_ranks);
  }
}

}  // namespace

namespace {
// Launch configuration of the absorbed kernels: clusters of `ranks` blocks along x.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1]{};
  ClusterLaunch(unsigned grid, int ranks, size_t smem, cudaStream_t st) {
    cfg.gridDim = dim3(grid, 1, 1);
    cfg.blockDim = dim3(kAbsThreads, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(ranks);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};
}  // namespace

bool launch_mla_naive(const MlaDims& d, TView q, TView kvb, TView k_pe, int64_t S, int64_t T, const int64_t* q_pos,
                      const KeySelection& sel, float scale, TView o, cudaStream_t st, bool flash, uint32_t* mask_ws) {
  if (S <= 0 || d.n_heads <= 0) return false;
  // bf16, the head sizes of the published checkpoints (and 128 / 64), 16-byte aligned rows, a DSA selection only
  // with the bitmap scratch: tensor cores.
  auto al = [](const TView& v) { return v.bf16 && (reinterpret_cast<uintptr_t>(v.p) & 15) == 0 && v.ld % 8 == 0; };
  const bool dims = (d.qk() == 192 && d.v == 128) || (d.qk() == 256 && d.v == 256) || (d.qk() == 128 && d.v == 64);
  if (flash && dims && (!sel.sel || mask_ws) && al(q) && al(kvb) && al(k_pe) && o.bf16 && d.nope % 8 == 0 &&
      d.rope % 8 == 0 && T > 0) {
    const dim3 grid(static_cast<unsigned>((S + kFaQ - 1) / kFaQ), static_cast<unsigned>(d.n_heads));
    const int64_t mwords = (T + 31) / 32;
    const uint32_t* mask = nullptr;
    if (sel.sel) {
      sel_mask_kernel<<<static_cast<unsigned>(S), 256, 0, st>>>(sel, q_pos, T, mwords, mask_ws);
      mask = mask_ws;
    }
#define LATENT_FA(DQK, DV)                                                                                             \
  if (d.qk() == (DQK) && d.v == (DV)) {                                                                                \
    static const cudaError_t attr = cudaFuncSetAttribute(                                                              \
        mla_flash_kernel<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(fa_smem<DQK, DV>())); \
    (void)attr;                                                                                                        \
    mla_flash_kernel<DQK, DV>                                                                                          \
        <<<grid, kFaThreads, fa_smem<DQK, DV>(), st>>>(d, q, kvb, k_pe, S, T, q_pos, scale, o, mask, mwords);          \
    return true;                                                                                                       \
  }
    LATENT_FA(192, 128)  // DeepSeek-V3 / V3.2
    LATENT_FA(256, 256)  // GLM-5
    LATENT_FA(128, 64)
#undef LATENT_FA
  }
  const size_t smem = static_cast<size_t>((T + 31) / 32) * 4 + static_cast<size_t>(d.qk()) * 4;
  mla_naive_kernel<<<static_cast<unsigned>(S * d.n_heads), 128, smem, st>>>(d, q, kvb, k_pe, T, q_pos, sel, scale, o);
  return false;
}

void launch_mla_absorbed(const MlaDims& d, TView q, const WDesc& kv_b, const float* c, const float* k_pe, int64_t S,
                         int64_t T, const int64_t* q_pos, const KeySelection& sel, float scale, TView o,
                         cudaStream_t st) {
  if (S <= 0 || d.n_heads <= 0) return;
  constexpr int kN = KeyVec<float>::kN;
  const bool vec = d.latent % kN == 0 && d.rope % kN == 0 && (reinterpret_cast<uintptr_t>(c) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(k_pe) & 15) == 0;
  const AbsLayout L = abs_layout(d, T, vec, kN);
  const bool cache = L.fixed_bytes + static_cast<size_t>(T) * 4 <= kAbsSmemCap;
  const size_t smem = L.fixed_bytes + (cache ? static_cast<size_t>(T) * 4 : 0);
  static const cudaError_t attr_set =
      cudaFuncSetAttribute(mla_absorbed_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kAbsSmemCap));  // once per process
  (void)attr_set;
  // Few (query, head) items: clusters split each one's keys over kAbsCluster SMs; many: one block each.
  const int ranks = S * d.n_heads >= 256 ? 1 : kAbsCluster;
  const ClusterLaunch cl(static_cast<unsigned>(S * d.n_heads * ranks), ranks, smem, st);
  cudaLaunchKernelEx(&cl.cfg, mla_absorbed_kernel, d, q, kv_b, c, k_pe, T, q_pos, sel, scale, o, vec, cache, ranks);
}

void launch_mla_absorbed_paged(const MlaDims& d, TView q, const WDesc& kv_b, const KvPool& pool, const StepSeqs& seqs,
                               const int64_t* pos, const KeySelection& sel, float scale, TView o, cudaStream_t st) {
  if (seqs.n_seqs <= 0 || d.n_heads <= 0) return;
  const bool b16 = pool.dtype == DType::BF16;
  const int64_t kN = b16 ? KeyVec<uint16_t>::kN : KeyVec<float>::kN;
  const bool vec = d.latent % kN == 0 && d.rope % kN == 0 && pool.width % kN == 0 &&
                   (reinterpret_cast<uintptr_t>(pool.data) & 15) == 0;
  const AbsLayout L = abs_layout(d, seqs.max_ctx, vec, kN);
  const bool cache = L.fixed_bytes + static_cast<size_t>(seqs.max_ctx) * 4 <= kAbsSmemCap;
  const size_t smem = L.fixed_bytes + (cache ? static_cast<size_t>(seqs.max_ctx) * 4 : 0);
  static const int sms = [] {
    int dev = 0, n = 132;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n;
  }();
  static const bool attrs_set = [] {  // once per process
    cudaFuncSetAttribute(mla_absorbed_paged_kernel<uint16_t>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kAbsSmemCap));
    cudaFuncSetAttribute(mla_absorbed_paged_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kAbsSmemCap));
    return true;
  }();
  (void)attrs_set;
  // n_seqs bounds the step's tokens from below: many sequences -> one block per (token, head).
  // Decided from the graph bucket of n_seqs: a padded graph step splits each item as the eager step does.
  const int ranks = decode_graph_bucket(seqs.n_seqs) * d.n_heads >= 256 ? 1 : kAbsCluster;
  const ClusterLaunch cl(static_cast<unsigned>(sms * 4 / kAbsCluster * kAbsCluster), ranks, smem, st);
  if (b16) {
    cudaLaunchKernelEx(&cl.cfg, mla_absorbed_paged_kernel<uint16_t>, d, q, kv_b, pool, seqs, pos, sel, scale, o, vec,
                       cache, ranks);
  } else {
    cudaLaunchKernelEx(&cl.cfg, mla_absorbed_paged_kernel<float>, d, q, kv_b, pool, seqs, pos, sel, scale, o, vec,
                       cache, ranks);
  }
}

}  // namespace latent::cuda
