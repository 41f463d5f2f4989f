// MXFP4: scale rules, block quantization, packing (OCP / Quark / gpt-oss / ggml), dequant rows
// (docs/quantization.md §MXFP4, §vectors).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/mxfp4.h"

namespace latent {
namespace {

using R = Mxfp4ScaleRule;

TEST(Mxfp4, ScaleRulesSpecVectors) {
  EXPECT_EQ(mxfp4_scale_code(6.2f, R::OcpFloor), 0x7F);
  EXPECT_EQ(mxfp4_scale_code(6.2f, R::Even), 0x7F);
  EXPECT_EQ(mxfp4_scale_code(6.2f, R::CeilAmax6), 0x80);
  EXPECT_EQ(mxfp4_scale_code(7.5f, R::OcpFloor), 0x7F);
  EXPECT_EQ(mxfp4_scale_code(7.5f, R::Even), 0x80);
  EXPECT_EQ(mxfp4_scale_code(7.5f, R::CeilAmax6), 0x80);
  for (R r : {R::OcpFloor, R::Even, R::CeilAmax6}) {
    EXPECT_EQ(mxfp4_scale_code(0.04f, r), 0x78) << mxfp4_scale_rule_name(r);
    EXPECT_EQ(mxfp4_scale_code(4.0f, r), 0x7F) << mxfp4_scale_rule_name(r);
    EXPECT_EQ(mxfp4_scale_code(0.0f, r), 0x00);
    EXPECT_EQ(mxfp4_scale_code(NAN, r), 0xFF);
    EXPECT_EQ(mxfp4_scale_code(INFINITY, r), 0xFF);
    EXPECT_EQ(mxfp4_scale_code(1e-45f, r), 0x00);   // clamp at 2^-127
    EXPECT_LE(mxfp4_scale_code(3.4e38f, r), 0xFE);  // never NaN for finite amax
  }
  // "even" bumps exactly at mantissa >= 1.75
  EXPECT_EQ(mxfp4_scale_code(std::nextafter(7.0f, 0.0f), R::Even), 0x7F);
  EXPECT_EQ(mxfp4_scale_code(7.0f, R::Even), 0x80);
  // ceil(log2(amax/6)) at the exact boundary 6 * 2^k
  EXPECT_EQ(mxfp4_scale_code(6.0f, R::CeilAmax6), 0x7F);
  EXPECT_EQ(mxfp4_scale_code(12.0f, R::CeilAmax6), 0x80);
  EXPECT_EQ(mxfp4_scale_code(std::nextafter(12.0f, 100.f), R::CeilAmax6), 0x81);
}

TEST(Mxfp4, SmallBlockSpecVector) {
  float x[32] = {0.04f, -0.011f, 0.02f, 0.0078125f};
  for (R r : {R::OcpFloor, R::Even, R::CeilAmax6}) {
    uint8_t p[16];
    EXPECT_EQ(quantize_block_mxfp4(x, p, r), 0x78);
    EXPECT_EQ(p[0], 0xB7);  // codes 7, B
    EXPECT_EQ(p[1], 0x25);  // codes 5, 2
    float out[32];
    const uint8_t s = 0x78;
    dequant_row_mxfp4(p, &s, 32, out);
    EXPECT_EQ(out[0], 0.046875f);
    EXPECT_EQ(out[1], -0.01171875f);
    EXPECT_EQ(out[2], 0.0234375f);
    EXPECT_EQ(out[3], 0.0078125f);
    for (int j = 2; j < 16; ++j) EXPECT_EQ(p[j], 0) << j;
  }
  // amax 7.5 under floor saturates to 6
  float y[32] = {7.5f};
  uint8_t p[16];
  EXPECT_EQ(quantize_block_mxfp4(y, p, R::OcpFloor), 0x7F);
  EXPECT_EQ(p[0] & 0xF, 0x7);
  EXPECT_EQ(quantize_block_mxfp4(y, p, R::Even), 0x80);
  EXPECT_EQ(p[0] & 0xF, 0x6);  // 3.75 -> 4 (x2 = 8)
}

TEST(Mxfp4, FullBlockSpecVector) {
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = float(i - 16) / 4.0f;
  const uint8_t want_codes[32] = {0xE, 0xE, 0xE, 0xD, 0xD, 0xD, 0xC, 0xC, 0xC, 0xC, 0xB, 0xA, 0xA, 0xA, 0x9, 0x0,
                                  0x0, 0x0, 0x1, 0x2, 0x2, 0x2, 0x3, 0x4, 0x4, 0x4, 0x4, 0x5, 0x5, 0x5, 0x6, 0x6};
  const uint8_t want_ocp[16] = {0xEE, 0xDE, 0xDD, 0xCC, 0xCC, 0xAB, 0xAA, 0x09,
                                0x00, 0x21, 0x22, 0x43, 0x44, 0x54, 0x55, 0x66};
  const uint8_t want_ggml[17] = {0x7F, 0x0E, 0x0E, 0x1E, 0x2D, 0x2D, 0x2D, 0x3C, 0x4C,
                                 0x4C, 0x4C, 0x4B, 0x5A, 0x5A, 0x5A, 0x69, 0x60};
  for (R r : {R::OcpFloor, R::Even, R::CeilAmax6}) {
    uint8_t p[16];
    ASSERT_EQ(quantize_block_mxfp4(x, p, r), 0x7F) << mxfp4_scale_rule_name(r);
    for (int i = 0; i < 32; ++i) EXPECT_EQ((p[i / 2] >> (4 * (i % 2))) & 0xF, want_codes[i]) << i;
    for (int j = 0; j < 16; ++j) EXPECT_EQ(p[j], want_ocp[j]) << j;
    uint8_t g[17];
    mxfp4_block_to_ggml(p, 0x7F, g);
    for (int j = 0; j < 17; ++j) EXPECT_EQ(g[j], want_ggml[j]) << j;
    float out[32];
    const uint8_t s = 0x7F;
    dequant_row_mxfp4(p, &s, 32, out);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], e2m1_to_f32(want_codes[i])) << i;
  }
  // A decoder must accept -0 (0x8), e.g. Quark's packer on element 15.
  uint8_t p[16] = {0xEE, 0xDE, 0xDD, 0xCC, 0xCC, 0xAB, 0xAA, 0x89, 0x00, 0x21, 0x22, 0x43, 0x44, 0x54, 0x55, 0x66};
  float out[32];
  const uint8_t s = 0x7F;
  dequant_row_mxfp4(p, &s, 32, out);
  EXPECT_EQ(out[15], 0.0f);
}

TEST(Mxfp4, RowRoundTripMatchesFormula) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 3.f);
  const int64_t k = 256;
  std::vector<float> x(k), y(k);
  for (auto& v : x) v = nd(rng);
  x[40] = 0.f;
  for (int i = 64; i < 96; ++i) x[size_t(i)] = 0.f;  // an all-zero block
  std::vector<uint8_t> codes(k / 2), scales(k / 32);
  quantize_row_mxfp4(x.data(), k, codes.data(), scales.data(), R::Even);
  EXPECT_EQ(scales[2], 0x00);
  dequant_row_mxfp4(codes.data(), scales.data(), k, y.data());
  for (int64_t c = 0; c < k; ++c) {
    const int nib = (codes[size_t(c / 2)] >> (4 * (c % 2))) & 0xF;
    EXPECT_EQ(y[size_t(c)], std::ldexp(e2m1_to_f32(uint8_t(nib)), int(scales[size_t(c / 32)]) - 127));
    // RNE choice: no other grid value is strictly closer
    const float s = std::ldexp(1.f, int(scales[size_t(c / 32)]) - 127);
    for (int alt = 0; alt < 16; ++alt) {
      const float v = e2m1_to_f32(uint8_t(alt)) * s;
      EXPECT_LE(std::fabs(y[size_t(c)] - x[size_t(c)]), std::fabs(v - x[size_t(c)]) + 1e-6f);
    }
  }
}

TEST(Mxfp4, NanBlockDecodesToNan) {
  float x[64] = {};
  x[5] = NAN;
  x[40] = 1.0f;
  uint8_t codes[32], scales[2];
  quantize_row_mxfp4(x, 64, codes, scales);
  EXPECT_EQ(scales[0], 0xFF);
  float y[64];
  dequant_row_mxfp4(codes, scales, 64, y);
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(y[i]));
  EXPECT_EQ(y[40], 1.0f);
}

// gpt-oss `_blocks [E, out, K/32, 16]` / `_scales [E, out, K/32]` are the Quark `[out, K/2]` / `[out, K/32]` bytes.
TEST(Mxfp4, GptOssAndQuarkViewsAgree) {
  const int64_t E = 2, out = 3, kb = 4, k = kb * 32;
  std::vector<float> w(static_cast<size_t>(E * out * k));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto& v : w) v = nd(rng);
  // Quark-style per expert: weight [out, K/2], weight_scale [out, K/32]; concatenated = gpt-oss tensors.
  std::vector<uint8_t> blocks(static_cast<size_t>(E * out * kb * 16)), scales(static_cast<size_t>(E * out * kb));
  for (int64_t r = 0; r < E * out; ++r)
    quantize_row_mxfp4(w.data() + r * k, k, blocks.data() + r * (k / 2), scales.data() + r * kb);
  for (int64_t e = 0; e < E; ++e) {
    const QuantWeight g = view_gpt_oss_mxfp4(blocks.data(), scales.data(), out, kb, e);
    const QuantWeight q =
        view_quark_mxfp4(blocks.data() + e * out * (k / 2), scales.data() + e * out * (k / 32), out, k);
    EXPECT_EQ(g.data, q.data);
    EXPECT_EQ(g.scale, q.scale);
    EXPECT_EQ(g.cols, k);
    EXPECT_EQ(g.row_bytes(), kb * 16);
    EXPECT_EQ(g.scale_cols(), kb);
    std::vector<float> a(static_cast<size_t>(k));
    for (int64_t r = 0; r < out; ++r) {
      dequant_row_ref(g, r, a.data());
      // HF convert_moe_packed_tensors semantics: element 2j low nibble, 2j+1 high nibble of block byte j
      for (int64_t b = 0; b < kb; ++b)
        for (int j = 0; j < 16; ++j) {
          const uint8_t byte = blocks[size_t(((e * out + r) * kb + b) * 16 + j)];
          const int ex = scales[size_t((e * out + r) * kb + b)] - 127;
          EXPECT_EQ(a[size_t(b * 32 + 2 * j)], std::ldexp(e2m1_to_f32(byte & 0xF), ex));
          EXPECT_EQ(a[size_t(b * 32 + 2 * j + 1)], std::ldexp(e2m1_to_f32(byte >> 4), ex));
        }
    }
  }
}

}  // namespace
}  // namespace latent
