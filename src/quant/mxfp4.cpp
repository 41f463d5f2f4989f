#include "quant/mxfp4.h"

#include <bit>
#include <cmath>

namespace latent {

namespace {

// floor(log2 a) for finite a > 0, fp32 subnormals included.
int floor_log2(float a) {
  const uint32_t b = std::bit_cast<uint32_t>(a);
  const int field = int(b >> 23);
  if (field) return field - 127;
  return int(std::bit_width(b & 0x7FFFFFu)) - 1 - 149;
}

bool is_pow2(float a) {  // finite a > 0
  const uint32_t b = std::bit_cast<uint32_t>(a);
  return (b >> 23) ? (b & 0x7FFFFFu) == 0 : std::has_single_bit(b);
}

int clamp_se(int se) { return se < -127 ? -127 : se > 127 ? 127 : se; }

}  // namespace

const char* mxfp4_scale_rule_name(Mxfp4ScaleRule r) {
  switch (r) {
    case Mxfp4ScaleRule::OcpFloor: return "ocp_floor";
    case Mxfp4ScaleRule::Even: return "even";
    case Mxfp4ScaleRule::CeilAmax6: return "ceil_amax6";
  }
  return "?";
}

uint8_t mxfp4_scale_code(float amax, Mxfp4ScaleRule rule) {
  if (!(amax < INFINITY)) return 0xFF;  // NaN or Inf
  if (amax == 0.0f) return 0x00;
  amax = std::fabs(amax);
  int se = 0;
  switch (rule) {
    case Mxfp4ScaleRule::OcpFloor: se = floor_log2(amax) - 2; break;
    case Mxfp4ScaleRule::Even: {
      // Round the fp32 mantissa at 2 bits (add half an ulp of a 2-bit mantissa), keep the exponent.
      const uint32_t field = (std::bit_cast<uint32_t>(amax) + 0x200000u) >> 23;
      se = field == 0 ? -129 : int(field) - 127 - 2;
      break;
    }
    case Mxfp4ScaleRule::CeilAmax6: {
      const float v = amax / 6.0f;
      se = v == 0.0f ? -127 : floor_log2(v) + (is_pow2(v) ? 0 : 1);
      break;
    }
  }
  return e8m0_from_exponent(clamp_se(se));
}

uint8_t quantize_block_mxfp4(const float* x, uint8_t* packed16, Mxfp4ScaleRule rule) {
  float amax = 0.0f;
  bool nan = false;
  for (int i = 0; i < kMxBlock; ++i) {
    const float a = std::fabs(x[i]);
    nan |= std::isnan(a);
    amax = a > amax ? a : amax;
  }
  const uint8_t scale = nan ? uint8_t(0xFF) : mxfp4_scale_code(amax, rule);
  if (scale == 0xFF) {
    for (int j = 0; j < kMxBlock / 2; ++j) packed16[j] = 0;
    return scale;
  }
  // 2^-se is the e8m0 value of code 127 - se (se in [-127, 127]); multiplying by it is exact.
  const float inv = kE8M0ToF32[uint8_t(254 - scale)];
  for (int j = 0; j < kMxBlock / 2; ++j) {
    uint8_t lo = f32_to_e2m1(x[2 * j] * inv);
    uint8_t hi = f32_to_e2m1(x[2 * j + 1] * inv);
    if ((lo & 7) == 0) lo = 0;
    if ((hi & 7) == 0) hi = 0;
    packed16[j] = uint8_t(lo | (hi << 4));
  }
  return scale;
}

void quantize_row_mxfp4(const float* x, int64_t k, uint8_t* codes_out, uint8_t* scales_out, Mxfp4ScaleRule rule) {
  for (int64_t b = 0; b < k / kMxBlock; ++b)
    scales_out[b] = quantize_block_mxfp4(x + b * kMxBlock, codes_out + b * (kMxBlock / 2), rule);
}

QuantWeight view_quark_mxfp4(const uint8_t* weight, const uint8_t* weight_scale, int64_t rows, int64_t cols) {
  QuantWeight w;
  w.format = WeightFormat::MXFP4;
  w.rows = rows;
  w.cols = cols;
  w.data = weight;
  w.scale = weight_scale;
  return w;
}

QuantWeight view_gpt_oss_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t k_blocks,
                               int64_t expert) {
  return view_quark_mxfp4(blocks + expert * rows * k_blocks * 16, scales + expert * rows * k_blocks, rows,
                          k_blocks * kMxBlock);
}

void mxfp4_block_to_ggml(const uint8_t* packed16, uint8_t scale, uint8_t* ggml17) {
  auto nib = [&](int i) { return uint8_t((packed16[i / 2] >> (4 * (i % 2))) & 0xF); };
  ggml17[0] = scale;
  for (int j = 0; j < 16; ++j) ggml17[1 + j] = uint8_t(nib(j) | (nib(j + 16) << 4));
}

}  // namespace latent
