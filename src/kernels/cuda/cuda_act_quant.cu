// Declared FP8 activations: the quantize kernel of act_quant_fp8 (cuda_act_quant.h). The linear ops with declared
// activations run the backend's default composition over it (backend.h matmul_act_fp8: this kernel, then the exact
// fp32 matmul on the scaled codes); an FP8 x FP8 tensor-core GEMM would replace that composition.
#include <cuda_fp8.h>

#include "kernels/cuda/cuda_act_quant.h"
#include "kernels/cuda/cuda_common.cuh"

namespace latent::cuda {

namespace {

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

__global__ void act_quant_kernel(TView x, int64_t rows, int64_t cols, int64_t group, int64_t n_groups, bool pow2,
                                 float* xq, int64_t xq_ld) {
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

}  // namespace

void launch_act_quant_fp8(TView x, int64_t rows, int64_t cols, int64_t group, bool pow2_scale, float* xq, int64_t xq_ld,
                          cudaStream_t st) {
  if (rows <= 0 || cols <= 0 || group <= 0) return;
  const int64_t n_groups = (cols + group - 1) / group;
  const int64_t warps = rows * n_groups;
  constexpr int kThreads = 256;
  const int64_t blocks = (warps * 32 + kThreads - 1) / kThreads;
  act_quant_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, st>>>(x, rows, cols, group, n_groups, pow2_scale, xq,
                                                                       xq_ld);
}

}  // namespace latent::cuda
