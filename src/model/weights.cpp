#include "model/weights.h"

#include <fmt/format.h>

#include <cstring>

#include "core/error.h"
#include "quant/float_formats.h"

namespace latent {

QuantWeight plain_weight(const TensorView& t, const std::string& name) {
  if (t.shape.ndim != 2) fail("tensor '{}': expected 2 dimensions, got shape {}", name, t.shape.str());
  QuantWeight w;
  switch (t.dtype) {
    case DType::F32: w.format = WeightFormat::F32; break;
    case DType::BF16: w.format = WeightFormat::BF16; break;
    case DType::F16: w.format = WeightFormat::F16; break;
    default: fail("tensor '{}': dtype {} is not a plain float (f32/bf16/f16)", name, dtype_name(t.dtype));
  }
  w.rows = t.shape[0];
  w.cols = t.shape[1];
  w.data = t.data;
  return w;
}

std::vector<float> to_f32_vector(const TensorView& t, const std::string& name) {
  if (t.shape.ndim != 1) fail("tensor '{}': expected 1 dimension, got shape {}", name, t.shape.str());
  const int64_t n = t.shape[0];
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* p = t.bytes();
  for (int64_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::F32: std::memcpy(&out[i], p + 4 * i, 4); break;
      case DType::BF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_f32(h);
        break;
      }
      case DType::F16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = f16_to_f32(h);
        break;
      }
      default: fail("tensor '{}': dtype {} is not a plain float (f32/bf16/f16)", name, dtype_name(t.dtype));
    }
  }
  return out;
}

namespace {

// Resolves one tensor at a time. With `missing` set it only records the tensors the plan lacks (and resolves
// nothing), so the same walk over the config (walk_weights) both lists what is missing and resolves.
struct Resolver {
  const ModelConfig& cfg;
  const PrecisionPlan& plan;
  std::vector<std::string>* missing = nullptr;

  bool note_absent(const std::string& name) const {
    if (!missing) return false;
    if (!plan.has(name)) missing->push_back(name);
    return true;
  }
  QuantWeight linear(const std::string& module, int64_t rows, int64_t cols) const {
    if (note_absent(module + ".weight")) return {};
    const QuantWeight& w = plan.linear(module);
    if (w.rows != rows || w.cols != cols)
      fail("tensor '{}.weight': shape [{}, {}], expected [{}, {}] from config.json", module, w.rows, w.cols, rows,
           cols);
    return w;
  }
  std::vector<float> vec(const std::string& name, int64_t n) const {
    if (note_absent(name)) return {};
    std::vector<float> v = to_f32_vector(plan.tensor(name), name);
    if (static_cast<int64_t>(v.size()) != n)
      fail("tensor '{}': shape [{}], expected [{}] from config.json", name, v.size(), n);
    return v;
  }
  QuantWeight table(const std::string& name, int64_t rows, int64_t cols) const {  // an embedding table [V, D]
    if (note_absent(name)) return {};
    QuantWeight w = plain_weight(plan.tensor(name), name);
    if (w.rows != rows || w.cols != cols)
      fail("tensor '{}': shape [{}, {}], expected [{}, {}]", name, w.rows, w.cols, rows, cols);
    return w;
  }
  MlpWeights mlp(const std::string& p, int64_t inter) const {
    const int64_t D = cfg.hidden_size;
    return {linear(p + "gate_proj", inter, D), linear(p + "up_proj", inter, D), linear(p + "down_proj", D, inter)};
  }
};

}  // namespace

bool layer_is_moe(const ModelConfig& cfg, int64_t l) {
  if (l < static_cast<int64_t>(cfg.layer_is_moe.size())) return cfg.layer_is_moe[static_cast<size_t>(l)];
  return cfg.n_routed_experts > 0 && l >= cfg.first_k_dense_replace;
}

bool layer_has_own_indexer(const ModelConfig& cfg, int64_t l) {
  if (!cfg.has_indexer()) return false;
  if (l < cfg.num_hidden_layers) return cfg.layer_has_indexer[static_cast<size_t>(l)];
  return true;
}

namespace {

// The same format, shape and bytes (codes and scales): the same linear map.
bool same_weight_bytes(const QuantWeight& a, const QuantWeight& b) {
  if (!a.data || !b.data || a.format != b.format || a.rows != b.rows || a.cols != b.cols || a.fnuz != b.fnuz ||
      a.block_rows != b.block_rows || a.block_cols != b.block_cols || (a.scale == nullptr) != (b.scale == nullptr))
    return false;
  if (a.data != b.data && std::memcmp(a.data, b.data, static_cast<size_t>(a.rows * a.row_bytes())) != 0) return false;
  if (!a.scale || a.scale == b.scale) return true;
  size_t scale_bytes = 0;
  switch (a.format) {
    case WeightFormat::MXFP4: scale_bytes = static_cast<size_t>(a.rows * a.scale_cols()); break;
    case WeightFormat::FP8_E4M3_BLOCK:
      scale_bytes = sizeof(float) * static_cast<size_t>(((a.rows + a.block_rows - 1) / a.block_rows) * a.scale_cols());
      break;
    case WeightFormat::FP8_E4M3_CHANNEL: scale_bytes = sizeof(float) * static_cast<size_t>(a.rows); break;
    case WeightFormat::FP8_E4M3_TENSOR: scale_bytes = sizeof(float); break;
    default: return false;  // a scale this function does not know the size of: not proven equal
  }
  return std::memcmp(a.scale, b.scale, scale_bytes) == 0;
}

// Every tensor the forward pass of `cfg` needs, in order: the embedding, final norm and lm_head, then per decoder
// layer (and per MTP layer, l >= num_hidden_layers) its norms, attention, indexer and MLP / experts.
ModelWeights walk_weights(const Resolver& r, int64_t mtp_layers) {
  const ModelConfig& cfg = r.cfg;
  const PrecisionPlan& plan = r.plan;
  const int64_t D = cfg.hidden_size, H = cfg.num_attention_heads, dq = cfg.q_lora_rank, dc = cfg.kv_lora_rank;
  const int64_t dn = cfg.qk_nope_head_dim, dr = cfg.qk_rope_head_dim, dv = cfg.v_head_dim, V = cfg.vocab_size;
  ModelWeights mw;
  mw.embed = r.table("model.embed_tokens.weight", V, D);
  mw.final_norm = r.vec("model.norm.weight", D);
  if (plan.has("lm_head.weight") || !cfg.tie_word_embeddings)
    mw.lm_head = r.linear("lm_head", V, D);
  else
    mw.lm_head = mw.embed;

  const int64_t L = cfg.num_hidden_layers;
  for (int64_t l = 0; l < L + mtp_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const std::string a = p + "self_attn.";
    LayerWeights lw;
    lw.input_norm = r.vec(p + "input_layernorm.weight", D);
    lw.post_attn_norm = r.vec(p + "post_attention_layernorm.weight", D);
    AttentionWeights& at = lw.attn;
    at.q_a = r.linear(a + "q_a_proj", dq, D);
    at.q_b = r.linear(a + "q_b_proj", H * (dn + dr), dq);
    at.kv_a = r.linear(a + "kv_a_proj_with_mqa", dc + dr, D);
    at.kv_b = r.linear(a + "kv_b_proj", H * (dn + dv), dc);
    at.o = r.linear(a + "o_proj", D, H * dv);
    at.q_a_norm = r.vec(a + "q_a_layernorm.weight", dq);
    at.kv_a_norm = r.vec(a + "kv_a_layernorm.weight", dc);
    if (cfg.attention_bias) {
      at.q_a_bias = r.vec(a + "q_a_proj.bias", dq);
      at.kv_a_bias = r.vec(a + "kv_a_proj_with_mqa.bias", dc + dr);
      at.o_bias = r.vec(a + "o_proj.bias", D);
    }
    if (layer_has_own_indexer(cfg, l)) {
      const std::string ip = a + "indexer.";
      const int64_t nI = cfg.index_n_heads, dI = cfg.index_head_dim;
      IndexerWeights& iw = lw.indexer;
      iw.present = true;
      iw.wq_b = r.linear(ip + "wq_b", nI * dI, dq);
      iw.wk = r.linear(ip + "wk", dI, D);
      iw.weights_proj = r.linear(ip + "weights_proj", nI, D);
      iw.k_norm_w = r.vec(ip + "k_norm.weight", dI);
      iw.k_norm_b = r.vec(ip + "k_norm.bias", dI);
    }
    lw.is_moe = layer_is_moe(cfg, l);
    const std::string m = p + "mlp.";
    if (!lw.is_moe) {
      lw.dense = r.mlp(m, cfg.intermediate_size);
    } else {
      const int64_t E = cfg.n_routed_experts, Im = cfg.moe_intermediate_size;
      lw.moe.router = r.linear(m + "gate", E, D);
      if (plan.has(m + "gate.e_score_correction_bias"))  // optional: no bias means plain top-k on the scores
        lw.moe.score_bias = r.vec(m + "gate.e_score_correction_bias", E);
      lw.moe.experts.reserve(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) lw.moe.experts.push_back(r.mlp(fmt::format("{}experts.{}.", m, e), Im));
      if (cfg.n_shared_experts > 0) {
        lw.moe.has_shared = true;
        lw.moe.shared = r.mlp(m + "shared_experts.", Im * cfg.n_shared_experts);
      }
    }
    mw.layers.push_back(std::move(lw));
    if (l < L) continue;
    MtpWeights mt;
    mt.enorm = r.vec(p + "enorm.weight", D);
    mt.hnorm = r.vec(p + "hnorm.weight", D);
    mt.head_norm = r.vec(p + "shared_head.norm.weight", D);
    mt.eh_proj = r.linear(p + "eh_proj", D, 2 * D);
    mt.own_embed = plan.has(p + "embed_tokens.weight");  // optional: else the main embedding
    mt.embed = mt.own_embed ? r.table(p + "embed_tokens.weight", V, D) : mw.embed;
    mt.own_head = plan.has(p + "shared_head.head.weight");  // optional: else the main lm_head
    mt.head = mt.own_head ? r.linear(p + "shared_head.head", V, D) : mw.lm_head;
    // A head stored as a byte-identical copy of lm_head (DeepSeek-V3, GLM-5 and the demo store one) is the same
    // linear map: the main lm_head serves both (one copy in memory and in the caches; the draft's head then reads
    // the rows the verify step just read).
    if (mt.own_head && same_weight_bytes(mt.head, mw.lm_head)) {
      mt.head = mw.lm_head;
      mt.own_head = false;
    }
    mw.mtp.push_back(std::move(mt));
  }
  return mw;
}

}  // namespace

std::vector<std::string> missing_tensors(const ModelConfig& cfg, const PrecisionPlan& plan, int64_t mtp_layers) {
  std::vector<std::string> missing;
  walk_weights(Resolver{cfg, plan, &missing}, mtp_layers);
  return missing;
}

void require_tensors(const ModelConfig& cfg, const PrecisionPlan& plan, int64_t mtp_layers) {
  const int64_t L = cfg.num_hidden_layers;
  if (mtp_layers > 0 && cfg.num_nextn_predict_layers < mtp_layers)
    fail(
        "speculative decoding (method mtp): the checkpoint has no MTP layer (config.json num_nextn_predict_layers "
        "{}, {} needed)",
        cfg.num_nextn_predict_layers, mtp_layers);
  const std::vector<std::string> missing = missing_tensors(cfg, plan, mtp_layers);
  if (missing.empty()) return;
  const std::string& first = missing.front();
  const size_t n = missing.size();
  // Names are listed main layers first, so a first name in layer >= L means only MTP tensors are missing.
  const std::string mtp_prefix = fmt::format("model.layers.{}.", L);
  const bool mtp_only = mtp_layers > 0 && first.compare(0, mtp_prefix.size(), mtp_prefix) == 0;
  fail("{}: {} tensor{} that config.json implies {} missing from the checkpoint, the first '{}'{}", plan.dir(), n,
       n == 1 ? "" : "s", n == 1 ? "is" : "are", first,
       mtp_only ? fmt::format(" (speculative decoding (method mtp) needs MTP layer {}, announced by config.json "
                              "num_nextn_predict_layers {})",
                              L, cfg.num_nextn_predict_layers)
                : std::string());
}

ModelWeights resolve_weights(const ModelConfig& cfg, const PrecisionPlan& plan, int64_t mtp_layers) {
  const int64_t dq = cfg.q_lora_rank, dr = cfg.qk_rope_head_dim;
  if (dq <= 0) fail("config: q_lora_rank must be > 0 for {} (got {})", cfg.model_type, dq);
  if (dr % 2 != 0) fail("config: qk_rope_head_dim must be even (got {})", dr);
  if (cfg.has_indexer() && dr > cfg.index_head_dim)
    fail("config: qk_rope_head_dim {} exceeds index_head_dim {}", dr, cfg.index_head_dim);
  require_tensors(cfg, plan, mtp_layers);
  return walk_weights(Resolver{cfg, plan}, mtp_layers);
}

}  // namespace latent
