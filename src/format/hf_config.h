// config.json of GlmMoeDsaForCausalLM (glm_moe_dsa), DeepseekV3ForCausalLM (deepseek_v3) and
// DeepseekV32ForCausalLM (deepseek_v32): every field of docs/model.md §config with the defaults transformers
// 5.17 applies, validated with named errors.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace latent {

enum class Arch { DeepseekV3, DeepseekV32, GlmMoeDsa };
const char* arch_name(Arch a);        // "DeepseekV3ForCausalLM", ...
const char* arch_model_type(Arch a);  // "deepseek_v3", ...

struct RopeConfig {
  std::string type = "default";  // "default" | "yarn"
  double theta = 10000.0;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0 = use max_position_embeddings (parse resolves it: never 0 after)
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;          // 0 = absent
  double mscale_all_dim = 0.0;  // 0 = absent
  std::optional<double> attention_factor;
  bool truncate = true;
};

struct ModelConfig {
  Arch arch = Arch::DeepseekV3;
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;            // D
  int64_t intermediate_size = 0;      // I (dense MLP)
  int64_t moe_intermediate_size = 0;  // Im
  int64_t num_hidden_layers = 0;      // L (MTP layers are extra)
  int64_t num_attention_heads = 0;    // H
  int64_t num_key_value_heads = 0;
  int64_t q_lora_rank = 0;       // dq (0 = no q LoRA; not supported by these archs -> error)
  int64_t kv_lora_rank = 0;      // dc
  int64_t qk_nope_head_dim = 0;  // dn
  int64_t qk_rope_head_dim = 0;  // dr
  int64_t v_head_dim = 0;        // dv
  int64_t n_routed_experts = 0;  // E
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;  // K
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  std::string scoring_func = "sigmoid";
  std::string topk_method = "noaux_tc";
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  std::vector<bool> layer_is_moe;  // resolved per layer (mlp_layer_types or first_k_dense_replace)
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  RopeConfig rope;
  bool rope_interleave = true;           // main MLA rope pairing
  bool indexer_rope_interleave = false;  // V3.2: half-split; GLM: interleaved
  bool attention_bias = false;
  bool tie_word_embeddings = false;
  int64_t num_nextn_predict_layers = 0;
  // DSA indexer (V3.2, GLM); index_n_heads == 0 means no indexer (V3).
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  std::vector<bool> layer_has_indexer;  // resolved per layer: own indexer ("full"); false = shared / none
  std::vector<int64_t> bos_token_ids, eos_token_ids;
  int64_t pad_token_id = -1;
  std::string torch_dtype;             // "bfloat16", ... (informational)
  nlohmann::json quantization_config;  // null when absent
  nlohmann::json raw;                  // the whole file
  std::vector<std::string> warnings;   // non-fatal findings (also logged at warn level), one line each

  bool has_indexer() const { return index_n_heads > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Softmax scale of MLA: qk_head_dim^-0.5 times yarn mscale(factor, mscale_all_dim)^2 (docs/model.md §yarn).
  double softmax_scale() const;
};

// ---- RoPE helpers (docs/model.md §RoPE, §yarn), computed in double. dim = qk_rope_head_dim. ----
// m(f, a) of yarn: 1 if scale <= 1 else 1 + 0.1·a·ln(scale).
double yarn_get_mscale(double scale, double mscale = 1.0);
// Yarn correction range [lo, hi] exactly as HF's find_correction_range returns it (floor/ceil when truncate,
// clamped to [0, dim-1]; the lo == hi → hi + 0.001 guard is NOT applied here). Throws for non-yarn configs.
struct YarnRange {
  double lo = 0, hi = 0;
};
YarnRange rope_yarn_range(const ModelConfig& c);
// inv_freq[i], i = 0..dim/2-1, in double (the mathematically exact values of docs/model.md §yarn).
std::vector<double> rope_inv_freq(const ModelConfig& c);
// inv_freq the way HF computes it: every tensor op in fp32 (exponent 2i/dim, pow, reciprocals, ramp) with the
// same operation order. Bit-exact with transformers 5.17 / torch CPU on the test configs (glibc powf).
std::vector<float> rope_inv_freq_f32(const ModelConfig& c);
// Factor multiplying cos and sin: rope.attention_factor if given, else m(f,mscale)/m(f,mscale_all_dim) when both
// are nonzero, else m(f,1); 1 for rope type "default".
double rope_attention_factor(const ModelConfig& c);

// Parses config.json text; `file` is used in messages. Throws latent::Error naming the field.
ModelConfig parse_model_config(const std::string& json_text, const std::string& file);
// Reads <dir>/config.json.
ModelConfig load_model_config(const std::string& dir);

}  // namespace latent
