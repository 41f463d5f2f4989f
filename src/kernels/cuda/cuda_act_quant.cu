// Declared FP8 activations: the quantize kernel of act_quant_fp8 (cuda_act_quant.h), writing either q · s in fp32 (the
// default composition of the linear ops: this kernel, then the exact fp32 matmul on the scaled values) or the codes
// and the group scales apart (the FP8 x FP8 cuBLASLt GEMM of cuda_lt.h in the bf16 mode).
#include <cuda_fp8.h>

#include "kernels/cuda/cuda_act_quant.h"
#include "kernels/cuda/cuda_common.cuh"

namespace latent::cuda {

namespace {

constexpr int kQuantThreads = 256;

// s for a group's amax: amax / 448 (IEEE division), pow2: the smallest power of two >= that; 1 when 0
// (quant/fp8.h act_fp8_scale_for_amax).
__device__ __forceinline__ float act_scale(float amax, bool pow2) {
  float s = __fdiv_rn(amax, 448.0f);
  if (pow2 && s > 0.0f) {
    int e = 0;
    const float m = frexpf(s, &e);
    if (m != 0.5f) s = ldexpf(1.0f, e);
  }
  return s == 0.0f ? 1.0f : s;
}

// kCodes false: xq [rows, cols] fp32 = q · s. kCodes true: the e4m3fn codes into `codes` (row stride codes_ld) and
// each group's s into scales[g · scale_g_ld + r] (a NaN group: codes 0x7F, s NaN).
template <bool kCodes>
__global__ void act_quant_kernel(TView x, int64_t rows, int64_t cols, int64_t group, int64_t n_groups, bool pow2,
                                 float* xq, int64_t xq_ld, uint8_t* codes, int64_t codes_ld, float* scales,
                                 int64_t scale_g_ld) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= rows * n_groups) return;  // whole warps leave together
  const int64_t r = warp / n_groups, k0 = (warp % n_groups) * group;
  const int64_t k1 = k0 + group < cols ? k0 + group : cols;
  float amax = 0.0f;
  int bad = 0;
  for (int64_t k = k0 + lane; k < k1; k += 32) {
    const float a = fabsf(tget(x, r, k));
    if (!(a <= 3.402823466e+38f))
      bad = 1;
    else
      amax = fmaxf(amax, a);
  }
  amax = warp_max(amax);
  bad = __any_sync(0xFFFFFFFFu, bad);
  if constexpr (kCodes) {
    uint8_t* out = codes + r * codes_ld;
    const float s = bad ? f_nan() : act_scale(amax, pow2);
    if (lane == 0) scales[(k0 / group) * scale_g_ld + r] = s;
    for (int64_t k = k0 + lane; k < k1; k += 32)
      out[k] = bad ? uint8_t{0x7F} : __nv_cvt_float_to_fp8(__fdiv_rn(tget(x, r, k), s), __NV_SATFINITE, __NV_E4M3);
  } else {
    float* out = xq + r * xq_ld;
    if (bad) {
      for (int64_t k = k0 + lane; k < k1; k += 32) out[k] = f_nan();
      return;
    }
    const float s = act_scale(amax, pow2);
    for (int64_t k = k0 + lane; k < k1; k += 32) {
      const float v = __fdiv_rn(tget(x, r, k), s);
      const __nv_fp8_storage_t c = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
      out[k] = __fmul_rn(e4m3_to_f(c, false), s);
    }
  }
}

}  // namespace

namespace {

unsigned quant_blocks(int64_t rows, int64_t cols, int64_t group) {
  const int64_t warps = rows * ((cols + group - 1) / group);
  return static_cast<unsigned>((warps * 32 + kQuantThreads - 1) / kQuantThreads);
}

}  // namespace

void launch_act_quant_fp8(TView x, int64_t rows, int64_t cols, int64_t group, bool pow2_scale, float* xq, int64_t xq_ld,
                          cudaStream_t st) {
  if (rows <= 0 || cols <= 0 || group <= 0) return;
  act_quant_kernel<false><<<quant_blocks(rows, cols, group), kQuantThreads, 0, st>>>(
      x, rows, cols, group, (cols + group - 1) / group, pow2_scale, xq, xq_ld, nullptr, 0, nullptr, 0);
}

void launch_act_quant_fp8_codes(TView x, int64_t rows, int64_t cols, int64_t group, bool pow2_scale, uint8_t* codes,
                                int64_t codes_ld, float* scales, int64_t scale_g_ld, cudaStream_t st) {
  if (rows <= 0 || cols <= 0 || group <= 0) return;
  act_quant_kernel<true><<<quant_blocks(rows, cols, group), kQuantThreads, 0, st>>>(
      x, rows, cols, group, (cols + group - 1) / group, pow2_scale, nullptr, 0, codes, codes_ld, scales, scale_g_ld);
}

}  // namespace latent::cuda
