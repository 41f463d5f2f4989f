// Per-layer weight structs of the MLA + MoE (+ DSA) architectures, resolved once from a PrecisionPlan.
// Linear weights are QuantWeight views into the memory-mapped checkpoint in their stored format (no copy, no
// upcast); only small per-channel vectors (norm weights, biases, router bias) are copied to fp32 (lossless).
#pragma once
#include <string>
#include <vector>

#include "format/hf_config.h"
#include "loader/precision_plan.h"
#include "quant/weight_format.h"

namespace latent {

struct MlpWeights {  // SwiGLU: down(silu(gate x) * up x)
  QuantWeight gate, up, down;
};

struct IndexerWeights {
  bool present = false;                   // false on V3 and on GLM IndexShare "shared" layers
  QuantWeight wq_b;                       // [nI*dI, dq]
  QuantWeight wk;                         // [dI, D]
  QuantWeight weights_proj;               // [nI, D]
  std::vector<float> k_norm_w, k_norm_b;  // [dI] LayerNorm
};

struct AttentionWeights {
  QuantWeight q_a;                                 // [dq, D]
  QuantWeight q_b;                                 // [H*(dn+dr), dq]
  QuantWeight kv_a;                                // [dc+dr, D]
  QuantWeight kv_b;                                // [H*(dn+dv), dc]
  QuantWeight o;                                   // [D, H*dv]
  std::vector<float> q_a_norm, kv_a_norm;          // [dq], [dc]
  std::vector<float> q_a_bias, kv_a_bias, o_bias;  // attention_bias only (else empty)
};

struct MoeWeights {
  QuantWeight router;               // [E, D]
  std::vector<float> score_bias;    // [E] e_score_correction_bias (empty if absent)
  std::vector<MlpWeights> experts;  // E
  bool has_shared = false;
  MlpWeights shared;
};

struct LayerWeights {
  std::vector<float> input_norm, post_attn_norm;  // [D]
  AttentionWeights attn;
  IndexerWeights indexer;
  bool is_moe = false;
  MlpWeights dense;  // !is_moe
  MoeWeights moe;    // is_moe
};

// A multi-token-prediction layer's own tensors (model.layers.{L+i}.*, tools/mtp_reference.py); its decoder block
// is ModelWeights::layers[L + i].
struct MtpWeights {
  std::vector<float> enorm, hnorm, head_norm;  // [D] enorm, hnorm, shared_head.norm
  QuantWeight eh_proj;                         // [D, 2D] over concat(enorm(embed), hnorm(hidden))
  QuantWeight embed;                           // [V, D] its embed_tokens, else the main embedding
  QuantWeight head;                            // [V, D] its shared_head.head, else the main lm_head
  bool own_embed = false, own_head = false;
};

struct ModelWeights {
  QuantWeight embed;                 // [V, D]
  std::vector<LayerWeights> layers;  // L decoder layers, then the decoder blocks of the MTP layers (if loaded)
  std::vector<float> final_norm;     // [D]
  QuantWeight lm_head;               // [V, D]
  std::vector<MtpWeights> mtp;       // the MTP layers loaded (PlanOptions::mtp_layers)
};

// Whether decoder layer l (l >= num_hidden_layers: an MTP layer) is MoE / has its own DSA indexer. MTP layers
// follow vLLM's rule (MoE when the model has routed experts and l >= first_k_dense_replace) and always have their
// own indexer on DSA models.
bool layer_is_moe(const ModelConfig& cfg, int64_t l);
bool layer_has_own_indexer(const ModelConfig& cfg, int64_t l);

// The tensors the forward pass of `cfg` needs (with mtp_layers MTP layers after the decoder layers) that the
// checkpoint lacks, in the order they are resolved (decoder layers first). Empty: every one is there.
std::vector<std::string> missing_tensors(const ModelConfig& cfg, const PrecisionPlan& plan, int64_t mtp_layers = 0);
// The check of load and `latent plan`: throws one latent::Error naming the checkpoint, how many tensors are missing
// and the first of them; with mtp_layers > 0 also when config.json announces fewer MTP layers.
void require_tensors(const ModelConfig& cfg, const PrecisionPlan& plan, int64_t mtp_layers = 0);

// Resolves every weight the forward pass needs and validates its shape against the config: require_tensors, then
// a latent::Error naming the tensor on a wrong shape. mtp_layers > 0 also resolves that many MTP layers (the plan
// must have been built with PlanOptions::mtp_layers >= mtp_layers).
ModelWeights resolve_weights(const ModelConfig& cfg, const PrecisionPlan& plan, int64_t mtp_layers = 0);

// A plain float tensor (F32/BF16/F16) as a QuantWeight [rows, cols] (e.g. the embedding table).
QuantWeight plain_weight(const TensorView& t, const std::string& name);
// A 1-D float tensor copied to fp32 (exact for f32/bf16/f16).
std::vector<float> to_f32_vector(const TensorView& t, const std::string& name);

}  // namespace latent
