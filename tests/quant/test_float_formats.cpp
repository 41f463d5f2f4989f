// Scalar codecs: every code and a few thousand encode samples against ml_dtypes (tests/data/quant, made by
// tools/gen_quant_tables.py), saturation, f16/bf16 exhaustively, and the docs/quantization.md §vectors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numbers>
#include <random>
#include <string>

#include "quant/float_formats.h"

namespace latent {
namespace {

const nlohmann::json& tables() {
  static const nlohmann::json j = [] {
    std::ifstream f(std::string(LATENT_SOURCE_DIR) + "/tests/data/quant/ml_dtypes_tables.json");
    EXPECT_TRUE(f.good()) << "missing tests/data/quant/ml_dtypes_tables.json";
    return nlohmann::json::parse(f);
  }();
  return j;
}

uint32_t hex32(const std::string& s) { return uint32_t(std::stoul(s, nullptr, 16)); }
uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

using DecodeFn = std::function<float(uint32_t)>;
using EncodeFn = std::function<uint32_t(float)>;

struct Fmt {
  const char* name;
  DecodeFn decode;
  EncodeFn encode_nonsat;  // must equal ml_dtypes
};

const std::vector<Fmt>& formats() {
  static const std::vector<Fmt> v = {
      {"float8_e4m3fn", [](uint32_t c) { return e4m3fn_to_f32(uint8_t(c)); },
       [](float x) { return uint32_t(f32_to_e4m3fn(x, Overflow::NonSaturating)); }},
      {"float8_e5m2", [](uint32_t c) { return e5m2_to_f32(uint8_t(c)); },
       [](float x) { return uint32_t(f32_to_e5m2(x, Overflow::NonSaturating)); }},
      {"float8_e4m3fnuz", [](uint32_t c) { return e4m3fnuz_to_f32(uint8_t(c)); },
       [](float x) { return uint32_t(f32_to_e4m3fnuz(x, Overflow::NonSaturating)); }},
      {"float8_e5m2fnuz", [](uint32_t c) { return e5m2fnuz_to_f32(uint8_t(c)); },
       [](float x) { return uint32_t(f32_to_e5m2fnuz(x, Overflow::NonSaturating)); }},
      {"float4_e2m1fn", [](uint32_t c) { return e2m1_to_f32(uint8_t(c)); },
       [](float x) { return uint32_t(f32_to_e2m1(x)); }},  // ml_dtypes e2m1 saturates (no Inf/NaN codes)
      {"float8_e8m0fnu", [](uint32_t c) { return e8m0_to_f32(uint8_t(c)); },
       [](float x) { return uint32_t(e8m0_from_exponent(std::ilogb(x))); }},  // inputs are exact 2^e
      {"bfloat16", nullptr, [](float x) { return uint32_t(f32_to_bf16(x)); }},
      {"float16", nullptr, [](float x) { return uint32_t(f32_to_f16(x, Overflow::NonSaturating)); }},
  };
  return v;
}

TEST(MlDtypes, AllFormatsPresent) {
  const auto& f = tables().at("formats");
  for (const Fmt& m : formats()) EXPECT_TRUE(f.contains(m.name)) << m.name;
}

TEST(MlDtypes, DecodeEveryCode) {
  for (const Fmt& m : formats()) {
    if (!m.decode) continue;
    const auto& dec = tables().at("formats").at(m.name).at("decode");
    ASSERT_GE(dec.size(), 16u) << m.name;
    for (size_t c = 0; c < dec.size(); ++c) {
      const std::string want = dec[c].get<std::string>();
      const float got = m.decode(uint32_t(c));
      if (want == "nan") {
        EXPECT_TRUE(std::isnan(got)) << m.name << " code " << c;
      } else {
        EXPECT_EQ(bits(got), hex32(want)) << m.name << " code " << c << " got " << got;
      }
    }
  }
}

TEST(MlDtypes, EncodeSamplesNonSaturating) {
  for (const Fmt& m : formats()) {
    const auto& e = tables().at("formats").at(m.name);
    const auto& in = e.at("encode_inputs");
    const auto& codes = e.at("encode_codes");
    ASSERT_EQ(in.size(), codes.size());
    int bad = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const float x = from_bits(hex32(in[i].get<std::string>()));
      const uint32_t want = codes[i].get<uint32_t>();
      const uint32_t got = m.encode_nonsat(x);
      if (got != want && ++bad < 10)
        ADD_FAILURE() << m.name << " encode(" << x << " = 0x" << std::hex << bits(x) << ") = 0x" << got
                      << ", ml_dtypes 0x" << want;
    }
    EXPECT_EQ(bad, 0) << m.name << ": " << in.size() << " samples";
  }
}

// Saturating mode: identical to the plain cast except that finite overflow and ±Inf give ±max finite.
TEST(MlDtypes, EncodeSamplesSaturating) {
  struct S {
    const char* name;
    uint8_t (*enc)(float, Overflow);
    float max;
  };
  const S fmts[] = {{"float8_e4m3fn", f32_to_e4m3fn, kE4M3FnMax},
                    {"float8_e5m2", f32_to_e5m2, kE5M2Max},
                    {"float8_e4m3fnuz", f32_to_e4m3fnuz, kE4M3FnuzMax},
                    {"float8_e5m2fnuz", f32_to_e5m2fnuz, kE5M2FnuzMax}};
  for (const S& s : fmts) {
    const auto& e = tables().at("formats").at(s.name);
    const auto& in = e.at("encode_inputs");
    const auto& codes = e.at("encode_codes");
    const auto* table = &fp8_table(Fp8Format::E4M3FN);
    if (std::string(s.name) == "float8_e5m2") table = &kE5M2ToF32;
    if (std::string(s.name) == "float8_e4m3fnuz") table = &kE4M3FnuzToF32;
    if (std::string(s.name) == "float8_e5m2fnuz") table = &kE5M2FnuzToF32;
    int n_sat = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const float x = from_bits(hex32(in[i].get<std::string>()));
      const uint8_t want = uint8_t(codes[i].get<uint32_t>());
      const float want_v = (*table)[want];
      const float got_v = (*table)[s.enc(x, Overflow::Saturate)];
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(got_v)) << s.name;
      } else if (std::isnan(want_v) || std::isinf(want_v)) {
        ++n_sat;
        EXPECT_EQ(got_v, std::signbit(x) ? -s.max : s.max) << s.name << " x=" << x;
      } else {
        EXPECT_EQ(bits(got_v), bits(want_v)) << s.name << " x=" << x;
      }
    }
    EXPECT_GT(n_sat, 10) << s.name;
  }
}

// Every non-NaN code survives decode -> encode (both modes).
TEST(FloatFormats, Fp8RoundTripEveryCode) {
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2, Fp8Format::E4M3FNUZ, Fp8Format::E5M2FNUZ}) {
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_to_f32(f, uint8_t(c));
      if (std::isnan(v)) continue;
      if (!std::isinf(v)) {
        EXPECT_EQ(f32_to_fp8(f, v, Overflow::Saturate), c) << fp8_format_name(f) << " " << c;
      }
      EXPECT_EQ(f32_to_fp8(f, v, Overflow::NonSaturating), c) << fp8_format_name(f) << " " << c;
    }
  }
  for (int c = 0; c < 16; ++c) EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(uint8_t(c))), c);
}

TEST(FloatFormats, Bf16Exhaustive) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float v = bf16_to_f32(uint16_t(h));
    ASSERT_EQ(bits(v), h << 16);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(v))));
    } else {
      ASSERT_EQ(f32_to_bf16(v), h);
    }
  }
  // RNE at ties, NaN stays quiet NaN even when the payload is only in the low bits
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808000u)), 0x3F80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F818000u)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7F800001u)))));
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F7FFFFFu)), 0x7F80);  // overflow rounds to Inf
}

TEST(FloatFormats, F16Exhaustive) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float v = f16_to_f32(uint16_t(h));
#if defined(__FLT16_MAX__)
    _Float16 ref;
    const uint16_t hh = uint16_t(h);
    std::memcpy(&ref, &hh, 2);
    if (std::isnan(float(ref))) {
      ASSERT_TRUE(std::isnan(v)) << h;
    } else {
      ASSERT_EQ(bits(v), bits(float(ref))) << h;
    }
#endif
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(v))));
    } else {
      ASSERT_EQ(f32_to_f16(v), h);
    }
  }
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-1e6f, Overflow::Saturate), 0xFBFF);
#if defined(__FLT16_MAX__)
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(uint32_t(rng()));
    if (std::isnan(x)) continue;
    const _Float16 r = static_cast<_Float16>(x);
    uint16_t want;
    std::memcpy(&want, &r, 2);
    ASSERT_EQ(f32_to_f16(x), want) << std::hex << bits(x);
  }
#endif
}

// ---- docs/quantization.md §vectors ---------------------------------------------------------------------------

TEST(SpecVectors, E2M1EncodeRne) {
  const std::pair<float, uint8_t> v[] = {{0.3f, 0x1},  {-0.7f, 0x9}, {1.1f, 0x2}, {1.25f, 0x2}, {-2.6f, 0xD},
                                         {3.5f, 0x6},  {5.0f, 0x6},  {6.2f, 0x7}, {100.f, 0x7}, {-0.25f, 0x0},
                                         {0.75f, 0x2}, {1.75f, 0x4}, {2.5f, 0x4}, {-5.0f, 0xE}, {-0.1f, 0x0}};
  for (auto [x, code] : v)  // zeros compare by value (we emit -0 as 0x8 like ml_dtypes)
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(x)), e2m1_to_f32(code)) << x;
  EXPECT_EQ(f32_to_e2m1(0.25f), 0x0);
  EXPECT_EQ(f32_to_e2m1(-0.25f) & 0x7, 0x0);
  EXPECT_EQ(f32_to_e2m1(-INFINITY), 0xF);
  // the E2M1 table (docs/quantization.md §E2M1)
  const float vals[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(bits(e2m1_to_f32(uint8_t(c))), bits(vals[c])) << c;
}

TEST(SpecVectors, E8M0Decode) {
  EXPECT_EQ(bits(e8m0_to_f32(0x00)), 0x00400000u);
  EXPECT_EQ(e8m0_to_f32(0x01), 0x1p-126f);
  EXPECT_EQ(e8m0_to_f32(0x7A), 0.03125f);
  EXPECT_EQ(e8m0_to_f32(0x7E), 0.5f);
  EXPECT_EQ(e8m0_to_f32(0x7F), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0x80), 2.0f);
  EXPECT_EQ(e8m0_to_f32(0x85), 64.0f);
  EXPECT_EQ(bits(e8m0_to_f32(0xFE)), 0x7F000000u);
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
  EXPECT_EQ(e8m0_to_f32_half(0x7F), 0.5f);
  EXPECT_EQ(e8m0_from_exponent(-200), 0x00);
  EXPECT_EQ(e8m0_from_exponent(500), 0xFE);
  EXPECT_EQ(e8m0_from_exponent(0), 0x7F);
  EXPECT_EQ(e8m0_exponent(0x85), 6);
}

TEST(SpecVectors, E4M3FN) {
  const std::pair<float, uint8_t> v[] = {{1.0f, 0x38},
                                         {0.5f, 0x30},
                                         {2.0f, 0x40},
                                         {-2.0f, 0xC0},
                                         {-1.5f, 0xBC},
                                         {240.f, 0x77},
                                         {256.f, 0x78},
                                         {448.f, 0x7E},
                                         {0.1f, 0x1D},
                                         {0.3f, 0x2A},
                                         {std::numbers::pi_v<float>, 0x45},
                                         {1.0625f, 0x38},
                                         {1.1875f, 0x3A},
                                         {0x1p-6f, 0x08},
                                         {0x1p-9f, 0x01},
                                         {0x1p-10f, 0x00},
                                         {0.75f * 0x1p-9f, 0x01},
                                         {-0.0f, 0x80}};
  for (auto [x, code] : v) {
    EXPECT_EQ(f32_to_e4m3fn(x), code) << x;
    EXPECT_EQ(f32_to_e4m3fn(x, Overflow::NonSaturating), code) << x;
  }
  EXPECT_EQ(e4m3fn_to_f32(0x1D), 0.1015625f);
  EXPECT_EQ(e4m3fn_to_f32(0x2A), 0.3125f);
  EXPECT_EQ(e4m3fn_to_f32(0x45), 3.25f);
  EXPECT_EQ(e4m3fn_to_f32(0x3A), 1.25f);
  EXPECT_EQ(f32_to_e4m3fn(500.f), 0x7E);
  EXPECT_EQ(f32_to_e4m3fn(500.f, Overflow::NonSaturating), 0x7F);
  EXPECT_EQ(f32_to_e4m3fn(464.f, Overflow::NonSaturating), 0x7E);  // 464 ties to 448
  EXPECT_EQ(f32_to_e4m3fn(-INFINITY), 0xFE);
  EXPECT_TRUE(std::isnan(e4m3fn_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3fn_to_f32(0xFF)));
  // fnuz: same bits => value / 2
  for (int c = 0; c < 256; ++c) {
    const float fn = e4m3fn_to_f32(uint8_t(c));
    if (std::isnan(fn) || c == 0x80) continue;
    EXPECT_EQ(e4m3fnuz_to_f32(uint8_t(c)), fn / 2) << c;
  }
}

TEST(FloatFormats, FnToFnuzIsLossless) {
  uint8_t codes[256];
  for (int c = 0; c < 256; ++c) codes[c] = uint8_t(c);
  e4m3fn_codes_to_fnuz(codes, 256);
  for (int c = 0; c < 256; ++c) {
    const float fn = e4m3fn_to_f32(uint8_t(c));
    if (std::isnan(fn)) continue;
    EXPECT_EQ(e4m3fnuz_to_f32(codes[c]) * 2.0f, fn) << c;  // with the scale doubled
  }
  EXPECT_EQ(codes[0x80], 0x00);
}

TEST(FloatFormats, SpecialsAndSigns) {
  EXPECT_EQ(f32_to_e4m3fnuz(-1e-30f), 0x00);  // no -0 in fnuz
  EXPECT_EQ(f32_to_e4m3fnuz(NAN), 0x80);
  EXPECT_EQ(f32_to_e4m3fnuz(1000.f, Overflow::NonSaturating), 0x80);
  EXPECT_EQ(f32_to_e4m3fnuz(-1000.f), 0xFF);  // -240
  EXPECT_EQ(f32_to_e5m2(1e6f, Overflow::NonSaturating), 0x7C);
  EXPECT_EQ(f32_to_e5m2(-1e6f), 0xFB);
  EXPECT_EQ(f32_to_e5m2(INFINITY, Overflow::NonSaturating), 0x7C);
  EXPECT_EQ(f32_to_e5m2(-NAN), 0xFE);
  EXPECT_EQ(f32_to_e4m3fn(-NAN), 0xFF);
  EXPECT_EQ(f32_to_e5m2fnuz(70000.f), 0x7F);
  EXPECT_TRUE(std::isinf(e5m2_to_f32(0xFC)) && e5m2_to_f32(0xFC) < 0);
  EXPECT_EQ(fp8_max(Fp8Format::E4M3FNUZ), 240.f);
  EXPECT_STREQ(fp8_format_name(Fp8Format::E5M2FNUZ), "e5m2fnuz");
}

}  // namespace
}  // namespace latent
