// The default implementations of the decode blocks (backend/backend.h): each block composed of primitives, in the
// order and with the rounding points of the unfused forward pass. Every backend inherits them (a backend that
// fuses a block overrides it); they are also the reference a fused block is tested against.
#include <algorithm>

#include "backend/backend.h"

namespace latent {

namespace {

// A linear of a block: with declared FP8 activations (act_fp8_applies: act set, the weights block FP8) through
// matmul_act_fp8, else the plain matmul.
void block_linear(Backend& be, const ActFp8* act, const QuantWeight& w, const Tensor& x, const Tensor& y,
                  const Epilogue& ep = {}) {
  if (act_fp8_applies(act, w, ep.glu ? ep.glu[0] : nullptr))
    be.matmul_act_fp8(w, x, *act, y, ep);
  else
    be.matmul(w, x, y, ep);
}

// Whether every weight of a grouped call (and its SwiGLU gates) is block FP8 of one block_cols.
bool grouped_act_fp8(const ActFp8* act, const QuantWeight* const* w, const QuantWeight* const* glu, int64_t n) {
  if (!act) return false;
  int64_t bc = 0;
  for (int64_t g = 0; g < n; ++g) {
    for (const QuantWeight* q : {w[g], glu ? glu[g] : nullptr}) {
      if (!q) continue;
      if (!q->act_fp8 || q->format != WeightFormat::FP8_E4M3_BLOCK || (bc && q->block_cols != bc)) return false;
      bc = q->block_cols;
    }
  }
  return bc > 0;
}

void block_grouped(Backend& be, const ActFp8* act, const QuantWeight* const* w, int64_t n, const int64_t* offsets,
                   const Tensor& x, const Tensor& y, const Epilogue& ep = {}) {
  if (grouped_act_fp8(act, w, ep.glu, n))
    be.grouped_matmul_act_fp8(w, n, offsets, x, *act, y, ep);
  else
    be.grouped_matmul(w, n, offsets, x, y, ep);
}

}  // namespace

void Backend::mla_qkv(const MlaLayer& L, const Tensor& x, const StepTokens& tok, const KvPool& pool, const Tensor& cq,
                      const Tensor& q, const Tensor& kv) {
  const int64_t H = L.d.n_heads, dn = L.d.nope, dr = L.d.rope, dqk = L.d.qk(), dc = L.d.latent;
  // Query path: cq = RMSNorm(x·Wq_aᵀ + b), q = cq·Wq_bᵀ, q_pe of every head rotated in place.
  Epilogue qa;
  qa.bias = L.q_a_bias;
  block_linear(*this, L.act, *L.q_a, x, cq, qa);
  rms_norm(cq, L.q_a_norm, L.norm_eps, cq);
  block_linear(*this, L.act, *L.q_b, cq, q);
  rope(q.col_slice(dn, (H - 1) * dqk + dr), H, dqk, tok.pos, L.rope);
  // Latent path: [c ; k_pe] = x·Wkv_aᵀ + b; c normalized and k_pe rotated in place; the row stored in the pool.
  Epilogue ka;
  ka.bias = L.kv_a_bias;
  block_linear(*this, L.act, *L.kv_a, x, kv, ka);
  const Tensor c = kv.col_slice(0, dc), kpe = kv.col_slice(dc, dr);
  rms_norm(c, L.kv_a_norm, L.norm_eps, c);
  rope(kpe, 1, dr, tok.pos, L.rope);
  kv_store(pool, tok.slots, kv, 0);
}

void Backend::mla_decode_attention(const MlaLayer& L, const Tensor& q, const KvPool& pool, const StepSeqs& seqs,
                                   const int64_t* pos, const KeySelection& sel, const Tensor& o) {
  mla_attention_absorbed_paged(L.d, q, *L.kv_b, pool, seqs, pos, sel, L.softmax_scale, o);
}

void Backend::moe_route(const MoeLayer& L, const Tensor& x, const MoeScratch& s) {
  const int64_t M = x.rows, E = L.router.n_experts;
  // Router logits in fp32 (never rounded).
  matmul(*L.gate, x, Tensor(s.logits, DType::F32, M, E));
  router(s.logits, L.score_bias, M, L.router, s.ids, s.weights);
}

void Backend::moe_experts(const MoeLayer& L, const Tensor& x, const MoeScratch& s, const Tensor& y,
                          bool include_shared) {
  const int64_t M = x.rows, E = L.router.n_experts, K = L.router.top_k, n = M * K;
  // Group the (token, slot) pairs by expert (ascending expert, then token: HF eager order).
  moe_group(s.ids, s.weights, M, K, E, s.offsets, s.token, s.pair_w);
  const Tensor xs = s.xs.with_rows(n), eg = s.eg.with_rows(n), ed = s.ed.with_rows(n);
  gather_rows(x, s.token, xs);
  // This rank's experts [e0, e1) (all of them on one rank): their rows of the grouped pairs. With expert
  // parallelism the other experts' rows of ed stay zero, so the combine adds exact zeros for them and the partial
  // outputs of the ranks are all-reduced by the caller.
  const int64_t e0 = L.expert0, e1 = L.expert1;
  if (e1 - e0 < E) fill(ed, 0.0f);
  Epilogue glu;
  glu.glu = L.w_gate + e0;
  block_grouped(*this, L.act, L.w_up + e0, e1 - e0, s.offsets + e0, xs, eg, glu);  // SiLU(x·Wgᵀ) ⊙ (x·Wuᵀ)
  block_grouped(*this, L.act, L.w_down + e0, e1 - e0, s.offsets + e0, eg, ed);
  moe_combine(ed, s.ids, K, s.offsets, s.token, s.pair_w, y);
  if (include_shared && L.shared_up) {
    const Tensor sh = s.sh.with_rows(M);
    Epilogue sg;
    sg.glu = &L.shared_gate;
    block_linear(*this, L.act, *L.shared_up, x, sh, sg);
    Epilogue res;
    res.residual = &y;
    block_linear(*this, L.act, *L.shared_down, sh, y, res);  // y = R(routed + R(shared))
  }
}

void Backend::moe_combine(const Tensor& x, const int32_t*, int64_t, const int64_t*, const int32_t* token,
                          const float* weight, const Tensor& y) {
  fill(y, 0.0f);
  scatter_add_weighted(x, token, weight, y);
}

void Backend::moe_ffn(const MoeLayer& L, const Tensor& x, const MoeScratch& s, const Tensor& y, bool include_shared) {
  moe_route(L, x, s);
  moe_experts(L, x, s, y, include_shared);
}

}  // namespace latent
