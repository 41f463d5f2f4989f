// Whole-matrix quantization and error measurement, for the opt-in `--quantize` transform and `latent plan`:
// quantize a fp32 (or any QuantWeight, e.g. a bf16 checkpoint view) [rows, cols] matrix into owned codes +
// scales with a QuantWeight view, and measure the relative Frobenius error ||W - Q(W)||_F / ||W||_F
// (docs/quantization.md §errors: bf16 0.166 %, MXFP4 11.50 % OCP floor / 11.19 % even, FP8 ~2.65 % on Gaussians).
#pragma once
#include <cstdint>
#include <vector>

#include "quant/mxfp4.h"
#include "quant/weight_format.h"

namespace latent {

struct QuantizeOptions {
  Mxfp4ScaleRule mxfp4_rule = Mxfp4ScaleRule::OcpFloor;
  int64_t block_rows = 128;  // FP8_E4M3_BLOCK
  int64_t block_cols = 128;
  bool fnuz = false;  // FP8: store e4m3fnuz codes (same bits, scales doubled: lossless)
};

struct QuantizedMatrix {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t block_rows = 128;
  int64_t block_cols = 128;
  bool fnuz = false;
  std::vector<uint8_t> data;        // row-major, QuantWeight::row_bytes() per row (f32/bf16/f16 values or codes)
  std::vector<float> scale_f32;     // FP8 scales: block [ceil(rows/br), ceil(cols/bc)], tensor [1], channel [rows]
  std::vector<uint8_t> scale_e8m0;  // MXFP4 scales [rows, cols/32]

  QuantWeight view() const;  // valid while *this lives and is not modified
};

// Throws latent::Error on bad shapes (negative sizes, MXFP4 with cols % 32 != 0, block sizes <= 0).
// F32 copies; BF16 rounds RNE; F16 rounds RNE and saturates at ±65504; FP8 and MXFP4 as in fp8.h / mxfp4.h.
QuantizedMatrix quantize_matrix(const float* w, int64_t rows, int64_t cols, WeightFormat f,
                                const QuantizeOptions& opt = {});
// Same from any stored weight (dequantized with dequant_row_ref first), e.g. a bf16 checkpoint tensor.
QuantizedMatrix quantize_matrix(const QuantWeight& src, WeightFormat f, const QuantizeOptions& opt = {});

// ||ref - dequant(q)||_F / ||ref||_F, accumulated in double (0 when both are zero). ref is [q.rows, q.cols].
double rel_error(const float* ref, const QuantWeight& q);
double rel_error(const QuantWeight& ref, const QuantWeight& q);  // shapes must match (else latent::Error)

// quantize_matrix + rel_error in one call.
double quant_rel_error(const float* w, int64_t rows, int64_t cols, WeightFormat f, const QuantizeOptions& opt = {});

}  // namespace latent
