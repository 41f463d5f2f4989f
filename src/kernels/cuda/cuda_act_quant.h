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
// The same quantization with the codes and scales kept apart (the operands of an FP8 x FP8 GEMM): codes [rows, cols]
// e4m3fn bytes (row stride codes_ld), the scale of row r's group g at scales[g · scale_g_ld + r] (rows of one group
// contiguous: the 1 x 128 scale layout cuBLASLt's block-scaled modes read). A group holding a NaN or ±Inf: codes
// 0x7F (NaN) and s NaN, so every output of the row is NaN as with the fp32 form.
void launch_act_quant_fp8_codes(TView x, int64_t rows, int64_t cols, int64_t group, bool pow2_scale, uint8_t* codes,
                                int64_t codes_ld, float* scales, int64_t scale_g_ld, cudaStream_t st);

}  // namespace latent::cuda
