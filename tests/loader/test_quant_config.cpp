#include <gtest/gtest.h>

#include "core/error.h"
#include "loader/quant_config.h"
#include "loader/quant_transform.h"

namespace latent {
namespace {

TEST(GlobMatch, Basics) {
  EXPECT_TRUE(glob_match("*.kv_b_proj", "model.layers.3.self_attn.kv_b_proj"));
  EXPECT_FALSE(glob_match("*.kv_b_proj", "model.layers.3.self_attn.kv_b_proj.weight"));
  EXPECT_TRUE(glob_match("*.mlp.experts.*", "model.layers.3.mlp.experts.17.up_proj"));
  EXPECT_FALSE(glob_match("*.mlp.experts.*", "model.layers.3.mlp.shared_experts.up_proj"));
  EXPECT_TRUE(glob_match("model.layers.[0-2].*", "model.layers.1.mlp"));
  EXPECT_FALSE(glob_match("model.layers.[0-2].*", "model.layers.3.mlp"));
  EXPECT_TRUE(glob_match("a?c", "abc"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("a", ""));
}

TEST(QuantConfig, QuarkExcludeSemantics) {
  auto qc = QuantConfig::parse(nlohmann::json::parse(R"({"quant_method": "quark",
      "exclude": ["lm_head", "re:.*mlp.gate$", "re:model.layers.61.*", "re:.*self_attn.*"],
      "global_quant_config": {"input_tensors": {"dtype": "fp4", "is_dynamic": true}}})"),
                               "cfg");
  EXPECT_EQ(qc.method, "quark");
  EXPECT_FALSE(*qc.expects_quantized("lm_head"));
  EXPECT_FALSE(*qc.expects_quantized("model.layers.3.mlp.gate"));
  EXPECT_TRUE(*qc.expects_quantized("model.layers.3.mlp.gate_proj"));  // `$` anchors the end
  EXPECT_FALSE(*qc.expects_quantized("model.layers.3.self_attn.kv_b_proj"));
  EXPECT_FALSE(*qc.expects_quantized("model.layers.61.mlp.experts.0.up_proj"));
  EXPECT_TRUE(*qc.expects_quantized("model.layers.6.mlp.experts.0.up_proj"));
  // re.match is anchored at the start: "layers.61" alone does not match "model.layers.61..."
  auto qc2 =
      QuantConfig::parse(nlohmann::json::parse(R"({"quant_method": "quark", "exclude": ["re:layers.61"]})"), "c");
  EXPECT_TRUE(*qc2.expects_quantized("model.layers.61.mlp"));
  EXPECT_NE(qc.activation_scheme.find("fp4"), std::string::npos);
}

TEST(QuantConfig, Fp8WithoutListDecidesByDtype) {
  auto qc =
      QuantConfig::parse(nlohmann::json::parse(R"({"quant_method": "fp8", "weight_block_size": [128, 64]})"), "cfg");
  EXPECT_FALSE(qc.expects_quantized("lm_head").has_value());
  EXPECT_EQ(qc.block_rows, 128);
  EXPECT_EQ(qc.block_cols, 64);
  EXPECT_THROW(QuantConfig::parse(nlohmann::json::parse(R"({"quant_method": "fp8", "weight_block_size": [0]})"), "c"),
               Error);
}

TEST(QuantConfig, GptOssGlobsAndUnknownMethod) {
  auto qc = QuantConfig::parse(nlohmann::json::parse(
                                   R"({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                   "model.embed_tokens", "lm_head"]})"),
                               "cfg");
  EXPECT_FALSE(*qc.expects_quantized("model.layers.4.self_attn.o_proj"));
  EXPECT_TRUE(*qc.expects_quantized("model.layers.4.mlp.experts"));
  EXPECT_THROW(QuantConfig::parse(nlohmann::json::parse(R"({"quant_method": "awq"})"), "c"), Error);
  EXPECT_THROW(QuantConfig::parse(nlohmann::json::parse(R"({"bits": 4})"), "c"), Error);
  EXPECT_FALSE(QuantConfig::parse(nlohmann::json(), "c").present);
}

TEST(QuantizeRule, Parse) {
  auto r = QuantizeRule::parse("*.kv_b_proj=mxfp4");
  EXPECT_EQ(r.pattern, "*.kv_b_proj");
  EXPECT_EQ(r.format, WeightFormat::MXFP4);
  EXPECT_EQ(QuantizeRule::parse("x=fp8_e4m3_block128").format, WeightFormat::FP8_E4M3_BLOCK);
  EXPECT_EQ(QuantizeRule::parse("x=fp8_e4m3_tensor").format, WeightFormat::FP8_E4M3_TENSOR);
  EXPECT_EQ(QuantizeRule::parse("x=bf16").format, WeightFormat::BF16);
  EXPECT_THROW(QuantizeRule::parse("*.kv_b_proj"), Error);
  EXPECT_THROW(QuantizeRule::parse("=mxfp4"), Error);
  EXPECT_THROW(QuantizeRule::parse("x=int4"), Error);
}

TEST(QuantTransform, RelFrobenius) {
  float a[3] = {1, 2, 2}, b[3] = {1, 2, 2}, c[3] = {1, 2, 5};
  EXPECT_EQ(rel_frobenius_error(a, b, 3), 0.0);
  EXPECT_NEAR(rel_frobenius_error(a, c, 3), 1.0, 1e-12);
}

}  // namespace
}  // namespace latent
