// FP8 E4M3 block (DeepSeek weight_scale_inv, ragged edges), per-tensor and per-channel quantization + dequant.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "quant/fp8.h"
#include "quant/quantize.h"
#include "quant/weight_format.h"

namespace latent {
namespace {

TEST(Fp8, DeepSeekBlockSpecVector) {
  // [200, 300] with 128x128 blocks -> scale_inv [2, 3]; code 0x38 (1.0) in block (1, 2) with scale 0.0025.
  const int64_t rows = 200, cols = 300;
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols), 0x38);
  std::vector<float> s = {0.001f, 0.002f, 0.003f, 0.004f, 0.005f, 0.0025f};  // s[1 * 3 + 2] = 0.0025
  QuantWeight w;
  w.format = WeightFormat::FP8_E4M3_BLOCK;
  w.rows = rows;
  w.cols = cols;
  w.data = codes.data();
  w.scale = s.data();
  EXPECT_EQ(w.scale_cols(), 3);
  std::vector<float> out(static_cast<size_t>(cols));
  dequant_row_ref(w, 150, out.data());
  EXPECT_EQ(out[290], 0.0025f);
  EXPECT_EQ(out[0], 0.004f);
  EXPECT_EQ(out[127], 0.004f);
  EXPECT_EQ(out[128], 0.005f);
  dequant_row_ref(w, 127, out.data());
  EXPECT_EQ(out[299], 0.003f);
  std::vector<float> fast(static_cast<size_t>(cols));
  dequant_row_fp8_block(codes.data() + 150 * cols, s.data() + 3, cols, 128, false, fast.data());
  dequant_row_ref(w, 150, out.data());
  EXPECT_EQ(fast, out);
}

TEST(Fp8, BlockQuantizeRaggedEdges) {
  const int64_t rows = 130, cols = 257, br = 128, bc = 128;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& v : w) v = nd(rng);
  w[size_t(129 * cols + 256)] = -5.0f;  // the 1x1 corner block
  std::vector<uint8_t> codes(w.size());
  std::vector<float> s(2 * 3);
  quantize_fp8_block(w.data(), rows, cols, br, bc, codes.data(), s.data());
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      float amax = 0;
      for (int64_t r = i * br; r < std::min(rows, (i + 1) * br); ++r)
        for (int64_t c = j * bc; c < std::min(cols, (j + 1) * bc); ++c)
          amax = std::max(amax, std::fabs(w[size_t(r * cols + c)]));
      EXPECT_EQ(s[size_t(i * 3 + j)], amax / 448.0f) << i << "," << j;
    }
  EXPECT_EQ(s[5], 5.0f / 448.0f);
  EXPECT_EQ(codes[size_t(129 * cols + 256)], 0xFE);  // -448
  for (size_t n = 0; n < w.size(); ++n) {
    const int64_t r = int64_t(n) / cols, c = int64_t(n) % cols;
    const float scale = s[size_t((r / br) * 3 + c / bc)];
    EXPECT_EQ(codes[n], f32_to_e4m3fn(w[n] / scale));
  }
  // quantize_matrix + dequant_row_ref agree with the raw functions
  const QuantizedMatrix q = quantize_matrix(w.data(), rows, cols, WeightFormat::FP8_E4M3_BLOCK);
  EXPECT_EQ(q.data, codes);
  EXPECT_EQ(q.scale_f32, s);
}

TEST(Fp8, PerTensorAndPerChannel) {
  const int64_t rows = 5, cols = 7;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) w[size_t(i)] = float(i - 17) * (1.0f + float(i % 5)) / 8.f;
  std::vector<uint8_t> codes(w.size());
  float st = 0;
  quantize_fp8_tensor(w.data(), rows, cols, codes.data(), &st);
  float amax = 0;
  for (float v : w) amax = std::max(amax, std::fabs(v));
  EXPECT_EQ(st, amax / 448.f);
  std::vector<float> sc(static_cast<size_t>(rows));
  quantize_fp8_channel(w.data(), rows, cols, codes.data(), sc.data());
  for (int64_t r = 0; r < rows; ++r) {
    float a = 0;
    for (int64_t c = 0; c < cols; ++c) a = std::max(a, std::fabs(w[size_t(r * cols + c)]));
    EXPECT_EQ(sc[size_t(r)], a / 448.f);
    std::vector<float> out(static_cast<size_t>(cols));
    dequant_row_fp8(codes.data() + r * cols, sc[size_t(r)], cols, false, out.data());
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_NEAR(out[size_t(c)], w[size_t(r * cols + c)], std::fabs(w[size_t(r * cols + c)]) * 0.0625f + 1e-6f);
  }
  // zero matrix: scale 1, codes 0, exact
  std::vector<float> z(12, 0.f);
  const QuantizedMatrix qz = quantize_matrix(z.data(), 3, 4, WeightFormat::FP8_E4M3_TENSOR);
  EXPECT_EQ(qz.scale_f32[0], 1.0f);
  EXPECT_EQ(quant_rel_error(z.data(), 3, 4, WeightFormat::FP8_E4M3_CHANNEL), 0.0);
}

TEST(Fp8, FnuzIsLosslessConversion) {
  const int64_t rows = 33, cols = 70;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (auto& v : w) v = nd(rng);
  for (WeightFormat f : {WeightFormat::FP8_E4M3_BLOCK, WeightFormat::FP8_E4M3_TENSOR, WeightFormat::FP8_E4M3_CHANNEL}) {
    QuantizeOptions o;
    o.block_rows = 16;
    o.block_cols = 32;
    const QuantizedMatrix a = quantize_matrix(w.data(), rows, cols, f, o);
    o.fnuz = true;
    const QuantizedMatrix b = quantize_matrix(w.data(), rows, cols, f, o);
    EXPECT_TRUE(b.view().fnuz);
    EXPECT_EQ(a.scale_f32.size(), b.scale_f32.size());
    std::vector<float> ra(static_cast<size_t>(cols)), rb(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      dequant_row_ref(a.view(), r, ra.data());
      dequant_row_ref(b.view(), r, rb.data());
      ASSERT_EQ(ra, rb) << weight_format_label(a.view()) << " row " << r;
    }
    EXPECT_NE(weight_format_label(a.view()), weight_format_label(b.view()));
  }
}

}  // namespace
}  // namespace latent

// Declared dynamic FP8 activations, one group (docs/quantization.md §declared-activations): s = amax / 448,
// codes e4m3fn(x / s) to nearest even with saturation; an all-zero group s = 1; pow2: s rounded up to 2^k; a NaN or
// Inf makes the group NaN.
TEST(Fp8, ActivationGroupVectors) {
  using latent::quantize_act_fp8_group;
  uint8_t c[4] = {};
  const float a[4] = {448.0f, 1.0f, -0.5f, 0.0f};
  EXPECT_EQ(quantize_act_fp8_group(a, 4, false, c), 1.0f);
  EXPECT_EQ(c[0], 0x7E);
  EXPECT_EQ(c[1], 0x38);
  EXPECT_EQ(c[2], 0xB0);
  EXPECT_EQ(c[3], 0x00);

  const float b[2] = {896.0f, 3.0f};  // s = 2: 448 -> 0x7E, 1.5 -> 0x3C
  EXPECT_EQ(quantize_act_fp8_group(b, 2, false, c), 2.0f);
  EXPECT_EQ(c[0], 0x7E);
  EXPECT_EQ(c[1], 0x3C);

  const float z[3] = {0.0f, -0.0f, 0.0f};  // all zero: s = 1, codes 0 (and -0)
  EXPECT_EQ(quantize_act_fp8_group(z, 3, false, c), 1.0f);
  EXPECT_EQ(c[0], 0x00);
  EXPECT_EQ(c[1], 0x80);

  const float p[2] = {500.0f, -1.0f};  // 500 / 448 = 1.116 -> pow2 s = 2: 250 -> 256 (0x78), -0.5 -> 0xB0
  EXPECT_EQ(quantize_act_fp8_group(p, 2, true, c), 2.0f);
  EXPECT_EQ(c[0], 0x78);
  EXPECT_EQ(c[1], 0xB0);
  EXPECT_FLOAT_EQ(quantize_act_fp8_group(p, 2, false, c), 500.0f / 448.0f);
  EXPECT_EQ(c[0], 0x7E);  // exactly amax / s rounds to 448 (saturating where s rounded down)

  const float e[2] = {896.0f, 1.0f};  // 896 / 448 = 2 exactly: pow2 keeps it
  EXPECT_EQ(quantize_act_fp8_group(e, 2, true, c), 2.0f);

  const float n[3] = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  EXPECT_TRUE(std::isnan(quantize_act_fp8_group(n, 3, false, c)));
  EXPECT_EQ(c[0], 0x7F);
  EXPECT_EQ(c[2], 0x7F);
  const float i[2] = {1.0f, -std::numeric_limits<float>::infinity()};
  EXPECT_TRUE(std::isnan(quantize_act_fp8_group(i, 2, false, c)));
  EXPECT_EQ(c[0], 0x7F);

  // amax / 448 below the fp32 subnormals: s = 1, codes 0.
  const float t[1] = {1e-44f};
  EXPECT_EQ(quantize_act_fp8_group(t, 1, false, c), 1.0f);
  EXPECT_EQ(c[0], 0x00);
}
