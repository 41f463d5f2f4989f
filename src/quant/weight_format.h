// How one logical Linear weight W[out][in] is stored, and the scalar dequantize-row function every kernel is
// tested against. A quantized weight keeps its scales as separate tensors, exactly as the checkpoint stores them.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace latent {

enum class WeightFormat : uint8_t {
  F32,
  BF16,
  F16,
  FP8_E4M3_BLOCK,    // DeepSeek block FP8: codes [out,in] e4m3fn + fp32 scale_inv [ceil(out/br), ceil(in/bc)]
  FP8_E4M3_TENSOR,   // per-tensor FP8: codes [out,in] + one fp32 scale
  FP8_E4M3_CHANNEL,  // per-channel FP8: codes [out,in] + fp32 scale [out]
  MXFP4,             // OCP MX: packed e2m1 codes [out, in/2] (low nibble = even element) + e8m0 scales [out, in/32]
};

// Names used in `latent plan` output and its --json: "f32", "bf16", "f16", "fp8_e4m3_block128",
// "fp8_e4m3_tensor", "fp8_e4m3_channel", "mxfp4". (Block FP8 with another block size prints its size.)
std::string_view weight_format_name(WeightFormat f);
bool is_quantized(WeightFormat f);

struct QuantWeight {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0;             // out features
  int64_t cols = 0;             // in features (logical elements)
  const void* data = nullptr;   // element codes, row-major
  const void* scale = nullptr;  // FP8: float scales; MXFP4: e8m0 codes (uint8)
  bool fnuz = false;            // FP8 codes are e4m3fnuz (value = fn value / 2)
  int64_t block_rows = 128;     // FP8_E4M3_BLOCK block shape
  int64_t block_cols = 128;
  // MXFP4 on the CUDA backend: each 32-bit word of codes in the pair-swizzled layout of kernels/cuda/mx_layout.h (set
  // by its prepare_weight; the same codes and values, only their bit order inside a word). Host views: false.
  bool mx_swizzled = false;
  // MXFP4 on the CUDA backend: the code bytes in the tile-major order of kernels/cuda/mx_layout.h (16-row tiles of
  // 128-column chunks; set by its prepare_weight where the shape allows; only the bytes' order). Host views: false.
  bool mx_tile_major = false;
  // FP8 (e4m3fn) on the CUDA backend: no code of the weight is NaN (0x7F / 0xFF), found by a scan at upload (set by
  // its prepare_weight); the tensor-core kernels then leave out their per-block NaN vote. Host views: false.
  bool fp8_nan_free = false;
  // The checkpoint declares dynamic 1 x block_cols FP8 activations for this module and latent can run them
  // (PrecisionPlan: block FP8 as stored, a plain linear of its input); used only with --activations declared.
  bool act_fp8 = false;

  int64_t scale_cols() const {  // scale entries per row of the scale tensor
    if (format == WeightFormat::FP8_E4M3_BLOCK) return (cols + block_cols - 1) / block_cols;
    if (format == WeightFormat::MXFP4) return cols / 32;
    return 0;
  }
  int64_t row_bytes() const;  // bytes of one row of `data`
};

// Scalar reference: writes W[r][0..cols) as fp32. Exactly decode(code) * scale per the spec.
void dequant_row_ref(const QuantWeight& w, int64_t r, float* out);

// weight_format_name plus what the enum alone does not say: block FP8 with a non-128 block prints its size
// ("fp8_e4m3_block64", "fp8_e4m3_block64x128"), fnuz codes print "fp8_e4m3fnuz_...".
std::string weight_format_label(const QuantWeight& w);

}  // namespace latent
