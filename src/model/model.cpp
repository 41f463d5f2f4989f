#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace latent {

// ---------------------------------------------------------------------------------------------------------------
// KvCache
// ---------------------------------------------------------------------------------------------------------------
KvCache::KvCache(const ModelConfig& cfg)
    : layers_(static_cast<size_t>(cfg.num_hidden_layers)),
      has_index_(static_cast<size_t>(cfg.num_hidden_layers), false),
      dc_(cfg.kv_lora_rank),
      dr_(cfg.qk_rope_head_dim),
      di_(cfg.index_head_dim) {
  if (cfg.has_indexer())
    for (size_t l = 0; l < has_index_.size() && l < cfg.layer_has_indexer.size(); ++l)
      has_index_[l] = cfg.layer_has_indexer[l];
}

void KvCache::clear() { grow(0); }

void KvCache::truncate(int64_t n) {
  if (n < 0 || n > len_) fail("kv cache: cannot truncate {} tokens to {}", len_, n);
  grow(n);
}

void KvCache::grow(int64_t n) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    layers_[l].c.resize(static_cast<size_t>(n * dc_));
    layers_[l].k_pe.resize(static_cast<size_t>(n * dr_));
    if (has_index_[l]) layers_[l].index_k.resize(static_cast<size_t>(n * di_));
  }
  len_ = n;
}

// ---------------------------------------------------------------------------------------------------------------
// Model
// ---------------------------------------------------------------------------------------------------------------
KeySelection Model::Selection::view() const {
  if (dense) return {};
  return {sel.data(), count.data(), k};
}

Model::Model(const ModelConfig& cfg, const PrecisionPlan& plan, Backend& backend, ModelOptions opt)
    : cfg_(cfg), be_(backend), opt_(opt), w_(resolve_weights(cfg, plan)) {
  if (cfg.n_routed_experts > 0) {
    const int64_t E = cfg.n_routed_experts, G = std::max<int64_t>(1, cfg.n_group);
    if (E % G != 0) fail("config: n_routed_experts {} is not divisible by n_group {}", E, G);
    if (cfg.topk_group < 1 || cfg.topk_group > G)
      fail("config: topk_group {} must be in [1, n_group {}]", cfg.topk_group, G);
    if (cfg.num_experts_per_tok < 1 || cfg.num_experts_per_tok > E)
      fail("config: num_experts_per_tok {} must be in [1, n_routed_experts {}]", cfg.num_experts_per_tok, E);
    if (cfg.num_experts_per_tok > cfg.topk_group * (E / G))
      fail("config: num_experts_per_tok {} exceeds the experts of topk_group {} groups", cfg.num_experts_per_tok,
           cfg.topk_group);
  }
  if (cfg.hidden_act != "silu") fail("config: hidden_act '{}' is not supported (silu only)", cfg.hidden_act);
  if (cfg.has_indexer() && cfg.index_topk <= 0) fail("config: index_topk must be > 0 (got {})", cfg.index_topk);
  inv_freq_ = rope_inv_freq_f32(cfg);
  attention_factor_ = static_cast<float>(rope_attention_factor(cfg));
  softmax_scale_ = static_cast<float>(cfg.softmax_scale());
}

void Model::linear(const QuantWeight& w, const float* x, int64_t M, float* y, const std::vector<float>* bias) {
  be_.matmul(w, x, M, y);
  if (bias && !bias->empty())
    for (int64_t m = 0; m < M; ++m) be_.add(y + m * w.rows, bias->data(), w.rows, false);
  if (opt_.bf16_activations) be_.round_bf16(y, M * w.rows);
}

void Model::mlp(const MlpWeights& w, const float* x, int64_t S, int64_t inter, float* out) {
  std::vector<float> g(static_cast<size_t>(S * inter)), u(static_cast<size_t>(S * inter));
  linear(w.gate, x, S, g.data());
  linear(w.up, x, S, u.data());
  be_.silu_mul(g.data(), u.data(), S * inter, g.data(), opt_.bf16_activations);
  linear(w.down, g.data(), S, out);
}

void Model::moe(int64_t l, const MoeWeights& w, const float* x, int64_t S, float* out) {
  const int64_t D = cfg_.hidden_size, E = cfg_.n_routed_experts, K = cfg_.num_experts_per_tok;
  const int64_t Im = cfg_.moe_intermediate_size;
  const bool bf16 = opt_.bf16_activations;
  // Router in fp32 (never rounded, spec §8).
  std::vector<float> logits(static_cast<size_t>(S * E));
  be_.matmul(w.router, x, S, logits.data());
  RouterParams rp;
  rp.n_experts = E;
  rp.n_group = std::max<int64_t>(1, cfg_.n_group);
  rp.topk_group = cfg_.topk_group;
  rp.top_k = K;
  rp.norm_topk_prob = cfg_.norm_topk_prob;
  rp.routed_scaling_factor = static_cast<float>(cfg_.routed_scaling_factor);
  std::vector<int32_t> ids(static_cast<size_t>(S * K));
  std::vector<float> wts(static_cast<size_t>(S * K));
  if (opt_.force_decisions) {
    // Replay recorded expert ids; weights from this run's scores (sigmoid, normalized, scaled as in the router).
    const auto& rec = opt_.force_decisions->experts;
    if (static_cast<size_t>(l) >= rec.size() || rec[l].size() != ids.size())
      fail("forced decisions: layer {} has no recorded routing for {} tokens", l, S);
    ids = rec[l];
    for (int64_t s = 0; s < S; ++s) {
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = ids[s * K + k];
        if (e < 0 || e >= E) fail("forced decisions: expert id {} out of range", e);
        wts[s * K + k] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logits[s * E + e]))));
        sum += wts[s * K + k];
      }
      for (int64_t k = 0; k < K; ++k) {
        if (rp.norm_topk_prob) wts[s * K + k] /= sum + 1e-20f;
        wts[s * K + k] *= rp.routed_scaling_factor;
      }
    }
  } else {
    be_.router(logits.data(), w.score_bias.empty() ? nullptr : w.score_bias.data(), S, rp, ids.data(), wts.data());
  }
  if (opt_.record_decisions) opt_.record_decisions->experts[l] = ids;

  // Group the (token, slot) assignments by expert: ascending expert, then ascending token (HF eager order).
  std::vector<int64_t> offsets(static_cast<size_t>(E + 1), 0);
  for (int32_t e : ids) ++offsets[static_cast<size_t>(e) + 1];
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  const int64_t n = S * K;
  std::vector<int32_t> tok(static_cast<size_t>(n));
  std::vector<float> aw(static_cast<size_t>(n));
  {
    std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = ids[s * K + k];
        const int64_t at = fill[e]++;
        tok[at] = static_cast<int32_t>(s);
        aw[at] = wts[s * K + k];
      }
  }
  std::vector<float> xs(static_cast<size_t>(n * D));
  for (int64_t i = 0; i < n; ++i) std::memcpy(&xs[i * D], x + tok[i] * D, sizeof(float) * D);
  std::vector<const QuantWeight*> wg(static_cast<size_t>(E)), wu(static_cast<size_t>(E)), wd(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    wg[e] = &w.experts[e].gate;
    wu[e] = &w.experts[e].up;
    wd[e] = &w.experts[e].down;
  }
  std::vector<float> g(static_cast<size_t>(n * Im)), u(static_cast<size_t>(n * Im));
  be_.grouped_matmul(wg.data(), E, offsets.data(), xs.data(), g.data());
  be_.grouped_matmul(wu.data(), E, offsets.data(), xs.data(), u.data());
  if (bf16) {
    be_.round_bf16(g.data(), n * Im);
    be_.round_bf16(u.data(), n * Im);
  }
  be_.silu_mul(g.data(), u.data(), n * Im, g.data(), bf16);
  std::vector<float>& d = xs;  // reuse: [n, D]
  be_.grouped_matmul(wd.data(), E, offsets.data(), g.data(), d.data());
  if (bf16) be_.round_bf16(d.data(), n * D);
  std::fill(out, out + S * D, 0.0f);
  be_.scatter_add_weighted(d.data(), tok.data(), aw.data(), n, D, out, bf16);
  if (w.has_shared) {
    std::vector<float> sh(static_cast<size_t>(S * D));
    mlp(w.shared, x, S, Im * cfg_.n_shared_experts, sh.data());
    be_.add(out, sh.data(), S * D, bf16);
  }
}

void Model::indexer(int64_t l, const float* x, const float* cq, int64_t S, int64_t past, KvCache& cache,
                    const int64_t* pos, Selection& sel) {
  const IndexerWeights& iw = w_.layers[l].indexer;
  const int64_t nI = cfg_.index_n_heads, dI = cfg_.index_head_dim, T = past + S;
  const bool bf16 = opt_.bf16_activations;
  RopeParams rp{inv_freq_.data(), cfg_.qk_rope_head_dim, attention_factor_, cfg_.indexer_rope_interleave};

  // Key of the new tokens: LayerNorm(x·Wkᵀ), RoPE on the first dr dims; appended to the cache.
  float* kc = cache.layer(l).index_k.data() + past * dI;
  linear(iw.wk, x, S, kc);
  be_.layer_norm(kc, iw.k_norm_w.data(), iw.k_norm_b.data(), S, dI, 1e-6f, kc, bf16);
  be_.rope(kc, S, 1, dI, dI, pos, rp, bf16);

  if (opt_.force_decisions) {
    const auto& f = *opt_.force_decisions;
    if (static_cast<size_t>(l) >= f.index_sel.size()) fail("forced decisions: layer {} has no recorded selection", l);
    sel.dense = f.index_sel[l].empty();
    if (!sel.dense) {
      if (f.index_count[l].size() != static_cast<size_t>(S))
        fail("forced decisions: layer {} selection recorded for another number of tokens", l);
      sel.k = static_cast<int64_t>(f.index_sel[l].size()) / S;
      sel.sel = f.index_sel[l];
      sel.count = f.index_count[l];
      for (int32_t t : sel.sel)
        if (t < 0 || t >= T) fail("forced decisions: layer {} selects key {} outside [0, {})", l, t, T);
    }
    return;
  }
  // Dense when every query sees at most index_topk keys (spec §4.3): skip the scores.
  if (T <= cfg_.index_topk) {
    sel.dense = true;
    return;
  }
  std::vector<float> q(static_cast<size_t>(S * nI * dI));
  linear(iw.wq_b, cq, S, q.data());
  be_.rope(q.data(), S, nI, nI * dI, dI, pos, rp, bf16);
  std::vector<float> wts(static_cast<size_t>(S * nI));
  linear(iw.weights_proj, x, S, wts.data());
  const float head_scale = static_cast<float>(std::pow(static_cast<double>(nI), -0.5));
  for (float& v : wts) v *= head_scale;
  const float score_scale = static_cast<float>(std::pow(static_cast<double>(dI), -0.5));

  const int64_t k = cfg_.index_topk;
  sel.dense = false;
  sel.k = k;
  sel.sel.assign(static_cast<size_t>(S * k), 0);
  sel.count.assign(static_cast<size_t>(S), 0);
  // Score rows in blocks so that the [rows, T] score matrix stays bounded.
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(T, 1));
  std::vector<float> scores;
  for (int64_t s0 = 0; s0 < S; s0 += block) {
    const int64_t ns = std::min(block, S - s0);
    scores.resize(static_cast<size_t>(ns * T));
    be_.indexer_scores(q.data() + s0 * nI * dI, wts.data() + s0 * nI, cache.layer(l).index_k.data(), ns, T, nI, dI,
                       score_scale, pos + s0, scores.data());
    be_.topk_select(scores.data(), ns, T, k, pos + s0, sel.sel.data() + s0 * k, sel.count.data() + s0);
  }
}

void Model::attention(int64_t l, const float* x, int64_t S, int64_t past, KvCache& cache, const int64_t* pos,
                      Selection& sel, float* out) {
  const LayerWeights& lw = w_.layers[l];
  const AttentionWeights& aw = lw.attn;
  const int64_t H = cfg_.num_attention_heads, dn = cfg_.qk_nope_head_dim, dr = cfg_.qk_rope_head_dim;
  const int64_t dv = cfg_.v_head_dim, dc = cfg_.kv_lora_rank, dq = cfg_.q_lora_rank, dqk = dn + dr;
  const int64_t T = past + S;
  const bool bf16 = opt_.bf16_activations;
  RopeParams rp{inv_freq_.data(), dr, attention_factor_, cfg_.rope_interleave};

  // Query path: cq = RMSNorm(x·Wq_aᵀ) (eps 1e-6), q = cq·Wq_bᵀ [S, H, dn+dr].
  std::vector<float> cq(static_cast<size_t>(S * dq));
  linear(aw.q_a, x, S, cq.data(), &aw.q_a_bias);
  be_.rms_norm(cq.data(), aw.q_a_norm.data(), S, dq, 1e-6f, cq.data(), bf16);
  std::vector<float> q(static_cast<size_t>(S * H * dqk));
  linear(aw.q_b, cq.data(), S, q.data());
  be_.rope(q.data() + dn, S, H, H * dqk, dqk, pos, rp, bf16);

  // Latent path: [c ; k_pe] = x·Wkv_aᵀ; c normalized, k_pe rotated; both appended to the cache.
  std::vector<float> kv(static_cast<size_t>(S * (dc + dr)));
  linear(aw.kv_a, x, S, kv.data(), &aw.kv_a_bias);
  KvCache::Layer& cl = cache.layer(l);
  float* c_new = cl.c.data() + past * dc;
  float* kpe_new = cl.k_pe.data() + past * dr;
  for (int64_t s = 0; s < S; ++s) {
    std::memcpy(c_new + s * dc, &kv[s * (dc + dr)], sizeof(float) * dc);
    std::memcpy(kpe_new + s * dr, &kv[s * (dc + dr) + dc], sizeof(float) * dr);
  }
  be_.rms_norm(c_new, aw.kv_a_norm.data(), S, dc, 1e-6f, c_new, bf16);
  be_.rope(kpe_new, S, 1, dr, dr, pos, rp, bf16);

  // DSA selection: own indexer, shared (IndexShare: reuse `sel` of the previous indexer layer), or none.
  if (cfg_.has_indexer() && !opt_.disable_indexer) {
    if (lw.indexer.present) {
      indexer(l, x, cq.data(), S, past, cache, pos, sel);
      if (opt_.record_decisions) {
        opt_.record_decisions->index_sel[l] = sel.dense ? std::vector<int32_t>{} : sel.sel;
        opt_.record_decisions->index_count[l] = sel.dense ? std::vector<int32_t>{} : sel.count;
      }
    }
    // else: shared layer, `sel` holds the previous layer's selection.
  } else {
    sel.dense = true;
  }
  const KeySelection ks = sel.view();

  MlaDims md{H, dn, dr, dv, dc};
  std::vector<float> o(static_cast<size_t>(S * H * dv));
  const bool absorbed =
      opt_.attention == AttentionForm::Absorbed || (opt_.attention == AttentionForm::Auto && S == 1);
  if (absorbed) {
    be_.mla_attention_absorbed(md, q.data(), aw.kv_b, cl.c.data(), cl.k_pe.data(), S, T, pos, ks, softmax_scale_,
                               o.data(), bf16);
  } else {
    std::vector<float> kvb(static_cast<size_t>(T * H * (dn + dv)));
    linear(aw.kv_b, cl.c.data(), T, kvb.data());
    be_.mla_attention_naive(md, q.data(), kvb.data(), cl.k_pe.data(), S, T, pos, ks, softmax_scale_, o.data(), bf16);
  }
  linear(aw.o, o.data(), S, out, &aw.o_bias);
}

void Model::forward(std::span<const int32_t> ids, KvCache& cache, float* logits, bool all_rows,
                    std::vector<float>* hidden) {
  const int64_t S = static_cast<int64_t>(ids.size());
  if (S == 0) return;
  const int64_t V = cfg_.vocab_size;
  for (int32_t id : ids)
    if (id < 0 || id >= V) fail("token id {} is out of range [0, {})", id, V);
  const int64_t past = cache.length();
  cache.grow(past + S);
  try {
    forward_impl(ids, cache, past, logits, all_rows, hidden);
  } catch (...) {
    cache.grow(past);  // a failed call leaves the cache as it was
    throw;
  }
}

void Model::forward_impl(std::span<const int32_t> ids, KvCache& cache, int64_t past, float* logits, bool all_rows,
                         std::vector<float>* hidden) {
  const int64_t S = static_cast<int64_t>(ids.size());
  const int64_t D = cfg_.hidden_size, L = cfg_.num_hidden_layers;
  const bool bf16 = opt_.bf16_activations;
  std::vector<int64_t> pos(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) pos[s] = past + s;

  std::vector<float> h(static_cast<size_t>(S * D)), x(static_cast<size_t>(S * D)), y(static_cast<size_t>(S * D));
  be_.embedding(w_.embed, ids.data(), S, h.data());
  if (bf16) be_.round_bf16(h.data(), S * D);
  if (hidden) {
    hidden->assign(static_cast<size_t>((L + 1) * S * D), 0.0f);
    std::copy(h.begin(), h.end(), hidden->begin());
  }
  if (opt_.record_decisions) {
    *opt_.record_decisions = {};
    opt_.record_decisions->experts.resize(static_cast<size_t>(L));
    opt_.record_decisions->index_sel.resize(static_cast<size_t>(L));
    opt_.record_decisions->index_count.resize(static_cast<size_t>(L));
  }
  Selection sel;
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& lw = w_.layers[l];
    be_.rms_norm(h.data(), lw.input_norm.data(), S, D, static_cast<float>(cfg_.rms_norm_eps), x.data(), bf16);
    attention(l, x.data(), S, past, cache, pos.data(), sel, y.data());
    be_.add(h.data(), y.data(), S * D, bf16);
    be_.rms_norm(h.data(), lw.post_attn_norm.data(), S, D, static_cast<float>(cfg_.rms_norm_eps), x.data(), bf16);
    if (lw.is_moe)
      moe(l, lw.moe, x.data(), S, y.data());
    else
      mlp(lw.dense, x.data(), S, cfg_.intermediate_size, y.data());
    be_.add(h.data(), y.data(), S * D, bf16);
    if (hidden && l + 1 < L) std::copy(h.begin(), h.end(), hidden->begin() + (l + 1) * S * D);
  }
  be_.rms_norm(h.data(), w_.final_norm.data(), S, D, static_cast<float>(cfg_.rms_norm_eps), x.data(), bf16);
  if (hidden) std::copy(x.begin(), x.end(), hidden->begin() + L * S * D);
  if (logits) {
    // The head stays fp32 in bf16 mode (no rounding of the logits; top-1 ties would be artificial).
    if (all_rows)
      be_.matmul(w_.lm_head, x.data(), S, logits);
    else
      be_.matmul(w_.lm_head, x.data() + (S - 1) * D, 1, logits);
  }
}

std::vector<float> Model::logits(std::span<const int32_t> ids) {
  KvCache cache(cfg_);
  std::vector<float> out(static_cast<size_t>(ids.size() * cfg_.vocab_size));
  forward(ids, cache, out.data(), true);
  return out;
}

ModelFiles open_model_files(const std::string& dir, const PlanOptions& opt) {
  ModelFiles f;
  f.cfg = std::make_unique<ModelConfig>(load_model_config(dir));
  f.ckpt = std::make_unique<Checkpoint>(Checkpoint::open(dir));
  f.plan = std::make_unique<PrecisionPlan>(PrecisionPlan::build(*f.ckpt, *f.cfg, opt));
  return f;
}

}  // namespace latent
