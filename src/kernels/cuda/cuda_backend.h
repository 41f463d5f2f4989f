// The CUDA backend (src/kernels/cuda): every Backend op on one CUDA stream of the current device, both activation
// modes. Plain C++ header (no CUDA types) so that the registry and the tests include it from host code.
#pragma once
#include <cstdint>
#include <memory>

#include "backend/backend.h"

namespace latent {

// Throws Error naming the CUDA error when no usable GPU is there (no device, no driver, driver too old).
// `threads` is accepted for symmetry with the CPU backends and ignored (host threads are not used).
std::unique_ptr<Backend> make_cuda_backend(int threads);

// matmul_bf16 takes cuBLASLt from this many rows of x (the skinny kernels keep M ≤ 16: decode, where they read the
// weights at the bandwidth roofline; above it, even M = 17, the bf16 GEMM beats the fp32 tiled kernel, see
// bench/cuda_bench prefill).
constexpr int64_t cuda_lt_min_rows() { return 17; }
// Diagnostics: the matmul_bf16 calls that ran on cuBLASLt so far (-1 when `be` is not the CUDA backend).
int64_t cuda_lt_matmuls(const Backend& be);
// Diagnostics: the matmul_bf16 / grouped_matmul_bf16 calls that ran on the own tensor-core kernel (FP8 weights,
// expert groups of more than 16 rows) so far (-1 when `be` is not the CUDA backend).
int64_t cuda_tc_matmuls(const Backend& be);
// Diagnostics: the skinny (M ≤ 16, decode) matmul / grouped_matmul calls of the bf16 mode that ran on the MXFP4
// tensor-core kernels (MXFP4 weights with cols % 128 == 0) so far (-1 when `be` is not the CUDA backend).
int64_t cuda_mx_tc_matmuls(const Backend& be);
// The own tensor-core kernels of the bf16 mode (FP8 weights from cuda_lt_min_rows() rows; expert groups of more
// than 16 rows; the MXFP4 skinny kernels) are on by default; off, those take the exact fp32 kernels (tests compare
// the two).
void cuda_set_tc_dispatch(Backend& be, bool on);
// The fused decode kernels of the bf16 mode (the MLA decode attention block, ...) are on by default; off, the
// blocks take their default compositions over the generic kernels (tests compare the two). Counter: the fused MLA
// decode attention calls so far (-1 when `be` is not the CUDA backend).
void cuda_set_fast_decode(Backend& be, bool on);
int64_t cuda_fast_decode_calls(const Backend& be);
bool cuda_tc_dispatch(const Backend& be);
// The BF16 / FP8 tensor-core skinny kernels of the bf16 mode (weights with K % 128 == 0; cuda_skinny_tc.cu): a
// matmul takes them for M in [bf16_min, bf16_max] (BF16 weights) or [fp8_min, fp8_max] (FP8), except one token
// over rows longer than 4,096 (BF16) / 8,192 (FP8) columns and matrices of fewer than 1,024 rows below 9 tokens
// (the GEMV kernels read those faster); grouped matmuls at decode sizes when `grouped`. Defaults
// (cuda_reset_stc_rows): BF16 1 .. 16 (cuBLASLt is faster above), FP8 1 .. 32 (the tiled kernel below above),
// grouped on — measured with `cuda_bench skinny` (bench/README.md); benches and tests change them (an empty
// range turns a format off). Counter: the matmul / grouped_matmul calls that took them so far (-1 when `be` is not
// the CUDA backend).
void cuda_set_stc_rows(Backend& be, int64_t bf16_min, int64_t bf16_max, int64_t fp8_min, int64_t fp8_max, bool grouped);
int64_t cuda_stc_matmuls(const Backend& be);
// The tiled tensor-core kernel (cuda_skinny_tc.cu: 128 weight rows × 64 tokens per block, both operands staged in
// shared memory, K split over parts when the blocks would not fill the GPU) for the same weights with bf16 x, over
// M in [bf16_min, bf16_max] / [fp8_min, fp8_max] where the skinny kernels did not take the call. Defaults: BF16
// off (cuBLASLt), FP8 from 33 rows (all prefill sizes too: it replaced the wmma kernel there). `grouped`: grouped
// matmuls whose weights all take the skinny kernels run their groups of more than 16 tokens on it, at any total
// (expert prefill, BF16 and FP8; default on). Counter: the matmul calls that took it, and the grouped calls above
// the decode sizes that did.
void cuda_set_tile_rows(Backend& be, int64_t bf16_min, int64_t bf16_max, int64_t fp8_min, int64_t fp8_max,
                        bool grouped = true);
int64_t cuda_tile_matmuls(const Backend& be);
// Both kernels' defaults.
void cuda_reset_stc_rows(Backend& be);
// The naive-form (prefill) MLA attention on tensor cores (cuda_attention.cu, FlashAttention-2 style) for bf16 calls
// at the head sizes it is built for (qk / v 192 / 128, 256 / 256, 128 / 64), with or without a DSA selection (then
// as a per-row key bitmap); on by default (with the tensor-core dispatch), off: the CUDA-core kernel. Counter: the
// calls the tensor-core kernel took.
void cuda_set_flash_prefill(Backend& be, bool on);
int64_t cuda_flash_prefill_calls(const Backend& be);
// The DSA indexer's scores on tensor cores (cuda_indexer.cu) for bf16 queries over a bf16 key pool at head_dim 128
// with 32 or 64 index heads (GLM-5, DeepSeek-V3.2); on by default (with the tensor-core dispatch), off: the CUDA-core
// kernel. Counter: the calls the tensor-core kernel took.
void cuda_set_tc_indexer(Backend& be, bool on);
// The fewest keys per split of the MLA decode attention (cuda_mla_decode.cu; 0, the default: 32 when a step has one
// (token, head tile) item, else 128): fewer means more blocks for short contexts at small batch. The same results up
// to the order of the splits' fp32 merge.
void cuda_set_mla_split_keys(Backend& be, int keys);
// SwiGLU expert calls of MXFP4 gate and up weights (bf16 x) with at most `rows` (token, expert) pairs read both
// weights in one pass (default 32: 4 decode tokens at top-8); above, the gate and then up with the gate epilogue.
// The same bits either way.
void cuda_set_glu_fused_rows(Backend& be, int64_t rows);
// MXFP4 weights whose rows are whole 16-row tiles and columns whole 128-column chunks stored in the tile-major byte
// order at load (kernels/cuda/mx_layout.h; on by default); off: as stored, row after row (the A/B of the layout:
// `cuda_bench ctx --no-mx-tile-major`). Weights prepared afterwards only; the same values and results either way.
void cuda_set_mx_tile_major(Backend& be, bool on);
// The tiled kernel's FP8 calls on wgmma (sm_90 devices; on by default; single weights up to 256 tokens, expert groups
// in calls of up to 1,024 pairs): each warp converts its rows' e4m3 codes straight into the A operand registers and
// the warpgroup's wgmma reads x from shared memory; off (and above those sizes): the mma.sync form
// (a bf16 copy of the W tile in shared memory). The same exact products and block-scale order; the tensor cores'
// fp32 sums inside a 128-column block may round differently.
void cuda_set_tile_wgmma(Backend& be, bool on);
int64_t cuda_tc_indexer_calls(const Backend& be);
// Declared FP8 activations (--activations declared) in the bf16 mode: matmul_act_fp8 of block-FP8 weights with
// 128 x 128 blocks takes the FP8 x FP8 cuBLASLt GEMM from this many rows of x (default 1; 0: never, the default
// composition of backend.h: quantize, then the exact matmul over q · s). Diagnostics: the calls that took it so far
// (-1 when `be` is not the CUDA backend).
void cuda_set_fp8_gemm_rows(Backend& be, int64_t min_rows);
int64_t cuda_fp8_gemm_calls(const Backend& be);

}  // namespace latent
