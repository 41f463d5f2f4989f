// MLA decode attention of the bf16 mode (cuda_mla_decode.cu): absorption GEMMs, tensor-core attention over the
// paged latent pool with split keys, the LSE combine, the output absorption.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_ops.h"

namespace latent::cuda {

// Shapes the fast path takes: a bf16 pool of width dc + dr, dc a multiple of 64 up to 512, dr a multiple of 16,
// dc + dr ≤ 576, dn ≤ 256. Anything else takes the generic paged kernel.
bool mla_decode_supported(const MlaDims& d, const KvPool& pool);
// Whether the absorptions (q · W_UK, o_lat · W_UVᵀ) run on tensor cores for this kv_b: bf16, or FP8 e4m3fn per
// tensor / with block scales in which each head's W_UK rows share a row block (DeepSeek-V3's 128 × 128 with dn 128,
// dn + dv 256); else CUDA-core kernels.
bool absorb_tc_ok(const MlaDims& d, const WDesc& kv_b);
// Key splits per (token, head tile) for a step of n_tokens tokens whose sequences hold at most max_ctx keys (a host
// bound: the reserved context for a graph step): about two blocks per SM, at least ~min_keys keys per split (<= 0:
// 32 for a single (token, head tile) item, 128 otherwise).
int mla_decode_splits(const MlaDims& d, int64_t n_tokens, int64_t max_ctx, int min_keys = 0);
struct MlaDecodeScratch {
  size_t qlat_bytes = 0, olat_bytes = 0, part_o_bytes = 0, part_ml_bytes = 0;
};
MlaDecodeScratch mla_decode_scratch(const MlaDims& d, int64_t n_tokens, int n_splits);
// o [n_tokens, H·dv] (rows of the run's tokens only) = the absorbed decode attention of the run `seqs` (token rows
// q_begin[0] .. q_begin[n_seqs] of q [n_tokens, H·(dn+dr)]). Scratch pointers sized by mla_decode_scratch.
void launch_mla_decode(const MlaDims& d, TView q, int64_t n_tokens, const WDesc& kv_b, const KvPool& pool,
                       const StepSeqs& seqs, const int64_t* pos, const KeySelection& sel, float scale, int n_splits,
                       void* qlat, void* olat, void* part_o, void* part_ml, TView o, cudaStream_t st);

}  // namespace latent::cuda
