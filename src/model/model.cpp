#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "backend/sample_reference.h"
#include "core/error.h"
#include "model/model_internal.h"
#include "quant/float_formats.h"

namespace latent {

// ---------------------------------------------------------------------------------------------------------------
// Construction: weights prepared by the backend, small vectors uploaded once.
// ---------------------------------------------------------------------------------------------------------------
Model::Model(const ModelConfig& cfg, const PrecisionPlan& plan, Backend& backend, ModelOptions opt,
             const RankContext& rank)
    : cfg_(cfg),
      be_(backend),
      opt_(opt),
      act_(opt.bf16_activations ? DType::BF16 : DType::F32),
      w_(resolve_weights(cfg, plan, opt.mtp_layers)),
      rank_(rank) {
  if (opt.mtp_layers > 1) fail("speculative decoding: {} MTP layers asked for; one is supported", opt.mtp_layers);
  // Declared FP8 activations: one rank only (a rank's slice of a row-split weight would quantize its own slice of
  // x; the group boundaries are not checked against the split yet).
  if (opt.act_fp8_declared && rank.parallel.active())
    fail("--activations declared needs a single-rank model (no --tensor-parallel-size / --expert-parallel) for now");
  act_fp8_.pow2_scale = plan.act_fp8_pow2();
  if (rank.parallel.active() && opt.mtp_layers > 0)
    fail("speculative decoding (MTP) needs a single-rank model (no --tensor-parallel-size / --expert-parallel)");
  if (rank.parallel.active()) {
    if (!rank.comm || rank.comm->size() != rank.parallel.ranks || rank.comm->rank() != rank.rank)
      fail("model: rank {} of {} needs a communicator of that rank and size", rank.rank, rank.parallel.ranks);
    sd_ = shard_dims(cfg, rank.parallel, rank.rank, w_);
    shard_weights(cfg, rank.parallel, rank.rank, sd_, w_, &shard_store_);
  } else {
    rank_ = RankContext{};
    sd_ = shard_dims(cfg, rank_.parallel, 0, w_);
  }
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
  attention_factor_ = static_cast<float>(rope_attention_factor(cfg));
  softmax_scale_ = static_cast<float>(cfg.softmax_scale());
  // Upload progress on a device backend: the bytes of every weight, as stored.
  uint64_t up_total = 0, up_done = 0, up_last = 0;
  const bool report = opt_.upload_progress && be_.device() != Device::Cpu;
  auto bytes_of = [](const QuantWeight& q) { return q.data ? static_cast<uint64_t>(q.rows * q.row_bytes()) : 0u; };
  if (report) {
    for (const QuantWeight* q : {&w_.embed, &w_.lm_head}) up_total += bytes_of(*q);
    for (const MtpWeights& mt : w_.mtp) {
      up_total += bytes_of(mt.eh_proj);
      if (mt.own_embed) up_total += bytes_of(mt.embed);
      if (mt.own_head) up_total += bytes_of(mt.head);
    }
    for (const LayerWeights& lw : w_.layers) {
      for (const QuantWeight* q : {&lw.attn.q_a, &lw.attn.q_b, &lw.attn.kv_a, &lw.attn.kv_b, &lw.attn.o})
        up_total += bytes_of(*q);
      if (lw.indexer.present)
        for (const QuantWeight* q : {&lw.indexer.wq_b, &lw.indexer.wk, &lw.indexer.weights_proj})
          up_total += bytes_of(*q);
      auto mlp_bytes = [&](const MlpWeights& m) { return bytes_of(m.gate) + bytes_of(m.up) + bytes_of(m.down); };
      if (lw.is_moe) {
        up_total += bytes_of(lw.moe.router);
        for (const auto& e : lw.moe.experts) up_total += mlp_bytes(e);
        if (lw.moe.has_shared) up_total += mlp_bytes(lw.moe.shared);
      } else {
        up_total += mlp_bytes(lw.dense);
      }
    }
  }
  try {
    inv_freq_ = upload_vector(rope_inv_freq_f32(cfg), "rope inv_freq");
    auto prep = [&](QuantWeight& q) {
      if (!q.data) return;
      const uint64_t n = bytes_of(q);
      q = be_.prepare_weight(q);
      if (!report) return;
      up_done += n;
      if (up_done - up_last > up_total / 200 || up_done == up_total) {
        up_last = up_done;
        opt_.upload_progress(up_done, up_total);
      }
    };
    prep(w_.embed);
    prep(w_.lm_head);
    final_norm_ = upload_vector(w_.final_norm, "model.norm.weight");
    lp_.resize(w_.layers.size());
    for (size_t l = 0; l < w_.layers.size(); ++l) {
      LayerWeights& lw = w_.layers[l];
      LayerParams& p = lp_[l];
      p.input_norm = upload_vector(lw.input_norm, "input_layernorm");
      p.post_attn_norm = upload_vector(lw.post_attn_norm, "post_attention_layernorm");
      AttentionWeights& a = lw.attn;
      for (QuantWeight* q : {&a.q_a, &a.q_b, &a.kv_a, &a.kv_b, &a.o}) prep(*q);
      p.q_a_norm = upload_vector(a.q_a_norm, "q_a_layernorm");
      p.kv_a_norm = upload_vector(a.kv_a_norm, "kv_a_layernorm");
      p.q_a_bias = upload_vector(a.q_a_bias, "q_a_proj.bias");
      p.kv_a_bias = upload_vector(a.kv_a_bias, "kv_a_proj_with_mqa.bias");
      if (!rank_.parallel.tensor || rank_.rank == 0) p.o_bias = upload_vector(a.o_bias, "o_proj.bias");
      if (lw.indexer.present) {
        IndexerWeights& iw = lw.indexer;
        for (QuantWeight* q : {&iw.wq_b, &iw.wk, &iw.weights_proj}) prep(*q);
        p.k_norm_w = upload_vector(iw.k_norm_w, "indexer.k_norm.weight");
        p.k_norm_b = upload_vector(iw.k_norm_b, "indexer.k_norm.bias");
      }
      auto prep_mlp = [&](MlpWeights& m) {
        prep(m.gate);
        prep(m.up);
        prep(m.down);
      };
      if (lw.is_moe) {
        prep(lw.moe.router);
        p.score_bias = upload_vector(lw.moe.score_bias, "e_score_correction_bias");
        for (auto& e : lw.moe.experts) prep_mlp(e);
        if (lw.moe.has_shared) prep_mlp(lw.moe.shared);
      } else {
        prep_mlp(lw.dense);
      }
    }
    for (MtpWeights& mt : w_.mtp) {
      prep(mt.eh_proj);
      if (mt.own_embed)
        prep(mt.embed);
      else
        mt.embed = w_.embed;
      if (mt.own_head)
        prep(mt.head);
      else
        mt.head = w_.lm_head;
      mtp_p_.push_back({upload_vector(mt.enorm, "enorm"), upload_vector(mt.hnorm, "hnorm"),
                        upload_vector(mt.head_norm, "shared_head.norm")});
    }
    build_block_args();
  } catch (...) {
    for (void* q : owned_) be_.dealloc(q);
    owned_.clear();
    throw;
  }
}

void Model::build_block_args() {
  const int64_t L = static_cast<int64_t>(w_.layers.size());  // (the MTP layer, when loaded, is index L of the config)
  mla_.assign(static_cast<size_t>(L), MlaLayer{});
  moe_.assign(static_cast<size_t>(L), MoeLayer{});
  expert_tables_.assign(static_cast<size_t>(L), {});
  const RopeParams rp{inv_freq_, cfg_.qk_rope_head_dim, attention_factor_, cfg_.rope_interleave};
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& lw = w_.layers[l];
    const LayerParams& p = lp_[static_cast<size_t>(l)];
    MlaLayer& a = mla_[static_cast<size_t>(l)];
    a.d = MlaDims{sd_.heads, cfg_.qk_nope_head_dim, cfg_.qk_rope_head_dim, cfg_.v_head_dim, cfg_.kv_lora_rank};
    a.q_lora = cfg_.q_lora_rank;
    a.q_a = &lw.attn.q_a;
    a.q_b = &lw.attn.q_b;
    a.kv_a = &lw.attn.kv_a;
    a.kv_b = &lw.attn.kv_b;
    a.q_a_norm = p.q_a_norm;
    a.kv_a_norm = p.kv_a_norm;
    a.q_a_bias = p.q_a_bias;
    a.kv_a_bias = p.kv_a_bias;
    a.norm_eps = 1e-6f;
    a.rope = rp;
    a.softmax_scale = softmax_scale_;
    a.act = act_fp8();
    if (!lw.is_moe) continue;
    MoeLayer& m = moe_[static_cast<size_t>(l)];
    const int64_t E = cfg_.n_routed_experts;
    m.router.n_experts = E;
    m.router.n_group = std::max<int64_t>(1, cfg_.n_group);
    m.router.topk_group = cfg_.topk_group;
    m.router.top_k = cfg_.num_experts_per_tok;
    m.router.norm_topk_prob = cfg_.norm_topk_prob;
    m.router.routed_scaling_factor = static_cast<float>(cfg_.routed_scaling_factor);
    m.gate = &lw.moe.router;
    m.score_bias = p.score_bias;
    std::vector<const QuantWeight*>& t = expert_tables_[static_cast<size_t>(l)];
    t.resize(static_cast<size_t>(3 * E));
    for (int64_t e = 0; e < E; ++e) {
      t[e] = lw.moe.experts[e].gate.data ? &lw.moe.experts[e].gate : nullptr;
      t[E + e] = lw.moe.experts[e].up.data ? &lw.moe.experts[e].up : nullptr;
      t[2 * E + e] = lw.moe.experts[e].down.data ? &lw.moe.experts[e].down : nullptr;
    }
    m.w_gate = t.data();
    m.w_up = t.data() + E;
    m.w_down = t.data() + 2 * E;
    m.expert0 = sd_.expert0;
    m.expert1 = sd_.expert1;
    m.inter = sd_.moe_inter;
    if (lw.moe.has_shared) {
      m.shared_gate = &lw.moe.shared.gate;
      m.shared_up = &lw.moe.shared.up;
      m.shared_down = &lw.moe.shared.down;
      m.shared_inter = sd_.shared_inter;
    }
    m.act = act_fp8();
  }
}

void Model::set_options(const ModelOptions& o) {
  drop_graphs();
  if (o.act_fp8_declared != opt_.act_fp8_declared)  // the workspace holds the quantization scratch only when on
    fail("model: act_fp8_declared is fixed at construction");
  opt_ = o;
}

Model::~Model() {
  try {
    drop_graphs();
  } catch (...) {  // a lost device context: the graphs are gone with it
  }
  for (void* p : owned_) be_.dealloc(p);
  if (smp_buf_) be_.dealloc(smp_buf_);
  if (smp_banned_) be_.dealloc(smp_banned_);
  for (void* p : {kept_, mtp_prev_, static_cast<void*>(mtp_ids_dev_), static_cast<void*>(mtp_params_dev_),
                  static_cast<void*>(dstep_buf_)})
    if (p) be_.dealloc(p);
}

void Model::upload_sampling(const SampleBatch& s) {
  const int64_t V = cfg_.vocab_size;
  auto al = [](size_t n) { return (n + 63) / 64 * 64; };
  const size_t o_par = 0, o_ed = al(sizeof(SampleRowParams) * static_cast<size_t>(s.n_rows));
  const size_t o_al = o_ed + al(sizeof(SampleEdit) * static_cast<size_t>(s.n_edits));
  const size_t o_ids = o_al + al(sizeof(uint32_t) * static_cast<size_t>(s.n_allow));
  const size_t total = o_ids + al(sizeof(int32_t) * static_cast<size_t>(std::max<int64_t>(s.n_rows, 1)));
  for (int64_t r = 0; r < s.n_rows; ++r) {
    const SampleRowParams& p = s.rows[r];
    if (p.edit_begin < 0 || p.n_edits < 0 || p.edit_begin + p.n_edits > s.n_edits)
      fail("model step: sampling row {} names edits [{}, {}) of {}", r, p.edit_begin, p.edit_begin + p.n_edits,
           s.n_edits);
    if (p.allow_offset >= 0 && p.allow_offset + (V + 31) / 32 > s.n_allow)
      fail("model step: sampling row {} names allow words at {} beyond the {} given", r, p.allow_offset, s.n_allow);
  }
  if (s.banned && static_cast<int64_t>(s.banned->size()) != V)
    fail("model step: the banned list has {} entries for a vocabulary of {}", s.banned->size(), V);
  if (total > smp_cap_) {
    if (smp_buf_) be_.dealloc(smp_buf_);
    smp_buf_ = nullptr;
    smp_buf_ = static_cast<char*>(be_.alloc(std::max<size_t>(total, 4096), "sampling parameters"));
    smp_cap_ = std::max<size_t>(total, 4096);
  }
  smp_host_.assign(o_ids, 0);
  if (s.n_rows) std::memcpy(smp_host_.data() + o_par, s.rows, sizeof(SampleRowParams) * static_cast<size_t>(s.n_rows));
  if (s.n_edits) std::memcpy(smp_host_.data() + o_ed, s.edits, sizeof(SampleEdit) * static_cast<size_t>(s.n_edits));
  if (s.n_allow) std::memcpy(smp_host_.data() + o_al, s.allow, sizeof(uint32_t) * static_cast<size_t>(s.n_allow));
  be_.upload(smp_buf_, smp_host_.data(), o_ids);
  smp_params_ = reinterpret_cast<const SampleRowParams*>(smp_buf_ + o_par);
  smp_edits_ = reinterpret_cast<const SampleEdit*>(smp_buf_ + o_ed);
  smp_allow_ = reinterpret_cast<const uint32_t*>(smp_buf_ + o_al);
  smp_ids_ = reinterpret_cast<int32_t*>(smp_buf_ + o_ids);
  if (s.banned && (s.banned != smp_banned_src_ || s.banned->size() != smp_banned_size_ || !smp_banned_)) {
    const std::vector<uint32_t> words = sample_bitmask(*s.banned);
    if (smp_banned_) be_.dealloc(smp_banned_);
    smp_banned_ = nullptr;
    smp_banned_ = static_cast<uint32_t*>(be_.alloc(words.size() * sizeof(uint32_t), "banned-id bitmask"));
    be_.upload(smp_banned_, words.data(), words.size() * sizeof(uint32_t));
    smp_banned_src_ = s.banned;
    smp_banned_size_ = s.banned->size();
  }
}

const float* Model::upload_vector(const std::vector<float>& v, const char* what) {
  if (v.empty()) return nullptr;
  void* p = be_.alloc(v.size() * sizeof(float), what);
  owned_.push_back(p);
  be_.upload(p, v.data(), v.size() * sizeof(float));
  return static_cast<const float*>(p);
}

// ---------------------------------------------------------------------------------------------------------------
// The step workspace: every buffer of a step carved from one backend allocation.
// ---------------------------------------------------------------------------------------------------------------

// Rows of indexer scores computed per call: bounds the [rows, T] score matrix to ~64 MB of fp32.
static int64_t score_block_rows(int64_t N, int64_t Tm) {
  return std::max<int64_t>(1, std::min<int64_t>(N, (int64_t{1} << 24) / std::max<int64_t>(Tm, 1)));
}

Model::Dims Model::dims_for(int64_t n_tokens, int64_t n_seqs, int64_t max_ctx, int64_t max_blocks,
                            int64_t logit_rows) const {
  Dims d;
  d.N = std::max<int64_t>(1, n_tokens);
  d.S = std::max<int64_t>(1, n_seqs);
  d.Tm = std::max<int64_t>(1, max_ctx);
  d.MB = std::max<int64_t>(1, max_blocks);
  d.R = std::max<int64_t>(1, logit_rows);
  d.Tn = opt_.attention == AttentionForm::Naive ? d.Tm : std::min(d.Tm, naive_limit());
  return d;
}

// An array of n elements of p's type at the next 64-byte boundary of base + off (null when only counting).
template <class T>
static void carve_array(char* base, size_t& off, T*& p, int64_t n) {
  off = (off + 63) / 64 * 64;
  p = base ? reinterpret_cast<T*>(base + off) : nullptr;
  off += static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T);
}

void Model::carve_meta(const Dims& d, char* base, size_t& off, Buffers& b) const {
  const int64_t N = d.N, S = d.S;
  carve_array(base, off, b.tokens, N);
  carve_array(base, off, b.q_begin, S + 1);
  carve_array(base, off, b.ctx_len, S);
  carve_array(base, off, b.btab, S * d.MB);
  carve_array(base, off, b.lrows, d.R);
  carve_array(base, off, b.lq_begin, 2 * S);
  carve_array(base, off, b.pos, N);
  carve_array(base, off, b.slots, N);
  // (consecutive with the metadata above: a draft pass uploads them in the same copy, stage_step)
  b.mtp_idx = b.mtp_hrows = nullptr;
  if (!w_.mtp.empty()) {
    carve_array(base, off, b.mtp_idx, 2 * N);
    carve_array(base, off, b.mtp_hrows, N);
  }
}

size_t Model::carve(const Dims& d, char* base, Buffers& b) const {
  size_t off = 0;
  auto take = [&](auto*& p, int64_t n) { carve_array(base, off, p, n); };
  auto tensor = [&](Tensor& t, int64_t rows, int64_t cols, DType dt) {
    off = (off + 63) / 64 * 64;
    t = Tensor(base ? base + off : nullptr, dt, rows, cols);
    off += static_cast<size_t>(std::max<int64_t>(rows * cols, 1)) * Tensor::size_of(dt);
  };
  const ModelConfig& c = cfg_;
  const DType A = act_, F = DType::F32;
  const int64_t N = d.N, Tm = d.Tm, D = c.hidden_size, H = c.num_attention_heads;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, dc = c.kv_lora_rank;
  const int64_t dq = std::max<int64_t>(c.q_lora_rank, 1), dqk = dn + dr;
  carve_meta(d, base, off, b);
  tensor(b.h, N, D, A);
  tensor(b.x, N, D, A);
  tensor(b.y, N, D, A);
  if (rank_.parallel.active()) tensor(b.yf, N, D, F);
  tensor(b.cq, N, dq, A);
  tensor(b.q, N, H * dqk, A);
  tensor(b.kv, N, dc + dr, A);
  tensor(b.o, N, H * dv, A);
  b.score_rows = 0;
  b.scores = nullptr;
  b.sel = b.cnt = nullptr;
  if (c.has_indexer()) {
    const int64_t nI = c.index_n_heads, dI = c.index_head_dim, k = c.index_topk;
    b.score_rows = score_block_rows(N, Tm);
    tensor(b.iq, N, nI * dI, A);
    tensor(b.iwa, N, nI, A);
    tensor(b.iw, N, nI, F);
    tensor(b.ik, N, dI, A);
    take(b.scores, b.score_rows * Tm);
    take(b.sel, N * k);
    take(b.cnt, N);
  }
  tensor(b.gc, d.Tn, dc, A);
  tensor(b.gk, d.Tn, dr, A);
  tensor(b.kvb, d.Tn, H * (dn + dv), A);
  int64_t inter = c.intermediate_size;
  if (c.n_routed_experts > 0) inter = std::max<int64_t>(inter, c.moe_intermediate_size * c.n_shared_experts);
  tensor(b.g, N, inter, A);
  b.moe = MoeScratch{};
  if (c.n_routed_experts > 0) {
    const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, Im = c.moe_intermediate_size;
    MoeScratch& m = b.moe;
    take(m.logits, N * E);
    take(m.ids, N * K);
    take(m.weights, N * K);
    take(m.offsets, E + 1);
    take(m.token, N * K);
    take(m.pair_w, N * K);
    tensor(m.xs, N * K, D, A);
    tensor(m.eg, N * K, Im, A);
    tensor(m.ed, N * K, D, A);
    tensor(m.sh, N, std::max<int64_t>(Im * c.n_shared_experts, 1), A);
  }
  b.aq = nullptr;
  b.aq_floats = 0;
  if (opt_.act_fp8_declared) {  // the widest input of any linear: [N, cols] (experts: [N·K, cols])
    int64_t w = std::max({2 * D, dq, H * dv, c.intermediate_size, D});
    if (c.n_routed_experts > 0)
      w = std::max({w, c.num_experts_per_tok * std::max(D, c.moe_intermediate_size),
                    c.moe_intermediate_size * c.n_shared_experts});
    b.aq_floats = N * w;
    take(b.aq, b.aq_floats);
  }
  tensor(b.hx, d.R, D, A);
  take(b.lg, d.R * std::max(c.vocab_size, sd_.vocab_chunk));
  b.lgall = nullptr;
  if (sd_.vocab_split) take(b.lgall, d.R * sd_.vocab_chunk * rank_.parallel.ranks);
  b.mtp_in = b.mtp_cat = Tensor{};
  if (!w_.mtp.empty()) {
    tensor(b.mtp_in, 2 * N, D, A);
    tensor(b.mtp_cat, N, 2 * D, A);
  }
  return (off + 63) / 64 * 64;
}

void Model::reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_ctx, int64_t max_blocks) {
  const Dims d = dims_for(max_tokens, max_seqs, max_ctx, max_blocks, max_tokens);
  // Host image of the step metadata (stage_step), at its largest: every array and its alignment.
  const size_t meta =
      static_cast<size_t>(4 * (d.N + (d.S + 1) + d.S + d.S * d.MB + d.R + 2 * d.S + 3 * d.N) + 8 * 2 * d.N + 64 * 11);
  if (stage_host_.size() < meta) stage_host_.resize(meta);
  Buffers b{};
  const size_t need = carve(d, nullptr, b);
  if (need > ws_cap_) replace_workspace(need);
  res_tokens_ = std::max(res_tokens_, d.N);
  res_seqs_ = std::max(res_seqs_, d.S);
  if (d.Tm != res_ctx_ || d.MB != res_blocks_) drop_graphs();  // graphs are shaped by these limits
  res_ctx_ = std::max(res_ctx_, d.Tm);
  res_blocks_ = std::max(res_blocks_, d.MB);
  // What the backend's matmuls need for every weight the step multiplies (the head, the router, every linear) at
  // up to the step's tokens; kv_b at up to max(tokens, naive keys) rows (it expands the keys of the naive form).
  if (!w_.mtp.empty()) ensure_mtp_buffers(d.N, decode_graph_bucket(d.S));  // (a draft graph's padded rows)
  std::vector<const QuantWeight*> ws{&w_.lm_head}, kvb;
  for (const MtpWeights& mt : w_.mtp) ws.insert(ws.end(), {&mt.eh_proj, &mt.head});
  auto mlp = [&](const MlpWeights& m) { ws.insert(ws.end(), {&m.gate, &m.up, &m.down}); };
  for (const LayerWeights& lw : w_.layers) {
    ws.insert(ws.end(), {&lw.attn.q_a, &lw.attn.q_b, &lw.attn.kv_a, &lw.attn.o});
    kvb.push_back(&lw.attn.kv_b);
    if (lw.indexer.present) ws.insert(ws.end(), {&lw.indexer.wq_b, &lw.indexer.wk, &lw.indexer.weights_proj});
    if (lw.is_moe) {
      ws.push_back(&lw.moe.router);
      if (lw.moe.has_shared) mlp(lw.moe.shared);
    } else {
      mlp(lw.dense);
    }
  }
  be_.reserve_matmul(ws.data(), ws.size(), d.N, act_);
  be_.reserve_matmul(kvb.data(), kvb.size(), std::max(d.N, d.Tn), act_);
}

void Model::replace_workspace(size_t bytes) {
  drop_graphs();  // they recorded pointers into the old workspace
  if (ws_) {
    be_.dealloc(ws_);
    owned_.erase(std::remove(owned_.begin(), owned_.end(), static_cast<void*>(ws_)), owned_.end());
    ws_ = nullptr;
    ws_cap_ = 0;
  }
  ws_ = static_cast<char*>(be_.alloc(bytes, "the step workspace (activations and scratch)"));
  owned_.push_back(ws_);
  ws_cap_ = bytes;
}

void Model::ensure_workspace(const Dims& d) {
  Buffers b{};
  const size_t need = carve(d, nullptr, b);
  if (need <= ws_cap_) return;
  // A step larger than any reserved: grow (counted; the server reserves its limits so this never happens there).
  ++ws_grows_;
  replace_workspace(std::max(need, ws_cap_ * 2));  // doubling: a few growths at most
}

// ---------------------------------------------------------------------------------------------------------------
// Step metadata
// ---------------------------------------------------------------------------------------------------------------

void Model::reduce_partial(const Tensor& y, const Tensor& yf) {
  // The ranks' partial sums, each rounded like any output, summed in fp32 and rounded once more.
  if (y.dtype == DType::F32) {
    rank_.comm->all_reduce_sum(y.f32(), y.numel());
    return;
  }
  be_.convert(y, yf);
  rank_.comm->all_reduce_sum(yf.f32(), yf.numel());
  be_.convert(yf, y);
}

// y = the dense SwiGLU MLP of x: down(SiLU(gate x) ⊙ up x); a tensor-parallel rank's partial sum (then reduced).
void Model::mlp(const MlpWeights& w, const Tensor& x, int64_t inter, Buffers& b, const Tensor& y) {
  const Tensor g = Tensor(b.g.data, act_, x.rows, inter);
  const QuantWeight* gate = &w.gate;
  Epilogue glu;
  glu.glu = &gate;
  linear(w.up, x, g, glu);
  linear(w.down, g, y);
}

void Model::linear(const QuantWeight& w, const Tensor& x, const Tensor& y, const Epilogue& ep) {
  const QuantWeight* g = ep.glu ? ep.glu[0] : nullptr;
  if (act_fp8_applies(act_fp8(), w, g))
    be_.matmul_act_fp8(w, x, act_fp8_, y, ep);
  else
    be_.matmul(w, x, y, ep);
}

void Model::moe(int64_t l, const Meta& m, Buffers& b, const Tensor& y) {
  const int64_t M = m.N, E = cfg_.n_routed_experts, K = cfg_.num_experts_per_tok;
  const MoeLayer& L = moe_[static_cast<size_t>(l)];
  const Tensor x = b.x.with_rows(M);
  // With expert parallelism alone the shared experts are replicated: the routed partials are reduced first.
  const bool ep_only = rank_.parallel.expert && !rank_.parallel.tensor;
  if (opt_.force_decisions) {
    // Diagnostic: replay recorded expert ids; weights from this run's scores (sigmoid, normalized, scaled).
    const auto& rec = opt_.force_decisions->experts;
    if (static_cast<size_t>(l) >= rec.size() || rec[l].size() != static_cast<size_t>(M * K))
      fail("forced decisions: layer {} has no recorded routing for {} tokens", l, M);
    be_.matmul(*L.gate, x, Tensor(b.moe.logits, DType::F32, M, E));
    std::vector<float> logits(static_cast<size_t>(M * E)), wts(static_cast<size_t>(M * K));
    be_.download(logits.data(), b.moe.logits, logits.size() * sizeof(float));
    const std::vector<int32_t>& ids = rec[l];
    for (int64_t s = 0; s < M; ++s) {
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = ids[s * K + k];
        if (e < 0 || e >= E) fail("forced decisions: expert id {} out of range", e);
        wts[s * K + k] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logits[s * E + e]))));
        sum += wts[s * K + k];
      }
      for (int64_t k = 0; k < K; ++k) {
        if (L.router.norm_topk_prob) wts[s * K + k] /= sum + 1e-20f;
        wts[s * K + k] *= L.router.routed_scaling_factor;
      }
    }
    be_.upload(b.moe.ids, ids.data(), ids.size() * sizeof(int32_t));
    be_.upload(b.moe.weights, wts.data(), wts.size() * sizeof(float));
    if (L.act)  // a fused block need not implement declared activations: the default composition does
      be_.Backend::moe_experts(L, x, b.moe, y, !ep_only);
    else
      be_.moe_experts(L, x, b.moe, y, !ep_only);
  } else if (L.act) {
    be_.Backend::moe_ffn(L, x, b.moe, y, !ep_only);
  } else {
    be_.moe_ffn(L, x, b.moe, y, !ep_only);
  }
  if (opt_.record_decisions) {
    auto& rec = opt_.record_decisions->experts[static_cast<size_t>(l)];
    rec.resize(static_cast<size_t>(M * K));
    be_.download(rec.data(), b.moe.ids, rec.size() * sizeof(int32_t));
  }
  if (ep_only) {
    reduce_partial(y, b.yf.with_rows(M));
    if (L.shared_up) {
      const Tensor sh = b.moe.sh.with_rows(M);
      Epilogue sg;
      sg.glu = &L.shared_gate;
      linear(*L.shared_up, x, sh, sg);
      Epilogue res;
      res.residual = &y;
      linear(*L.shared_down, sh, y, res);
    }
  }
  if (rank_.parallel.tensor) reduce_partial(y, b.yf.with_rows(M));  // routed + shared partials in one all-reduce
}

// The DSA indexer of layer l: new keys into the index pool; when some sequence sees more than index_topk keys,
// the per-token selection (rows of b.sel / b.cnt) for every token of the step (sparse = true), else dense.
void Model::indexer(int64_t l, const Meta& m, PagedKvCache& cache, Buffers& b, bool& sparse) {
  const IndexerWeights& iw = w_.layers[l].indexer;
  const LayerParams& p = lp_[static_cast<size_t>(l)];
  const int64_t nI = cfg_.index_n_heads, dI = cfg_.index_head_dim, N = m.N, k = cfg_.index_topk;
  RopeParams rp{inv_freq_, cfg_.qk_rope_head_dim, attention_factor_, cfg_.indexer_rope_interleave};

  // Keys of the new tokens: LayerNorm(x·Wkᵀ), RoPE on the first dr dims; written to the pool.
  const Tensor ik = b.ik.with_rows(N);
  linear(iw.wk, b.x.with_rows(N), ik);
  be_.layer_norm(ik, p.k_norm_w, p.k_norm_b, 1e-6f, ik);
  be_.rope(ik, 1, dI, b.pos, rp);
  const KvPool& pool = cache.index(l);
  be_.kv_store(pool, b.slots, ik, 0);

  if (opt_.force_decisions) {
    const auto& f = *opt_.force_decisions;
    if (static_cast<size_t>(l) >= f.index_sel.size()) fail("forced decisions: layer {} has no recorded selection", l);
    sparse = !f.index_sel[l].empty();
    if (sparse) {
      if (f.index_count[l].size() != static_cast<size_t>(N) || f.index_sel[l].size() != static_cast<size_t>(N * k))
        fail("forced decisions: layer {} selection recorded for another number of tokens", l);
      for (int64_t s = 0; s < m.S; ++s)
        for (int64_t i = m.q_begin[s]; i < m.q_begin[s + 1]; ++i)
          for (int64_t j = 0; j < k; ++j) {
            const int32_t t = f.index_sel[l][i * k + j];
            if (j < f.index_count[l][i] && (t < 0 || t >= m.ctx[s]))
              fail("forced decisions: layer {} selects key {} outside [0, {})", l, t, m.ctx[s]);
          }
      be_.upload(b.sel, f.index_sel[l].data(), static_cast<size_t>(N * k) * sizeof(int32_t));
      be_.upload(b.cnt, f.index_count[l].data(), static_cast<size_t>(N) * sizeof(int32_t));
    }
    return;
  }
  // Dense when every query sees at most index_topk keys (docs/model.md §DSA): skip the scores. Otherwise
  // every token gets a selection row; a sequence with <= index_topk keys selects all its causal keys, which equals
  // dense attention.
  if (!m.any_long) {
    sparse = false;
    return;
  }
  sparse = true;
  const Tensor iq = b.iq.with_rows(N), iwt = b.iw.with_rows(N);
  linear(iw.wq_b, b.cq.with_rows(N), iq);
  be_.rope(iq, nI, dI, b.pos, rp);
  // The head weights: rounded like any linear output, then scaled by nI^-0.5 in fp32.
  if (act_ == DType::F32) {
    be_.matmul(iw.weights_proj, b.x.with_rows(N), iwt);
  } else {
    be_.matmul(iw.weights_proj, b.x.with_rows(N), b.iwa.with_rows(N));
    be_.convert(b.iwa.with_rows(N), iwt);
  }
  be_.scale(iwt, static_cast<float>(std::pow(static_cast<double>(nI), -0.5)));
  const float score_scale = static_cast<float>(std::pow(static_cast<double>(dI), -0.5));
  // Every token of the step over its own sequence's keys in the pool, in blocks of rows (a graph step scores the
  // reserved context: keys past a token's position score −inf and are never selected, so the selection equals the
  // eager one).
  const int64_t T = m.max_ctx;
  for (int64_t r0 = 0; r0 < N; r0 += b.score_rows) {
    const int64_t nr = std::min(b.score_rows, N - r0);
    be_.indexer_scores_paged(iq.row_slice(r0, nr), iwt.row_slice(r0, nr), pool, m.seqs, r0, nI, score_scale, b.pos + r0,
                             T, b.scores);
    be_.topk_select(b.scores, nr, T, k, b.pos + r0, b.sel + r0 * k, b.cnt + r0);
  }
}

void Model::attention(int64_t l, const Meta& m, PagedKvCache& cache, Buffers& b, bool& sparse) {
  const LayerWeights& lw = w_.layers[l];
  const MlaLayer& L = mla_[static_cast<size_t>(l)];
  const int64_t H = sd_.heads, dn = cfg_.qk_nope_head_dim, dr = cfg_.qk_rope_head_dim;  // this rank's heads
  const int64_t dv = cfg_.v_head_dim, dc = cfg_.kv_lora_rank, dqk = dn + dr;
  const int64_t N = m.N;
  const KvPool& pool = cache.latent(l);
  const Tensor q(b.q.data, act_, N, H * dqk), o(b.o.data, act_, N, H * dv);  // this rank's heads

  // Query and latent path (q with rotated q_pe; c and k_pe into the pool).
  if (L.act)  // a fused block need not implement declared activations: the default composition does
    be_.Backend::mla_qkv(L, b.x.with_rows(N), StepTokens{N, b.pos, b.slots}, pool, b.cq.with_rows(N), q,
                         b.kv.with_rows(N));
  else
    be_.mla_qkv(L, b.x.with_rows(N), StepTokens{N, b.pos, b.slots}, pool, b.cq.with_rows(N), q, b.kv.with_rows(N));

  // DSA selection: own indexer, shared (IndexShare: reuse the previous indexer layer's rows), or none.
  if (cfg_.has_indexer() && !opt_.disable_indexer) {
    if (lw.indexer.present) {
      indexer(l, m, cache, b, sparse);
      if (opt_.record_decisions) {
        auto& rs = opt_.record_decisions->index_sel[static_cast<size_t>(l)];
        auto& rc = opt_.record_decisions->index_count[static_cast<size_t>(l)];
        rs.clear();
        rc.clear();
        if (sparse) {
          rs.resize(static_cast<size_t>(N * cfg_.index_topk));
          rc.resize(static_cast<size_t>(N));
          be_.download(rs.data(), b.sel, rs.size() * sizeof(int32_t));
          be_.download(rc.data(), b.cnt, rc.size() * sizeof(int32_t));
        }
      }
    }
    // else: shared layer, b.sel / b.cnt hold the previous indexer layer's selection.
  } else {
    sparse = false;
  }
  const KeySelection all = sparse ? KeySelection{b.sel, b.cnt, cfg_.index_topk} : KeySelection{};

  // Per sequence: the absorbed form over the pages for generated tokens (decode) in runs of consecutive
  // sequences, the naive form (expanded K/V of the gathered context) for prompt chunks.
  auto absorbed_for = [&](int64_t s) {
    if (opt_.attention == AttentionForm::Absorbed) return true;
    if (opt_.attention == AttentionForm::Naive) return false;
    return m.step->seqs[s].decode;
  };
  for (int64_t s = 0; s < m.S;) {
    if (absorbed_for(s)) {
      int64_t e = s + 1;
      while (e < m.S && absorbed_for(e)) ++e;
      StepSeqs run = m.seqs;
      run.n_seqs = e - s;
      run.q_begin = m.seqs.q_begin + s;
      run.ctx_len = m.seqs.ctx_len + s;
      run.block_table = m.seqs.block_table + s * m.max_blocks;
      be_.mla_decode_attention(L, q, pool, run, b.pos, all, o);
      s = e;
      continue;
    }
    // A prompt chunk: its rows below naive_max_context in the naive form over the keys they can see (expanded
    // through kv_b), the rest in the absorbed form over the pages (lq_begin: their row range).
    const int64_t q0 = m.q_begin[s], n = m.q_begin[s + 1] - q0, T = m.ctx[s], nn = naive_rows(T - n, n);
    if (nn > 0) {
      const int64_t Tn = T - n + nn;  // the last naive row's position + 1
      const int32_t* blocks = m.seqs.block_table + s * m.max_blocks;
      const Tensor gc = b.gc.with_rows(Tn), gk = b.gk.with_rows(Tn);
      const Tensor kvb = Tensor(b.kvb.data, act_, Tn, H * (cfg_.qk_nope_head_dim + dv));
      be_.kv_gather(pool, blocks, 0, gc);
      be_.kv_gather(pool, blocks, dc, gk);
      be_.matmul(*L.kv_b, gc, kvb);
      KeySelection ks;
      if (sparse) ks = {b.sel + q0 * cfg_.index_topk, b.cnt + q0, cfg_.index_topk};
      be_.mla_attention_naive(L.d, q.row_slice(q0, nn), kvb, gk, Tn, b.pos + q0, ks, L.softmax_scale,
                              o.row_slice(q0, nn));
    }
    if (nn < n) {
      StepSeqs run = m.seqs;
      run.n_seqs = 1;
      run.q_begin = b.lq_begin + 2 * s;
      run.ctx_len = m.seqs.ctx_len + s;
      run.block_table = m.seqs.block_table + s * m.max_blocks;
      run.max_ctx = T;
      run.split_ctx = 0;  // (prompt rows: never in a graph; split by their own context)
      be_.mla_decode_attention(L, q, pool, run, b.pos, all, o);
    }
    ++s;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The step
// ---------------------------------------------------------------------------------------------------------------
Model::StepShape Model::validate_step(const Step& st, const PagedKvCache& cache, int64_t layers_needed) const {
  const int64_t N = static_cast<int64_t>(st.tokens.size()), V = cfg_.vocab_size, bt = cache.block_tokens();
  if (&cache.backend() != &be_) fail("model step: the KV cache was allocated by another backend");
  if (cache.dtype() != cache_dtype())
    fail("model step: the KV cache holds {} but the activations are {}", dtype_name(cache.dtype()),
         dtype_name(cache_dtype()));
  if (cache.num_layers() < layers_needed)
    fail("model step: the KV cache holds {} layers, the model needs {}", cache.num_layers(), layers_needed);
  // Validate everything before any write: a bad step leaves the cache untouched.
  StepShape sh;
  int64_t total = 0;
  for (const StepSequence& q : st.seqs) {
    if (q.n_tokens < 0 || q.start < 0) fail("model step: negative token count or start");
    const int64_t ctx = q.start + q.n_tokens;
    if (ctx > cfg_.max_position_embeddings && cfg_.max_position_embeddings > 0)
      fail("model step: position {} exceeds max_position_embeddings {}", ctx - 1, cfg_.max_position_embeddings);
    const int64_t need = (ctx + bt - 1) / bt;
    if (static_cast<int64_t>(q.blocks.size()) < need)
      fail("model step: a block table of {} blocks cannot hold {} tokens of {} per block", q.blocks.size(), ctx, bt);
    for (int64_t j = 0; j < need; ++j)
      if (q.blocks[j] < 0 || q.blocks[j] >= cache.num_blocks())
        fail("model step: block id {} outside the pool of {} blocks", q.blocks[j], cache.num_blocks());
    total += q.n_tokens;
    sh.max_ctx = std::max(sh.max_ctx, ctx);
    sh.max_blocks = std::max(sh.max_blocks, need);
    if (cfg_.has_indexer() && ctx > cfg_.index_topk) sh.any_long = true;
    sh.rows += q.logits == LogitRows::All ? q.n_tokens : (q.logits == LogitRows::Last && q.n_tokens > 0 ? 1 : 0);
  }
  if (total != N) fail("model step: the sequences hold {} tokens, the step {}", total, N);
  for (int32_t id : st.tokens)
    if (id < 0 || id >= V) fail("token id {} is out of range [0, {})", id, V);
  return sh;
}

Model::Meta Model::stage_step(const Step& st, const PagedKvCache& cache, const StepShape& sh, Buffers& b,
                              std::span<const int32_t> mtp_hrows, int64_t n_real) {
  const int64_t N = static_cast<int64_t>(st.tokens.size()), S = static_cast<int64_t>(st.seqs.size());
  const int64_t max_blocks = sh.max_blocks, rows = sh.rows;
  const Dims d = dims_for(N, S, sh.max_ctx, max_blocks, rows);
  ensure_workspace(d);
  carve(d, ws_, b);
  act_fp8_.scratch = b.aq;
  act_fp8_.scratch_floats = b.aq_floats;

  // The metadata arrays [b.tokens, b.slots + N) (and a draft pass's [b.mtp_idx, b.mtp_hrows + N) after them) are
  // consecutive in the workspace: staged as one host image and uploaded in one copy (every upload synchronizes
  // the device's stream).
  char* const base = reinterpret_cast<char*>(b.tokens);
  const bool with_mtp = !mtp_hrows.empty();
  const size_t bytes = static_cast<size_t>(
      (with_mtp ? reinterpret_cast<char*>(b.mtp_hrows + N) : reinterpret_cast<char*>(b.slots + N)) - base);
  if (stage_host_.size() < bytes) stage_host_.resize(bytes);
  const MetaHost h = fill_meta(st, cache, max_blocks, b, base, stage_host_.data(), mtp_hrows, n_real);
  be_.upload(base, stage_host_.data(), bytes);
  Meta m(st, N, S, sh.max_ctx, max_blocks, rows, sh.any_long, h.q_begin, h.ctx, b);
  m.seqs.split_ctx = res_ctx_;  // (a graph step's max_ctx is res_ctx_ too: eager and replayed steps split alike)
  return m;
}

Model::MetaHost Model::fill_meta(const Step& st, const PagedKvCache& cache, int64_t max_blocks, const Buffers& b,
                                 const char* dev_base, char* host, std::span<const int32_t> mtp_hrows,
                                 int64_t n_real) const {
  const int64_t N = static_cast<int64_t>(st.tokens.size()), S = static_cast<int64_t>(st.seqs.size());
  if (n_real < 0) n_real = S;
  const int64_t bt = cache.block_tokens();
  auto host_of = [&](auto* dev) {
    return reinterpret_cast<decltype(dev)>(host + (reinterpret_cast<const char*>(dev) - dev_base));
  };
  int32_t *h_tok = host_of(b.tokens), *h_qb = host_of(b.q_begin), *h_ctx = host_of(b.ctx_len);
  int32_t *h_bt = host_of(b.btab), *h_rows = host_of(b.lrows), *h_lqb = host_of(b.lq_begin);
  int64_t *h_pos = host_of(b.pos), *h_slot = host_of(b.slots);
  if (!mtp_hrows.empty()) {
    if (static_cast<int64_t>(mtp_hrows.size()) != N)
      fail("model: {} MTP hidden rows for {} tokens", mtp_hrows.size(), N);
    // The MTP concat as a row gather over [enorm rows; hnorm rows]: output row 2i = row i, row 2i+1 = row N + i.
    int32_t *h_idx = host_of(b.mtp_idx), *h_hr = host_of(b.mtp_hrows);
    for (int64_t i = 0; i < N; ++i) {
      h_idx[2 * i] = static_cast<int32_t>(i);
      h_idx[2 * i + 1] = static_cast<int32_t>(N + i);
      h_hr[i] = mtp_hrows[static_cast<size_t>(i)];
    }
  }
  std::copy(st.tokens.begin(), st.tokens.end(), h_tok);
  if (sd_.vocab_split)  // vocab-parallel embedding: local row, or the zero row for another rank's token
    for (int64_t i = 0; i < N; ++i)
      h_tok[i] = h_tok[i] >= sd_.vocab0 && h_tok[i] < sd_.vocab1 ? static_cast<int32_t>(h_tok[i] - sd_.vocab0)
                                                                 : static_cast<int32_t>(sd_.vocab1 - sd_.vocab0);
  int64_t at = 0, r = 0;
  for (int64_t s = 0; s < S; ++s) {
    const StepSequence& q = st.seqs[s];
    const bool pad = s >= n_real;
    h_qb[s] = static_cast<int32_t>(at);
    h_ctx[s] = pad ? 1 : static_cast<int32_t>(q.start + q.n_tokens);
    h_lqb[2 * s] = static_cast<int32_t>(at + naive_rows(q.start, q.n_tokens));
    h_lqb[2 * s + 1] = static_cast<int32_t>(at + q.n_tokens);
    const int64_t need = pad ? 1 : (q.start + q.n_tokens + bt - 1) / bt;
    for (int64_t j = 0; j < max_blocks; ++j) h_bt[s * max_blocks + j] = j < need ? q.blocks[j] : 0;
    for (int64_t i = 0; i < q.n_tokens; ++i) {
      const int64_t p = q.start + i;
      h_pos[at + i] = pad ? 0 : p;
      h_slot[at + i] = pad ? -1 : static_cast<int64_t>(q.blocks[p / bt]) * bt + p % bt;
    }
    if (q.logits == LogitRows::All)
      for (int64_t i = 0; i < q.n_tokens; ++i) h_rows[r++] = static_cast<int32_t>(at + i);
    else if (q.logits == LogitRows::Last && q.n_tokens > 0)
      h_rows[r++] = static_cast<int32_t>(at + q.n_tokens - 1);
    at += q.n_tokens;
  }
  h_qb[S] = static_cast<int32_t>(at);
  return {h_qb, h_ctx};
}

void Model::step(const Step& st, PagedKvCache& cache, float* logits, std::vector<float>* hidden,
                 const SampleBatch* sampling, int32_t* ids) {
  const int64_t N = static_cast<int64_t>(st.tokens.size());
  const int64_t V = cfg_.vocab_size;
  if (N == 0) return;
  const StepShape sh = validate_step(st, cache, cfg_.num_hidden_layers + mtp_layers());
  const int64_t rows = sh.rows;
  if (sampling) {
    if (!ids) fail("model step: sampling without an ids output");
    if (sampling->n_rows != rows) fail("model step: {} sampling rows for {} logits rows", sampling->n_rows, rows);
    if (rank_.parallel.ranks > 1) fail("model step: sampling on the backend needs a single-rank model");
    upload_sampling(*sampling);
  }
  struct SamplingScope {
    bool& flag;
    ~SamplingScope() { flag = false; }
  } scope{sampling_step_};
  sampling_step_ = sampling != nullptr && rows > 0;
  last_lg_ = nullptr;
  auto sample = [&] {
    if (!sampling_step_ || !last_lg_) return;
    be_.sample_rows(last_lg_, rows, V, smp_params_, smp_edits_, smp_allow_, sampling->banned ? smp_banned_ : nullptr,
                    smp_ids_);
    be_.download(ids, smp_ids_, sizeof(int32_t) * static_cast<size_t>(rows));
  };
  const GraphShape gs = graph_eligible(st, sh, logits, hidden);
  if (!w_.mtp.empty()) ensure_mtp_buffers(std::max(N, gs.B * gs.T), 1);
  kept_rows_ = 0;

  if (gs.B > 0) {
    graph_step(st, cache, logits, sh, gs);
    sample();
    if (!w_.mtp.empty()) kept_rows_ = N;
    return;
  }
  Buffers b{};
  const Meta m = stage_step(st, cache, sh, b);
  forward_step(st, cache, m, b, logits, hidden);
  sample();
  if (!w_.mtp.empty()) kept_rows_ = N;
}

void Model::download_rows(const Tensor& t, float* dst) {
  // A device tensor to host fp32 (hidden-state diagnostics): the bytes, then widened on the host.
  const size_t n = static_cast<size_t>(t.numel());
  if (t.dtype == DType::F32) {
    be_.download(dst, t.data, n * sizeof(float));
    return;
  }
  std::vector<uint16_t> raw(n);
  be_.download(raw.data(), t.data, n * sizeof(uint16_t));
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(raw[i]);
}

void Model::forward_step(const Step& st, PagedKvCache& cache, const Meta& m, Buffers& b, float* logits,
                         std::vector<float>* hidden, bool capture) {
  const int64_t N = m.N, D = cfg_.hidden_size, L = cfg_.num_hidden_layers, V = cfg_.vocab_size;
  const Tensor h = b.h.with_rows(N), x = b.x.with_rows(N);
  if (sd_.vocab_split) {  // vocab-parallel embedding: every rank's rows (zeros for the others' tokens), summed
    const Tensor yf = b.yf.with_rows(N);
    be_.embedding(w_.embed, b.tokens, yf);
    rank_.comm->all_reduce_sum(yf.f32(), N * D);  // exact: one rank holds each row
    be_.convert(yf, h);
  } else {
    be_.embedding(w_.embed, b.tokens, h);
  }
  if (hidden) {
    hidden->assign(static_cast<size_t>((L + 1) * N * D), 0.0f);
    download_rows(h, hidden->data());
  }
  if (opt_.record_decisions) {
    *opt_.record_decisions = {};
    opt_.record_decisions->experts.resize(static_cast<size_t>(L));
    opt_.record_decisions->index_sel.resize(static_cast<size_t>(L));
    opt_.record_decisions->index_count.resize(static_cast<size_t>(L));
  }
  // Layer l: x = norm(h); h += o_proj(attention(x)); x = norm(h); y = ffn(x); h += y (fused with the next norm).
  bool sparse = false;
  for (int64_t l = 0; l < L; ++l) {
    const float* next = l + 1 < L ? lp_[static_cast<size_t>(l + 1)].input_norm : final_norm_;
    decoder_layer(l, m, cache, b, sparse, l > 0, next);
    if (hidden && l + 1 < L) download_rows(h, hidden->data() + (l + 1) * N * D);
  }
  if (hidden) download_rows(x, hidden->data() + L * N * D);
  // MTP: the head-input rows of every token stay for the draft step (Model::mtp_draft).
  if (kept_) be_.copy(kept_, x.data, static_cast<size_t>(N * D) * x.elem_size());
  if ((logits || capture || sampling_step_) && m.rows > 0) {
    // The head's logits stay fp32 (no rounding; top-1 ties would be artificial).
    const Tensor hx = b.hx.with_rows(m.rows);
    be_.gather_rows(x, b.lrows, hx);
    if (!sd_.vocab_split) {
      be_.matmul(w_.lm_head, hx, Tensor(b.lg, DType::F32, m.rows, V));
      if (!capture && logits) be_.download(logits, b.lg, sizeof(float) * m.rows * V);
      if (!capture) last_lg_ = b.lg;
    } else {  // (never captured: graphs are single-rank, see use_graph)
      // Vocab-parallel head: [rows, Vr] per rank, all-gathered ([ranks][rows * chunk]); rank 0 lays them out.
      const int64_t C = sd_.vocab_chunk, W = rank_.parallel.ranks, R = m.rows;
      if (sd_.vocab1 > sd_.vocab0) be_.matmul(w_.lm_head, hx, Tensor(b.lg, DType::F32, R, w_.lm_head.rows));
      rank_.comm->all_gather(b.lg, sizeof(float) * static_cast<size_t>(R * C), b.lgall);
      if (rank_.rank == 0) {
        host_f32_.resize(static_cast<size_t>(W * R * C));
        be_.download(host_f32_.data(), b.lgall, sizeof(float) * host_f32_.size());
        for (int64_t k = 0; k < W; ++k) {
          const int64_t v0 = std::min(V, k * C), vk = std::min(V, v0 + C) - v0;
          for (int64_t r = 0; r < R && vk > 0; ++r)
            std::memcpy(logits + r * V + v0, host_f32_.data() + k * R * C + r * vk, sizeof(float) * vk);
        }
      }
    }
  }
  if (!capture) be_.sync();
  (void)st;
}

void Model::decoder_layer(int64_t l, const Meta& m, PagedKvCache& cache, Buffers& b, bool& sparse, bool input_normed,
                          const float* next_norm) {
  const int64_t N = m.N;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const Tensor h = b.h.with_rows(N), x = b.x.with_rows(N), y = b.y.with_rows(N);
  const LayerWeights& lw = w_.layers[static_cast<size_t>(l)];
  const LayerParams& p = lp_[static_cast<size_t>(l)];
  if (!input_normed) be_.rms_norm(h, p.input_norm, eps, x);
  attention(l, m, cache, b, sparse);
  const Tensor o(b.o.data, act_, N, sd_.heads * cfg_.v_head_dim);
  Epilogue ob;
  ob.bias = p.o_bias;
  if (rank_.parallel.tensor) {  // o_proj over this rank's heads: partial sums, reduced, then added
    linear(lw.attn.o, o, y, ob);
    reduce_partial(y, b.yf.with_rows(N));
    be_.add(h, y);
  } else {
    ob.residual = &h;
    linear(lw.attn.o, o, h, ob);
  }
  be_.rms_norm(h, p.post_attn_norm, eps, x);
  if (lw.is_moe) {
    moe(l, m, b, y);
  } else {
    mlp(lw.dense, x, sd_.inter, b, y);
    if (rank_.parallel.tensor) reduce_partial(y, b.yf.with_rows(N));
  }
  if (next_norm)
    be_.add_rms_norm(h, y, next_norm, eps, x);
  else
    be_.add(h, y);
}

// ---------------------------------------------------------------------------------------------------------------
// Decode graphs
// ---------------------------------------------------------------------------------------------------------------
Model::GraphShape Model::graph_shape(const Step& st, const StepShape& sh, GraphKind kind) const {
  // Single rank only: the in-process communicator cannot be recorded in a graph (NCCL could; not done yet).
  if (!opt_.graphs || !be_.graphs_supported() || res_ctx_ <= 0 || rank_.parallel.ranks > 1 || st.seqs.empty())
    return {};
  if (opt_.record_decisions || opt_.force_decisions || opt_.attention == AttentionForm::Naive) return {};
  if (sh.max_ctx > res_ctx_ || sh.max_blocks > res_blocks_) return {};  // (DSA selection runs in the graph too)
  const int64_t T = st.seqs.front().n_tokens;
  if (T < 1) return {};
  // A step: T = 1 wanting its last row, or a verify step (the last token and T - 1 drafts) wanting every row. A
  // draft pass: the draft after the last slot.
  auto rows_recorded = [&](LogitRows r) {
    if (kind != GraphKind::Step) return r == LogitRows::Last;
    return T == 1 ? r != LogitRows::None : r == LogitRows::All;
  };
  bool ragged = false;
  for (const StepSequence& q : st.seqs) {
    if (!q.decode || q.n_tokens < 1 || q.start < 1 || !rows_recorded(q.logits)) return {};
    ragged = ragged || q.n_tokens != T;
  }
  const int64_t S = static_cast<int64_t>(st.seqs.size()), N = static_cast<int64_t>(st.tokens.size());
  if (ragged) {
    // A first draft pass whose sequences fill different numbers of slots (after a verify they accepted
    // differently): a graph of its exact shape — its S sequences and N tokens, unpadded, keyed by both — since the
    // kernels' launch shapes follow the token count, padding every sequence to the most slots would not compute the
    // rows as the eager pass does. Where each sequence's rows start is metadata (uploaded before the replay).
    if (kind != GraphKind::DraftFromStep || S > res_seqs_ || N > res_tokens_) return {};
    GraphShape g;
    g.B = S;
    g.T = 0;
    g.tokens = N;
    return g;
  }
  const int64_t B = graph_seqs_for(S, T);
  if (B > res_seqs_ || B * T > res_tokens_) return {};
  return {B, T};
}

Model::GraphShape Model::graph_eligible(const Step& st, const StepShape& sh, const float* logits,
                                        const std::vector<float>* hidden) const {
  if ((!logits && !sampling_step_) || hidden) return {};
  return graph_shape(st, sh, GraphKind::Step);
}

void Model::drop_graphs() {
  for (const GraphEntry& g : graphs_) be_.graph_release(g.id);
  graphs_.clear();
  graph_ptrs_.clear();
}

int64_t Model::ragged_draft_graphs() const {
  return static_cast<int64_t>(
      std::count_if(graphs_.begin(), graphs_.end(), [](const GraphEntry& e) { return e.g.T == 0; }));
}

bool Model::ragged_graph_allowed(GraphKind kind, const GraphShape& g, bool any_long) const {
  for (const GraphEntry& e : graphs_)
    if (e.kind == kind && e.g == g && e.any_long == any_long) return true;  // captured: replay it
  return ragged_draft_graphs() < kMaxRaggedGraphs;
}

void Model::drop_graphs_of(GraphKind kind) {
  for (const GraphEntry& g : graphs_)
    if (g.kind == kind) be_.graph_release(g.id);
  std::erase_if(graphs_, [&](const GraphEntry& g) { return g.kind == kind; });
}

void Model::keep_graphs_valid(const PagedKvCache& cache) {
  graph_ptrs_now_.clear();
  // (dstep_buf_ is not listed: only the one-graph draft steps record it, released when it moves.)
  graph_ptrs_now_.insert(graph_ptrs_now_.end(), {ws_, kept_, mtp_prev_, mtp_ids_dev_, mtp_params_dev_});
  for (int64_t l = 0; l < cache.num_layers(); ++l) {
    graph_ptrs_now_.push_back(cache.latent(l).data);
    graph_ptrs_now_.push_back(cache.index(l).data);
  }
  if (graph_ptrs_now_ == graph_ptrs_) return;
  drop_graphs();
  graph_ptrs_.swap(graph_ptrs_now_);
}

int64_t Model::graph_kernels_of(bool draft, int64_t seqs, int64_t rows_per_seq) const {
  int64_t n = 0;  // the largest graph of the shape (with the DSA selection, a first draft pass)
  for (const GraphEntry& e : graphs_)
    if (e.kind != GraphKind::DraftStep && (e.kind != GraphKind::Step) == draft && e.g.B == seqs &&
        e.g.T == rows_per_seq)
      n = std::max(n, be_.graph_kernels(e.id));
  return n;
}
int64_t Model::draft_step_graph_kernels(int64_t seqs, int64_t slots, int64_t k) const {
  int64_t n = 0;  // the largest such graph (by where the DSA selection starts)
  for (const GraphEntry& e : graphs_)
    if (e.kind == GraphKind::DraftStep && e.g.B == seqs && e.g.T == slots && e.g.passes == k)
      n = std::max(n, be_.graph_kernels(e.id));
  return n;
}
int64_t Model::graph_kernels(int64_t seqs, int64_t rows_per_seq) const {
  return graph_kernels_of(false, seqs, rows_per_seq);
}
int64_t Model::draft_graph_kernels(int64_t seqs, int64_t rows_per_seq) const {
  return graph_kernels_of(true, seqs, rows_per_seq);
}

// A step of S sequences of T tokens each in the graph of B sequences (graph_shape): the real sequences first, as in
// the eager step, so that the logits rows (and the head-input rows kept for the MTP draft step) of the real
// sequences are the first rows of the graph's; then B − S padding sequences of T tokens (token 0 at position 0
// over the first key of sequence 0's first block, nothing stored; a draft pass gathers row pad_hrow for them).
void Model::pad_graph_step(const Step& st, const StepShape& sh, GraphShape g, std::span<const int32_t> mtp_hrows,
                           int32_t pad_hrow, PadStep& p) const {
  const int64_t B = g.B, T = g.T;
  const int64_t n = T > 0 ? B * T : g.tokens;  // (a ragged draft pass, T = 0: its B sequences, not padded)
  p.tokens.assign(st.tokens.begin(), st.tokens.end());
  p.tokens.resize(static_cast<size_t>(n), 0);
  p.seqs.assign(st.seqs.begin(), st.seqs.end());
  StepSequence pad = st.seqs.front();
  pad.start = 0;
  pad.blocks = pad.blocks.first(1);
  p.seqs.resize(static_cast<size_t>(B), pad);
  p.hrows.assign(mtp_hrows.begin(), mtp_hrows.end());
  if (!mtp_hrows.empty()) p.hrows.resize(static_cast<size_t>(n), pad_hrow);
  p.shape = sh;
  p.shape.max_ctx = res_ctx_;
  p.shape.max_blocks = res_blocks_;
  p.shape.rows = st.seqs.front().logits == LogitRows::All ? B * T : B;
  p.step = Step{p.tokens, p.seqs};
}

Model::Meta Model::stage_graph_step(const Step& st, const PagedKvCache& cache, const StepShape& sh, GraphShape g,
                                    Buffers& b, std::span<const int32_t> mtp_hrows, int32_t pad_hrow) {
  pad_graph_step(st, sh, g, mtp_hrows, pad_hrow, pad_);
  Meta m = stage_step(pad_.step, cache, pad_.shape, b, pad_.hrows, static_cast<int64_t>(st.seqs.size()));
  m.graph = true;
  return m;
}

// A decode or verify step in its graph; the logits stay in the workspace (downloaded when asked, else sampled).
void Model::graph_step(const Step& st, PagedKvCache& cache, float* logits, const StepShape& sh, GraphShape g) {
  Buffers b{};
  const Meta m = stage_graph_step(st, cache, sh, g, b);
  run_graph(GraphKind::Step, g, sh.any_long, cache,
            [&] { forward_step(pad_.step, cache, m, b, nullptr, nullptr, true); });
  if (logits) be_.download(logits, b.lg, sizeof(float) * static_cast<size_t>(sh.rows * cfg_.vocab_size));
  last_lg_ = b.lg;
}

void Model::forward(std::span<const int32_t> ids, KvCache& cache, float* logits, bool all_rows,
                    std::vector<float>* hidden) {
  const int64_t S = static_cast<int64_t>(ids.size());
  if (S == 0) return;
  const int64_t V = cfg_.vocab_size;
  for (int32_t id : ids)
    if (id < 0 || id >= V) fail("token id {} is out of range [0, {})", id, V);
  const std::vector<int32_t>& blocks = cache.ensure(be_, cache_dtype(), cache.length() + S);
  StepSequence q;
  q.start = cache.length();
  q.n_tokens = S;
  q.blocks = blocks;
  q.logits = logits ? (all_rows ? LogitRows::All : LogitRows::Last) : LogitRows::None;
  q.decode = S == 1 && cache.length() > 0;  // a single token after a prefill: decode
  Step st{ids, std::span<const StepSequence>(&q, 1)};
  step(st, *cache.pool_, logits, hidden);
  cache.len_ += S;
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
