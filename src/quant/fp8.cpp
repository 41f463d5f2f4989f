#include "quant/fp8.h"

#include <cmath>
#include <limits>

namespace latent {

namespace {

// max |x| over a [r0, r1) x [c0, c1) window; NaN if any element is NaN.
float window_amax(const float* w, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  float amax = 0.0f;
  bool nan = false;
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = w + r * cols;
    for (int64_t c = c0; c < c1; ++c) {
      const float a = std::fabs(row[c]);
      nan |= std::isnan(a);
      amax = a > amax ? a : amax;
    }
  }
  return nan ? NAN : amax;
}

void encode_window(const float* w, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float scale,
                   uint8_t* codes) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) codes[r * cols + c] = f32_to_e4m3fn(w[r * cols + c] / scale);
}

}  // namespace

float fp8_e4m3_scale_for_amax(float amax) { return amax == 0.0f ? 1.0f : amax / kE4M3FnMax; }

void quantize_fp8_block(const float* w, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols,
                        uint8_t* codes, float* scale_inv) {
  const int64_t sc = (cols + block_cols - 1) / block_cols;
  for (int64_t i = 0, r0 = 0; r0 < rows; ++i, r0 += block_rows) {
    const int64_t r1 = r0 + block_rows < rows ? r0 + block_rows : rows;
    for (int64_t j = 0, c0 = 0; c0 < cols; ++j, c0 += block_cols) {
      const int64_t c1 = c0 + block_cols < cols ? c0 + block_cols : cols;
      const float s = fp8_e4m3_scale_for_amax(window_amax(w, cols, r0, r1, c0, c1));
      scale_inv[i * sc + j] = s;
      encode_window(w, cols, r0, r1, c0, c1, s, codes);
    }
  }
}

void quantize_fp8_tensor(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scale) {
  const float s = fp8_e4m3_scale_for_amax(window_amax(w, cols, 0, rows, 0, cols));
  *scale = s;
  encode_window(w, cols, 0, rows, 0, cols, s, codes);
}

void quantize_fp8_channel(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scales) {
  for (int64_t r = 0; r < rows; ++r) {
    const float s = fp8_e4m3_scale_for_amax(window_amax(w, cols, r, r + 1, 0, cols));
    scales[r] = s;
    encode_window(w, cols, r, r + 1, 0, cols, s, codes);
  }
}

float act_fp8_scale_for_amax(float amax, bool pow2_scale) {
  float s = amax / kE4M3FnMax;
  if (pow2_scale && s > 0.0f) {
    int e = 0;
    const float m = std::frexp(s, &e);  // s = m · 2^e, m in [0.5, 1)
    if (m != 0.5f) s = std::ldexp(1.0f, e);
  }
  return s == 0.0f ? 1.0f : s;
}

float quantize_act_fp8_group(const float* x, int64_t n, bool pow2_scale, uint8_t* codes) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (!(a <= std::numeric_limits<float>::max()))
      finite = false;
    else if (a > amax)
      amax = a;
  }
  if (!finite) {
    for (int64_t i = 0; i < n; ++i) codes[i] = 0x7F;
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float s = act_fp8_scale_for_amax(amax, pow2_scale);
  for (int64_t i = 0; i < n; ++i) codes[i] = f32_to_e4m3fn(x[i] / s, Overflow::Saturate);
  return s;
}

}  // namespace latent
