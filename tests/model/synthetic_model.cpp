#include "synthetic_model.h"

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "quant/float_formats.h"

namespace latent::testing {

namespace {

struct Tensor {
  std::vector<int64_t> shape;
  bool bf16 = false;
  std::vector<float> v;
};

class Writer {
 public:
  explicit Writer(uint64_t seed) : rng_(seed) {}
  void normal(const std::string& name, std::vector<int64_t> shape, double mean, double sd, bool bf16) {
    Tensor t;
    t.shape = std::move(shape);
    t.bf16 = bf16;
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    std::normal_distribution<double> nd(0.0, 1.0);
    t.v.resize(static_cast<size_t>(n));
    for (auto& x : t.v) x = static_cast<float>(mean + sd * nd(rng_));
    tensors_[name] = std::move(t);
  }
  void save(const std::string& path) const {
    nlohmann::json h = nlohmann::json::object();
    uint64_t off = 0;
    for (const auto& [name, t] : tensors_) {
      const uint64_t nb = t.v.size() * (t.bf16 ? 2 : 4);
      h[name] = {{"dtype", t.bf16 ? "BF16" : "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + nb}}};
      off += nb;
    }
    std::string hs = h.dump();
    while (hs.size() % 8) hs += ' ';
    std::ofstream f(path, std::ios::binary);
    uint64_t n = hs.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(hs.data(), static_cast<std::streamsize>(hs.size()));
    for (const auto& [name, t] : tensors_) {
      if (t.bf16) {
        for (float x : t.v) {
          uint16_t b = f32_to_bf16(x);
          f.write(reinterpret_cast<const char*>(&b), 2);
        }
      } else {
        f.write(reinterpret_cast<const char*>(t.v.data()), static_cast<std::streamsize>(t.v.size() * 4));
      }
    }
  }

 private:
  std::mt19937_64 rng_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace

std::string write_synthetic_model(const SyntheticSpec& s) {
  static int counter = 0;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() /
                       ("latent-synth-" + s.arch + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::create_directories(dir);
  const int64_t V = 96, D = 64, I = 96, Im = 32, L = 4, H = 4, dq = 48, dc = 32, dn = 32, dr = 16, dv = 24, E = 8;
  const int64_t nI = s.index_n_heads, dI = 32;
  const bool dsa = s.arch != "v3";
  nlohmann::json cfg = {{"vocab_size", V},
                        {"hidden_size", D},
                        {"intermediate_size", I},
                        {"moe_intermediate_size", Im},
                        {"num_hidden_layers", L},
                        {"num_attention_heads", H},
                        {"num_key_value_heads", H},
                        {"q_lora_rank", dq},
                        {"kv_lora_rank", dc},
                        {"qk_nope_head_dim", dn},
                        {"qk_rope_head_dim", dr},
                        {"v_head_dim", dv},
                        {"n_routed_experts", E},
                        {"n_shared_experts", 1},
                        {"num_experts_per_tok", 2},
                        {"n_group", 4},
                        {"topk_group", 2},
                        {"routed_scaling_factor", 2.5},
                        {"norm_topk_prob", true},
                        {"first_k_dense_replace", 1},
                        {"rms_norm_eps", 1e-5},
                        {"max_position_embeddings", 128},
                        {"tie_word_embeddings", false},
                        {"num_nextn_predict_layers", 0},
                        {"hidden_act", "silu"}};
  if (s.yarn)
    cfg["rope_parameters"] = {
        {"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}, {"original_max_position_embeddings", 32},
        {"beta_fast", 32.0},   {"beta_slow", 1.0},      {"mscale", 1.0}, {"mscale_all_dim", 0.8}};
  else
    cfg["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  if (s.arch == "glm") {
    cfg["architectures"] = {"GlmMoeDsaForCausalLM"};
    cfg["model_type"] = "glm_moe_dsa";
    cfg["indexer_types"] = {"full", "full", "shared", "full"};
  } else if (s.arch == "v32") {
    cfg["architectures"] = {"DeepseekV32ForCausalLM"};
    cfg["model_type"] = "deepseek_v32";
  } else {
    cfg["architectures"] = {"DeepseekV3ForCausalLM"};
    cfg["model_type"] = "deepseek_v3";
  }
  if (dsa) {
    cfg["index_n_heads"] = nI;
    cfg["index_head_dim"] = dI;
    cfg["index_topk"] = s.index_topk;
  }
  std::ofstream(dir / "config.json") << cfg.dump(1);

  Writer w(s.seed);
  const bool bw = s.bf16_weights;
  const double sd = 0.1;
  w.normal("model.embed_tokens.weight", {V, D}, 0, 1.0, bw);
  w.normal("model.norm.weight", {D}, 1, 0.2, false);
  w.normal("lm_head.weight", {V, D}, 0, sd, bw);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    w.normal(p + "input_layernorm.weight", {D}, 1, 0.2, false);
    w.normal(p + "post_attention_layernorm.weight", {D}, 1, 0.2, false);
    w.normal(a + "q_a_proj.weight", {dq, D}, 0, sd, bw);
    w.normal(a + "q_a_layernorm.weight", {dq}, 1, 0.2, false);
    w.normal(a + "q_b_proj.weight", {H * (dn + dr), dq}, 0, sd, bw);
    w.normal(a + "kv_a_proj_with_mqa.weight", {dc + dr, D}, 0, sd, bw);
    w.normal(a + "kv_a_layernorm.weight", {dc}, 1, 0.2, false);
    w.normal(a + "kv_b_proj.weight", {H * (dn + dv), dc}, 0, sd, bw);
    w.normal(a + "o_proj.weight", {D, H * dv}, 0, sd, bw);
    const bool own_indexer = dsa && !(s.arch == "glm" && l == 2);
    if (own_indexer) {
      const std::string ip = a + "indexer.";
      w.normal(ip + "wq_b.weight", {nI * dI, dq}, 0, sd, bw);
      w.normal(ip + "wk.weight", {dI, D}, 0, sd, bw);
      w.normal(ip + "weights_proj.weight", {nI, D}, 0, sd, bw);
      w.normal(ip + "k_norm.weight", {dI}, 1, 0.2, false);
      w.normal(ip + "k_norm.bias", {dI}, 0, 0.2, false);
    }
    const std::string m = p + "mlp.";
    auto mlp = [&](const std::string& q, int64_t inter) {
      w.normal(q + "gate_proj.weight", {inter, D}, 0, sd, bw);
      w.normal(q + "up_proj.weight", {inter, D}, 0, sd, bw);
      w.normal(q + "down_proj.weight", {D, inter}, 0, sd, bw);
    };
    if (l < 1) {
      mlp(m, I);
    } else {
      w.normal(m + "gate.weight", {E, D}, 0, sd, bw);
      w.normal(m + "gate.e_score_correction_bias", {E}, 0, 0.05, false);
      for (int64_t e = 0; e < E; ++e) mlp(m + "experts." + std::to_string(e) + ".", Im);
      mlp(m + "shared_experts.", Im);
    }
  }
  w.save((dir / "model.safetensors").string());
  return dir.string();
}

}  // namespace latent::testing
