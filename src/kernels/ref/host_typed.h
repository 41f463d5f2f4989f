// HostTyped<Derived>: the typed ops of backend/backend.h for a host backend whose arithmetic is written over
// contiguous fp32 arrays (ref, cpu). Each op takes fp32 views of its inputs (host_tensor.h: the tensor itself when
// it is F32 and contiguous, else a converted copy), runs Derived's fp32 implementation (`*_f32`, with `bf16` = the
// output is BF16, so the op rounds at its internal bf16 points), and stores the result in the output's dtype.
// With F32 contiguous tensors nothing is copied. The linear ops apply the epilogue with host::finish_linear, whose
// SwiGLU / gate step runs Derived's own silu_mul_f32, so a fused call equals the unfused sequence bit for bit.
#pragma once
#include <vector>

#include "backend/backend.h"
#include "kernels/ref/host_tensor.h"

namespace latent {

template <class Derived>
class HostTyped : public Backend {
 public:
  void matmul(const QuantWeight& w, const Tensor& x, const Tensor& y, const Epilogue& ep = {}) override {
    const int64_t M = x.rows, N = w.rows;
    if (M <= 0 || N <= 0) return;
    const float* xf = host::f32_in(x, tl(0));
    const bool direct = ep.empty() && y.dtype == DType::F32 && y.contiguous();
    float* acc = direct ? y.f32() : tl_ptr(1, M * N);
    self().matmul_f32(w, xf, M, acc);
    if (direct) return;
    float* gacc = nullptr;
    if (ep.glu) {
      gacc = tl_ptr(2, M * N);
      self().matmul_f32(*ep.glu[0], xf, M, gacc);
    }
    host::finish_linear(acc, gacc, y, ep, silu());
  }

  void grouped_matmul(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const Tensor& x,
                      const Tensor& y, const Epilogue& ep = {}) override {
    if (n_groups <= 0) return;
    const int64_t r0 = offsets[0], r1 = offsets[n_groups], N = y.cols;
    if (r1 <= r0) return;
    // The groups' rows [r0, r1) of x and y (the epilogue tensors are indexed like y).
    const Tensor xr = x.row_slice(r0, r1 - r0), yr = y.row_slice(r0, r1 - r0);
    const float* xf = host::f32_in(xr, tl(0));
    thread_local std::vector<int64_t> rel;
    rel.resize(static_cast<size_t>(n_groups + 1));
    for (int64_t g = 0; g <= n_groups; ++g) rel[g] = offsets[g] - r0;
    const bool direct = ep.empty() && y.dtype == DType::F32 && y.contiguous();
    float* acc = direct ? yr.f32() : tl_ptr(1, (r1 - r0) * N);
    self().grouped_matmul_f32(w, n_groups, rel.data(), xf, acc);
    if (direct) return;
    float* gacc = nullptr;
    if (ep.glu) {
      gacc = tl_ptr(2, (r1 - r0) * N);
      self().grouped_matmul_f32(ep.glu, n_groups, rel.data(), xf, gacc);
    }
    host::finish_linear_rows(acc, gacc, yr, ep, r0, silu());
  }

  void embedding(const QuantWeight& table, const int32_t* ids, const Tensor& out) override {
    float* o = host::f32_out(out, tl(0));
    self().embedding_f32(table, ids, out.rows, o);
    host::store_out(out, o);
  }

  void rms_norm(const Tensor& x, const float* w, float eps, const Tensor& y) override {
    const float* xf = host::f32_in(x, tl(0));
    float* yf = host::f32_out(y, tl(1));
    self().rms_norm_f32(xf, w, x.rows, x.cols, eps, yf, y.bf16());
    host::store_out(y, yf);
  }

  void layer_norm(const Tensor& x, const float* w, const float* b, float eps, const Tensor& y) override {
    const float* xf = host::f32_in(x, tl(0));
    float* yf = host::f32_out(y, tl(1));
    self().layer_norm_f32(xf, w, b, x.rows, x.cols, eps, yf, y.bf16());
    host::store_out(y, yf);
  }

  void rope(const Tensor& x, int64_t n_heads, int64_t head_stride, const int64_t* pos, const RopeParams& p) override {
    if (x.dtype == DType::F32) {  // in place over the strided rows
      self().rope_f32(x.f32(), x.rows, n_heads, x.ld, head_stride, pos, p, false);
      return;
    }
    float* xf = host::f32_out(x, tl(0), true);
    self().rope_f32(xf, x.rows, n_heads, x.cols, head_stride, pos, p, true);
    host::store_out(x, xf);
  }

  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    const float* g = host::f32_in(gate, tl(0));
    const float* u = host::f32_in(up, tl(1));
    float* o = host::f32_out(out, tl(2));
    self().silu_mul_f32(g, u, out.numel(), o, out.bf16());
    host::store_out(out, o);
  }

  void add(const Tensor& y, const Tensor& x) override {
    const float* xf = host::f32_in(x, tl(0));
    float* yf = host::f32_out(y, tl(1), true);
    self().add_f32(yf, xf, y.numel(), y.bf16());
    host::store_out(y, yf);
  }

  void mla_attention_naive(const MlaDims& d, const Tensor& q, const Tensor& kvb, const Tensor& k_pe, int64_t T,
                           const int64_t* q_pos, const KeySelection& sel, float scale, const Tensor& o) override {
    const float* qf = host::f32_in(q, tl(0));
    const float* kf = host::f32_in(kvb.with_rows(T), tl(1));
    const float* pf = host::f32_in(k_pe.with_rows(T), tl(2));
    float* of = host::f32_out(o, tl(3));
    self().mla_attention_naive_f32(d, qf, kf, pf, q.rows, T, q_pos, sel, scale, of, o.bf16());
    host::store_out(o, of);
  }

  void mla_attention_absorbed(const MlaDims& d, const Tensor& q, const QuantWeight& kv_b, const Tensor& c,
                              const Tensor& k_pe, int64_t T, const int64_t* q_pos, const KeySelection& sel, float scale,
                              const Tensor& o) override {
    const float* qf = host::f32_in(q, tl(0));
    const float* cf = host::f32_in(c.with_rows(T), tl(1));
    const float* pf = host::f32_in(k_pe.with_rows(T), tl(2));
    float* of = host::f32_out(o, tl(3));
    self().mla_attention_absorbed_f32(d, qf, kv_b, cf, pf, q.rows, T, q_pos, sel, scale, of, o.bf16());
    host::store_out(o, of);
  }

  void indexer_scores(const Tensor& q, const Tensor& w, const Tensor& k, int64_t n_heads, float scale,
                      const int64_t* q_pos, float* scores) override {
    const float* qf = host::f32_in(q, tl(0));
    const float* wf = host::f32_in(w, tl(1));
    const float* kf = host::f32_in(k, tl(2));
    self().indexer_scores_f32(qf, wf, kf, q.rows, k.rows, n_heads, k.cols, scale, q_pos, scores);
  }

  void scatter_add_weighted(const Tensor& x, const int32_t* token, const float* weight, const Tensor& y) override {
    const float* xf = host::f32_in(x, tl(0));
    float* yf = host::f32_out(y, tl(1), true);
    self().scatter_add_weighted_f32(xf, token, weight, x.rows, x.cols, yf, y.bf16());
    host::store_out(y, yf);
  }

 protected:
  // Per-thread conversion buffers (the ops run on the caller's thread; pool threads do not use these).
  static std::vector<float>& tl(int slot) {
    thread_local std::vector<float> bufs[6];
    return bufs[slot];
  }
  static float* tl_ptr(int slot, int64_t n) {
    std::vector<float>& v = tl(slot);
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    return v.data();
  }

  Derived& self() { return static_cast<Derived&>(*this); }
  host::SiluMulFn silu() {
    return [this](const float* g, const float* u, int64_t n, float* o, bool b) { self().silu_mul_f32(g, u, n, o, b); };
  }
};

}  // namespace latent
