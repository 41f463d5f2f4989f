// Model: the forward pass of GlmMoeDsaForCausalLM / DeepseekV3ForCausalLM / DeepseekV32ForCausalLM
// (shared/spec/model.md §3–§6) written over Backend ops, with the latent KV cache (§3.4) and the DSA indexer key
// cache (§4). MTP layers (index >= num_hidden_layers) are not part of the forward pass.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "loader/precision_plan.h"
#include "model/weights.h"

namespace latent {

enum class AttentionForm {
  Auto,      // naive (expanded K/V) when a call processes > 1 token, weight-absorbed for single-token decode
  Naive,     // always the naive form (spec §3.2)
  Absorbed,  // always the weight-absorbed form over the latent cache (spec §3.4)
};

// The discrete decisions of one forward call, per layer: routed expert ids [S, K] (empty on dense layers) and the
// DSA selection [S, index_topk] + counts [S] (empty = dense / no own indexer). Diagnostics (spec §8): recording
// them in one run (e.g. fp32) and forcing them in another (e.g. bf16) separates numeric error from flipped
// decisions.
struct ForwardDecisions {
  std::vector<std::vector<int32_t>> experts;
  std::vector<std::vector<int32_t>> index_sel, index_count;
};

struct ModelOptions {
  bool bf16_activations = false;  // round activations to bf16 where HF bf16 runs do (spec §8)
  bool disable_indexer = false;   // dense causal MLA on DSA layers (diagnostic: equals DSA when T <= index_topk)
  AttentionForm attention = AttentionForm::Auto;
  // Diagnostics: fill *record_decisions during forward(); or replay *force_decisions (recorded by a call with the
  // same tokens and cache length) instead of routing / top-k selection. Routing weights are still computed from
  // this run's router logits.
  ForwardDecisions* record_decisions = nullptr;
  const ForwardDecisions* force_decisions = nullptr;
};

// Per-sequence cache: per layer the latent c (after kv_a_layernorm) [T, dc] and k_pe (after RoPE) [T, dr], plus the
// indexer keys (after LayerNorm and RoPE) [T, dI] on layers with their own indexer.
class KvCache {
 public:
  explicit KvCache(const ModelConfig& cfg);
  int64_t length() const { return len_; }
  void clear();
  // Keeps the first n tokens (n <= length()).
  void truncate(int64_t n);

  struct Layer {
    std::vector<float> c, k_pe, index_k;
  };
  Layer& layer(int64_t l) { return layers_[static_cast<size_t>(l)]; }
  const Layer& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  int64_t latent_dim() const { return dc_; }
  int64_t rope_dim() const { return dr_; }
  int64_t index_dim() const { return di_; }

 private:
  friend class Model;
  void grow(int64_t new_len);  // resize every layer to new_len tokens and set length
  std::vector<Layer> layers_;
  std::vector<bool> has_index_;
  int64_t dc_ = 0, dr_ = 0, di_ = 0;
  int64_t len_ = 0;
};

class Model {
 public:
  // cfg and plan must outlive the model (weights point into the plan's memory-mapped checkpoint).
  Model(const ModelConfig& cfg, const PrecisionPlan& plan, Backend& backend, ModelOptions opt = {});

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opt_; }
  void set_options(const ModelOptions& o) { opt_ = o; }
  Backend& backend() { return be_; }
  const ModelWeights& weights() const { return w_; }

  // Runs ids at positions cache.length() .. cache.length()+S-1 and appends them to the cache.
  // logits: [S, V] (all_rows) or [1, V] (only the last token), nullptr for none.
  // hidden: if non-null, resized to [L+1, S, D] with HF's hidden_states convention: entry 0 = embeddings,
  //   entry i (1..L-1) = output of decoder layer i-1, entry L = final-norm output.
  void forward(std::span<const int32_t> ids, KvCache& cache, float* logits, bool all_rows = true,
               std::vector<float>* hidden = nullptr);

  // Convenience: a prefill from an empty cache returning [S, V] logits.
  std::vector<float> logits(std::span<const int32_t> ids);

 private:
  struct Selection {  // DSA top-k of the current call; dense when empty
    bool dense = true;
    int64_t k = 0;
    std::vector<int32_t> sel, count;
    KeySelection view() const;
  };
  void forward_impl(std::span<const int32_t> ids, KvCache& cache, int64_t past, float* logits, bool all_rows,
                    std::vector<float>* hidden);
  void attention(int64_t l, const float* x, int64_t S, int64_t past, KvCache& cache, const int64_t* pos,
                 Selection& sel, float* out);
  void indexer(int64_t l, const float* x, const float* cq, int64_t S, int64_t past, KvCache& cache,
               const int64_t* pos, Selection& sel);
  void mlp(const MlpWeights& w, const float* x, int64_t S, int64_t inter, float* out);
  void moe(int64_t l, const MoeWeights& w, const float* x, int64_t S, float* out);
  void linear(const QuantWeight& w, const float* x, int64_t M, float* y, const std::vector<float>* bias = nullptr);

  const ModelConfig& cfg_;
  Backend& be_;
  ModelOptions opt_;
  ModelWeights w_;
  std::vector<float> inv_freq_;
  float attention_factor_ = 1.0f;
  float softmax_scale_ = 1.0f;
};

// Everything needed to run a model directory: the mapped checkpoint, its config and precision plan.
struct ModelFiles {
  std::unique_ptr<Checkpoint> ckpt;
  std::unique_ptr<ModelConfig> cfg;
  std::unique_ptr<PrecisionPlan> plan;
};
ModelFiles open_model_files(const std::string& dir, const PlanOptions& opt = {});

}  // namespace latent
