// Declared FP8 activations on the GPU (backend.h act_quant_fp8; docs/quantization.md §declared-activations).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cuda_ops.h"

namespace latent::cuda {

// xq [rows, cols] fp32 (row stride xq_ld) = x quantized per row in groups of `group` columns as act_quant_fp8
// defines it, its scales applied: the same bits as the host loop (IEEE divisions, round-to-nearest-even e4m3 with
// saturation, one fp32 multiply). One warp per (row, group).
void launch_act_quant_fp8(TView x, int64_t rows, int64_t cols, int64_t group, bool pow2_scale, float* xq, int64_t xq_ld,
                          cudaStream_t st);

}  // namespace latent::cuda
