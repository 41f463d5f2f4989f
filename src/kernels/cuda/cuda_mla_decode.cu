// MLA decode attention in the bf16 mode, as FlashMLA structures it (docs/design.md §cuda-backend):
//   A. absorb:   q_lat[i, h, :] = W_UK[h]ᵀ · q_nope[i, h, :]   for every token and head of the step (kv_b read once
//                per step, not per token and head), rounded to bf16;
//   B. attend:   per (token, tile of 64 heads, split of the keys) one block: the query tile [64 heads × (dc + dr)]
//                (q_lat ‖ q_pe) in shared memory, the keys of its split streamed from the paged latent pool in tiles
//                of 32 (cp.async, double-buffered), S = Q·Kᵀ and O += P·V on bf16 tensor cores (mma.sync m16n8k16,
//                fp32 accumulators), an online softmax over the tiles; a DSA selection restricts the keys to the
//                token's selected rows;
//   C. combine:  the splits' partial (O, max, sum) merged by their log-sum-exp → o_lat (bf16);
//   D. output:   o[i, h, :] = W_UV[h] · o_lat[i, h, :] (kv_b read once per step), rounded to bf16.
// The split count is decided on the host from the graph bucket's shape (tokens, heads, the reserved context): every
// block reads its sequence's length and its key range on the device, so a replayed graph splits a step exactly as
// an eager one. Scores keep the ref backend's rounding (bf16(bf16(q·k) · scale)); the probabilities enter the P·V
// product as bf16 values of exp(s − running max) and are normalized at the end (FlashAttention's order), so the
// result matches the ref's bf16 emulation within bf16 rounding, not bit for bit.
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_mla_decode.h"

namespace latent::cuda {

namespace {

constexpr int kHT = 64;  // head rows per attention block
constexpr int kKT = 32;  // keys per tile
constexpr int kAttnThreads = 256;
constexpr int kMaxD = 576;  // dc + dr at most (GLM-5, DeepSeek-V3: 512 + 64)
constexpr int kPad = 8;     // bf16 elements of padding per shared-memory row (conflict-free ldmatrix)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// d += a · b (m16n8k16, bf16 operands, fp32 accumulators).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0: zero-fill
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ uint16_t bf16_bits(float f) { return f_to_bf16_bits(f); }

// The sequence of token i within the run (the last s with q_begin[s] <= i), or -1 when i is outside the run.
__device__ __forceinline__ int64_t seq_of(const StepSeqs& seqs, int64_t i) {
  if (i < seqs.q_begin[0] || i >= seqs.q_begin[seqs.n_seqs]) return -1;
  int64_t lo = 0, hi = seqs.n_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (seqs.q_begin[mid] <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// ---- A. absorption: block (head h, 64 latent columns), 8 warps; tokens in chunks of kTokChunk ----
// Warp w takes rows j ≡ w (mod 8) of W_UK[h], lane l the columns c0 + 2l, c0 + 2l + 1 (one 4-byte load of a bf16
// pair; four rows' loads in flight); the warps' partial sums are added in warp order.
constexpr int kTokChunk = 16;
__device__ __forceinline__ float2 w_pair(const WDesc& w, int64_t row, int64_t c) {
  if (w.format == kFmtBF16) {
    const uint32_t v =
        *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(w.data) + row * w.row_bytes + c * 2);
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u));
  }
  return make_float2(wget(w, row, c), wget(w, row, c + 1));
}
__global__ void __launch_bounds__(256)
    absorb_q_kernel(MlaDims d, TView q, int64_t N, WDesc kv_b, StepSeqs seqs, uint16_t* qlat) {
  __shared__ float qs[kTokChunk][256];      // q_nope of the chunk (dn ≤ 256)
  __shared__ float part[8][kTokChunk][64];  // per warp, token, column
  const int64_t H = d.n_heads, dn = d.nope, dqk = d.nope + d.rope, dc = d.latent, dkv = d.nope + d.v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t h = blockIdx.x, c0 = static_cast<int64_t>(blockIdx.y) * 64, c = c0 + 2 * lane;
  const int64_t i0 = seqs.q_begin[0], i1 = seqs.q_begin[seqs.n_seqs] < N ? seqs.q_begin[seqs.n_seqs] : N;
  for (int64_t m0 = i0; m0 < i1; m0 += kTokChunk) {
    const int nm = static_cast<int>(i1 - m0 < kTokChunk ? i1 - m0 : kTokChunk);
    __syncthreads();
    for (int e = threadIdx.x; e < kTokChunk * static_cast<int>(dn); e += blockDim.x) {
      const int m = e / static_cast<int>(dn), j = e % static_cast<int>(dn);
      qs[m][j] = m < nm ? tget(q, m0 + m, h * dqk + j) : 0.0f;
    }
    __syncthreads();
    float acc[kTokChunk][2];
#pragma unroll
    for (int m = 0; m < kTokChunk; ++m) acc[m][0] = acc[m][1] = 0.0f;
    for (int64_t j0 = warp; j0 < dn; j0 += 32) {
      float2 wv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t j = j0 + 8 * u;
        wv[u] = j < dn ? w_pair(kv_b, h * dkv + j, c) : make_float2(0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t j = j0 + 8 * u;
        if (j >= dn) break;
#pragma unroll
        for (int m = 0; m < kTokChunk; ++m) {
          acc[m][0] = fmaf(qs[m][j], wv[u].x, acc[m][0]);
          acc[m][1] = fmaf(qs[m][j], wv[u].y, acc[m][1]);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kTokChunk; ++m) {
      part[warp][m][2 * lane] = acc[m][0];
      part[warp][m][2 * lane + 1] = acc[m][1];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kTokChunk * 64; e += blockDim.x) {
      const int m = e / 64, col = e % 64;
      float v = 0.0f;
#pragma unroll
      for (int w8 = 0; w8 < 8; ++w8) v += part[w8][m][col];
      if (m < nm && c0 + col < dc) qlat[((m0 + m) * H + h) * dc + c0 + col] = bf16_bits(v);
    }
  }
}

// ---- D. output absorption: block (head h, 8 value rows), warp per value row, tokens in chunks ----
// Lane l reads 8 consecutive columns per 256-column step (one 16-byte load of bf16 weights).
__global__ void __launch_bounds__(256)
    absorb_o_kernel(MlaDims d, const uint16_t* olat, int64_t N, WDesc kv_b, StepSeqs seqs, TView o) {
  __shared__ __align__(16) float os[kTokChunk][512];  // o_lat of the chunk (dc ≤ 512)
  const int64_t H = d.n_heads, dn = d.nope, dv = d.v, dc = d.latent, dkv = d.nope + d.v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t h = blockIdx.x, v = static_cast<int64_t>(blockIdx.y) * 8 + warp;
  const int64_t i0 = seqs.q_begin[0], i1 = seqs.q_begin[seqs.n_seqs] < N ? seqs.q_begin[seqs.n_seqs] : N;
  const bool wbf16 = kv_b.format == kFmtBF16;
  for (int64_t m0 = i0; m0 < i1; m0 += kTokChunk) {
    const int nm = static_cast<int>(i1 - m0 < kTokChunk ? i1 - m0 : kTokChunk);
    __syncthreads();
    for (int e = threadIdx.x; e < kTokChunk * static_cast<int>(dc); e += blockDim.x) {
      const int m = e / static_cast<int>(dc), c = e % static_cast<int>(dc);
      os[m][c] = m < nm ? bf16_bits_to_f(olat[((m0 + m) * H + h) * dc + c]) : 0.0f;
    }
    __syncthreads();
    if (v >= dv) continue;
    const int64_t row = h * dkv + dn + v;
    float acc[kTokChunk];
#pragma unroll
    for (int m = 0; m < kTokChunk; ++m) acc[m] = 0.0f;
    for (int64_t c0 = lane * 8; c0 < dc; c0 += 256) {
      float wv[8];
      if (wbf16) {
        const uint4 raw =
            *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(kv_b.data) + row * kv_b.row_bytes + c0 * 2);
        const uint32_t ws[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          wv[2 * k] = __uint_as_float(ws[k] << 16);
          wv[2 * k + 1] = __uint_as_float(ws[k] & 0xFFFF0000u);
        }
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) wv[k] = wget(kv_b, row, c0 + k);
      }
#pragma unroll
      for (int m = 0; m < kTokChunk; ++m) {
        const float4 a = *reinterpret_cast<const float4*>(&os[m][c0]);
        const float4 b = *reinterpret_cast<const float4*>(&os[m][c0 + 4]);
        acc[m] = fmaf(a.x, wv[0], fmaf(a.y, wv[1], fmaf(a.z, wv[2], fmaf(a.w, wv[3], acc[m]))));
        acc[m] = fmaf(b.x, wv[4], fmaf(b.y, wv[5], fmaf(b.z, wv[6], fmaf(b.w, wv[7], acc[m]))));
      }
    }
#pragma unroll
    for (int m = 0; m < kTokChunk; ++m) acc[m] = warp_sum(acc[m]);
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < kTokChunk; ++m)
        if (m < nm) tset(o, m0 + m, h * dv + v, acc[m]);
    }
  }
}

// ---- B. attention ----
struct AttnSmem {
  uint16_t q[kHT][kMaxD + kPad];
  uint16_t k[2][kKT][kMaxD + kPad];
  uint16_t p[kHT][kKT + kPad];
  float red_max[2][kHT], red_sum[2][kHT];
  float m[kHT], l[kHT], alpha[kHT];
  int32_t key[2][kKT];  // key position of each slot of a tile (-1: masked)
};

// NT: n-tiles of 8 latent columns per warp in O (dc = 64 · NT).
template <int NT>
__global__ void __launch_bounds__(kAttnThreads, 1)
    mla_decode_attn_kernel(MlaDims d, TView q, const uint16_t* qlat, KvPool pool, StepSeqs seqs, const int64_t* pos,
                           KeySelection sel, float scale, int n_splits, float* part_o, float* part_ml, uint16_t* olat) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  AttnSmem& sm = *reinterpret_cast<AttnSmem*>(smem_raw);
  const int64_t H = d.n_heads, dn = d.nope, dr = d.rope, dqk = d.nope + d.rope, dc = d.latent;
  const int D = static_cast<int>(dc + dr);
  const int64_t i = blockIdx.x, ht = blockIdx.y, split = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, cq = lane & 3;
  const int64_t s = seq_of(seqs, i);
  if (s < 0) return;
  const int64_t T = seqs.ctx_len[s];
  const int64_t last = pos[i] < T - 1 ? pos[i] : T - 1;
  const int32_t* blocks = seqs.block_table + s * seqs.max_blocks;
  const int64_t bt = pool.block_tokens;
  // This split's keys: slots [k0, k1) of the token's key list (the selection, or positions 0 .. last).
  const int64_t n_keys = sel.sel ? sel.count[i] : last + 1;
  const int64_t per = ((n_keys + n_splits - 1) / n_splits + kKT - 1) / kKT * kKT;
  const int64_t k0 = split * per, k1 = k0 + per < n_keys ? k0 + per : n_keys;
  const int64_t out_row = (i * ((H + kHT - 1) / kHT) + ht) * n_splits + split;  // partial index

  // Query tile: rows = heads ht·64 .. +64 (zero beyond H): q_lat (16-byte copies) then q_pe.
  const int qch = static_cast<int>(dc / 8);
  for (int e = tid; e < kHT * qch; e += kAttnThreads) {
    const int r = e / qch, ch = e % qch;
    const int64_t h = ht * kHT + r;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (h < H) v = *reinterpret_cast<const uint4*>(qlat + (i * H + h) * dc + ch * 8);
    *reinterpret_cast<uint4*>(&sm.q[r][ch * 8]) = v;
  }
  for (int e = tid; e < kHT * static_cast<int>(dr); e += kAttnThreads) {
    const int r = e / static_cast<int>(dr), col = e % static_cast<int>(dr);
    const int64_t h = ht * kHT + r;
    sm.q[r][dc + col] = h < H ? bf16_bits(tget(q, i, h * dqk + dn + col)) : uint16_t{0};
  }
  if (tid < kHT) {
    sm.m[tid] = __uint_as_float(0xFF800000u);
    sm.l[tid] = 0.0f;
  }
  __syncthreads();  // (the statistics are read below even when the split has no keys)
  // Loads key tile `tile` (slots k0 + tile·kKT ..) into buffer b: one 16-byte chunk per (slot, 8 columns).
  const int chunks = D / 8;
  auto load_tile = [&](int64_t tile, int b) {
    const int64_t base = k0 + tile * kKT;
    if (tid < kKT) {
      const int64_t slot = base + tid;
      int32_t t = -1;
      if (slot < k1) {
        t = sel.sel ? sel.sel[i * sel.stride + slot] : static_cast<int32_t>(slot);
        if (t < 0 || t > last) t = -1;
      }
      sm.key[b][tid] = t;
    }
    for (int e = tid; e < kKT * chunks; e += kAttnThreads) {
      const int j = e / chunks, ch = e % chunks;
      const int64_t slot = base + j;
      int64_t t = -1;
      if (slot < k1) {
        t = sel.sel ? sel.sel[i * sel.stride + slot] : slot;
        if (t < 0 || t > last) t = -1;
      }
      const uint16_t* src = static_cast<const uint16_t*>(pool.data);
      if (t >= 0) src += (static_cast<int64_t>(blocks[t / bt]) * bt + t % bt) * pool.width + ch * 8;
      cp_async16(&sm.k[b][j][ch * 8], src, t >= 0);
    }
    cp_async_commit();
  };
  const int64_t n_tiles = k1 > k0 ? (k1 - k0 + kKT - 1) / kKT : 0;
  if (n_tiles > 0) load_tile(0, 0);

  // O accumulators: warp w holds all 64 rows × latent columns [w·8·NT, (w+1)·8·NT).
  float oacc[4][NT][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) oacc[mt][nt][e] = 0.0f;
  const int smt = warp & 3, snh = warp >> 2;  // S: m-tile of heads, half of the 32 keys
  const float kNegInf = __uint_as_float(0xFF800000u);

  for (int64_t tile = 0; tile < n_tiles; ++tile) {
    const int b = static_cast<int>(tile & 1);
    if (tile + 1 < n_tiles) {
      load_tile(tile + 1, b ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    // S = Q · Kᵀ for rows smt·16 .., keys snh·16 .. (two n-tiles of 8).
    float sacc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[nt][e] = 0.0f;
    for (int kk = 0; kk < D; kk += 16) {
      uint32_t a[4], bb[4];
      ldsm_x4(a, &sm.q[smt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][kk + (lane >> 4) * 8]);
      ldsm_x4(bb, &sm.k[b][snh * 16 + (lane & 7) + (lane >> 4) * 8][kk + ((lane >> 3) & 1) * 8]);
      mma_bf16(sacc[0], a, bb[0], bb[1]);
      mma_bf16(sacc[1], a, bb[2], bb[3]);
    }
    // Scores with the ref's rounding; masked keys −inf. Element e of n-tile nt: row smt·16 + g (+8 for e ≥ 2), key
    // snh·16 + nt·8 + 2·cq + (e & 1).
    float rmax[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = snh * 16 + nt * 8 + 2 * cq + (e & 1);
        float v = bf16r(__fmul_rn(bf16r(sacc[nt][e]), scale));
        if (sm.key[b][key] < 0) v = kNegInf;
        sacc[nt][e] = v;
        rmax[e >> 1] = fmaxf(rmax[e >> 1], v);
      }
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      rmax[h2] = fmaxf(rmax[h2], __shfl_xor_sync(0xFFFFFFFFu, rmax[h2], 1));
      rmax[h2] = fmaxf(rmax[h2], __shfl_xor_sync(0xFFFFFFFFu, rmax[h2], 2));
    }
    if (cq == 0) {
      sm.red_max[snh][smt * 16 + g] = rmax[0];
      sm.red_max[snh][smt * 16 + g + 8] = rmax[1];
    }
    __syncthreads();
    // New running max per row; probabilities exp(s − m_new) as bf16 into P; their row sums.
    float mnew[2], rsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int row = smt * 16 + g + 8 * h2;
      mnew[h2] = fmaxf(sm.m[row], fmaxf(sm.red_max[0][row], sm.red_max[1][row]));
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int h2 = e >> 1, row = smt * 16 + g + 8 * h2, key = snh * 16 + nt * 8 + 2 * cq;
        float p0 = sacc[nt][e] == kNegInf ? 0.0f : bf16r(__expf(sacc[nt][e] - mnew[h2]));
        float p1 = sacc[nt][e + 1] == kNegInf ? 0.0f : bf16r(__expf(sacc[nt][e + 1] - mnew[h2]));
        rsum[h2] += p0 + p1;
        const uint32_t packed = static_cast<uint32_t>(bf16_bits(p0)) | (static_cast<uint32_t>(bf16_bits(p1)) << 16);
        *reinterpret_cast<uint32_t*>(&sm.p[row][key]) = packed;
      }
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      rsum[h2] += __shfl_xor_sync(0xFFFFFFFFu, rsum[h2], 1);
      rsum[h2] += __shfl_xor_sync(0xFFFFFFFFu, rsum[h2], 2);
    }
    if (cq == 0) {
      sm.red_sum[snh][smt * 16 + g] = rsum[0];
      sm.red_sum[snh][smt * 16 + g + 8] = rsum[1];
    }
    __syncthreads();
    if (tid < kHT) {  // one thread per row: the running statistics
      const float mo = sm.m[tid];
      const float mn = fmaxf(mo, fmaxf(sm.red_max[0][tid], sm.red_max[1][tid]));
      const float al = mn == kNegInf ? 1.0f : __expf(mo - mn);  // mo = −inf: O and l are 0, any factor works
      sm.alpha[tid] = al;
      sm.l[tid] = sm.l[tid] * al + sm.red_sum[0][tid] + sm.red_sum[1][tid];
      sm.m[tid] = mn;
    }
    __syncthreads();
    // O = O · alpha + P · V (V = the tile's latent columns).
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      const float a0 = sm.alpha[mt * 16 + g], a1 = sm.alpha[mt * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        oacc[mt][nt][0] *= a0;
        oacc[mt][nt][1] *= a0;
        oacc[mt][nt][2] *= a1;
        oacc[mt][nt][3] *= a1;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKT; kk += 16) {
      uint32_t a[4][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
        ldsm_x4(a[mt], &sm.p[mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][kk + (lane >> 4) * 8]);
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        const int col = warp * 8 * NT + nt * 8;
        uint32_t bb[4];
        ldsm_x4_t(bb, &sm.k[b][kk + (lane & 7) + ((lane >> 3) & 1) * 8][col + (lane >> 4) * 8]);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          mma_bf16(oacc[mt][nt], a[mt], bb[0], bb[1]);
          if (nt + 1 < NT) mma_bf16(oacc[mt][nt + 1], a[mt], bb[2], bb[3]);
        }
      }
    }
    __syncthreads();  // P and this K buffer are rewritten by the next tile
  }
  // Output: one split → normalized o_lat (bf16); several → the partial O (unnormalized), max and sum.
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int row = mt * 16 + g + 8 * h2;
      const int64_t h = ht * kHT + row;
      if (h >= H) continue;
      const float l = sm.l[row], inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = warp * 8 * NT + nt * 8 + 2 * cq;
        const float v0 = oacc[mt][nt][2 * h2], v1 = oacc[mt][nt][2 * h2 + 1];
        if (n_splits == 1) {
          olat[(i * H + h) * dc + col] = bf16_bits(v0 * inv);
          olat[(i * H + h) * dc + col + 1] = bf16_bits(v1 * inv);
        } else {
          float* po = part_o + (out_row * kHT + row) * dc + col;
          po[0] = v0;
          po[1] = v1;
        }
      }
    }
  if (n_splits > 1 && tid < kHT) {
    part_ml[(out_row * kHT + tid) * 2] = sm.m[tid];
    part_ml[(out_row * kHT + tid) * 2 + 1] = sm.l[tid];
  }
}

// ---- C. combine: block per (token, head), threads over the latent columns ----
__global__ void combine_kernel(MlaDims d, int64_t N, StepSeqs seqs, int n_splits, const float* part_o,
                               const float* part_ml, uint16_t* olat) {
  const int64_t H = d.n_heads, dc = d.latent;
  const int64_t i = blockIdx.x / H, h = blockIdx.x % H;
  if (i >= N || seq_of(seqs, i) < 0) return;
  const int64_t tiles = (H + kHT - 1) / kHT, ht = h / kHT, row = h % kHT;
  float M = __uint_as_float(0xFF800000u);
  for (int sp = 0; sp < n_splits; ++sp) M = fmaxf(M, part_ml[(((i * tiles + ht) * n_splits + sp) * kHT + row) * 2]);
  float L = 0.0f;
  for (int sp = 0; sp < n_splits; ++sp) {
    const float* ml = part_ml + (((i * tiles + ht) * n_splits + sp) * kHT + row) * 2;
    if (ml[1] > 0.0f) L += ml[1] * __expf(ml[0] - M);
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  for (int64_t c = threadIdx.x; c < dc; c += blockDim.x) {
    float acc = 0.0f;
    for (int sp = 0; sp < n_splits; ++sp) {
      const int64_t pr = ((i * tiles + ht) * n_splits + sp) * kHT + row;
      const float* ml = part_ml + pr * 2;
      if (ml[1] > 0.0f) acc += part_o[pr * dc + c] * __expf(ml[0] - M);
    }
    olat[(i * H + h) * dc + c] = bf16_bits(acc * inv);
  }
}

}  // namespace

bool mla_decode_supported(const MlaDims& d, const KvPool& pool) {
  return pool.dtype == DType::BF16 && d.latent % 64 == 0 && d.latent >= 64 && d.latent <= 512 && d.rope % 16 == 0 &&
         d.latent + d.rope <= kMaxD && d.nope <= 256 && pool.width == d.latent + d.rope && d.n_heads > 0;
}

int mla_decode_splits(const MlaDims& d, int64_t n_tokens, int64_t max_ctx) {
  static const int sms = [] {
    int dev = 0, n = 132;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n;
  }();
  const int64_t items = n_tokens * ((d.n_heads + kHT - 1) / kHT);
  int64_t s = (2 * sms + items - 1) / items;      // about two blocks per SM
  const int64_t by_keys = (max_ctx + 127) / 128;  // at least ~128 keys per split
  if (s > by_keys) s = by_keys;
  if (s < 1) s = 1;
  if (s > 64) s = 64;
  return static_cast<int>(s);
}

MlaDecodeScratch mla_decode_scratch(const MlaDims& d, int64_t n_tokens, int n_splits) {
  MlaDecodeScratch s;
  const int64_t tiles = (d.n_heads + kHT - 1) / kHT;
  s.qlat_bytes = static_cast<size_t>(n_tokens * d.n_heads * d.latent) * 2;
  s.olat_bytes = s.qlat_bytes;
  s.part_o_bytes = n_splits > 1 ? static_cast<size_t>(n_tokens * tiles * n_splits * kHT * d.latent) * 4 : 0;
  s.part_ml_bytes = n_splits > 1 ? static_cast<size_t>(n_tokens * tiles * n_splits * kHT * 2) * 4 : 0;
  return s;
}

void launch_mla_decode(const MlaDims& d, TView q, int64_t n_tokens, const WDesc& kv_b, const KvPool& pool,
                       const StepSeqs& seqs, const int64_t* pos, const KeySelection& sel, float scale, int n_splits,
                       void* qlat, void* olat, void* part_o, void* part_ml, TView o, cudaStream_t st) {
  if (seqs.n_seqs <= 0 || n_tokens <= 0) return;
  auto* ql = static_cast<uint16_t*>(qlat);
  auto* ol = static_cast<uint16_t*>(olat);
  absorb_q_kernel<<<dim3(static_cast<unsigned>(d.n_heads), static_cast<unsigned>((d.latent + 63) / 64)), 256, 0, st>>>(
      d, q, n_tokens, kv_b, seqs, ql);
  const size_t smem = sizeof(AttnSmem);
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>((d.n_heads + kHT - 1) / kHT),
                  static_cast<unsigned>(n_splits));
  auto* po = static_cast<float*>(part_o);
  auto* pm = static_cast<float*>(part_ml);
  switch (d.latent / 64) {
#define LATENT_MLA_CASE(NT)                                                                               \
  case NT: {                                                                                              \
    static const cudaError_t attr = cudaFuncSetAttribute(                                                 \
        mla_decode_attn_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)); \
    (void)attr;                                                                                           \
    mla_decode_attn_kernel<NT>                                                                            \
        <<<grid, kAttnThreads, smem, st>>>(d, q, ql, pool, seqs, pos, sel, scale, n_splits, po, pm, ol);  \
    break;                                                                                                \
  }
    LATENT_MLA_CASE(1)
    LATENT_MLA_CASE(2)
    LATENT_MLA_CASE(4)
    LATENT_MLA_CASE(8)
#undef LATENT_MLA_CASE
    default: return;  // (mla_decode_supported excludes the other sizes)
  }
  if (n_splits > 1)
    combine_kernel<<<static_cast<unsigned>(n_tokens * d.n_heads), 128, 0, st>>>(d, n_tokens, seqs, n_splits, po, pm,
                                                                                ol);
  absorb_o_kernel<<<dim3(static_cast<unsigned>(d.n_heads), static_cast<unsigned>((d.v + 7) / 8)), 256, 0, st>>>(
      d, ol, n_tokens, kv_b, seqs, o);
}

}  // namespace latent::cuda
