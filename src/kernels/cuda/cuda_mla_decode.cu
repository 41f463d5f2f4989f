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
// A and D run on tensor cores when kv_b is stored bf16 (tokens as the M rows of mma.sync, each block's weight slice
// copied whole into shared memory: every byte of kv_b in flight at once) or FP8 e4m3fn with block scales that fit
// the heads (DeepSeek-V3's: the codes staged as their exact bf16 values, each 128 × 128 block's scale applied to its
// fp32 partial sums — absorb_tc_ok); other kv_b formats (MXFP4, f32, fnuz, per-channel FP8) take CUDA-core kernels
// that dequantize per element.
// The split count is decided on the host from the graph bucket's shape (tokens, heads, the reserved context): every
// block reads its sequence's length and its key range on the device, so a replayed graph splits a step exactly as
// an eager one. Scores keep the ref backend's rounding (bf16(bf16(q·k) · scale)); the probabilities enter the P·V
// product as bf16 values of exp(s − running max) and are normalized at the end (FlashAttention's order), so the
// result matches the ref's bf16 emulation within bf16 rounding, not bit for bit.
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_mla_decode.h"
#include "kernels/cuda/cuda_skinny.cuh"

namespace latent::cuda {

namespace {

constexpr int kHT = 64;  // head rows per attention block
constexpr int kKT = 32;  // keys per tile
constexpr int kAttnThreads = 256;
constexpr int kRowChunk = kAttnThreads;  // key slots per key-table fill (one per thread; 8 tiles)
constexpr int kMaxD = 576;               // dc + dr at most (GLM-5, DeepSeek-V3: 512 + 64)
constexpr int kPad = 8;                  // bf16 elements of padding per shared-memory row (conflict-free ldmatrix)

// d += a · b (m16n8k16, bf16 operands, fp32 accumulators).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint16_t bf16_bits(float f) { return f_to_bf16_bits(f); }

// The sequence of token i within the run (the last s with q_begin[s] <= i), or -1 when i is outside the run.
__device__ __forceinline__ int64_t seq_of(const StepSeqs& seqs, int64_t i) {
  if (i < seqs.q_begin[0] || i >= seqs.q_begin[seqs.n_seqs]) return -1;
  return seq_of_token(seqs, i);
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
        bf16x8_to_f(
            *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(kv_b.data) + row * kv_b.row_bytes + c0 * 2),
            wv);
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

// ---- A and D on tensor cores, for bf16 kv_b (GLM-5's as published): tokens are the M rows of m16n8k16 (a tile
// of 16, zero rows past the run), the block's slice of W_UK / W_UV is copied whole into shared memory with cp.async
// (every byte of it in flight at once: the step reads kv_b once, at bandwidth), fp32 accumulators rounded to bf16
// once. Each token's result depends on its own row only (batch invariant: a padded graph step = an eager one).
constexpr int kAbsCols = 64;  // A: latent columns per block (4 warps × 16)
constexpr int kAbsRows = 64;  // D: value rows per block (4 warps × 16)
constexpr int kAbsThreads = 128;
constexpr size_t kAbsSmemMax = static_cast<size_t>(kAbsRows + 16) * (kMaxD + kPad) * 2;  // absorb_o at dc ≤ 576

// FP8 kv_b: 16 codes (one 16-byte load) as their exact bf16 values into dst (32 bytes, 16-byte aligned).
__device__ __forceinline__ void fp8x16_to_bf16(const uint4& raw, uint16_t* dst) {
  uint32_t out[8];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t c = word_of(raw, w);
    fp8_word(c, (fp8_nan_marks(c) & 0x80808080u) != 0u, out[2 * w], out[2 * w + 1]);
  }
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(out[0], out[1], out[2], out[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(out[4], out[5], out[6], out[7]);
}
// The fp32 scale of kv_b's element (row, col) for FP8 kv_b (block or per tensor).
__device__ __forceinline__ float kvb_scale(const WDesc& w, int64_t row, int64_t col) {
  const float* s = static_cast<const float*>(w.scale);
  return w.format == kFmtFp8Tensor ? s[0] : s[(row / w.block_rows) * w.scale_cols + col / w.block_cols];
}

// q_lat[i, h, c0 .. c0 + 64) = q_nope[i, h, :] · W_UK[h][:, c0 .. c0 + 64): W_UK rows (k = j) staged as [dn][64]
// and read as the B operand through ldmatrix.trans; q_nope tiles [16][dn] through ldmatrix.
__global__ void __launch_bounds__(kAbsThreads)
    absorb_q_tc_kernel(MlaDims d, TView q, int64_t N, WDesc kv_b, StepSeqs seqs, uint16_t* qlat) {
  __shared__ __align__(16) uint16_t ws[256][kAbsCols + kPad];  // dn ≤ 256
  __shared__ __align__(16) uint16_t as[16][256 + kPad];
  const int64_t H = d.n_heads, dqk = d.nope + d.rope, dc = d.latent, dkv = d.nope + d.v;
  const int dn = static_cast<int>(d.nope);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, cq = lane & 3;
  const int64_t h = blockIdx.x, c0 = static_cast<int64_t>(blockIdx.y) * kAbsCols;
  const int64_t i0 = seqs.q_begin[0], i1 = seqs.q_begin[seqs.n_seqs] < N ? seqs.q_begin[seqs.n_seqs] : N;
  if (i1 <= i0) return;
  const bool fp8 = kv_b.format != kFmtBF16;
  if (!fp8) {
    const auto* wb = static_cast<const uint8_t*>(kv_b.data) + h * dkv * kv_b.row_bytes + c0 * 2;
    for (int e = tid; e < dn * (kAbsCols / 8); e += kAbsThreads) {
      const int j = e / (kAbsCols / 8), ch = e % (kAbsCols / 8);
      cp_async16(&ws[j][ch * 8], wb + j * kv_b.row_bytes + ch * 16, true);
    }
  } else {  // 16 codes per load, four loads in flight per thread, then their bf16 values into ws
    const auto* wb = static_cast<const uint8_t*>(kv_b.data) + h * dkv * kv_b.row_bytes + c0;
    constexpr int kCh = kAbsCols / 16;
    for (int e0 = 0; e0 < dn * kCh; e0 += 4 * kAbsThreads) {
      uint4 raw[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int e = e0 + u * kAbsThreads + tid;
        raw[u] = make_uint4(0u, 0u, 0u, 0u);
        if (e < dn * kCh)
          raw[u] = __ldg(reinterpret_cast<const uint4*>(wb + (e / kCh) * kv_b.row_bytes + (e % kCh) * 16));
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int e = e0 + u * kAbsThreads + tid;
        if (e < dn * kCh) fp8x16_to_bf16(raw[u], &ws[e / kCh][(e % kCh) * 16]);
      }
    }
  }
  cp_async_commit();
  // FP8: W_UK[h] lies in one scale row block and the block's 64 columns in one column block (absorb_tc_ok).
  const float wsc = fp8 ? kvb_scale(kv_b, h * dkv, c0) : 1.0f;
  const bool pairs = q.bf16 && (q.ld & 1) == 0 && (reinterpret_cast<uintptr_t>(q.p) & 3) == 0;
  for (int64_t m0 = i0; m0 < i1; m0 += 16) {
    __syncthreads();  // (the previous tile's reads of `as` are done)
    for (int e = tid; e < 16 * (dn / 2); e += kAbsThreads) {
      const int r = e / (dn / 2), j = 2 * (e % (dn / 2));
      uint32_t v = 0;
      if (m0 + r < i1) {
        if (pairs) {
          v = *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(q.p) + (m0 + r) * q.ld + h * dqk + j);
        } else {
          v = bf16x2_bits(tget(q, m0 + r, h * dqk + j), tget(q, m0 + r, h * dqk + j + 1));
        }
      }
      *reinterpret_cast<uint32_t*>(&as[r][j]) = v;
    }
    cp_async_wait<0>();
    __syncthreads();
    float acc[2][4] = {};
    for (int kk = 0; kk < dn; kk += 16) {
      uint32_t a[4], b[4];
      ldsm_x4(a, &as[(lane & 7) + ((lane >> 3) & 1) * 8][kk + (lane >> 4) * 8]);
      ldsm_x4_t(b, &ws[kk + (lane & 7) + ((lane >> 3) & 1) * 8][warp * 16 + (lane >> 4) * 8]);
      mma_bf16(acc[0], a, b[0], b[1]);
      mma_bf16(acc[1], a, b[2], b[3]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int64_t i = m0 + g + 8 * h2;
        if (i >= i1) continue;
        const int64_t c = c0 + warp * 16 + nt * 8 + 2 * cq;
        const float a0 = fp8 ? acc[nt][2 * h2] * wsc : acc[nt][2 * h2];
        const float a1 = fp8 ? acc[nt][2 * h2 + 1] * wsc : acc[nt][2 * h2 + 1];
        *reinterpret_cast<uint32_t*>(qlat + (i * H + h) * dc + c) = bf16x2_bits(a0, a1);
      }
  }
}

// o[i, h, v0 .. v0 + 64) = o_lat[i, h, :] · W_UV[h][v0 .. v0 + 64, :]ᵀ: W_UV rows (n = v, k = c contiguous) staged
// as [64][dc] and read as the B operand through ldmatrix; o_lat tiles [16][dc]. Dynamic shared memory:
// (64 + 16) · (dc + 8) bf16.
__global__ void __launch_bounds__(kAbsThreads)
    absorb_o_tc_kernel(MlaDims d, const uint16_t* olat, int64_t N, WDesc kv_b, StepSeqs seqs, TView o) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t H = d.n_heads, dn = d.nope, dv = d.v, dkv = d.nope + d.v;
  const int dc = static_cast<int>(d.latent), ld = dc + kPad;
  uint16_t* ws = reinterpret_cast<uint16_t*>(smem_raw);  // [kAbsRows][ld]
  uint16_t* as = ws + kAbsRows * ld;                     // [16][ld]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, cq = lane & 3;
  const int64_t h = blockIdx.x, v0 = static_cast<int64_t>(blockIdx.y) * kAbsRows;
  const int64_t i0 = seqs.q_begin[0], i1 = seqs.q_begin[seqs.n_seqs] < N ? seqs.q_begin[seqs.n_seqs] : N;
  if (i1 <= i0) return;
  const int chunks = dc / 8;
  const bool fp8 = kv_b.format != kFmtBF16, blocks = kv_b.format == kFmtFp8Block;
  if (!fp8) {
    const auto* wb = static_cast<const uint8_t*>(kv_b.data) + (h * dkv + dn + v0) * kv_b.row_bytes;
    for (int e = tid; e < kAbsRows * chunks; e += kAbsThreads) {
      const int r = e / chunks, ch = e % chunks;
      const bool valid = v0 + r < dv;
      cp_async16(ws + r * ld + ch * 8, valid ? wb + r * kv_b.row_bytes + ch * 16 : kv_b.data, valid);
    }
  } else {  // 16 codes per load (rows past dv: zeros), four in flight per thread
    const auto* wb = static_cast<const uint8_t*>(kv_b.data) + (h * dkv + dn + v0) * kv_b.row_bytes;
    const int ch16 = dc / 16;
    for (int e0 = 0; e0 < kAbsRows * ch16; e0 += 4 * kAbsThreads) {
      uint4 raw[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int e = e0 + u * kAbsThreads + tid, r = e / ch16;
        raw[u] = make_uint4(0u, 0u, 0u, 0u);
        if (e < kAbsRows * ch16 && v0 + r < dv)
          raw[u] = __ldg(reinterpret_cast<const uint4*>(wb + r * kv_b.row_bytes + (e % ch16) * 16));
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int e = e0 + u * kAbsThreads + tid;
        if (e < kAbsRows * ch16) fp8x16_to_bf16(raw[u], ws + (e / ch16) * ld + (e % ch16) * 16);
      }
    }
  }
  cp_async_commit();
  // FP8 block scales: the kv_b row of each value column of this lane's accumulators (clamped past dv).
  int64_t vrow[2][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int64_t v = v0 + warp * 16 + nt * 8 + 2 * cq + k;
      vrow[nt][k] = h * dkv + dn + (v < dv ? v : dv - 1);
    }
  for (int64_t m0 = i0; m0 < i1; m0 += 16) {
    __syncthreads();
    for (int e = tid; e < 16 * chunks; e += kAbsThreads) {
      const int r = e / chunks, ch = e % chunks;
      const bool valid = m0 + r < i1;
      cp_async16(as + r * ld + ch * 8, valid ? olat + ((m0 + r) * H + h) * dc + ch * 8 : olat, valid);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float acc[2][4] = {}, part[2][4] = {};
    for (int kk = 0; kk < dc; kk += 16) {
      uint32_t a[4], b[4];
      ldsm_x4(a, as + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + kk + (lane >> 4) * 8);
      ldsm_x4(b, ws + (warp * 16 + (lane & 7) + (lane >> 4) * 8) * ld + kk + ((lane >> 3) & 1) * 8);
      if (blocks) {
        mma_bf16(part[0], a, b[0], b[1]);
        mma_bf16(part[1], a, b[2], b[3]);
        if ((kk + 16) % kv_b.block_cols == 0 || kk + 16 == dc) {  // a column block's partial sums, scaled
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              acc[nt][e] = fmaf(part[nt][e], kvb_scale(kv_b, vrow[nt][e & 1], kk), acc[nt][e]);
              part[nt][e] = 0.0f;
            }
        }
      } else {
        mma_bf16(acc[0], a, b[0], b[1]);
        mma_bf16(acc[1], a, b[2], b[3]);
      }
    }
    if (fp8 && !blocks) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] *= static_cast<const float*>(kv_b.scale)[0];
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int64_t i = m0 + g + 8 * h2, v = v0 + warp * 16 + nt * 8 + 2 * cq;
        if (i >= i1 || v >= dv) continue;
        tset(o, i, h * dv + v, acc[nt][2 * h2]);
        if (v + 1 < dv) tset(o, i, h * dv + v + 1, acc[nt][2 * h2 + 1]);
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
  int32_t key[2][kKT];                       // key position of each slot of a tile (-1: masked)
  int32_t kpos[kRowChunk], krow[kRowChunk];  // the key table of the current chunk of 8 tiles
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

  // Query tile: rows = heads ht·64 .. +64 (zero beyond H): q_lat, then q_pe, copied with cp.async (one group, in
  // flight with the first key tile; q_pe element-wise when q is not 16-byte-aligned bf16).
  const int qch = static_cast<int>(dc / 8);
  for (int e = tid; e < kHT * qch; e += kAttnThreads) {
    const int r = e / qch, ch = e % qch;
    const int64_t h = ht * kHT + r;
    cp_async16(&sm.q[r][ch * 8], h < H ? qlat + (i * H + h) * dc + ch * 8 : qlat, h < H);
  }
  const bool qpe_async = q.bf16 && dr % 8 == 0 && dn % 8 == 0 && dqk % 8 == 0 && q.ld % 8 == 0 &&
                         (reinterpret_cast<uintptr_t>(q.p) & 15) == 0;
  if (qpe_async) {
    const int pch = static_cast<int>(dr / 8);
    for (int e = tid; e < kHT * pch; e += kAttnThreads) {
      const int r = e / pch, ch = e % pch;
      const int64_t h = ht * kHT + r;
      const uint16_t* src = static_cast<const uint16_t*>(q.p) + i * q.ld + h * dqk + dn + ch * 8;
      cp_async16(&sm.q[r][dc + ch * 8], h < H ? src : qlat, h < H);
    }
  } else {
#pragma unroll 4
    for (int e = tid; e < kHT * static_cast<int>(dr); e += kAttnThreads) {
      const int r = e / static_cast<int>(dr), col = e % static_cast<int>(dr);
      const int64_t h = ht * kHT + r;
      sm.q[r][dc + col] = h < H ? bf16_bits(tget(q, i, h * dqk + dn + col)) : uint16_t{0};
    }
  }
  cp_async_commit();
  if (tid < kHT) {
    sm.m[tid] = __uint_as_float(0xFF800000u);
    sm.l[tid] = 0.0f;
  }
  // The key table: for the 256 slots of chunk `chunk` (8 tiles), each key's position (-1: masked) and its pool row,
  // one slot per thread (the block-table and selection loads of 8 tiles in one round trip).
  auto fill_rows = [&](int64_t chunk) {
    const int64_t slot = k0 + chunk * kRowChunk + tid;
    int32_t t = -1, row = 0;
    if (slot < k1) {
      t = sel.sel ? sel.sel[i * sel.stride + slot] : static_cast<int32_t>(slot);
      if (t < 0 || t > last) t = -1;
    }
    if (t >= 0) row = static_cast<int32_t>(static_cast<int64_t>(blocks[t / bt]) * bt + t % bt);
    sm.kpos[tid] = t;
    sm.krow[tid] = row;
  };
  const int64_t n_tiles = k1 > k0 ? (k1 - k0 + kKT - 1) / kKT : 0;
  if (n_tiles > 0) fill_rows(0);
  __syncthreads();  // (the statistics are read below even when the split has no keys)
  // Loads key tile `tile` (its chunk's table filled) into buffer b: warp w copies keys w, w + 8, w + 16, w + 24,
  // its lanes the key's 16-byte chunks.
  const int chunks = D / 8;
  auto load_tile = [&](int64_t tile, int b) {
    const int t0 = static_cast<int>(tile % (kRowChunk / kKT)) * kKT;
    if (tid < kKT) sm.key[b][tid] = sm.kpos[t0 + tid];
    for (int j = warp; j < kKT; j += kAttnThreads / 32) {
      const bool valid = sm.kpos[t0 + j] >= 0;
      const uint16_t* row =
          static_cast<const uint16_t*>(pool.data) + static_cast<int64_t>(sm.krow[t0 + j]) * pool.width;
      for (int ch = lane; ch < chunks; ch += 32) cp_async16(&sm.k[b][j][ch * 8], row + ch * 8, valid);
    }
    cp_async_commit();
  };
  if (n_tiles > 0)
    load_tile(0, 0);
  else
    cp_async_wait<0>();

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
      if ((tile + 1) % (kRowChunk / kKT) == 0) {  // every earlier tile's copies are issued (last iteration's sync)
        fill_rows((tile + 1) / (kRowChunk / kKT));
        __syncthreads();
      }
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
    // Two accumulator chains per n-tile (even and odd k-steps), added at the end: half the dependent mma latency.
    float sacc2[2][4] = {};
    int kk = 0;
#pragma unroll 2
    for (; kk + 32 <= D; kk += 32) {
      uint32_t a[4], bb[4], a2[4], bb2[4];
      ldsm_x4(a, &sm.q[smt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][kk + (lane >> 4) * 8]);
      ldsm_x4(bb, &sm.k[b][snh * 16 + (lane & 7) + (lane >> 4) * 8][kk + ((lane >> 3) & 1) * 8]);
      ldsm_x4(a2, &sm.q[smt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][kk + 16 + (lane >> 4) * 8]);
      ldsm_x4(bb2, &sm.k[b][snh * 16 + (lane & 7) + (lane >> 4) * 8][kk + 16 + ((lane >> 3) & 1) * 8]);
      mma_bf16(sacc[0], a, bb[0], bb[1]);
      mma_bf16(sacc[1], a, bb[2], bb[3]);
      mma_bf16(sacc2[0], a2, bb2[0], bb2[1]);
      mma_bf16(sacc2[1], a2, bb2[2], bb2[3]);
    }
    if (kk < D) {  // D ≡ 16 (mod 32)
      uint32_t a[4], bb[4];
      ldsm_x4(a, &sm.q[smt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][kk + (lane >> 4) * 8]);
      ldsm_x4(bb, &sm.k[b][snh * 16 + (lane & 7) + (lane >> 4) * 8][kk + ((lane >> 3) & 1) * 8]);
      mma_bf16(sacc[0], a, bb[0], bb[1]);
      mma_bf16(sacc[1], a, bb[2], bb[3]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[nt][e] += sacc2[nt][e];
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
        *reinterpret_cast<uint32_t*>(&sm.p[row][key]) = bf16x2_bits(p0, p1);
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

// ---- C. combine: block per (token, head, 128 latent columns), thread per column ----
// The splits' weights exp(m_sp − M) (0 for a split without keys) are computed once per block into shared memory;
// each thread then sums its column over the splits (ascending, eight loads in flight).
constexpr int kCombineCols = 128;
constexpr int kMaxSplits = 64;  // mla_decode_splits' cap
__global__ void __launch_bounds__(kCombineCols)
    combine_kernel(MlaDims d, int64_t N, StepSeqs seqs, int n_splits, const float* part_o, const float* part_ml,
                   uint16_t* olat) {
  __shared__ float wsp[kMaxSplits];
  __shared__ float inv_l;
  const int64_t H = d.n_heads, dc = d.latent;
  const int64_t i = blockIdx.x / H, h = blockIdx.x % H;
  if (i >= N || seq_of(seqs, i) < 0) return;
  const int64_t tiles = (H + kHT - 1) / kHT, ht = h / kHT, row = h % kHT;
  const int64_t pr0 = (i * tiles + ht) * n_splits;  // partial row of split 0 is (pr0 + sp) · kHT + row
  const int tid = threadIdx.x;
  if (tid < 32) {
    float mv[kMaxSplits / 32], lv[kMaxSplits / 32];
    float M = __uint_as_float(0xFF800000u);
#pragma unroll
    for (int u = 0; u < kMaxSplits / 32; ++u) {
      const int sp = tid + 32 * u;
      mv[u] = M;
      lv[u] = 0.0f;
      if (sp < n_splits) {
        const float* ml = part_ml + ((pr0 + sp) * kHT + row) * 2;
        mv[u] = ml[0];
        lv[u] = ml[1];
      }
      if (lv[u] > 0.0f) M = fmaxf(M, mv[u]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xFFFFFFFFu, M, off));
    float L = 0.0f;
#pragma unroll
    for (int u = 0; u < kMaxSplits / 32; ++u) {
      const int sp = tid + 32 * u;
      const float w = lv[u] > 0.0f ? __expf(mv[u] - M) : 0.0f;
      if (sp < n_splits) wsp[sp] = w;
      L += lv[u] * w;
    }
    L = warp_sum(L);
    if (tid == 0) inv_l = L > 0.0f ? 1.0f / L : 0.0f;
  }
  __syncthreads();
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kCombineCols + tid;
  if (c >= dc) return;
  float acc = 0.0f;
  int sp = 0;
  for (; sp + 8 <= n_splits; sp += 8) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = part_o[((pr0 + sp + u) * kHT + row) * dc + c];
#pragma unroll
    for (int u = 0; u < 8; ++u) acc += v[u] * wsp[sp + u];
  }
  for (; sp < n_splits; ++sp) acc += part_o[((pr0 + sp) * kHT + row) * dc + c] * wsp[sp];
  olat[(i * H + h) * dc + c] = bf16_bits(acc * inv_l);
}

}  // namespace

bool absorb_tc_ok(const MlaDims& d, const WDesc& kv_b) {
  if (d.nope % 16 != 0) return false;
  if (kv_b.format == kFmtBF16) return true;
  const int64_t dkv = d.nope + d.v;
  if (kv_b.fnuz || kv_b.row_bytes != d.latent || kv_b.scale == nullptr ||
      (reinterpret_cast<uintptr_t>(kv_b.data) & 15) != 0)
    return false;
  if (kv_b.format == kFmtFp8Tensor) return true;
  // Block scales: W_UK[h] (rows h·dkv .. + dn) in one row block, absorb_q's 64 columns in one column block, and
  // absorb_o's 16-column steps inside column blocks.
  return kv_b.format == kFmtFp8Block && kv_b.block_rows > 0 && dkv % kv_b.block_rows == 0 &&
         d.nope <= kv_b.block_rows && kv_b.block_cols > 0 && kv_b.block_cols % 64 == 0;
}

bool mla_decode_supported(const MlaDims& d, const KvPool& pool) {
  return pool.dtype == DType::BF16 && d.latent % 64 == 0 && d.latent >= 64 && d.latent <= 512 && d.rope % 16 == 0 &&
         d.latent + d.rope <= kMaxD && d.nope <= 256 && pool.width == d.latent + d.rope && d.n_heads > 0;
}

int mla_decode_splits(const MlaDims& d, int64_t n_tokens, int64_t max_ctx, int min_keys) {
  static const int sms = [] {
    int dev = 0, n = 132;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n;
  }();
  const int64_t items = n_tokens * ((d.n_heads + kHT - 1) / kHT);
  int64_t s = (2 * sms + items - 1) / items;  // about two blocks per SM
  // Auto (min_keys <= 0): 32 keys for a step of one (token, head tile) item, else 128 (GLM-5 shape, H100, ctx 1K:
  // batch 1 3.651 -> 3.600 ms per step at 32; batch 8 5.875 -> 6.094 ms, so not there).
  const int64_t mk = min_keys > 0 ? min_keys : items == 1 ? 32 : 128;
  const int64_t by_keys = (max_ctx + mk - 1) / mk;  // at least ~min_keys keys per split
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
  const bool tc = absorb_tc_ok(d, kv_b);  // A and D on tensor cores (bf16 kv_b, FP8 with fitting scales)
  if (tc)
    absorb_q_tc_kernel<<<dim3(static_cast<unsigned>(d.n_heads), static_cast<unsigned>(d.latent / kAbsCols)),
                         kAbsThreads, 0, st>>>(d, q, n_tokens, kv_b, seqs, ql);
  else
    absorb_q_kernel<<<dim3(static_cast<unsigned>(d.n_heads), static_cast<unsigned>((d.latent + 63) / 64)), 256, 0,
                      st>>>(d, q, n_tokens, kv_b, seqs, ql);
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
    combine_kernel<<<dim3(static_cast<unsigned>(n_tokens * d.n_heads),
                          static_cast<unsigned>((d.latent + kCombineCols - 1) / kCombineCols)),
                     kCombineCols, 0, st>>>(d, n_tokens, seqs, n_splits, po, pm, ol);
  if (tc) {
    const size_t osmem = static_cast<size_t>(kAbsRows + 16) * static_cast<size_t>(d.latent + kPad) * 2;
    static const cudaError_t oattr = cudaFuncSetAttribute(
        absorb_o_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kAbsSmemMax));
    (void)oattr;
    absorb_o_tc_kernel<<<dim3(static_cast<unsigned>(d.n_heads), static_cast<unsigned>((d.v + kAbsRows - 1) / kAbsRows)),
                         kAbsThreads, osmem, st>>>(d, ol, n_tokens, kv_b, seqs, o);
  } else {
    absorb_o_kernel<<<dim3(static_cast<unsigned>(d.n_heads), static_cast<unsigned>((d.v + 7) / 8)), 256, 0, st>>>(
        d, ol, n_tokens, kv_b, seqs, o);
  }
}

}  // namespace latent::cuda
