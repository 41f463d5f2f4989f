#include "quant/float_formats.h"

#include <cmath>

namespace latent {

// Spot checks of the compile-time tables against docs/quantization.md §E2M1, §E8M0, §FP8.
static_assert(kE4M3FnToF32[0x7E] == 448.0f && kE4M3FnToF32[0x08] == 0.015625f && kE4M3FnToF32[0x01] == 0x1p-9f);
static_assert(kE5M2ToF32[0x7B] == 57344.0f && kE5M2ToF32[0x01] == 0x1p-16f);
static_assert(kE4M3FnuzToF32[0x7F] == 240.0f && kE4M3FnuzToF32[0x01] == 0x1p-10f);
static_assert(kE5M2FnuzToF32[0x7F] == 57344.0f && kE5M2FnuzToF32[0x01] == 0x1p-17f);
static_assert(kE2M1ToF32[0x7] == 6.0f && kE2M1ToF32[0x1] == 0.5f && kE2M1ToF32[0xD] == -3.0f);
static_assert(kE8M0ToF32[0x7F] == 1.0f && kE8M0ToF32[0x00] == 0x1p-127f && kE8M0ToF32[0xFE] == 0x1p127f);
static_assert(f32_to_e4m3fn(464.0f) == 0x7E && f32_to_e4m3fn(465.0f, Overflow::NonSaturating) == 0x7F);
static_assert(f32_to_e2m1(2.5f) == 0x4 && f32_to_e2m1(3.5f) == 0x6 && f32_to_e2m1(-5.0f) == 0xE);

const std::array<float, 256>& fp8_table(Fp8Format f) {
  switch (f) {
    case Fp8Format::E4M3FN: return kE4M3FnToF32;
    case Fp8Format::E5M2: return kE5M2ToF32;
    case Fp8Format::E4M3FNUZ: return kE4M3FnuzToF32;
    case Fp8Format::E5M2FNUZ: return kE5M2FnuzToF32;
  }
  return kE4M3FnToF32;
}

float fp8_max(Fp8Format f) {
  switch (f) {
    case Fp8Format::E4M3FN: return kE4M3FnMax;
    case Fp8Format::E5M2: return kE5M2Max;
    case Fp8Format::E4M3FNUZ: return kE4M3FnuzMax;
    case Fp8Format::E5M2FNUZ: return kE5M2FnuzMax;
  }
  return kE4M3FnMax;
}

const char* fp8_format_name(Fp8Format f) {
  switch (f) {
    case Fp8Format::E4M3FN: return "e4m3fn";
    case Fp8Format::E5M2: return "e5m2";
    case Fp8Format::E4M3FNUZ: return "e4m3fnuz";
    case Fp8Format::E5M2FNUZ: return "e5m2fnuz";
  }
  return "?";
}

uint8_t f32_to_fp8(Fp8Format f, float x, Overflow ov) {
  switch (f) {
    case Fp8Format::E4M3FN: return f32_to_e4m3fn(x, ov);
    case Fp8Format::E5M2: return f32_to_e5m2(x, ov);
    case Fp8Format::E4M3FNUZ: return f32_to_e4m3fnuz(x, ov);
    case Fp8Format::E5M2FNUZ: return f32_to_e5m2fnuz(x, ov);
  }
  return 0;
}

void e4m3fn_codes_to_fnuz(uint8_t* codes, int64_t n) {
  for (int64_t i = 0; i < n; ++i) codes[i] = e4m3fn_code_to_fnuz(codes[i]);
}

float e8m0_to_f32_half(uint8_t c) {
  if (c == 0xFF) return std::nanf("");
  return std::ldexp(1.0f, int(c) - 128);
}

}  // namespace latent
