// RefBackend: the scalar reference implementation of every Backend op (the oracle). fp32 arithmetic, double
// accumulation, weights dequantized row by row with dequant_row_ref (each row once per call, reused across the
// M activation rows). Rows / heads / queries are split over a ThreadPool; results do not depend on the thread
// count (every output element is computed by one thread in a fixed order).
#pragma once
#include <memory>

#include "backend/backend.h"
#include "core/threads.h"
#include "kernels/ref/host_typed.h"

namespace latent {

class RefBackend final : public HostTyped<RefBackend> {
 public:
  explicit RefBackend(int threads);
  const char* name() const override { return "ref"; }
  int num_threads() const override { return pool_.size(); }
  ThreadPool& pool() { return pool_; }

  void topk_select(const float* scores, int64_t S, int64_t T, int64_t k, const int64_t* q_pos, int32_t* sel,
                   int32_t* count) override;
  void router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
              float* weights) override;
  // Declared FP8 activations: the definition of backend.h itself (ref_act_fp8.cpp), not the default composition —
  // codes of x times codes of W exactly (double), times s_x · s_w per group, summed in double, rounded once.
  void matmul_act_fp8(const QuantWeight& w, const Tensor& x, const ActFp8& a, const Tensor& y,
                      const Epilogue& ep = {}) override;
  void grouped_matmul_act_fp8(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const Tensor& x,
                              const ActFp8& a, const Tensor& y, const Epilogue& ep = {}) override;

  // The fp32 implementations behind the typed ops (host_typed.h): contiguous fp32 arrays; `bf16` = the output is
  // BF16 (round at the op's bf16 points).
  void matmul_f32(const QuantWeight& w, const float* x, int64_t M, float* y);
  // y [M, w.rows] = the declared-FP8 product of x [M, w.cols] (backend.h matmul_act_fp8), fp32 accumulators.
  void matmul_act_fp8_f32(const QuantWeight& w, const float* x, int64_t M, bool pow2_scale, float* y);
  void grouped_matmul_f32(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const float* x,
                          float* y);
  void embedding_f32(const QuantWeight& table, const int32_t* ids, int64_t M, float* out);
  void rms_norm_f32(const float* x, const float* w, int64_t M, int64_t D, float eps, float* y, bool bf16);
  void layer_norm_f32(const float* x, const float* w, const float* b, int64_t M, int64_t D, float eps, float* y,
                      bool bf16);
  void rope_f32(float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
                const int64_t* pos, const RopeParams& p, bool bf16);
  void silu_mul_f32(const float* gate, const float* up, int64_t n, float* out, bool bf16);
  void add_f32(float* y, const float* x, int64_t n, bool bf16);
  void mla_attention_naive_f32(const MlaDims& d, const float* q, const float* kvb, const float* k_pe, int64_t S,
                               int64_t T, const int64_t* q_pos, const KeySelection& sel, float scale, float* o,
                               bool bf16);
  void mla_attention_absorbed_f32(const MlaDims& d, const float* q, const QuantWeight& kv_b, const float* c,
                                  const float* k_pe, int64_t S, int64_t T, const int64_t* q_pos,
                                  const KeySelection& sel, float scale, float* o, bool bf16);
  void indexer_scores_f32(const float* q, const float* w, const float* k, int64_t S, int64_t T, int64_t n_heads,
                          int64_t head_dim, float scale, const int64_t* q_pos, float* scores);
  void scatter_add_weighted_f32(const float* x, const int32_t* token, const float* weight, int64_t n, int64_t D,
                                float* y, bool bf16);

 private:
  ThreadPool pool_;
};

namespace ref {
// bf16 round trip (round to nearest even), the rounding every bf16-mode op uses.
float bf16r(float x);
// One row of LayerNorm (double statistics): y = (x - mean) / sqrt(var + eps) * w + b (b may be null), rounded to
// bf16 when asked. Shared by the ref and cpu backends (the cpu one only splits rows over threads).
void layer_norm_row(const float* x, const float* w, const float* b, int64_t D, float eps, float* y, bool bf16);
// The keys query s may attend to (causal ∩ selection), ascending. Shared by the attention ops.
void allowed_keys(int64_t s, int64_t T, const int64_t* q_pos, const KeySelection& sel, std::vector<int32_t>& out);
}  // namespace ref

}  // namespace latent
