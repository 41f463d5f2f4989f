// Scalar codecs for the small float formats of docs/quantization.md §bf16, §E2M1, §E8M0, §FP8: bf16, f16, fp8 (e4m3fn,
// e5m2, e4m3fnuz, e5m2fnuz), e8m0 (shared MX scale) and e2m1 (MXFP4 element), plus 256-entry fp32 lookup tables for
// kernels. Everything hot is constexpr/inline; the codecs are bit-exact against ml_dtypes (tests/quant).
//
// Encoders round to nearest, ties to even (on the code's last mantissa bit), and by default saturate finite
// overflow (and ±Inf) to ±max finite (docs/quantization.md §E2M1, §FP8). Overflow::NonSaturating gives what ml_dtypes /
// a plain cast gives instead: Inf for e5m2 / f16 / bf16, NaN for e4m3fn (0x7F|sign) and for the fnuz types (0x80).
// NaN inputs always give NaN (e4m3fn 0x7F|sign, e5m2 0x7E|sign, fnuz 0x80); e2m1 has no NaN (NaN -> 0x0).
// A negative value that rounds to zero keeps its sign (-0: 0x80 fp8, 0x8 e2m1) except in fnuz (no -0: 0x00).
#pragma once
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace latent {

enum class Overflow : uint8_t {
  Saturate,       // |x| beyond max finite (incl. Inf) -> ±max finite. What every quantizer must use.
  NonSaturating,  // IEEE-style cast: ±Inf where the format has it, else NaN (e4m3fn > 464: docs/quantization.md §FP8)
};

enum class Fp8Format : uint8_t {
  E4M3FN,    // OCP, torch float8_e4m3fn, safetensors F8_E4M3: bias 7, max 448, NaN 0x7F/0xFF, no Inf
  E5M2,      // OCP, safetensors F8_E5M2: bias 15, max 57344, ±Inf 0x7C/0xFC, NaN 0x7D-0x7F
  E4M3FNUZ,  // AMD gfx942: bias 8, max 240, NaN 0x80 only, no -0, no Inf
  E5M2FNUZ,  // AMD gfx942: bias 16, max 57344, NaN 0x80 only, no -0, no Inf
};

namespace detail {

// How a format spends its special codes.
enum class Specials : uint8_t {
  Ieee,  // all-ones exponent: mantissa 0 = Inf, else NaN (e5m2, f16)
  Fn,    // only the all-ones magnitude is NaN; no Inf (e4m3fn)
  Fnuz,  // only 0x80 (sign bit alone) is NaN; no Inf, no -0 (e4m3fnuz, e5m2fnuz)
  None,  // every code is finite (e2m1)
};

// A sign-magnitude mini float with E exponent bits, M mantissa bits and bias B.
template <int E, int M, int B, Specials S>
struct MiniFloat {
  static constexpr uint32_t kSignBit = 1u << (E + M);
  static constexpr uint32_t kMantMask = (1u << M) - 1;
  static constexpr uint32_t kExpOnes = (1u << E) - 1;
  static constexpr int kEmin = 1 - B;  // exponent of the smallest normal
  static constexpr uint32_t kMaxFinite = S == Specials::Ieee ? (kExpOnes << M) - 1
                                         : S == Specials::Fn ? kSignBit - 2
                                                             : kSignBit - 1;

  static constexpr float decode(uint32_t code) {
    const uint32_t sign = (code & kSignBit) ? 0x80000000u : 0u;
    const uint32_t mag = code & (kSignBit - 1);
    if constexpr (S == Specials::Fnuz) {
      if (code == kSignBit) return std::bit_cast<float>(0x7FC00000u);
    } else if constexpr (S == Specials::Fn) {
      if (mag == kSignBit - 1) return std::bit_cast<float>(sign | 0x7FC00000u);
    } else if constexpr (S == Specials::Ieee) {
      if ((mag >> M) == kExpOnes) return std::bit_cast<float>(sign | ((mag & kMantMask) ? 0x7FC00000u : 0x7F800000u));
    }
    uint32_t e_field = mag >> M;
    uint32_t m = mag & kMantMask;
    if (e_field == 0) {  // subnormal: m * 2^(emin - M); normalize for fp32
      if (m == 0) return std::bit_cast<float>(sign);
      int e = kEmin;
      while (!(m & (1u << M))) {
        m <<= 1;
        --e;
      }
      return std::bit_cast<float>(sign | (uint32_t(e + 127) << 23) | ((m & kMantMask) << (23 - M)));
    }
    return std::bit_cast<float>(sign | (uint32_t(int(e_field) - B + 127) << 23) | (m << (23 - M)));
  }

  static constexpr uint32_t encode(float x, Overflow ov) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    const uint32_t sign = (bits >> 31) ? kSignBit : 0u;
    const uint32_t abs = bits & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) {  // NaN
      if constexpr (S == Specials::Ieee)
        return sign | (kExpOnes << M) | (1u << (M - 1));
      else if constexpr (S == Specials::Fn)
        return sign | (kSignBit - 1);
      else if constexpr (S == Specials::Fnuz)
        return kSignBit;
      else
        return 0;
    }
    uint32_t mag;
    if (abs == 0x7F800000u) {
      mag = kMaxFinite + 1;  // Inf: treated as overflow
    } else {
      int e = int(abs >> 23) - 127;  // value = sig * 2^(e - 23)
      uint32_t sig = abs & 0x7FFFFFu;
      if (abs >> 23)
        sig |= 0x800000u;
      else
        e = -126;
      // Quantum at exponent e is 2^(max(e, emin) - M): shift the 24-bit significand right by `shift`, RNE.
      const int below = e < kEmin ? kEmin - e : 0;
      const int shift = 23 - M + below;
      uint32_t q;
      if (shift >= 26) {
        q = 0;  // sig < 2^24 < half quantum
      } else {
        q = sig >> shift;
        const uint32_t rem = sig & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) ++q;
      }
      // Normal: ((e - emin + 1) << M) + (q - 2^M) == ((e - emin) << M) + q; a carry in q bumps the exponent.
      mag = (below ? 0u : uint32_t(e - kEmin) << M) + q;
    }
    if (mag > kMaxFinite) {
      if constexpr (S == Specials::None) {
        mag = kMaxFinite;
      } else {
        if (ov == Overflow::Saturate)
          mag = kMaxFinite;
        else if constexpr (S == Specials::Ieee)
          mag = kExpOnes << M;
        else if constexpr (S == Specials::Fn)
          mag = kSignBit - 1;
        else
          return kSignBit;  // Fnuz NaN
      }
    }
    if constexpr (S == Specials::Fnuz) {
      if (mag == 0) return 0;  // no -0
    }
    return sign | mag;
  }
};

using E4M3Fn = MiniFloat<4, 3, 7, Specials::Fn>;
using E5M2 = MiniFloat<5, 2, 15, Specials::Ieee>;
using E4M3Fnuz = MiniFloat<4, 3, 8, Specials::Fnuz>;
using E5M2Fnuz = MiniFloat<5, 2, 16, Specials::Fnuz>;
using E2M1 = MiniFloat<2, 1, 1, Specials::None>;
using F16 = MiniFloat<5, 10, 15, Specials::Ieee>;

template <class F, std::size_t N>
constexpr std::array<float, N> make_table() {
  std::array<float, N> t{};
  for (std::size_t i = 0; i < N; ++i) t[i] = F::decode(uint32_t(i));
  return t;
}

constexpr float e8m0_decode(uint8_t code) {
  if (code == 0xFF) return std::bit_cast<float>(0x7FC00000u);
  if (code == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127, an fp32 subnormal
  return std::bit_cast<float>(uint32_t(code) << 23);
}

constexpr std::array<float, 256> make_e8m0_table() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[std::size_t(i)] = e8m0_decode(uint8_t(i));
  return t;
}

}  // namespace detail

// ---- lookup tables (code -> fp32), built at compile time ------------------------------------------------------
alignas(64) inline constexpr std::array<float, 256> kE4M3FnToF32 = detail::make_table<detail::E4M3Fn, 256>();
alignas(64) inline constexpr std::array<float, 256> kE5M2ToF32 = detail::make_table<detail::E5M2, 256>();
alignas(64) inline constexpr std::array<float, 256> kE4M3FnuzToF32 = detail::make_table<detail::E4M3Fnuz, 256>();
alignas(64) inline constexpr std::array<float, 256> kE5M2FnuzToF32 = detail::make_table<detail::E5M2Fnuz, 256>();
alignas(64) inline constexpr std::array<float, 256> kE8M0ToF32 = detail::make_e8m0_table();  // 0x00 = 2^-127, 0xFF NaN
alignas(64) inline constexpr std::array<float, 16> kE2M1ToF32 = detail::make_table<detail::E2M1, 16>();

// Largest finite magnitudes.
inline constexpr float kE4M3FnMax = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;
inline constexpr float kE4M3FnuzMax = 240.0f;
inline constexpr float kE5M2FnuzMax = 57344.0f;
inline constexpr float kE2M1Max = 6.0f;

// ---- bf16 ------------------------------------------------------------------------------------------------------
constexpr float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }
// RNE; NaN stays NaN (quiet bit forced, sign and high payload kept); overflow rounds to ±Inf like any IEEE cast.
constexpr uint16_t f32_to_bf16(float f) {
  const uint32_t b = std::bit_cast<uint32_t>(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((b >> 16) | 0x0040u);
  return uint16_t((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// ---- f16 (IEEE binary16) ---------------------------------------------------------------------------------------
constexpr float f16_to_f32(uint16_t h) { return detail::F16::decode(h); }        // exact, subnormals included
constexpr uint16_t f32_to_f16(float f, Overflow ov = Overflow::NonSaturating) {  // RNE; NaN -> 0x7E00|sign
  return uint16_t(detail::F16::encode(f, ov));
}

// ---- fp8 -------------------------------------------------------------------------------------------------------
inline float e4m3fn_to_f32(uint8_t c) { return kE4M3FnToF32[c]; }
inline float e5m2_to_f32(uint8_t c) { return kE5M2ToF32[c]; }
inline float e4m3fnuz_to_f32(uint8_t c) { return kE4M3FnuzToF32[c]; }
inline float e5m2fnuz_to_f32(uint8_t c) { return kE5M2FnuzToF32[c]; }

constexpr uint8_t f32_to_e4m3fn(float x, Overflow ov = Overflow::Saturate) {
  return uint8_t(detail::E4M3Fn::encode(x, ov));
}
constexpr uint8_t f32_to_e5m2(float x, Overflow ov = Overflow::Saturate) {
  return uint8_t(detail::E5M2::encode(x, ov));
}
constexpr uint8_t f32_to_e4m3fnuz(float x, Overflow ov = Overflow::Saturate) {
  return uint8_t(detail::E4M3Fnuz::encode(x, ov));
}
constexpr uint8_t f32_to_e5m2fnuz(float x, Overflow ov = Overflow::Saturate) {
  return uint8_t(detail::E5M2Fnuz::encode(x, ov));
}

// Runtime-selected variants (not for inner loops: switch per call).
const std::array<float, 256>& fp8_table(Fp8Format f);
float fp8_max(Fp8Format f);
const char* fp8_format_name(Fp8Format f);  // "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"
inline float fp8_to_f32(Fp8Format f, uint8_t c) { return fp8_table(f)[c]; }
uint8_t f32_to_fp8(Fp8Format f, float x, Overflow ov = Overflow::Saturate);

// e4m3fn -> e4m3fnuz (docs/quantization.md §FP8): same bits decode to half the value in fnuz, so keep the bits, map -0
// (0x80, the fnuz NaN) to 0x00, and the caller doubles every scale. Lossless for all non-NaN codes.
constexpr uint8_t e4m3fn_code_to_fnuz(uint8_t c) { return c == 0x80 ? uint8_t(0) : c; }
void e4m3fn_codes_to_fnuz(uint8_t* codes, int64_t n);

// ---- e8m0 (MX shared scale) ------------------------------------------------------------------------------------
// value = 2^(code - 127); 0x00 = 2^-127 exactly (fp32 subnormal 0x00400000, beware FTZ); 0xFF = NaN.
inline float e8m0_to_f32(uint8_t c) { return kE8M0ToF32[c]; }
constexpr int e8m0_exponent(uint8_t c) { return int(c) - 127; }  // meaningless for 0xFF (NaN)
// Code of 2^e, e clamped to [-127, 127] (docs/quantization.md §E8M0). Never produces the NaN code.
constexpr uint8_t e8m0_from_exponent(int e) { return uint8_t((e < -127 ? -127 : e > 127 ? 127 : e) + 127); }
// llama.cpp's halved convention (GGML_E8M0_TO_FP32_HALF): 2^(code - 128), for its doubled e2m1 table.
float e8m0_to_f32_half(uint8_t c);

// ---- e2m1 (MXFP4 element, one nibble) --------------------------------------------------------------------------
// Codes 0x0..0xF: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; 0x8 decodes to -0.0. Only the low nibble of `c` is used.
inline float e2m1_to_f32(uint8_t c) { return kE2M1ToF32[c & 0xF]; }
// RNE with ties to the even code (0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2, 2.5->2, 3.5->4, 5->4), |x| >= 6 (and Inf)
// saturate to ±6. A negative value rounding to zero gives 0x8 (as ml_dtypes); NaN gives 0x0.
constexpr uint8_t f32_to_e2m1(float x) { return uint8_t(detail::E2M1::encode(x, Overflow::Saturate)); }

}  // namespace latent
