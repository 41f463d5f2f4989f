// config.json parsing: docs/model.md §config fields, transformers defaults, yarn (docs/model.md §yarn), layer typing,
// IndexShare, named validation errors.
#include "format/hf_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numbers>
#include <sstream>

#include "core/error.h"

namespace latent {
namespace {

using nlohmann::json;

std::string data_path(const std::string& name) {
  return std::string(LATENT_SOURCE_DIR) + "/tests/data/configs/" + name;
}

json load_json(const std::string& name) {
  std::ifstream in(data_path(name));
  EXPECT_TRUE(in.good()) << data_path(name);
  return json::parse(in);
}

ModelConfig parse(const json& j) { return parse_model_config(j.dump(), "cfg/config.json"); }

json mutate(const std::string& base, const std::function<void(json&)>& fn) {
  json j = load_json(base);
  fn(j);
  return j;
}

// Expects an Error whose message is one line, starts with the file, and contains every needle.
void expect_error(const json& j, const std::vector<std::string>& needles) {
  try {
    parse(j);
    ADD_FAILURE() << "no error for: " << j.dump();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("cfg/config.json: ", 0), 0u) << msg;
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

// Independent fp64 yarn of docs/model.md §yarn (written from the document, not from the implementation).
std::vector<double> spec_yarn_inv_freq(double theta, int dim, double f, double l0, double bf, double bs) {
  auto corr = [&](double r) { return dim * std::log(l0 / (2 * std::numbers::pi * r)) / (2 * std::log(theta)); };
  double lo = std::max(std::floor(corr(bf)), 0.0);
  double hi = std::min(std::ceil(corr(bs)), dim - 1.0);
  if (lo == hi) hi += 0.001;
  std::vector<double> out;
  for (int i = 0; i < dim / 2; ++i) {
    double ramp = std::min(std::max((i - lo) / (hi - lo), 0.0), 1.0);
    double base = std::pow(theta, -2.0 * i / dim);
    out.push_back(base * (1 - ramp) + base / f * ramp);
  }
  return out;
}

void expect_tiny_common(const ModelConfig& c) {
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.intermediate_size, 256);
  EXPECT_EQ(c.moe_intermediate_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 4);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_nope_head_dim, 32);
  EXPECT_EQ(c.qk_rope_head_dim, 16);
  EXPECT_EQ(c.v_head_dim, 24);
  EXPECT_EQ(c.qk_head_dim(), 48);
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.layer_is_moe, (std::vector<bool>{false, true, true, true}));
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 128);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 32);
  EXPECT_DOUBLE_EQ(c.rope.mscale, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 0.8);
  EXPECT_TRUE(c.rope.truncate);
  EXPECT_FALSE(c.rope.attention_factor.has_value());
  EXPECT_TRUE(c.rope_interleave);
  // docs/model.md §tiny-models: scale = 48^-0.5 · m(4,0.8)² ≈ 0.178128, attention_factor = m(4,1)/m(4,0.8) ≈ 1.02496.
  const double m08 = 1 + 0.08 * std::log(4.0), m1 = 1 + 0.1 * std::log(4.0);
  EXPECT_NEAR(c.softmax_scale(), m08 * m08 / std::sqrt(48.0), 1e-15);
  EXPECT_NEAR(c.softmax_scale(), 0.178128, 5e-7);
  EXPECT_NEAR(rope_attention_factor(c), m1 / m08, 1e-15);
  EXPECT_NEAR(rope_attention_factor(c), 1.02496, 5e-6);
  std::vector<double> want = spec_yarn_inv_freq(10000.0, 16, 4.0, 32.0, 32.0, 1.0);
  std::vector<double> got = rope_inv_freq(c);
  ASSERT_EQ(got.size(), 8u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15 * want[i]) << i;
  std::vector<float> got32 = rope_inv_freq_f32(c);
  ASSERT_EQ(got32.size(), 8u);
  for (size_t i = 0; i < got32.size(); ++i) EXPECT_NEAR(got32[i], want[i], 3e-7 * want[i]) << i;
  EXPECT_EQ(c.bos_token_ids, (std::vector<int64_t>{0}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_TRUE(c.quantization_config.is_null());
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
}

// ---------------------------------------------------------------------------------------------------------------
// Tiny configs (docs/model.md §tiny-models)

TEST(HfConfig, TinyGlm) {
  ModelConfig c = parse(load_json("glm_tiny.json"));
  EXPECT_EQ(c.arch, Arch::GlmMoeDsa);
  EXPECT_EQ(c.model_type, "glm_moe_dsa");
  expect_tiny_common(c);
  EXPECT_TRUE(c.has_indexer());
  EXPECT_EQ(c.index_n_heads, 16);
  EXPECT_EQ(c.index_head_dim, 32);
  EXPECT_EQ(c.index_topk, 8);
  EXPECT_EQ(c.layer_has_indexer, (std::vector<bool>{true, true, false, true}));
  EXPECT_TRUE(c.indexer_rope_interleave);
  EXPECT_EQ(c.raw["initializer_range"].get<double>(), 0.1);
}

TEST(HfConfig, TinyV32) {
  ModelConfig c = parse(load_json("deepseek_v32_tiny.json"));
  EXPECT_EQ(c.arch, Arch::DeepseekV32);
  expect_tiny_common(c);
  EXPECT_TRUE(c.has_indexer());
  EXPECT_EQ(c.layer_has_indexer, (std::vector<bool>(4, true)));
  EXPECT_FALSE(c.indexer_rope_interleave);  // V3.2 indexer RoPE is half-split
}

TEST(HfConfig, TinyV3) {
  ModelConfig c = parse(load_json("deepseek_v3_tiny.json"));
  EXPECT_EQ(c.arch, Arch::DeepseekV3);
  expect_tiny_common(c);
  EXPECT_FALSE(c.has_indexer());
  EXPECT_EQ(c.index_n_heads, 0);
  EXPECT_EQ(c.layer_has_indexer, (std::vector<bool>(4, false)));
}

// ---------------------------------------------------------------------------------------------------------------
// Real-size configs (values of docs/model.md §config)

ModelConfig parse_file(const std::string& name) {
  std::ifstream in(data_path(name));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), data_path(name));
}

void expect_deepseek_real(const ModelConfig& c) {
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.intermediate_size, 18432);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  ASSERT_EQ(c.layer_is_moe.size(), 61u);
  EXPECT_FALSE(c.layer_is_moe[2]);
  EXPECT_TRUE(c.layer_is_moe[3]);
  // Legacy rope_scaling with "type" + top-level rope_theta.
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 40.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  YarnRange r = rope_yarn_range(c);
  EXPECT_EQ(r.lo, 10.0);
  EXPECT_EQ(r.hi, 23.0);
  EXPECT_DOUBLE_EQ(rope_attention_factor(c), 1.0);
  double m = yarn_get_mscale(40.0, 1.0);
  EXPECT_NEAR(m * m, 1.8738542, 5e-8);
  EXPECT_NEAR(c.softmax_scale(), 0.13523378, 5e-9);
  std::vector<double> want = spec_yarn_inv_freq(10000.0, 64, 40.0, 4096.0, 32.0, 1.0);
  std::vector<double> got = rope_inv_freq(c);
  ASSERT_EQ(got.size(), 32u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15 * want[i]) << i;
  EXPECT_DOUBLE_EQ(got[0], 1.0);                                // below lo: pure extrapolation
  EXPECT_NEAR(got[31], std::pow(1e4, -62.0 / 64) / 40, 1e-18);  // above hi: pure interpolation
  EXPECT_EQ(c.quantization_config["quant_method"], "fp8");
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
}

TEST(HfConfig, DeepseekV3Real) {
  ModelConfig c = parse_file("deepseek_v3.json");
  EXPECT_EQ(c.arch, Arch::DeepseekV3);
  expect_deepseek_real(c);
  EXPECT_FALSE(c.has_indexer());
}

TEST(HfConfig, DeepseekV32Real) {
  ModelConfig c = parse_file("deepseek_v32.json");
  EXPECT_EQ(c.arch, Arch::DeepseekV32);
  expect_deepseek_real(c);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.quantization_config["scale_fmt"], "ue8m0");
  EXPECT_EQ(c.layer_has_indexer, std::vector<bool>(61, true));
}

TEST(HfConfig, Glm5Real) {
  ModelConfig c = parse_file("glm5.json");
  EXPECT_EQ(c.arch, Arch::GlmMoeDsa);
  EXPECT_EQ(c.vocab_size, 154880);
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_hidden_layers, 78);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.q_lora_rank, 2048);
  EXPECT_EQ(c.qk_nope_head_dim, 192);
  EXPECT_EQ(c.v_head_dim, 256);
  EXPECT_EQ(c.qk_head_dim(), 256);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 0.0625);
  EXPECT_DOUBLE_EQ(rope_attention_factor(c), 1.0);
  std::vector<double> inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 32u);
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_NEAR(inv[i], std::pow(1e6, -2.0 * i / 64), 1e-16) << i;
  std::vector<float> inv32 = rope_inv_freq_f32(c);
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_NEAR(inv32[i], inv[i], 2e-7 * inv[i]) << i;
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{154820, 154827, 154829}));
  EXPECT_EQ(c.pad_token_id, 154820);
  EXPECT_EQ(c.bos_token_ids, (std::vector<int64_t>{0}));  // HF default
  EXPECT_EQ(c.torch_dtype, "bfloat16");                   // transformers 5 key "dtype"
  EXPECT_TRUE(c.quantization_config.is_null());
  EXPECT_EQ(c.layer_has_indexer, std::vector<bool>(78, true));  // no IndexShare keys: freq 1 -> all full
  EXPECT_EQ(std::count(c.layer_is_moe.begin(), c.layer_is_moe.end(), true), 75);
  EXPECT_TRUE(c.indexer_rope_interleave);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
}

// ---------------------------------------------------------------------------------------------------------------
// Defaults (transformers config classes)

TEST(HfConfig, DefaultsDeepseekV3) {
  ModelConfig c = parse(json{{"architectures", {"DeepseekV3ForCausalLM"}}});
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.intermediate_size, 18432);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.num_key_value_heads, 128);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_TRUE(c.rope_interleave);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_EQ(c.bos_token_ids, (std::vector<int64_t>{0}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(192.0));
  EXPECT_FALSE(c.has_indexer());
}

TEST(HfConfig, DefaultsDeepseekV32) {
  ModelConfig c = parse(json{{"model_type", "deepseek_v32"}});  // model_type alone is enough
  EXPECT_EQ(c.arch, Arch::DeepseekV32);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.layer_is_moe.size(), 61u);
  EXPECT_EQ(std::count(c.layer_is_moe.begin(), c.layer_is_moe.end(), false), 3);
  EXPECT_FALSE(c.indexer_rope_interleave);
}

TEST(HfConfig, DefaultsGlmMoeDsa) {
  ModelConfig c = parse(json{{"architectures", {"GlmMoeDsaForCausalLM"}}});
  EXPECT_EQ(c.model_type, "glm_moe_dsa");
  EXPECT_EQ(c.vocab_size, 154880);
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.num_hidden_layers, 78);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 64);
  EXPECT_EQ(c.q_lora_rank, 2048);
  EXPECT_EQ(c.qk_nope_head_dim, 192);
  EXPECT_EQ(c.v_head_dim, 256);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.max_position_embeddings, 202752);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);  // mixin default_theta: GLM does not override it
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.layer_has_indexer, std::vector<bool>(78, true));
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 0.0625);
}

// ---------------------------------------------------------------------------------------------------------------
// RoPE variants

TEST(HfConfig, LegacyRopeScalingWithType) {
  json j = load_json("glm_tiny.json");
  json rp = j["rope_parameters"];
  j.erase("rope_parameters");
  rp.erase("rope_type");
  rp["type"] = "yarn";
  rp.erase("rope_theta");
  j["rope_scaling"] = rp;
  j["rope_theta"] = 10000;
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_NEAR(c.softmax_scale(), 0.178128, 5e-7);
  ModelConfig ref = parse(load_json("glm_tiny.json"));
  EXPECT_EQ(rope_inv_freq(c), rope_inv_freq(ref));
}

TEST(HfConfig, RopeYarnDefaultsAndOptions) {
  ModelConfig c = parse(mutate("deepseek_v3_tiny.json", [](json& j) {
    j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4}};  // no L0, no betas, no mscale
  }));
  EXPECT_EQ(c.rope.original_max_position_embeddings, 128);  // = max_position_embeddings
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_NEAR(rope_attention_factor(c), 1 + 0.1 * std::log(4.0), 1e-15);  // m(f, 1)
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1 / std::sqrt(48.0));               // no mscale_all_dim
  std::vector<double> want = spec_yarn_inv_freq(10000.0, 16, 4.0, 128.0, 32.0, 1.0);
  std::vector<double> got = rope_inv_freq(c);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15 * want[i]) << i;

  ModelConfig af = parse(mutate("glm_tiny.json", [](json& j) { j["rope_parameters"]["attention_factor"] = 0.5; }));
  EXPECT_DOUBLE_EQ(rope_attention_factor(af), 0.5);

  ModelConfig nt = parse(mutate("glm_tiny.json", [](json& j) { j["rope_parameters"]["truncate"] = false; }));
  YarnRange r = rope_yarn_range(nt);
  EXPECT_EQ(r.lo, 0.0);              // corr(32) < 0, clamped
  EXPECT_NE(r.hi, std::ceil(r.hi));  // corr(1) ≈ 1.41, not rounded up
  EXPECT_NE(rope_inv_freq(nt), rope_inv_freq(parse(load_json("glm_tiny.json"))));

  // rope_parameters and rope_scaling both present and equal: accepted.
  ModelConfig both = parse(mutate("glm_tiny.json", [](json& j) { j["rope_scaling"] = j["rope_parameters"]; }));
  EXPECT_EQ(both.rope.type, "yarn");
  // top-level rope_theta differing from rope_parameters.rope_theta: dict wins, with a warning.
  ModelConfig th = parse(mutate("glm_tiny.json", [](json& j) { j["rope_theta"] = 5000; }));
  EXPECT_DOUBLE_EQ(th.rope.theta, 10000.0);
  ASSERT_EQ(th.warnings.size(), 1u);
  EXPECT_NE(th.warnings[0].find("rope_theta"), std::string::npos);
}

TEST(HfConfig, RopeF32MatchesDouble) {
  for (const char* name : {"glm_tiny.json", "deepseek_v3.json", "glm5.json"}) {
    ModelConfig c = parse(load_json(name));
    std::vector<double> d = rope_inv_freq(c);
    std::vector<float> f = rope_inv_freq_f32(c);
    ASSERT_EQ(d.size(), f.size());
    for (size_t i = 0; i < d.size(); ++i) EXPECT_NEAR(f[i], d[i], 4e-7 * d[i]) << name << " " << i;
  }
}

// fp32 inv_freq, softmax scale and attention factor produced by transformers 5.17.0 + torch 2.11 (CPU) for the
// configs of tests/data/configs (DeepseekV3RotaryEmbedding / GlmMoeDsaRotaryEmbedding .inv_freq, as float bits;
// Attention.scaling; RotaryEmbedding.attention_scaling), captured on the team's H200 machine.
struct HfRef {
  const char* file;
  double scaling, attention_scaling;
  std::vector<uint32_t> inv_freq_bits;
};

TEST(HfConfig, MatchesTransformers517Numbers) {
  const std::vector<HfRef> refs = {
      {"glm_tiny.json",
       0.1781279581324309,
       1.0249579607969668,
       {0x3f800000, 0x3e4a62c2, 0x3ccccccd, 0x3c0186e3, 0x3b23d70a, 0x3a4f3e38, 0x3983126f, 0x38a5cb60}},
      {"deepseek_v3.json",
       0.1352337788608801,
       1.0,
       {0x3f800000, 0x3f3ff911, 0x3f0ff59a, 0x3ed7e89b, 0x3ea1e89b, 0x3e72d423, 0x3e361887, 0x3e088d77,
        0x3dcccccd, 0x3d99940d, 0x3d6655c2, 0x3d1fc5ba, 0x3cdc321b, 0x3c968dc3, 0x3c4bf283, 0x3c088d77,
        0x3bb43959, 0x3b697066, 0x3b136a16, 0x3ab3a2cd, 0x3a4f3e37, 0x39d99312, 0x393a7753, 0x380bd471,
        0x37d1b717, 0x379d43a3, 0x376bdcf0, 0x3730df51, 0x3704a2b3, 0x36c6ecdd, 0x36952c42, 0x365fba4f}},
      {"glm5.json", 0.0625, 1.0, {0x3f800000, 0x3f263de0, 0x3ed7e89b, 0x3e8c3504, 0x3e361887, 0x3dec7fd6, 0x3d99940d,
                                  0x3d47763f, 0x3d0186e3, 0x3ca8398b, 0x3c5a7bf2, 0x3c0de12d, 0x3bb8449c, 0x3b6f520e,
                                  0x3b1b690d, 0x3ac9d75c, 0x3a83126f, 0x3a2a3b44, 0x39dd1725, 0x398f9272, 0x393a7753,
                                  0x38f22ce2, 0x389d43a4, 0x384c3fbe, 0x3804a2b2, 0x37ac431d, 0x375fba4f, 0x371148e3,
                                  0x36bcb0c1, 0x36751070, 0x361f23e4, 0x35ceaf79}},
  };
  for (const HfRef& ref : refs) {
    SCOPED_TRACE(ref.file);
    ModelConfig c = parse(load_json(ref.file));
    EXPECT_NEAR(c.softmax_scale(), ref.scaling, 1e-15);
    EXPECT_NEAR(rope_attention_factor(c), ref.attention_scaling, 1e-15);
    std::vector<float> f = rope_inv_freq_f32(c);
    ASSERT_EQ(f.size(), ref.inv_freq_bits.size());
    // Bit-exact with glibc powf here; torch's vectorised pow could in principle differ by 1 ulp elsewhere.
    for (size_t i = 0; i < f.size(); ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, &f[i], 4);
      EXPECT_EQ(bits, ref.inv_freq_bits[i]) << "i=" << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Layer typing and IndexShare

TEST(HfConfig, MlpLayerTypes) {
  ModelConfig c = parse(mutate("glm_tiny.json", [](json& j) {
    j["mlp_layer_types"] = {"dense", "sparse", "dense", "sparse"};
  }));
  EXPECT_EQ(c.layer_is_moe, (std::vector<bool>{false, true, false, true}));
  // All dense: MoE dims are not needed.
  ModelConfig d = parse(mutate("deepseek_v3_tiny.json", [](json& j) {
    j["first_k_dense_replace"] = 4;
    j["n_routed_experts"] = nullptr;
  }));
  EXPECT_EQ(d.layer_is_moe, std::vector<bool>(4, false));
  // V3: mlp_layer_types agreeing with first_k_dense_replace is fine.
  ModelConfig v3 = parse(mutate("deepseek_v3_tiny.json", [](json& j) {
    j["mlp_layer_types"] = {"dense", "sparse", "sparse", "sparse"};
  }));
  EXPECT_EQ(v3.layer_is_moe, (std::vector<bool>{false, true, true, true}));
  // moe_layer_freq != 1: ignored like HF, with a warning.
  ModelConfig fq = parse(mutate("glm_tiny.json", [](json& j) { j["moe_layer_freq"] = 2; }));
  EXPECT_EQ(fq.layer_is_moe, (std::vector<bool>{false, true, true, true}));
  ASSERT_EQ(fq.warnings.size(), 1u);
  EXPECT_NE(fq.warnings[0].find("moe_layer_freq"), std::string::npos);
}

TEST(HfConfig, GlmIndexShareSchedules) {
  auto no_types = [](std::function<void(json&)> more) {
    return mutate("glm_tiny.json", [&](json& j) {
      j.erase("indexer_types");
      more(j);
    });
  };
  ModelConfig p = parse(no_types([](json& j) { j["index_topk_pattern"] = "FSFS"; }));
  EXPECT_EQ(p.layer_has_indexer, (std::vector<bool>{true, false, true, false}));
  ModelConfig plist = parse(no_types([](json& j) { j["index_topk_pattern"] = {"full", "full", "shared", "full"}; }));
  EXPECT_EQ(plist.layer_has_indexer, (std::vector<bool>{true, true, false, true}));
  ModelConfig all = parse(no_types([](json&) {}));
  EXPECT_EQ(all.layer_has_indexer, std::vector<bool>(4, true));
  // GLM-5.2-like freq 4 / offset 3 over 78 layers: full at 0,1,2,6,10,...,74.
  ModelConfig g = parse(mutate("glm5.json", [](json& j) {
    j["index_topk_freq"] = 4;
    j["index_skip_topk_offset"] = 3;
  }));
  std::vector<bool> want(78, false);
  want[0] = want[1] = want[2] = true;
  for (int i = 6; i < 78; i += 4) want[static_cast<size_t>(i)] = true;
  EXPECT_EQ(g.layer_has_indexer, want);
  EXPECT_TRUE(g.layer_has_indexer[74]);
  // freq 0 is clamped to 1 (HF max(freq, 1)).
  ModelConfig f0 = parse(no_types([](json& j) { j["index_topk_freq"] = 0; }));
  EXPECT_EQ(f0.layer_has_indexer, std::vector<bool>(4, true));
  // indexer_types on V3.2 is ignored (every layer has an indexer in HF V3.2).
  ModelConfig v32 = parse(mutate("deepseek_v32_tiny.json", [](json& j) {
    j["indexer_types"] = {"full", "shared", "shared", "shared"};
  }));
  EXPECT_EQ(v32.layer_has_indexer, std::vector<bool>(4, true));
}

TEST(HfConfig, RopeInterleave) {
  ModelConfig v3 = parse(mutate("deepseek_v3_tiny.json", [](json& j) { j["rope_interleave"] = false; }));
  EXPECT_FALSE(v3.rope_interleave);  // HF V3 honours it
  EXPECT_TRUE(v3.warnings.empty());
  ModelConfig v32 = parse(mutate("deepseek_v32_tiny.json", [](json& j) {
    j["rope_interleave"] = false;
    j["indexer_rope_interleave"] = true;
  }));
  EXPECT_TRUE(v32.rope_interleave);           // hard-coded in HF V3.2
  EXPECT_FALSE(v32.indexer_rope_interleave);  // hard-coded half-split
  EXPECT_EQ(v32.warnings.size(), 2u);
}

// ---------------------------------------------------------------------------------------------------------------
// Tokens, aliases, misc

TEST(HfConfig, TokensAndAliases) {
  ModelConfig c = parse(mutate("glm_tiny.json", [](json& j) {
    j["bos_token_id"] = nullptr;
    j["eos_token_id"] = {3, 4};
    j["pad_token_id"] = 5;
    j["quantization_config"] = {{"quant_method", "quark"}};
  }));
  EXPECT_TRUE(c.bos_token_ids.empty());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(c.pad_token_id, 5);
  EXPECT_EQ(c.quantization_config["quant_method"], "quark");
  ModelConfig e = parse(mutate("glm_tiny.json", [](json& j) { j["eos_token_id"] = 7; }));
  EXPECT_EQ(e.eos_token_ids, (std::vector<int64_t>{7}));
  // num_experts (HF BC) re-routes to n_routed_experts for V3.2/GLM; num_local_experts is an alias.
  ModelConfig ne = parse(mutate("glm_tiny.json", [](json& j) { j["num_experts"] = 16; }));
  EXPECT_EQ(ne.n_routed_experts, 16);
  ModelConfig nl = parse(mutate("glm_tiny.json", [](json& j) {
    j.erase("n_routed_experts");
    j["num_local_experts"] = 16;
  }));
  EXPECT_EQ(nl.n_routed_experts, 16);
  // num_key_value_heads null -> num_attention_heads (HF V3 BC); integral floats are integers.
  ModelConfig kv = parse(mutate("deepseek_v3_tiny.json", [](json& j) {
    j["num_key_value_heads"] = nullptr;
    j["hidden_size"] = 128.0;
  }));
  EXPECT_EQ(kv.num_key_value_heads, 4);
  EXPECT_EQ(kv.hidden_size, 128);
  // swish == silu
  EXPECT_EQ(parse(mutate("glm_tiny.json", [](json& j) { j["hidden_act"] = "swish"; })).hidden_act, "silu");
}

TEST(HfConfig, ArchitectureResolution) {
  // Unknown architectures[0] but known model_type: model_type decides, with a warning.
  ModelConfig c = parse(mutate("glm_tiny.json", [](json& j) { j["architectures"] = {"GlmMoeDsaForSomething"}; }));
  EXPECT_EQ(c.arch, Arch::GlmMoeDsa);
  ASSERT_EQ(c.warnings.size(), 1u);
  // Known architecture without model_type.
  ModelConfig d = parse(mutate("deepseek_v3_tiny.json", [](json& j) { j.erase("model_type"); }));
  EXPECT_EQ(d.arch, Arch::DeepseekV3);
  EXPECT_EQ(d.model_type, "deepseek_v3");
  EXPECT_STREQ(arch_name(Arch::DeepseekV32), "DeepseekV32ForCausalLM");
  EXPECT_STREQ(arch_model_type(Arch::GlmMoeDsa), "glm_moe_dsa");
}

// ---------------------------------------------------------------------------------------------------------------
// Errors

TEST(HfConfig, UnknownArchitectureListsSupported) {
  for (json j : {json{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}}, json{{"model_type", "qwen3"}},
                 json::object()}) {
    expect_error(
        j, {"unsupported architecture", "GlmMoeDsaForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"});
  }
  expect_error(json{{"architectures", {"LlamaForCausalLM"}}}, {"'LlamaForCausalLM'"});
  expect_error(json{{"architectures", {"DeepseekV3ForCausalLM"}}, {"model_type", "glm_moe_dsa"}},
               {"model_type", "glm_moe_dsa", "DeepseekV3ForCausalLM"});
  expect_error(json{{"architectures", "DeepseekV3ForCausalLM"}}, {"architectures", "list"});
}

struct ErrorCase {
  const char* base;
  std::function<void(json&)> fn;
  std::vector<std::string> needles;
};

TEST(HfConfig, ValidationErrorsNameTheField) {
  const std::vector<ErrorCase> cases = {
      {"glm_tiny.json", [](json& j) { j["n_routed_experts"] = 9; }, {"n_routed_experts", "9", "n_group 4"}},
      {"glm_tiny.json", [](json& j) { j["q_lora_rank"] = nullptr; }, {"q_lora_rank missing", "q LoRA"}},
      {"deepseek_v3_tiny.json", [](json& j) { j["q_lora_rank"] = 0; }, {"q_lora_rank missing"}},
      {"glm_tiny.json", [](json& j) { j["hidden_size"] = "abc"; }, {"'hidden_size'", "integer", "\"abc\""}},
      {"glm_tiny.json", [](json& j) { j["hidden_size"] = 0; }, {"'hidden_size'", "positive", "0"}},
      {"glm_tiny.json", [](json& j) { j["num_hidden_layers"] = -2; }, {"'num_hidden_layers'", "-2"}},
      {"glm_tiny.json", [](json& j) { j["num_attention_heads"] = nullptr; }, {"'num_attention_heads'", "null"}},
      {"glm_tiny.json", [](json& j) { j["kv_lora_rank"] = 1.5; }, {"'kv_lora_rank'", "integer", "1.5"}},
      {"glm_tiny.json", [](json& j) { j["v_head_dim"] = 0; }, {"'v_head_dim'"}},
      {"glm_tiny.json", [](json& j) { j["qk_nope_head_dim"] = true; }, {"'qk_nope_head_dim'", "true"}},
      {"glm_tiny.json", [](json& j) { j["vocab_size"] = -1; }, {"'vocab_size'", "-1"}},
      {"glm_tiny.json", [](json& j) { j["num_hidden_layers"] = int64_t{1} << 40; }, {"'num_hidden_layers'", "large"}},
      {"glm_tiny.json", [](json& j) { j["vocab_size"] = 1e300; }, {"'vocab_size'", "integer"}},
      {"glm_tiny.json",
       [](json& j) {
         j["qk_rope_head_dim"] = 15;
         j["index_head_dim"] = 32;
       },
       {"'qk_rope_head_dim'", "even", "15"}},
      {"glm_tiny.json", [](json& j) { j["topk_group"] = 5; }, {"'topk_group'", "5", "n_group 4"}},
      {"glm_tiny.json", [](json& j) { j["num_experts_per_tok"] = 9; }, {"'num_experts_per_tok'", "9"}},
      {"glm_tiny.json", [](json& j) { j["num_experts_per_tok"] = 5; }, {"'num_experts_per_tok'", "5", "topk_group 2"}},
      {"glm_tiny.json",
       [](json& j) {
         j["n_group"] = 8;
         j["topk_group"] = 2;
       },
       {"'n_group'", "top 2"}},
      {"glm_tiny.json", [](json& j) { j["moe_intermediate_size"] = nullptr; }, {"'moe_intermediate_size'", "null"}},
      {"glm_tiny.json", [](json& j) { j["n_routed_experts"] = 0; }, {"'n_routed_experts'"}},
      {"glm_tiny.json", [](json& j) { j["index_head_dim"] = 8; }, {"'index_head_dim'", "8", "qk_rope_head_dim 16"}},
      {"glm_tiny.json", [](json& j) { j["index_topk"] = 0; }, {"'index_topk'", "0"}},
      {"deepseek_v32_tiny.json", [](json& j) { j["index_n_heads"] = 0; }, {"'index_n_heads'"}},
      {"glm_tiny.json",
       [](json& j) {
         j["mlp_layer_types"] = {"dense", "sparse"};
       },
       {"'mlp_layer_types'", "2 entries", "4"}},
      {"glm_tiny.json",
       [](json& j) {
         j["mlp_layer_types"] = {"dense", "moe", "sparse", "sparse"};
       },
       {"'mlp_layer_types[1]'", "moe"}},
      {"deepseek_v3_tiny.json",
       [](json& j) {
         j["mlp_layer_types"] = {"dense", "dense", "sparse", "sparse"};
       },
       {"'mlp_layer_types'", "first_k_dense_replace 1"}},
      {"glm_tiny.json",
       [](json& j) {
         j["indexer_types"] = {"full", "shared"};
       },
       {"'indexer_types'", "2 entries"}},
      {"glm_tiny.json",
       [](json& j) {
         j["indexer_types"] = {"full", "full", "half", "full"};
       },
       {"'indexer_types[2]'", "half"}},
      {"glm_tiny.json",
       [](json& j) {
         j["indexer_types"] = {"shared", "full", "full", "full"};
       },
       {"'indexer_types'", "layer 0"}},
      {"glm_tiny.json",
       [](json& j) {
         j.erase("indexer_types");
         j["index_topk_pattern"] = "FSX?";
       },
       {"'index_topk_pattern'", "'X'", "position 2"}},
      {"glm_tiny.json",
       [](json& j) {
         j.erase("indexer_types");
         j["index_topk_freq"] = 2;
         j["index_skip_topk_offset"] = 0;
       },
       {"index_topk_freq", "layer 0"}},
      {"glm_tiny.json", [](json& j) { j["first_k_dense_replace"] = 5; }, {"'first_k_dense_replace'", "5", "4"}},
      {"glm_tiny.json", [](json& j) { j["hidden_act"] = "gelu"; }, {"'hidden_act'", "gelu", "silu"}},
      {"glm_tiny.json", [](json& j) { j["scoring_func"] = "softmax"; }, {"'scoring_func'", "softmax", "sigmoid"}},
      {"glm_tiny.json", [](json& j) { j["topk_method"] = "greedy"; }, {"'topk_method'", "greedy"}},
      {"glm_tiny.json",
       [](json& j) { j["rope_parameters"]["rope_type"] = "linear"; },
       {"'rope_parameters.rope_type'", "linear", "default, yarn"}},
      {"deepseek_v32.json", [](json& j) { j["rope_scaling"]["type"] = "dynamic"; }, {"'rope_scaling.type'", "dynamic"}},
      {"glm_tiny.json", [](json& j) { j["rope_parameters"]["rope_type"] = "llama3"; }, {"llama3"}},
      {"glm_tiny.json", [](json& j) { j["rope_parameters"].erase("factor"); }, {"'rope_parameters.factor'", "missing"}},
      {"glm_tiny.json", [](json& j) { j["rope_parameters"]["factor"] = "4"; }, {"'rope_parameters.factor'", "number"}},
      {"glm_tiny.json", [](json& j) { j["rope_parameters"]["truncate"] = "yes"; }, {"'rope_parameters.truncate'"}},
      {"glm_tiny.json", [](json& j) { j["rope_parameters"] = "yarn"; }, {"'rope_parameters'", "object"}},
      {"glm_tiny.json", [](json& j) { j["rope_parameters"]["rope_theta"] = -1; }, {"rope_theta"}},
      {"glm_tiny.json",
       [](json& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.5; },
       {"'rope_parameters.partial_rotary_factor'"}},
      {"glm_tiny.json",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "default"}};
       },
       {"'rope_parameters' and 'rope_scaling'", "disagree"}},
      {"glm_tiny.json",
       [](json& j) { j["original_max_position_embeddings"] = 64; },
       {"original_max_position_embeddings", "64", "32"}},
      {"glm_tiny.json", [](json& j) { j["eos_token_id"] = "x"; }, {"'eos_token_id'"}},
      {"glm_tiny.json",
       [](json& j) {
         j["eos_token_id"] = {1, -3};
       },
       {"'eos_token_id'"}},
      {"glm_tiny.json", [](json& j) { j["norm_topk_prob"] = 1; }, {"'norm_topk_prob'", "true or false"}},
      {"glm_tiny.json", [](json& j) { j["rms_norm_eps"] = 0; }, {"'rms_norm_eps'"}},
      {"glm_tiny.json", [](json& j) { j["max_position_embeddings"] = 0; }, {"'max_position_embeddings'"}},
      {"glm_tiny.json", [](json& j) { j["quantization_config"] = "fp8"; }, {"'quantization_config'", "object"}},
      {"glm_tiny.json", [](json& j) { j["num_local_experts"] = 4; }, {"'num_local_experts'", "'n_routed_experts'"}},
      {"glm_tiny.json", [](json& j) { j["intermediate_size"] = nullptr; }, {"'intermediate_size'"}},
  };
  ASSERT_GE(cases.size(), 15u);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "case " << i);
    expect_error(mutate(cases[i].base, cases[i].fn), cases[i].needles);
  }
}

TEST(HfConfig, NotAnObjectAndBadJson) {
  try {
    parse_model_config("[1, 2]", "x/config.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x/config.json: top level must be a JSON object"), std::string::npos);
  }
  try {
    parse_model_config("{\n  \"hidden_size\": 12,\n  oops\n}", "x/config.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("x/config.json: invalid JSON"), std::string::npos) << msg;
    EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  }
}

TEST(HfConfig, LoadModelConfigFromDirectory) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(testing::TempDir()) / "latent_hf_config_test";
  fs::create_directories(dir);
  fs::copy_file(data_path("glm_tiny.json"), dir / "config.json", fs::copy_options::overwrite_existing);
  ModelConfig c = load_model_config(dir.string());
  EXPECT_EQ(c.arch, Arch::GlmMoeDsa);
  EXPECT_EQ(c.num_hidden_layers, 4);
  fs::remove_all(dir);

  try {
    load_model_config((dir / "nope").string());
    ADD_FAILURE();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find((dir / "nope" / "config.json").string()), std::string::npos) << msg;
  }

  // Errors name the full path of the file.
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": "abc"})";
  try {
    load_model_config(dir.string());
    ADD_FAILURE();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind((dir / "config.json").string() + ": field 'hidden_size'", 0), 0u) << msg;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace latent
