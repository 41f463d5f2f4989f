// FP8 E4M3 weight quantization at three granularities (docs/quantization.md §block-fp8) and the matching dequant rows.
// All scales are fp32 *multipliers*: W[r, c] = e4m3(code[r, c]) * scale (DeepSeek's `weight_scale_inv` too).
// Quantizers follow the reference ones: scale = amax / 448 over the group, code = e4m3fn(x / scale) with RNE and
// saturation (docs/quantization.md §FP8). An all-zero group gets scale 1 (codes 0). NaN inputs propagate
// (NaN codes / scales).
//
// Block FP8 (DeepSeek `quant_method: fp8`, Quark per_block): codes [rows, cols] + scale_inv
// [ceil(rows/br), ceil(cols/bc)], block (i, j) covers rows [i*br, min(rows, (i+1)*br)) and columns
// [j*bc, min(cols, (j+1)*bc)) — edge blocks are ragged (smaller), their amax is over the elements present.
// fnuz: e4m3fnuz codes decode to half the e4m3fn value of the same bits (kE4M3FnuzToF32); to convert, keep the
// bits (e4m3fn_codes_to_fnuz) and double every scale.
#pragma once
#include <cstdint>

#include "quant/float_formats.h"

namespace latent {

inline constexpr int64_t kFp8BlockDefault = 128;

// Group scale for max |x| = amax: amax / 448, or 1 when amax == 0.
float fp8_e4m3_scale_for_amax(float amax);

// w [rows, cols] fp32 -> codes [rows, cols] e4m3fn, scale_inv [ceil(rows/br), ceil(cols/bc)].
void quantize_fp8_block(const float* w, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols,
                        uint8_t* codes, float* scale_inv);
// One scale for the whole tensor.
void quantize_fp8_tensor(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scale);
// One scale per row (output channel, Quark per_channel ch_axis 0): scales [rows].
void quantize_fp8_channel(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scales);

// codes[n] * scale -> out[n] (per-tensor rows, per-channel rows).
inline void dequant_row_fp8(const uint8_t* codes, float scale, int64_t n, bool fnuz, float* out) {
  const float* t = fnuz ? kE4M3FnuzToF32.data() : kE4M3FnToF32.data();
  for (int64_t i = 0; i < n; ++i) out[i] = t[codes[i]] * scale;
}

// One row of a block-FP8 matrix: codes[cols], scale_row = the scale_inv row of this row's block row
// (scale_inv + (r / block_rows) * ceil(cols / block_cols)).
inline void dequant_row_fp8_block(const uint8_t* codes, const float* scale_row, int64_t cols, int64_t block_cols,
                                  bool fnuz, float* out) {
  const float* t = fnuz ? kE4M3FnuzToF32.data() : kE4M3FnToF32.data();
  for (int64_t c0 = 0, j = 0; c0 < cols; c0 += block_cols, ++j) {
    const float s = scale_row[j];
    const int64_t c1 = c0 + block_cols < cols ? c0 + block_cols : cols;
    for (int64_t c = c0; c < c1; ++c) out[c] = t[codes[c]] * s;
  }
}

// Declared dynamic FP8 activations (docs/quantization.md §declared-activations; backend.h act_quant_fp8): one group
// x[0..n) of a row (n <= the weight's block_cols) -> codes[0..n) e4m3fn; returns its scale s:
//   amax = max |x| (fp32); s = amax / 448 (fp32 division; pow2_scale: the smallest power of two >= that, as
//   DeepSeek's `scale_fmt: ue8m0` kernels round it); s = 1 when s is 0; code = e4m3fn(x / s), round to nearest
//   even, saturating. A NaN or ±Inf in the group: s = NaN, every code NaN (0x7F).
float act_fp8_scale_for_amax(float amax, bool pow2_scale);
float quantize_act_fp8_group(const float* x, int64_t n, bool pow2_scale, uint8_t* codes);

}  // namespace latent
