// Device helpers shared by the kernels: bf16 rounding identical to quant/float_formats.h, exact decoders of every
// stored weight element format, the generic element fetch, and block reductions.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/mx_layout.h"
#include "quant/weight_format.h"

namespace latent::cuda {

constexpr int kFmtF32 = static_cast<int>(WeightFormat::F32);
constexpr int kFmtBF16 = static_cast<int>(WeightFormat::BF16);
constexpr int kFmtF16 = static_cast<int>(WeightFormat::F16);
constexpr int kFmtFp8Block = static_cast<int>(WeightFormat::FP8_E4M3_BLOCK);
constexpr int kFmtFp8Tensor = static_cast<int>(WeightFormat::FP8_E4M3_TENSOR);
constexpr int kFmtFp8Channel = static_cast<int>(WeightFormat::FP8_E4M3_CHANNEL);
constexpr int kFmtMxfp4 = static_cast<int>(WeightFormat::MXFP4);

__device__ __forceinline__ float f_nan() { return __uint_as_float(0x7FC00000u); }

// Round to bf16 (nearest even) and back; NaN stays NaN with the quiet bit set (as f32_to_bf16).
__device__ __forceinline__ float bf16r(float f) {
  const uint32_t b = __float_as_uint(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return __uint_as_float(((b >> 16) | 0x0040u) << 16);
  return __uint_as_float(((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16) << 16);
}
__device__ __forceinline__ float bf16_bits_to_f(uint32_t h) { return __uint_as_float((h & 0xFFFFu) << 16); }
// The 8 bf16 values of a 16-byte load, in memory order, as floats (exact).
__device__ __forceinline__ void bf16x8_to_f(const uint4& q, float* v) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __uint_as_float(w[k] << 16);
    v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
  }
}
// RNE to bf16 bits (NaN: quiet bit forced), as f32_to_bf16.
__device__ __forceinline__ uint16_t f_to_bf16_bits(float f) {
  const uint32_t b = __float_as_uint(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
// Two floats as one word of bf16 bits (lo in the low half: the memory order of a bf16 pair).
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  return static_cast<uint32_t>(f_to_bf16_bits(lo)) | (static_cast<uint32_t>(f_to_bf16_bits(hi)) << 16);
}

// The sequence of a step's token i: the last s with seqs.q_begin[s] <= i (binary search).
__device__ __forceinline__ int64_t seq_of_token(const StepSeqs& seqs, int64_t i) {
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

// Element access of a typed activation view (TView, cuda_ops.h): fp32 values in and out, rounded on store to bf16.
__device__ __forceinline__ float tget(const TView& t, int64_t r, int64_t c) {
  return t.bf16 ? bf16_bits_to_f(static_cast<const uint16_t*>(t.p)[r * t.ld + c])
                : static_cast<const float*>(t.p)[r * t.ld + c];
}
__device__ __forceinline__ void tset(const TView& t, int64_t r, int64_t c, float v) {
  if (t.bf16)
    static_cast<uint16_t*>(t.p)[r * t.ld + c] = f_to_bf16_bits(v);
  else
    static_cast<float*>(t.p)[r * t.ld + c] = v;
}
__device__ __forceinline__ float f16_bits_to_f(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xFFFFu)));
}
// e4m3fn (bias 7, NaN 0x7F/0xFF) or e4m3fnuz (bias 8, NaN 0x80 only), exact.
__device__ __forceinline__ float e4m3_to_f(uint32_t c, bool fnuz) {
  c &= 0xFFu;
  if (fnuz ? c == 0x80u : (c & 0x7Fu) == 0x7Fu) return f_nan();
  const uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
  float v;
  if (e == 0)
    v = static_cast<float>(m) * (fnuz ? 0.0009765625f : 0.001953125f);  // m · 2^-10 / 2^-9
  else
    v = __uint_as_float(((e + (fnuz ? 119u : 120u)) << 23) | (m << 20));
  return __uint_as_float(__float_as_uint(v) | ((c & 0x80u) << 24));
}
// e2m1 code (low 4 bits): ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
__device__ __forceinline__ float e2m1_to_f(uint32_t c) {
  const float v = static_cast<float>((0xC8643210u >> (4u * (c & 7u))) & 0xFu) * 0.5f;
  return (c & 8u) ? -v : v;
}
// e8m0: 2^(code-127); 0x00 = 2^-127 (subnormal), 0xFF = NaN.
__device__ __forceinline__ float e8m0_to_f(uint32_t c) {
  c &= 0xFFu;
  if (c == 0xFFu) return f_nan();
  if (c == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(c << 23);
}

// MXFP4 codes: the address of byte b of row r's codes, in either byte order (w.tiled: tile-major, mx_layout.h).
// A read of up to 16 bytes at b % 16 == 0 (or of 4 at b % 4 == 0) stays inside one 64-byte chunk, so it reads the
// same consecutive bytes as in the row-major order.
__device__ __forceinline__ const uint8_t* mx_code_ptr(const WDesc& w, int64_t r, int64_t b) {
  const uint8_t* d = static_cast<const uint8_t*>(w.data);
  return w.tiled ? d + mx_tile_major_offset(r, b, w.row_bytes) : d + r * w.row_bytes + b;
}
// The distance in bytes from a row's 64-byte chunk k to its chunk k + 1 (64 row-major, 1,024 tile-major).
__device__ __forceinline__ int64_t mx_chunk_stride(const WDesc& w) {
  return w.tiled ? kMxTileChunkBytes : kMxChunkBytes;
}

// W[r][c] dequantized exactly as dequant_row_ref does (decode(code) · scale, one fp32 multiply).
__device__ __forceinline__ float wget(const WDesc& w, int64_t r, int64_t c) {
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
  switch (w.format) {
    case kFmtF32: return reinterpret_cast<const float*>(row)[c];
    case kFmtBF16: return bf16_bits_to_f(reinterpret_cast<const uint16_t*>(row)[c]);
    case kFmtF16: return f16_bits_to_f(reinterpret_cast<const uint16_t*>(row)[c]);
    case kFmtFp8Block: {
      const float s = static_cast<const float*>(w.scale)[(r / w.block_rows) * w.scale_cols + c / w.block_cols];
      return __fmul_rn(e4m3_to_f(row[c], w.fnuz), s);
    }
    case kFmtFp8Tensor: return __fmul_rn(e4m3_to_f(row[c], w.fnuz), static_cast<const float*>(w.scale)[0]);
    case kFmtFp8Channel: return __fmul_rn(e4m3_to_f(row[c], w.fnuz), static_cast<const float*>(w.scale)[r]);
    case kFmtMxfp4: {
      const float s = e8m0_to_f(static_cast<const uint8_t*>(w.scale)[r * w.scale_cols + (c >> 5)]);
      if (w.swz) {  // the word of columns c & ~7 .. (c | 7), pair-swizzled
        const uint32_t word = mx_unswizzle(*reinterpret_cast<const uint32_t*>(mx_code_ptr(w, r, (c >> 3) * 4)));
        return __fmul_rn(e2m1_to_f(word >> (4 * (c & 7))), s);
      }
      const uint32_t byte = *mx_code_ptr(w, r, c >> 1);
      return __fmul_rn(e2m1_to_f((c & 1) ? byte >> 4 : byte), s);
    }
    default: return f_nan();
  }
}

// SiLU(g) · u with the ref's points (SiLU in double; bf16: SiLU and the product rounded — the product by the store).
__device__ __forceinline__ float silu_mul_value(float g, float u, bool bf16) {
  const double gd = g;
  float s = static_cast<float>(gd / (1.0 + exp(-gd)));
  if (bf16) s = bf16r(s);
  return __fmul_rn(s, u);
}
// The linear epilogue of output element (m, j) (backend.h "Epilogue") from its fp32 accumulator, and (glu) the gate
// weight's accumulator; the result is rounded by the caller's store (tset).
__device__ __forceinline__ float epi_value(float acc, const float* bias, const float* gacc, const TView& gate,
                                           const TView& residual, int64_t m, int64_t j, bool bf16) {
  float v = bias ? __fadd_rn(acc, bias[j]) : acc;
  if (bf16) v = bf16r(v);
  if (gacc) {
    v = silu_mul_value(bf16 ? bf16r(*gacc) : *gacc, v, bf16);
    if (bf16) v = bf16r(v);
  }
  if (gate.p) {
    v = silu_mul_value(tget(gate, m, j), v, bf16);
    if (bf16) v = bf16r(v);
  }
  if (residual.p) v = __fadd_rn(tget(residual, m, j), v);
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result.
__device__ __forceinline__ double block_sum_d(double v, double* sh /* [32] */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double t = 0.0;
  for (int i = 0; i < nw; ++i) t += sh[i];  // fixed order: deterministic
  return t;
}
__device__ __forceinline__ float block_max(float v, float* sh /* [32] */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float t = sh[0];
  for (int i = 1; i < nw; ++i) t = fmaxf(t, sh[i]);
  return t;
}
__device__ __forceinline__ float block_sum(float v, float* sh /* [32] */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float t = 0.0f;
  for (int i = 0; i < nw; ++i) t += sh[i];
  return t;
}

inline unsigned grid_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b > 65535LL * 32) b = 65535LL * 32;  // grid-stride loops cover the rest
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

}  // namespace latent::cuda
