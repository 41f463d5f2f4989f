// Internal interface between the CudaBackend class (cuda_backend.cpp, host C++) and the kernels (*.cu): one launch
// function per op family, all asynchronous on the given stream. Pointers are device memory. Launch errors are
// picked up by the caller (cudaGetLastError after each launch).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/backend.h"

namespace latent::cuda {

// A weight as the kernels see it (device pointers, plain fields).
struct WDesc {
  const void* data = nullptr;
  const void* scale = nullptr;
  int64_t rows = 0, cols = 0, row_bytes = 0, scale_cols = 0;
  int32_t format = 0;  // WeightFormat
  int32_t fnuz = 0;
  int32_t block_rows = 128, block_cols = 128;
};
WDesc make_wdesc(const QuantWeight& w);

// ---- linear (cuda_linear.cu) ----
// y = x·Wᵀ, x [M, cols], y [M, rows].
void launch_matmul(const WDesc& w, const float* x, int64_t M, float* y, cudaStream_t st);
// Grouped: table [n_groups] on the device (entries with data == null are skipped), offsets [n_groups + 1] on the
// device, rows/cols the common shape, scratch ≥ grouped_scratch_bytes(n_groups) of device memory.
size_t grouped_scratch_bytes(int64_t n_groups);
// tc: the groups with more than 16 rows take the tensor-core kernel (bf16 activation mode; every non-null entry
// passes tc_format), else the fp32 tiled kernel.
void launch_grouped_matmul(const WDesc* table, int64_t n_groups, int64_t rows, int64_t cols, const int64_t* offsets,
                           const float* x, float* y, void* scratch, cudaStream_t st, bool tc = false);
// Tensor-core matmul for the bf16 activation mode (x values bf16): formats whose values or codes are exact bf16
// values (tc_format: BF16, MXFP4, FP8 with block scales in 16×32 multiples, per tensor or per channel); FP8 scales
// are applied to fp32 partial sums, never to the weights.
bool tc_format(const WDesc& w);
void launch_matmul_tc(const WDesc& w, const float* x, int64_t M, float* y, cudaStream_t st);
void launch_embedding(const WDesc& table, const int32_t* ids, int64_t M, float* out, cudaStream_t st);
// The cuBLASLt path's bf16 operands (Kp = K rounded up to a multiple of 8, the padding columns zero): out [M, Kp]
// = x rounded to bf16; out [rows, Kp] = W dequantized (as the exact kernels do) and rounded to bf16.
void launch_to_bf16(const float* x, int64_t M, int64_t K, int64_t Kp, void* out, cudaStream_t st);
void launch_dequant_bf16(const WDesc& w, int64_t Kp, void* out, cudaStream_t st);

// ---- norms / elementwise / MoE / top-k (cuda_ops.cu) ----
void launch_rms_norm(const float* x, const float* w, int64_t M, int64_t D, float eps, float* y, bool bf16,
                     cudaStream_t st);
void launch_layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t D, float eps, float* y,
                       bool bf16, cudaStream_t st);
void launch_rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
                 const int64_t* pos, const RopeParams& p, bool bf16, cudaStream_t st);
void launch_silu_mul(const float* gate, const float* up, int64_t n, float* out, bool bf16, cudaStream_t st);
void launch_add(float* y, const float* x, int64_t n, bool bf16, cudaStream_t st);
void launch_round_bf16(float* x, int64_t n, cudaStream_t st);
void launch_router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
                   float* weights, cudaStream_t st);
void launch_scatter_add_weighted(const float* x, const int32_t* token, const float* weight, int64_t n, int64_t D,
                                 float* y, bool bf16, cudaStream_t st);
// scratch: at least topk_scratch_bytes(S, k) bytes of device memory (used when k does not fit shared memory).
size_t topk_scratch_bytes(int64_t S, int64_t k);
void launch_topk_select(const float* scores, int64_t S, int64_t T, int64_t k, const int64_t* q_pos, int32_t* sel,
                        int32_t* count, void* scratch, cudaStream_t st);
void launch_indexer_scores(const float* q, const float* w, const float* k, int64_t S, int64_t T, int64_t n_heads,
                           int64_t head_dim, float scale, const int64_t* q_pos, float* scores, cudaStream_t st);

// ---- sampling (cuda_sample.cu): Backend::sample_rows ----
void launch_sample_rows(float* logits, int64_t rows, int64_t V, const SampleRowParams* params, const SampleEdit* edits,
                        const uint32_t* allow, const uint32_t* banned, int32_t* ids, cudaStream_t st);

// ---- data movement / paged cache (cuda_data.cu) ----
void launch_moe_group(const int32_t* ids, const float* weights, int64_t M, int64_t K, int64_t E, int64_t* offsets,
                      int32_t* token, float* weight, cudaStream_t st);
void launch_gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t D, float* dst, cudaStream_t st);
void launch_copy_cols(const float* src, int64_t src_stride, int64_t col0, int64_t width, int64_t n, float* dst,
                      cudaStream_t st);
void launch_scale(float* x, int64_t n, float s, cudaStream_t st);
void launch_fill(float* x, int64_t n, float v, cudaStream_t st);
void launch_add_bias(float* y, const float* b, int64_t M, int64_t N, bool bf16, cudaStream_t st);
void launch_kv_store(const KvPool& pool, const int64_t* slots, int64_t n, const float* src, int64_t col0,
                     int64_t width, cudaStream_t st);
void launch_kv_gather(const KvPool& pool, const int32_t* blocks, int64_t n_tokens, int64_t col0, int64_t width,
                      float* dst, cudaStream_t st);

// ---- MLA attention (cuda_attention.cu) ----
void launch_mla_naive(const MlaDims& d, const float* q, const float* kvb, const float* k_pe, int64_t S, int64_t T,
                      const int64_t* q_pos, const KeySelection& sel, float scale, float* o, bool bf16,
                      cudaStream_t st);
void launch_mla_absorbed(const MlaDims& d, const float* q, const WDesc& kv_b, const float* c, const float* k_pe,
                         int64_t S, int64_t T, const int64_t* q_pos, const KeySelection& sel, float scale, float* o,
                         bool bf16, cudaStream_t st);
// Whole step in one launch: token i (of sequence s found from q_begin on the device) attends over the paged pool.
void launch_mla_absorbed_paged(const MlaDims& d, const float* q, const WDesc& kv_b, const KvPool& pool,
                               const StepSeqs& seqs, const int64_t* pos, const KeySelection& sel, float scale,
                               float* o, bool bf16, cudaStream_t st);

}  // namespace latent::cuda
