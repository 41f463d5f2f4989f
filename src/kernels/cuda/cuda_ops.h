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
  int32_t swz = 0;       // MXFP4 codes in the pair-swizzled layout (mx_layout.h)
  int32_t tiled = 0;     // MXFP4 code bytes in tile-major order (mx_layout.h): address them through mx_code_ptr
  int32_t nan_free = 0;  // FP8: no code is NaN (QuantWeight::fp8_nan_free)
};
WDesc make_wdesc(const QuantWeight& w);

// A typed activation tensor as the kernels see it: element (r, c) at p + r * ld (elements), fp32 or bf16 storage.
struct TView {
  void* p = nullptr;
  int64_t ld = 0;
  int32_t bf16 = 0;
};
inline TView tview(const Tensor& t) { return TView{t.data, t.ld, t.dtype == DType::BF16 ? 1 : 0}; }

// The epilogue of a linear op over fp32 accumulators (backend.h "Epilogue"): acc [M, N] fp32 (row stride N), gacc
// (the SwiGLU gate's accumulators, same shape) or null, bias [N] or null, gate / residual views or null-p. With
// row_lo / row_hi (device pointers, e.g. a grouped matmul's first and last offsets) only rows [*row_lo, *row_hi).
void launch_epilogue(const float* acc, const float* gacc, const float* bias, TView gate, TView residual, int64_t M,
                     int64_t N, TView y, const int64_t* row_lo, const int64_t* row_hi, cudaStream_t st);
// dst = R(src) element-wise over [rows, cols] views.
void launch_convert(TView src, TView dst, int64_t rows, int64_t cols, cudaStream_t st);

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
// The skinny kernels (M ≤ 16 rows of x, fp32 or bf16 storage, row stride x.ld) with the linear epilogue at the store
// (bias, gate tensor, residual; rounded to y's dtype). Grouped (decode: a group is one expert's tokens, any number
// of rows, a warp per (group, weight row)); scratch ≥ grouped_scratch_bytes(n_groups).
struct LinEpi {
  const float* bias = nullptr;
  TView gate{}, residual{};
};
constexpr int64_t kSmallMaxRows = 16;
// mx_tc: the weights (every listed one) pass mx_tc_ok — MXFP4 pair-swizzled by prepare_weight (mx_layout.h),
// cols % 128 == 0, 16-byte aligned — and take the tensor-core skinny kernels when x is bf16 (16-byte aligned rows);
// else the exact warp/block kernels.
bool mx_tc_ok(const WDesc& w);
void launch_matmul_small(const WDesc& w, TView x, int64_t M, TView y, const LinEpi& e, cudaStream_t st,
                         bool mx_tc = false);
// pairs: the grouped call's (token, expert) rows in all, or -1 when not known: at most 16 cannot make a group of more
// than 16 tokens, so the launches of that class are left out (3 empty kernels per MoE layer at batch 1).
constexpr bool may_have_class2(int64_t pairs) { return pairs < 0 || pairs > 16; }
// SwiGLU over MXFP4 experts with bf16 x (every weight of table and gtable passing mx_tc_ok): y = SiLU(x·Gᵀ) ·
// (x·Uᵀ) with e's bias / residual, as launch_grouped_small of the gate into gtmp and then of up with gate = gtmp
// computes it, bit for bit; groups of ≤ 16 tokens read both weights in one pass (gtmp untouched), larger ones
// through gtmp ([R, N], y's dtype) on the kernels launch_grouped_small takes for them (tile, tile_fmt and
// gate_tile_fmt as it gets them for the up and the gate table).
void launch_grouped_small_glu(const WDesc* table, const WDesc* gtable, int64_t n_groups, int64_t rows, int64_t pairs,
                              const int64_t* offsets, TView x, TView y, const LinEpi& e, TView gtmp, void* scratch,
                              cudaStream_t st, bool tile, int tile_fmt, int gate_tile_fmt);
// stc: every listed weight passes stc_ok and x passes stc_x_ok: the BF16 / FP8 tensor-core kernels below; with
// tile, its groups of more than 16 tokens on the tiled kernel (any number of rows: prefill too); tile_fmt: the
// table's one weight format (WeightFormat; FP8 per tensor and per channel count as one), or -2 when it mixes them;
// wgmma: FP8 tables' tiled groups on the wgmma form where it runs (wg_tile_ok) in calls of up to 1,024 pairs.
void launch_grouped_small(const WDesc* table, int64_t n_groups, int64_t rows, int64_t pairs, const int64_t* offsets,
                          TView x, TView y, const LinEpi& e, void* scratch, cudaStream_t st, bool mx_tc = false,
                          bool stc = false, bool tile = false, int tile_fmt = -2, bool wgmma = true);
// ---- BF16 / FP8 tensor-core skinny kernels (cuda_skinny_tc.cu) ----
// Weights whose values (BF16) or codes (FP8 e4m3fn) are exact bf16 values, K % 128 == 0, 16-byte aligned rows; FP8
// block scales in 16-row × 128-column multiples (or per tensor / per channel), applied to fp32 partial sums. x bf16
// with 16-byte aligned rows (stc_x_ok). Any M (passes of up to 64 tokens read the weights once each); the linear
// epilogue at the store. A token's result does not depend on M or on the other tokens.
bool stc_ok(const WDesc& w);
bool stc_x_ok(TView x);
void launch_matmul_stc(const WDesc& w, TView x, int64_t M, TView y, const LinEpi& e, cudaStream_t st);
// The tiled kernel for more tokens (the same weights and x as stc_ok / stc_x_ok; any M): 128 weight rows × 64
// tokens per block with both operands staged in shared memory, K split into tile_splits(w, M) parts when the blocks
// would not fill the GPU — ws: device memory of tile_ws_bytes(w, M) (0: none needed). Deterministic for a given M;
// the K split (and so the rounding) depends on M.
int tile_splits(const WDesc& w, int64_t M);
size_t tile_ws_bytes(const WDesc& w, int64_t M);
// wgmma: FP8 weights on sm_90 devices (wg_tile_ok) take the wgmma form up to 256 tokens (A operands converted from
// the codes in registers; the same tile, K split, block-scale order and store; the tensor cores' sums may round
// differently from mma.sync's).
bool wg_tile_ok();
void launch_matmul_tile(const WDesc& w, TView x, int64_t M, TView y, const LinEpi& e, float* ws, cudaStream_t st,
                        bool wgmma = true);
// Grouped, over the device lists of classify_groups_kernel (launch_grouped_small makes them): classes 1 and 2 (groups
// of more than one token; launch_grouped_small runs class 0 on the warp kernel).
void launch_grouped_stc(const WDesc* table, int64_t n_groups, int64_t rows, const int64_t* offsets, TView x, TView y,
                        const LinEpi& e, const int32_t* lists, const int32_t* counts, cudaStream_t st, bool tile,
                        int tile_fmt, int64_t pairs = -1, bool wgmma = true);
// Tensor-core matmul for the bf16 activation mode (x values bf16): formats whose values or codes are exact bf16
// values (tc_format: BF16, MXFP4, FP8 with block scales in 16×32 multiples, per tensor or per channel); FP8 scales
// are applied to fp32 partial sums, never to the weights.
bool tc_format(const WDesc& w);
void launch_matmul_tc(const WDesc& w, const float* x, int64_t M, float* y, cudaStream_t st);
void launch_embedding(const WDesc& table, const int32_t* ids, int64_t M, TView out, cudaStream_t st);
// The cuBLASLt path's bf16 operands (Kp = K rounded up to a multiple of 8, the padding columns zero): out [M, Kp]
// = x rounded to bf16; out [rows, Kp] = W dequantized (as the exact kernels do) and rounded to bf16.
void launch_to_bf16(const float* x, int64_t M, int64_t K, int64_t Kp, void* out, cudaStream_t st);
void launch_dequant_bf16(const WDesc& w, int64_t Kp, void* out, cudaStream_t st);
// MXFP4 codes [rows, cols / 2] on the device into the pair-swizzled layout (mx_layout.h), in place; whole words only
// (mx_swizzle_ok: cols % 8 == 0, data 4-byte aligned). prepare_weight does it once per weight.
bool mx_swizzle_ok(int64_t cols, const void* data);
void launch_mx_swizzle(void* data, int64_t rows, int64_t cols, cudaStream_t st);
// MXFP4 codes [rows, row_bytes] from the row-major src into the tile-major order at dst (mx_layout.h; the shape must
// pass mx_tile_major_ok; src and dst 16-byte aligned, distinct).
void launch_mx_tile_major(const void* src, void* dst, int64_t rows, int64_t row_bytes, cudaStream_t st);
// *flag |= 1 when any of the n bytes at data (e4m3fn codes, 16-byte aligned) is a NaN code (0x7F / 0xFF); flag on
// the device, zeroed by the caller.
void launch_fp8_nan_scan(const void* data, int64_t n, uint32_t* flag, cudaStream_t st);

// ---- norms / elementwise / MoE / top-k (cuda_ops.cu) ----
// Typed views; the bf16 points of an op apply when its output view is bf16.
void launch_rms_norm(TView x, const float* w, int64_t M, int64_t D, float eps, TView y, cudaStream_t st);
// h = R(h + delta); y = rms_norm(h) (one block per row).
void launch_add_rms_norm(TView h, TView delta, const float* w, int64_t M, int64_t D, float eps, TView y,
                         cudaStream_t st);
void launch_layer_norm(TView x, const float* w, const float* b, int64_t M, int64_t D, float eps, TView y,
                       cudaStream_t st);
// The MLA query / latent path after its matmuls, one launch (a block per token): q's rope parts (columns q_col0 +
// h·head_stride, n_heads heads) rotated, kv's c = RMSNorm(kv[:, 0:dc]) · norm_w, k_pe = kv[:, dc:dc+dr] rotated, the
// row [c | k_pe] stored to the pool at slots[t] (skipped for < 0) — the same bits as rope, rms_norm, rope, kv_store.
// mla_qkv_tail_ok: the shapes it takes (dc up to the register norm's 8,192, dr even).
bool mla_qkv_tail_ok(int64_t dc, int64_t dr);
void launch_mla_qkv_tail(TView q, int64_t q_col0, int64_t n_heads, int64_t head_stride, TView kv, int64_t dc,
                         const float* norm_w, float eps, const int64_t* pos, const int64_t* slots, int64_t n,
                         const KvPool& pool, const RopeParams& rp, cudaStream_t st);
// Head h of row t starts at column h * head_stride of x.
void launch_rope(TView x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, const int64_t* pos,
                 const RopeParams& p, cudaStream_t st);
void launch_silu_mul(TView gate, TView up, int64_t rows, int64_t cols, TView out, cudaStream_t st);
void launch_add(TView y, TView x, int64_t rows, int64_t cols, cudaStream_t st);
void launch_router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
                   float* weights, cudaStream_t st);
void launch_scatter_add_weighted(TView x, const int32_t* token, const float* weight, int64_t n, int64_t D, TView y,
                                 cudaStream_t st);
// indexer_scores_paged on tensor cores (cuda_indexer.cu): bf16 q and pool, head_dim 128, 32 or 64 heads, 16-byte
// aligned rows; false (nothing launched) otherwise.
bool launch_indexer_tc(TView q, TView w, const KvPool& pool, const StepSeqs& seqs, int64_t r0, int64_t n,
                       int64_t n_heads, int64_t head_dim, float scale, const int64_t* q_pos, int64_t T, float* scores,
                       cudaStream_t st);
// scratch: at least topk_scratch_bytes(S, k) bytes of device memory (used when k does not fit shared memory).
size_t topk_scratch_bytes(int64_t S, int64_t k);
void launch_topk_select(const float* scores, int64_t S, int64_t T, int64_t k, const int64_t* q_pos, int32_t* sel,
                        int32_t* count, void* scratch, cudaStream_t st);
// Tokens r0 .. r0+n-1 of the step over their sequences' keys in the paged index pool: scores [n, T].
void launch_indexer_scores_paged(TView q, TView w, const KvPool& pool, const StepSeqs& seqs, int64_t r0, int64_t n,
                                 int64_t n_heads, int64_t head_dim, float scale, const int64_t* q_pos, int64_t T,
                                 float* scores, cudaStream_t st);
void launch_indexer_scores(TView q, TView w, TView k, int64_t S, int64_t T, int64_t n_heads, int64_t head_dim,
                           float scale, const int64_t* q_pos, float* scores, cudaStream_t st);

// ---- sampling (cuda_sample.cu): Backend::sample_rows ----
void launch_sample_rows(float* logits, int64_t rows, int64_t V, const SampleRowParams* params, const SampleEdit* edits,
                        const uint32_t* allow, const uint32_t* banned, int32_t* ids, cudaStream_t st);

// ---- data movement / paged cache (cuda_data.cu) ----
void launch_moe_group(const int32_t* ids, const float* weights, int64_t M, int64_t K, int64_t E, int64_t* offsets,
                      int32_t* token, float* weight, cudaStream_t st);
// Backend::moe_combine from the grouping (false, nothing launched: K > 64, the caller falls back).
bool launch_moe_combine(TView x, const int32_t* ids, int64_t M, int64_t K, const int64_t* offsets, const int32_t* token,
                        const float* weight, int64_t D, TView y, cudaStream_t st);
void launch_gather_rows(TView src, const int32_t* rows, int64_t n, int64_t D, TView dst, cudaStream_t st);
void launch_scale(TView x, int64_t rows, int64_t cols, float s, cudaStream_t st);
void launch_fill(TView x, int64_t rows, int64_t cols, float v, cudaStream_t st);
void launch_kv_store(const KvPool& pool, const int64_t* slots, int64_t n, TView src, int64_t col0, int64_t width,
                     cudaStream_t st);
void launch_kv_gather(const KvPool& pool, const int32_t* blocks, int64_t n_tokens, int64_t col0, int64_t width,
                      TView dst, cudaStream_t st);

// ---- MLA attention (cuda_attention.cu) ----
// Returns whether the tensor-core kernel took the call (flash, bf16, supported head sizes, aligned rows; with a DSA
// selection only when mask_ws holds S · ceil(T / 32) words of scratch for its bitmap).
bool launch_mla_naive(const MlaDims& d, TView q, TView kvb, TView k_pe, int64_t S, int64_t T, const int64_t* q_pos,
                      const KeySelection& sel, float scale, TView o, cudaStream_t st, bool flash = true,
                      uint32_t* mask_ws = nullptr);
// c and k_pe contiguous fp32 [T, dc] / [T, dr].
void launch_mla_absorbed(const MlaDims& d, TView q, const WDesc& kv_b, const float* c, const float* k_pe, int64_t S,
                         int64_t T, const int64_t* q_pos, const KeySelection& sel, float scale, TView o,
                         cudaStream_t st);
// Whole step in one launch: token i (of sequence s found from q_begin on the device) attends over the paged pool.
void launch_mla_absorbed_paged(const MlaDims& d, TView q, const WDesc& kv_b, const KvPool& pool, const StepSeqs& seqs,
                               const int64_t* pos, const KeySelection& sel, float scale, TView o, cudaStream_t st);

}  // namespace latent::cuda
