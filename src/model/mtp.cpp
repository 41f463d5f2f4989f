// Multi-token prediction (MTP) drafting over the MTP layer a GLM-5 / DeepSeek-V3 checkpoint stores after its L
// decoder layers. The math is tools/mtp_reference.py's: slot q of the layer pairs the head-input hidden state of
// position q-1 (the final RMSNorm's output of the last Model::step, kept in backend memory) with the embedding of
// the token at q; x = eh_proj(concat(enorm(embed), hnorm(hidden))) goes through the layer's decoder block (MLA,
// DSA indexer, MoE: Model::decoder_layer with l = L, over the layer's own pools in the paged cache), then
// shared_head.norm and the head; the draft is the head's argmax (Backend::sample_rows, greedy: only ids leave the
// backend). Draft j + 1 applies the layer to its own normed output at draft j's slot. A pass runs in a backend graph
// (CUDA graph) when the main model's steps would (ModelOptions::graphs, within the reserve() limits) and every
// sequence decodes and drafts: every later pass (one slot per sequence, padded to a bucket), and the first pass —
// padded to a bucket when every sequence fills the same number of slots (a verify every sequence accepted alike),
// else (ragged) in a graph of its exact layout, up to Model::kMaxRaggedGraphs of those. When every pass of a step
// would, and every sequence drafts the same k >= 2 tokens, the k passes run as one graph with one download of their
// ids (draft_step_in_one_graph); else each pass on its own (graphed or eager), downloading its ids.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/model.h"
#include "model/model_internal.h"

namespace latent {

void Model::ensure_mtp_buffers(int64_t rows, int64_t seqs) {
  const int64_t D = cfg_.hidden_size;
  const size_t esz = Tensor::size_of(act_);
  // (Graphs that recorded a buffer moved here are dropped before the next runs: Model::keep_graphs_valid.)
  if (rows > kept_cap_) {
    if (kept_) be_.dealloc(kept_);
    kept_ = nullptr;
    const int64_t cap = std::max(rows, kept_cap_ * 2);
    kept_ = be_.alloc(esz * static_cast<size_t>((cap + 1) * D), "the MTP hidden rows");
    kept_cap_ = cap;
    kept_rows_ = 0;
    be_.fill(Tensor(static_cast<char*>(kept_) + esz * static_cast<size_t>(cap * D), act_, 1, D), 0.0f);  // zero row
  }
  if (seqs > mtp_prev_cap_) {
    for (void* p : {mtp_prev_, static_cast<void*>(mtp_ids_dev_), static_cast<void*>(mtp_params_dev_)})
      if (p) be_.dealloc(p);
    mtp_prev_ = nullptr;
    mtp_ids_dev_ = nullptr;
    mtp_params_dev_ = nullptr;
    const int64_t cap = std::max(seqs, mtp_prev_cap_ * 2);
    mtp_prev_ = be_.alloc(esz * static_cast<size_t>(cap * D), "the MTP draft rows");
    mtp_ids_dev_ = static_cast<int32_t*>(be_.alloc(sizeof(int32_t) * static_cast<size_t>(cap), "MTP draft ids"));
    mtp_params_dev_ = static_cast<SampleRowParams*>(
        be_.alloc(sizeof(SampleRowParams) * static_cast<size_t>(cap), "MTP draft sampling rows"));
    std::vector<SampleRowParams> greedy(static_cast<size_t>(cap));
    for (auto& r : greedy) r.temperature = 0.0f;
    be_.upload(mtp_params_dev_, greedy.data(), sizeof(SampleRowParams) * greedy.size());
    mtp_prev_cap_ = cap;
  }
}

// A pass in a graph when every sequence fills the same number of slots and drafts (graph_shape). Padding sequences
// gather the zero row of the kept rows, or the previous pass's first row (both hold finite values). The drafts'
// greedy rows (no edits, bans or temperature) leave the head's logits as they are (Backend::sample_rows writes the
// final scores), so the diagnostics' logits are read after the pass, graphed or not.
void Model::mtp_pass(bool from_step, std::span<const int32_t> hrows, std::span<const int32_t> tokens,
                     std::span<const StepSequence> sseqs, PagedKvCache& cache, int32_t* ids, float* logits) {
  const int64_t L = cfg_.num_hidden_layers;
  const Step st{tokens, sseqs};
  const StepShape sh = validate_step(st, cache, L + 1);
  // The recorded / forced decisions of the diagnostics cover the L main layers only.
  ForwardDecisions* rec = opt_.record_decisions;
  const ForwardDecisions* force = opt_.force_decisions;
  opt_.record_decisions = nullptr;
  opt_.force_decisions = nullptr;
  struct Restore {
    ModelOptions& o;
    ForwardDecisions* r;
    const ForwardDecisions* f;
    ~Restore() {
      o.record_decisions = r;
      o.force_decisions = f;
    }
  } restore{opt_, rec, force};
  const GraphKind kind = from_step ? GraphKind::DraftFromStep : GraphKind::DraftFromDraft;
  GraphShape g = graph_shape(st, sh, kind);
  if (g.T == 0 && !ragged_graph_allowed(kind, g, sh.any_long)) g = {};
  const void* src = from_step ? kept_ : mtp_prev_;
  ++draft_passes_;
  Buffers b{};
  if (g.B > 0) {
    const Meta m = stage_graph_step(st, cache, sh, g, b, hrows, from_step ? static_cast<int32_t>(kept_cap_) : 0);
    run_graph(kind, g, sh.any_long, cache, [&] { mtp_ops(m, b, src, cache, mtp_ids_dev_); });
  } else {
    const Meta m = stage_step(st, cache, sh, b, hrows);
    mtp_ops(m, b, src, cache, mtp_ids_dev_);
  }
  const size_t rows = static_cast<size_t>(sh.rows);
  if (logits && rows > 0) be_.download(logits, b.lg, sizeof(float) * rows * static_cast<size_t>(cfg_.vocab_size));
  if (rows > 0) {
    be_.download(ids, mtp_ids_dev_, sizeof(int32_t) * rows);
    ++draft_id_downloads_;
  }
  be_.sync();
}

// x = eh_proj(concat(enorm(embed(tokens)), hnorm(hidden rows))), the MTP decoder layer over its pools with
// shared_head.norm fused at its end, then for the rows that draft: the head's logits, the normed rows kept for the
// next pass (mtp_prev_) and the greedy ids.
void Model::mtp_ops(const Meta& m, Buffers& b, const void* hidden_src, PagedKvCache& cache, int32_t* ids) {
  const int64_t L = cfg_.num_hidden_layers, D = cfg_.hidden_size, V = cfg_.vocab_size, N = m.N;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const MtpWeights& mt = w_.mtp.front();
  const MtpParams& mp = mtp_p_.front();
  // The concat [enorm rows; hnorm rows] gathered as row 2i = row i, row 2i+1 = row N + i (the [2N, D] result read
  // as [N, 2D]); the row order and the hidden rows came with the metadata (stage_step).
  const Tensor in = b.mtp_in.with_rows(2 * N), e = in.row_slice(0, N), hh = in.row_slice(N, N);
  const Tensor src(const_cast<void*>(hidden_src), act_, std::max(kept_cap_, mtp_prev_cap_) + 1, D);
  be_.embedding(mt.embed, b.tokens, e);
  be_.gather_rows(src, b.mtp_hrows, hh);
  be_.rms_norm(e, mp.enorm, eps, e);
  be_.rms_norm(hh, mp.hnorm, eps, hh);
  const Tensor cat(b.mtp_cat.data, act_, 2 * N, D);
  be_.gather_rows(in, b.mtp_idx, cat);
  linear(mt.eh_proj, Tensor(b.mtp_cat.data, act_, N, 2 * D), b.h.with_rows(N));
  bool sparse = false;
  decoder_layer(L, m, cache, b, sparse, false, mp.head_norm);  // x = shared_head.norm(h) at the end
  if (m.rows == 0) return;
  const Tensor hx = b.hx.with_rows(m.rows);
  be_.gather_rows(b.x.with_rows(N), b.lrows, hx);
  be_.matmul(mt.head, hx, Tensor(b.lg, DType::F32, m.rows, V));
  be_.copy(mtp_prev_, hx.data, static_cast<size_t>(m.rows * D) * hx.elem_size());
  be_.sample_rows(b.lg, m.rows, V, mtp_params_dev_, nullptr, nullptr, nullptr, ids);
}

// One pass of a draft step on the one-graph route: its step as the per-pass route builds it (mtp_draft; a later
// pass's tokens are drafts not made yet: zeros here, the graph reads them from backend memory), its shape and graph
// shape, the step padded to that graph, and its metadata arrays carved in dstep_buf_.
struct Model::DraftPass {
  std::vector<int32_t> tokens, hrows;
  std::vector<StepSequence> seqs;
  StepShape sh;
  GraphShape g;
  PadStep pad;
  Buffers meta{};
};

// The k passes of the step, each validated and shaped as a graph of its own; false when one would run eagerly.
bool Model::plan_draft_passes(std::span<const MtpSequence> seqs, const PagedKvCache& cache,
                              std::vector<DraftPass>& ps) const {
  const int64_t S = static_cast<int64_t>(seqs.size()), k = static_cast<int64_t>(ps.size());
  for (int64_t j = 0; j < k; ++j) {
    DraftPass& p = ps[static_cast<size_t>(j)];
    for (int64_t i = 0; i < S; ++i) {
      const MtpSequence& q = seqs[static_cast<size_t>(i)];
      StepSequence s;
      s.blocks = q.blocks;
      s.logits = LogitRows::Last;
      if (j == 0) {  // the slots, their hidden rows from the last step's head-input rows
        p.tokens.insert(p.tokens.end(), q.tokens.begin(), q.tokens.end());
        for (int64_t t = 0; t < q.n_slots; ++t)
          p.hrows.push_back(q.zero_first && t == 0 ? static_cast<int32_t>(kept_cap_)
                                                   : static_cast<int32_t>(q.hidden_row + t));
        s.start = q.start;
        s.n_tokens = q.n_slots;
        s.decode = q.decode;
      } else {  // the slot after the previous draft, its hidden row the previous pass's row of the sequence
        p.tokens.push_back(0);
        p.hrows.push_back(static_cast<int32_t>(i));
        s.start = q.start + q.n_slots + j - 1;
        s.n_tokens = 1;
        s.decode = true;
      }
      p.seqs.push_back(s);
    }
    const Step st{p.tokens, p.seqs};
    p.sh = validate_step(st, cache, cfg_.num_hidden_layers + 1);
    p.g = graph_shape(st, p.sh, j == 0 ? GraphKind::DraftFromStep : GraphKind::DraftFromDraft);
    if (p.g.B == 0) return false;
  }
  return true;
}

// Stages the planned passes for the graph: each padded to its graph's sequences; dstep_buf_ laid out as the ids
// [k, Bmax] (zero: a later pass's padding sequences may read ids an earlier pass's padding did not write) and then
// every pass's metadata, filled in its host image and uploaded in one copy; the workspace carved once at the largest
// pass (its logits rows: every pass's, Bmax apart). bufs[j] / metas[j]: pass j's buffers (the shared activations,
// its own metadata, tokens = pass j - 1's ids for j > 0, logits rows) and Meta. Returns the ids' address.
int32_t* Model::stage_draft_passes(std::vector<DraftPass>& ps, int64_t Bmax, int64_t n_real, const PagedKvCache& cache,
                                   std::vector<Buffers>& bufs, std::vector<Meta>& metas) {
  const int64_t k = static_cast<int64_t>(ps.size()), V = cfg_.vocab_size;
  for (int64_t j = 0; j < k; ++j) {
    DraftPass& p = ps[static_cast<size_t>(j)];
    pad_graph_step(Step{p.tokens, p.seqs}, p.sh, p.g, p.hrows, j == 0 ? static_cast<int32_t>(kept_cap_) : 0, p.pad);
  }
  const size_t ids_bytes = sizeof(int32_t) * static_cast<size_t>(k * Bmax);
  auto lay_out = [&](char* base) {
    size_t off = ids_bytes;
    for (DraftPass& p : ps) {
      const int64_t n = static_cast<int64_t>(p.pad.tokens.size());
      carve_meta(dims_for(n, p.g.B, res_ctx_, res_blocks_, p.pad.shape.rows), base, off, p.meta);
    }
    return (off + 63) / 64 * 64;
  };
  const size_t bytes = lay_out(nullptr);
  if (bytes > dstep_cap_) {
    // Only the one-graph draft steps recorded the old buffer: the decode, verify and per-pass graphs stay.
    drop_graphs_of(GraphKind::DraftStep);
    if (dstep_buf_) be_.dealloc(dstep_buf_);
    dstep_buf_ = nullptr;
    const size_t cap = std::max(bytes, dstep_cap_ * 2);
    dstep_buf_ = static_cast<char*>(be_.alloc(cap, "the MTP draft step's ids and metadata"));
    dstep_cap_ = cap;
  }
  lay_out(dstep_buf_);
  int32_t* const ids = reinterpret_cast<int32_t*>(dstep_buf_);

  int64_t n_max = 0;
  for (const DraftPass& p : ps) n_max = std::max(n_max, static_cast<int64_t>(p.pad.tokens.size()));
  const Dims da = dims_for(n_max, Bmax, res_ctx_, res_blocks_, k * Bmax);
  ensure_workspace(da);
  Buffers act{};
  carve(da, ws_, act);
  act_fp8_.scratch = act.aq;
  act_fp8_.scratch_floats = act.aq_floats;

  dstep_host_.assign(bytes, 0);
  bufs.assign(static_cast<size_t>(k), act);
  metas.clear();
  metas.reserve(static_cast<size_t>(k));  // (Meta points at its pass's padded step: no reallocation)
  for (int64_t j = 0; j < k; ++j) {
    DraftPass& p = ps[static_cast<size_t>(j)];
    const MetaHost h =
        fill_meta(p.pad.step, cache, res_blocks_, p.meta, dstep_buf_, dstep_host_.data(), p.pad.hrows, n_real);
    Buffers& b = bufs[static_cast<size_t>(j)];
    for (auto field : {&Buffers::tokens, &Buffers::q_begin, &Buffers::ctx_len, &Buffers::btab, &Buffers::lrows,
                       &Buffers::lq_begin, &Buffers::mtp_idx, &Buffers::mtp_hrows})
      b.*field = p.meta.*field;
    b.pos = p.meta.pos;
    b.slots = p.meta.slots;
    if (j > 0) b.tokens = ids + (j - 1) * Bmax;  // the previous pass's drafts
    b.lg = act.lg + j * Bmax * V;
    const int64_t n = static_cast<int64_t>(p.pad.tokens.size());
    metas.emplace_back(p.pad.step, n, p.g.B, res_ctx_, res_blocks_, p.pad.shape.rows, p.sh.any_long, h.q_begin, h.ctx,
                       b);
    metas.back().graph = true;
    metas.back().seqs.split_ctx = res_ctx_;
  }
  be_.upload(dstep_buf_, dstep_host_.data(), bytes);
  return ids;
}

// The draft step as one graph. Eligible when every sequence drafts the same k >= 2 tokens and each of the k passes
// would run in a graph of its own on the per-pass route (graph_shape), and the k passes' logits rows fit the
// workspace's reserved rows. The graph runs the per-pass route's passes, in order, over the same buffers, each at
// its own graph shape (the first pass's B sequences of T slots or its ragged layout, the later ones' B_later of one
// slot); only where their metadata and ids live differs: every pass's metadata (a later pass's positions and slots
// are its sequences' next ones, known before any draft) is staged into dstep_buf_ in one upload before the replay,
// pass j writes its ids into row j of the ids there, and pass j + 1 embeds them from there. Nothing crosses to the
// host until one download of every pass's ids at the end. (k = 1 stays on the per-pass route: one graph, one
// download already.)
bool Model::draft_step_in_one_graph(std::span<const MtpSequence> seqs, PagedKvCache& cache, int32_t* drafts,
                                    float* logits) {
  const int64_t S = static_cast<int64_t>(seqs.size()), k = seqs.front().n_draft, V = cfg_.vocab_size;
  // (Without graphs, before building the passes' steps: the CPU backend's draft steps take the per-pass route.)
  if (!opt_.draft_step_graph || !opt_.graphs || !be_.graphs_supported() || k < 2) return false;
  for (const MtpSequence& q : seqs)
    if (q.n_draft != k) return false;
  std::vector<DraftPass> ps(static_cast<size_t>(k));
  if (!plan_draft_passes(seqs, cache, ps)) return false;
  const GraphShape& g0 = ps.front().g;
  const int64_t B1 = ps.back().g.B, Bmax = std::max(g0.B, B1);
  if (k * Bmax > res_tokens_) return false;  // every pass's logits rows in the workspace's reserved rows
  int64_t long_from = k;                     // the first pass with the DSA selection (k: none)
  for (int64_t j = k - 1; j >= 0; --j)
    if (ps[static_cast<size_t>(j)].sh.any_long) long_from = j;
  const GraphShape key{g0.B, g0.T, g0.tokens, k, B1, long_from};
  const bool any_long = ps.front().sh.any_long;
  if (g0.T == 0 && !ragged_graph_allowed(GraphKind::DraftStep, key, any_long)) return false;

  std::vector<Buffers> bufs;
  std::vector<Meta> metas;
  int32_t* const ids_dev = stage_draft_passes(ps, Bmax, S, cache, bufs, metas);
  run_graph(GraphKind::DraftStep, key, any_long, cache, [&] {
    for (int64_t j = 0; j < k; ++j)
      mtp_ops(metas[static_cast<size_t>(j)], bufs[static_cast<size_t>(j)], j == 0 ? kept_ : mtp_prev_, cache,
              ids_dev + j * Bmax);
  });
  draft_passes_ += k;
  ++draft_step_graphs_;

  // One download of every pass's ids (and, for the diagnostics, of every pass's logits rows).
  std::vector<int32_t> ids(static_cast<size_t>(k * Bmax));
  be_.download(ids.data(), ids_dev, ids.size() * sizeof(int32_t));
  ++draft_id_downloads_;
  std::vector<float> lg;
  if (logits) {
    lg.resize(static_cast<size_t>(k * Bmax * V));
    be_.download(lg.data(), bufs.front().lg, sizeof(float) * lg.size());
  }
  be_.sync();
  for (int64_t i = 0; i < S; ++i)
    for (int64_t j = 0; j < k; ++j) {
      drafts[i * k + j] = ids[static_cast<size_t>(j * Bmax + i)];
      if (logits)
        std::memcpy(logits + (i * k + j) * V, lg.data() + (j * Bmax + i) * V, sizeof(float) * static_cast<size_t>(V));
    }
  return true;
}

void Model::mtp_draft(std::span<const MtpSequence> seqs, PagedKvCache& cache, int32_t* drafts,
                      const std::vector<bool>* banned, float* logits) {
  if (w_.mtp.empty()) fail("model: no MTP layer is loaded (speculative decoding is off)");
  const int64_t L = cfg_.num_hidden_layers, V = cfg_.vocab_size, bt = cache.block_tokens();
  if (cache.num_layers() < L + 1) fail("model: the KV cache has no pools for the MTP layer");
  // Validate every sequence (the passes validate their steps too, but the recursion must not start half-way).
  int64_t max_draft = 0;
  for (const MtpSequence& q : seqs) {
    if (q.n_slots < 1 || static_cast<int64_t>(q.tokens.size()) != q.n_slots || q.start < 0 || q.n_draft < 0)
      fail("mtp draft: a sequence needs n_slots >= 1 tokens (got {} slots, {} tokens, start {}, {} drafts)", q.n_slots,
           q.tokens.size(), q.start, q.n_draft);
    const int64_t first = q.zero_first ? 1 : 0;
    if (q.n_slots > first && (q.hidden_row + first < 0 || q.hidden_row + q.n_slots - 1 >= kept_rows_))
      fail("mtp draft: hidden rows [{}, {}) outside the last step's {} rows", q.hidden_row + first,
           q.hidden_row + q.n_slots, kept_rows_);
    const int64_t slots = q.start + q.n_slots + std::max<int32_t>(q.n_draft - 1, 0);
    if (static_cast<int64_t>(q.blocks.size()) * bt < slots)
      fail("mtp draft: a block table of {} blocks cannot hold {} slots", q.blocks.size(), slots);
    if (cfg_.max_position_embeddings > 0 && slots > cfg_.max_position_embeddings)
      fail("mtp draft: slot {} exceeds max_position_embeddings {}", slots - 1, cfg_.max_position_embeddings);
    for (int32_t t : q.tokens)
      if (t < 0 || t >= V) fail("token id {} is out of range [0, {})", t, V);
    max_draft = std::max<int64_t>(max_draft, q.n_draft);
  }
  if (seqs.empty()) return;
  // Room for every pass's rows, padded to a graph's sequences, before the first pass: a later pass must not move
  // the rows the previous one left.
  ensure_mtp_buffers(0, decode_graph_bucket(static_cast<int64_t>(seqs.size())));
  (void)banned;  // a draft of a banned id is rejected by the target like any other wrong draft
  if (draft_step_in_one_graph(seqs, cache, drafts, logits)) return;
  std::vector<int64_t> out_at(seqs.size());  // where each sequence's drafts go
  {
    int64_t at = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      out_at[i] = at;
      at += seqs[i].n_draft;
    }
  }
  // Pass 1: the slots from the last step's rows; the first draft of every sequence that wants one.
  std::vector<int32_t> toks, hrows, ids(seqs.size());
  std::vector<StepSequence> ss;
  std::vector<size_t> row_seq;  // logits row -> sequence
  for (size_t i = 0; i < seqs.size(); ++i) {
    const MtpSequence& q = seqs[i];
    toks.insert(toks.end(), q.tokens.begin(), q.tokens.end());
    for (int64_t j = 0; j < q.n_slots; ++j)
      hrows.push_back(q.zero_first && j == 0 ? static_cast<int32_t>(kept_cap_)
                                             : static_cast<int32_t>(q.hidden_row + j));
    StepSequence s;
    s.start = q.start;
    s.n_tokens = q.n_slots;
    s.blocks = q.blocks;
    s.logits = q.n_draft > 0 ? LogitRows::Last : LogitRows::None;
    s.decode = q.decode;
    ss.push_back(s);
    if (q.n_draft > 0) row_seq.push_back(i);
  }
  std::vector<float> lg;
  float* lrow = nullptr;
  if (logits) {
    lg.resize(row_seq.size() * static_cast<size_t>(V));
    lrow = lg.data();
  }
  mtp_pass(true, hrows, toks, ss, cache, ids.data(), lrow);
  std::vector<int32_t> last(seqs.size(), -1);
  auto put = [&](size_t r, int64_t j) {
    const size_t i = row_seq[r];
    drafts[out_at[i] + j] = ids[r];
    last[i] = ids[r];
    if (logits) std::memcpy(logits + (out_at[i] + j) * V, lg.data() + r * V, sizeof(float) * static_cast<size_t>(V));
  };
  for (size_t r = 0; r < row_seq.size(); ++r) put(r, 0);
  // Passes 2 ..: one token per sequence still drafting, its hidden state the previous pass's normed row.
  std::vector<size_t> prev_rows = row_seq;  // prev pass row r -> sequence
  for (int64_t j = 1; j < max_draft; ++j) {
    toks.clear();
    hrows.clear();
    ss.clear();
    std::vector<size_t> next;
    for (size_t r = 0; r < prev_rows.size(); ++r) {
      const size_t i = prev_rows[r];
      const MtpSequence& q = seqs[i];
      if (q.n_draft <= j) continue;
      toks.push_back(last[i]);
      hrows.push_back(static_cast<int32_t>(r));
      StepSequence s;
      s.start = q.start + q.n_slots + j - 1;
      s.n_tokens = 1;
      s.blocks = q.blocks;
      s.logits = LogitRows::Last;
      s.decode = true;
      ss.push_back(s);
      next.push_back(i);
    }
    if (next.empty()) break;
    row_seq = next;
    if (logits) {
      lg.resize(row_seq.size() * static_cast<size_t>(V));
      lrow = lg.data();
    }
    ids.resize(row_seq.size());
    mtp_pass(false, hrows, toks, ss, cache, ids.data(), lrow);
    for (size_t r = 0; r < row_seq.size(); ++r) put(r, j);
    prev_rows = next;
  }
}

}  // namespace latent
