// MXFP4 (OCP MX, docs/quantization.md §MXFP4): blocks of 32 contiguous e2m1 elements along K sharing one e8m0 scale.
//
// Row layout used everywhere in latent (and by both checkpoint families, byte for byte):
//   codes  [rows, K/2]  uint8: byte j holds element 2j in its low nibble and element 2j+1 in its high nibble
//   scales [rows, K/32] uint8: e8m0 codes, value 2^(code-127); 0xFF = NaN
//   W[r, c] = e2m1(nibble(r, c)) * 2^(scales[r, c/32] - 127)
// * Quark / OCP (`quant_method: quark`, fp4): `<m>.weight` U8 [out, K/2] + `<m>.weight_scale` U8 [out, K/32].
// * gpt-oss (`quant_method: mxfp4`): `<m>_blocks` U8 [E, out, K/32, 16] + `<m>_scales` U8 [E, out, K/32].
//   The 16 bytes of block b of a row are bytes 16b..16b+15 of that row, with the same nibble order, so for one
//   expert `_blocks` viewed as [out, K/2] is exactly the Quark `weight` and `_scales` is exactly `weight_scale`.
//   (HF then transposes the dequantized [E, out, in] to [E, in, out]; we keep [out, in] rows.)
// * llama.cpp GGUF `block_mxfp4` differs (17 bytes: scale first, then qs[j] = element j | element j+16 << 4);
//   mxfp4_block_to_ggml exists to check the docs/quantization.md §vectors only.
#pragma once
#include <cstdint>

#include "quant/float_formats.h"
#include "quant/weight_format.h"

namespace latent {

inline constexpr int kMxBlock = 32;  // elements per MX block

// How the shared exponent se of a block is chosen from its amax (docs/quantization.md §E8M0); scale = 2^se,
// se in [-127, 127].
enum class Mxfp4ScaleRule : uint8_t {
  OcpFloor,   // se = floor(log2 amax) - 2 (OCP spec, microxcaling, llama.cpp)
  Even,       // round amax's mantissa to 2 bits first (bump a binade iff amax/2^floor(log2 amax) >= 1.75), then
              // floor(log2) - 2 (Quark `scale_calculation_mode: even`, AITER dynamic_mxfp4_quant)
  CeilAmax6,  // se = ceil(log2(amax / 6)) (Quark Triton ROUND_UP); never saturates
};
const char* mxfp4_scale_rule_name(Mxfp4ScaleRule r);  // "ocp_floor", "even", "ceil_amax6"

// e8m0 code of a block with max |x| = amax. amax == 0 -> 0x00 (convention of llama.cpp, Quark, AITER);
// NaN or Inf amax -> 0xFF (NaN scale: the whole block decodes to NaN).
uint8_t mxfp4_scale_code(float amax, Mxfp4ScaleRule rule);

// Quantizes one block x[32]: writes 16 packed bytes (OCP order) and returns the e8m0 scale code.
// Elements are x * 2^-se rounded RNE (ties to even code) and saturated to ±6 (docs/quantization.md §E2M1). A zero
// result is always written as 0x0 (never -0 = 0x8), so packed bytes match docs/quantization.md §vectors and llama.cpp.
uint8_t quantize_block_mxfp4(const float* x, uint8_t* packed16, Mxfp4ScaleRule rule);

// x[k] -> codes_out[k/2], scales_out[k/32]. Requires k % 32 == 0 (not checked: callers validate).
void quantize_row_mxfp4(const float* x, int64_t k, uint8_t* codes_out, uint8_t* scales_out,
                        Mxfp4ScaleRule rule = Mxfp4ScaleRule::OcpFloor);

// codes[k/2], scales[k/32] -> out[k] (fp32), exactly e2m1 * 2^(scale - 127). k % 32 == 0.
inline void dequant_row_mxfp4(const uint8_t* codes, const uint8_t* scales, int64_t k, float* out) {
  for (int64_t b = 0; b < k / kMxBlock; ++b) {
    const float s = kE8M0ToF32[scales[b]];
    const uint8_t* q = codes + b * (kMxBlock / 2);
    float* o = out + b * kMxBlock;
    for (int j = 0; j < kMxBlock / 2; ++j) {
      o[2 * j] = kE2M1ToF32[q[j] & 0xF] * s;
      o[2 * j + 1] = kE2M1ToF32[q[j] >> 4] * s;
    }
  }
}

// Views (no copy) of a checkpoint's MXFP4 weight as a QuantWeight [rows, cols].
// Quark: weight U8 [rows, cols/2], weight_scale U8 [rows, cols/32].
QuantWeight view_quark_mxfp4(const uint8_t* weight, const uint8_t* weight_scale, int64_t rows, int64_t cols);
// gpt-oss: blocks U8 [n_experts, rows, k_blocks, 16], scales U8 [n_experts, rows, k_blocks]; the view is expert
// `expert`'s [rows, k_blocks*32] matrix.
QuantWeight view_gpt_oss_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t k_blocks,
                               int64_t expert = 0);

// Re-packs one OCP block (16 bytes + scale) as llama.cpp `block_mxfp4` (out[0] = scale, out[1+j] = element j |
// element j+16 << 4). For cross-checking docs/quantization.md §vectors.
void mxfp4_block_to_ggml(const uint8_t* packed16, uint8_t scale, uint8_t* ggml17);

}  // namespace latent
