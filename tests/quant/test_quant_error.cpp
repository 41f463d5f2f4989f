// WeightFormat plumbing, quantize_matrix, and the round-trip errors of docs/quantization.md §errors on Gaussian
// data (±0.3 points).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "quant/float_formats.h"
#include "quant/quantize.h"
#include "quant/weight_format.h"

namespace latent {
namespace {

TEST(WeightFormat, NamesAndSizes) {
  EXPECT_EQ(weight_format_name(WeightFormat::F32), "f32");
  EXPECT_EQ(weight_format_name(WeightFormat::BF16), "bf16");
  EXPECT_EQ(weight_format_name(WeightFormat::F16), "f16");
  EXPECT_EQ(weight_format_name(WeightFormat::FP8_E4M3_BLOCK), "fp8_e4m3_block128");
  EXPECT_EQ(weight_format_name(WeightFormat::FP8_E4M3_TENSOR), "fp8_e4m3_tensor");
  EXPECT_EQ(weight_format_name(WeightFormat::FP8_E4M3_CHANNEL), "fp8_e4m3_channel");
  EXPECT_EQ(weight_format_name(WeightFormat::MXFP4), "mxfp4");
  EXPECT_FALSE(is_quantized(WeightFormat::BF16));
  EXPECT_FALSE(is_quantized(WeightFormat::F32));
  EXPECT_TRUE(is_quantized(WeightFormat::MXFP4));
  EXPECT_TRUE(is_quantized(WeightFormat::FP8_E4M3_CHANNEL));
  QuantWeight w;
  w.cols = 64;
  const std::pair<WeightFormat, int64_t> rb[] = {
      {WeightFormat::F32, 256},           {WeightFormat::BF16, 128},           {WeightFormat::F16, 128},
      {WeightFormat::FP8_E4M3_BLOCK, 64}, {WeightFormat::FP8_E4M3_TENSOR, 64}, {WeightFormat::MXFP4, 32}};
  for (auto [f, n] : rb) {
    w.format = f;
    EXPECT_EQ(w.row_bytes(), n) << weight_format_name(f);
  }
  w.format = WeightFormat::FP8_E4M3_BLOCK;
  EXPECT_EQ(weight_format_label(w), "fp8_e4m3_block128");
  w.block_rows = 64;
  w.block_cols = 64;
  EXPECT_EQ(weight_format_label(w), "fp8_e4m3_block64");
  w.block_cols = 128;
  EXPECT_EQ(weight_format_label(w), "fp8_e4m3_block64x128");
  w.fnuz = true;
  w.format = WeightFormat::FP8_E4M3_TENSOR;
  EXPECT_EQ(weight_format_label(w), "fp8_e4m3fnuz_tensor");
}

TEST(Quantize, RejectsBadShapes) {
  std::vector<float> w(48, 1.0f);
  EXPECT_THROW(quantize_matrix(w.data(), 2, 24, WeightFormat::MXFP4), Error);
  QuantizeOptions o;
  o.block_rows = 0;
  EXPECT_THROW(quantize_matrix(w.data(), 2, 24, WeightFormat::FP8_E4M3_BLOCK, o), Error);
  EXPECT_THROW(quantize_matrix(w.data(), -1, 24, WeightFormat::BF16), Error);
}

TEST(Quantize, PlainFormatsAndBf16Source) {
  std::vector<float> w = {1.0f, -2.5f, 3.0e-3f, 70000.f, 1.00390625f, 0.f};
  const QuantizedMatrix f = quantize_matrix(w.data(), 2, 3, WeightFormat::F32);
  EXPECT_EQ(rel_error(w.data(), f.view()), 0.0);
  const QuantizedMatrix h = quantize_matrix(w.data(), 2, 3, WeightFormat::F16);
  std::vector<float> row(3);
  dequant_row_ref(h.view(), 1, row.data());
  EXPECT_EQ(row[0], 65504.f);  // saturates
  const QuantizedMatrix b = quantize_matrix(w.data(), 2, 3, WeightFormat::BF16);
  dequant_row_ref(b.view(), 1, row.data());
  EXPECT_EQ(row[1], 1.0f);  // 1 + 2^-8 ties to even
  // A bf16 checkpoint view as the source of --quantize: quantize_matrix(QuantWeight) and rel_error(view, view).
  std::vector<uint16_t> bf(64 * 32);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> ref(bf.size());
  for (size_t i = 0; i < bf.size(); ++i) {
    bf[i] = f32_to_bf16(nd(rng));
    ref[i] = bf16_to_f32(bf[i]);
  }
  QuantWeight src;
  src.format = WeightFormat::BF16;
  src.rows = 64;
  src.cols = 32;
  src.data = bf.data();
  const QuantizedMatrix m1 = quantize_matrix(src, WeightFormat::MXFP4);
  const QuantizedMatrix m2 = quantize_matrix(ref.data(), 64, 32, WeightFormat::MXFP4);
  EXPECT_EQ(m1.data, m2.data);
  EXPECT_EQ(m1.scale_e8m0, m2.scale_e8m0);
  EXPECT_EQ(rel_error(src, m1.view()), rel_error(ref.data(), m2.view()));
  EXPECT_EQ(rel_error(src, src), 0.0);
}

// docs/quantization.md §errors (4096x4096, sigma 1). 1024x1024 here keeps Debug+ASan fast; sampling noise ~0.01 pt.
TEST(Quantize, GaussianRoundTripErrorMatchesSpec) {
  const int64_t rows = 1024, cols = 1024;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  std::mt19937 rng(12345);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : w) v = nd(rng);
  struct Case {
    WeightFormat f;
    Mxfp4ScaleRule rule;
    double want_pct;
  };
  const Case cases[] = {
      {WeightFormat::MXFP4, Mxfp4ScaleRule::OcpFloor, 11.50},
      {WeightFormat::MXFP4, Mxfp4ScaleRule::Even, 11.19},
      {WeightFormat::MXFP4, Mxfp4ScaleRule::CeilAmax6, 11.54},
      {WeightFormat::FP8_E4M3_BLOCK, Mxfp4ScaleRule::OcpFloor, 2.646},
      {WeightFormat::FP8_E4M3_TENSOR, Mxfp4ScaleRule::OcpFloor, 2.654},
      {WeightFormat::FP8_E4M3_CHANNEL, Mxfp4ScaleRule::OcpFloor, 2.647},
      {WeightFormat::BF16, Mxfp4ScaleRule::OcpFloor, 0.166},
  };
  for (const Case& c : cases) {
    QuantizeOptions o;
    o.mxfp4_rule = c.rule;
    const double pct = 100.0 * quant_rel_error(w.data(), rows, cols, c.f, o);
    EXPECT_NEAR(pct, c.want_pct, 0.3) << weight_format_name(c.f) << " " << mxfp4_scale_rule_name(c.rule);
    std::printf("  %-18s %-10s %.3f %% (spec %.3f %%)\n", std::string(weight_format_name(c.f)).c_str(),
                c.f == WeightFormat::MXFP4 ? mxfp4_scale_rule_name(c.rule) : "", pct, c.want_pct);
  }
  EXPECT_EQ(quant_rel_error(w.data(), rows, cols, WeightFormat::F32), 0.0);
}

}  // namespace
}  // namespace latent
