// The step workspace layout, step metadata and graph runner of Model (model.cpp), shared with the MTP draft step
// (mtp.cpp).
// Private to src/model.
#pragma once
#include <cstdint>

#include "model/model.h"

namespace latent {

struct Model::Dims {
  int64_t N = 0, S = 0, Tm = 0, MB = 0, R = 0;  // tokens, sequences, max context, max blocks, logit rows
  int64_t Tn = 0;  // the most keys the naive form expands (Tm, bounded by ModelOptions::naive_max_context)
};

struct Model::Buffers {
  int32_t *tokens, *q_begin, *ctx_len, *btab, *lrows;
  int32_t* lq_begin;  // [2S]: per sequence, the first and end row of its prompt rows that take the absorbed form
  int64_t *pos, *slots;
  // Activations in the run's dtype (act_), except where said: iw, scores, router logits and weights and the head's
  // logits are always F32; yf (parallel models only) is the F32 staging of the partial sums the ranks all-reduce.
  Tensor h, x, y, yf, cq, q, kv, o;
  Tensor iq, iwa, iw, ik;
  float* scores;
  int32_t *sel, *cnt;
  Tensor gc, gk, kvb;
  Tensor g;
  MoeScratch moe;
  Tensor hx;
  float* lg;
  float* lgall;            // [ranks, R, vocab_chunk]: the all-gathered logits slices (vocab-parallel lm_head only)
  Tensor mtp_in, mtp_cat;  // MTP: [2N, D] enorm(embed) rows then hnorm(hidden) rows; their concat [N, 2D]
  int32_t *mtp_idx, *mtp_hrows;  // [2N] the concat's row order, [N] the hidden rows gathered
  int64_t score_rows;
  float* aq;  // declared FP8 activations: the quantized inputs of a linear (ActFp8::scratch), fp32
  int64_t aq_floats;
};

struct Model::Meta {
  int64_t N = 0, S = 0, max_ctx = 0, max_blocks = 0, rows = 0;
  bool any_long = false;             // some sequence sees more than index_topk keys (DSA selection needed)
  bool graph = false;                // a graph step: shapes fixed by the reserved limits (indexer over max_ctx keys)
  const int32_t* q_begin = nullptr;  // host [S+1]
  const int32_t* ctx = nullptr;      // host [S]
  StepSeqs seqs;                     // backend memory
  const Step* step = nullptr;

  // The step's shape over the metadata arrays carved in b (host copies h_qb [S+1], h_ctx [S]).
  Meta(const Step& st, int64_t n, int64_t s, int64_t ctx_max, int64_t blocks_max, int64_t n_rows, bool long_seq,
       const int32_t* h_qb, const int32_t* h_ctx, const Buffers& b)
      : N(n),
        S(s),
        max_ctx(ctx_max),
        max_blocks(blocks_max),
        rows(n_rows),
        any_long(long_seq),
        q_begin(h_qb),
        ctx(h_ctx),
        seqs{s, b.q_begin, b.ctx_len, b.btab, blocks_max, ctx_max, 0},
        step(&st) {}
};

// Runs body() — the ops of a step staged by stage_graph_step at shape g — from the backend graph of its key (kind,
// shape, with the DSA selection or not): the first time eagerly at that shape (every one-time setup of the ops
// happens there, and its results are the step's), then recorded (not run); later replayed. Returns whether it
// was replayed.
template <class Body>
bool Model::run_graph(GraphKind kind, GraphShape g, bool any_long, const PagedKvCache& cache, Body&& body) {
  keep_graphs_valid(cache);
  const bool draft = kind != GraphKind::Step;
  for (const GraphEntry& e : graphs_)
    if (e.kind == kind && e.g == g && e.any_long == any_long) {
      be_.graph_replay(e.id);
      ++(draft ? draft_graph_replays_ : graph_replays_);
      if (draft) draft_passes_replayed_ += g.passes;
      return true;
    }
  body();
  be_.sync();
  be_.graph_begin();
  try {
    body();
  } catch (...) {
    try {
      be_.graph_end();
    } catch (...) {
    }
    throw;
  }
  graphs_.push_back({kind, g, any_long, be_.graph_end()});
  ++(draft ? draft_graph_captures_ : graph_captures_);
  return false;
}

}  // namespace latent
