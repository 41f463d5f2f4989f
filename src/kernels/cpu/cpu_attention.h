// Internal: the weight-absorbed MLA attention of the CPU backend (decode), over a paged latent pool or one
// sequence's contiguous latent cache, with raw pointers only (the Backend overrides in cpu_backend.cpp fill an
// AbsorbedCall and call absorbed_attention).
//
// Math (the ref backend's definition): per token i and head h, q_lat = W_UK[h]ᵀ·q_nope; score(t) =
// (q_lat·c[t] + q_pe·k_pe[t])·scale over the token's keys; P = softmax; o = W_UV[h]·Σ_t P(t)·c[t]. bf16 mode rounds
// q_lat, bf16(dot)·scale, the normalized P, Σ P·c and o to bf16, as HF's bf16 eager attention does.
//
// Work, per call (every token of every sequence of the step):
//   1. per head: q_lat of all tokens = q_nope · W_UK[h] as one small GEMM (W_UK[h] read once per call: bf16 rows in
//      place, other formats dequantized once into a panel);
//   2. per (token, chunk of its keys, group of heads): the scores of all heads of the token against the chunk's
//      keys as a small GEMM (keys read in place from the pool rows, fp32 or bf16; the heads in the vector lanes,
//      from the queries transposed once per call, so each key element is broadcast once per tile of heads; a
//      token with fewer than 64 keys from its query rows, where the transposition would cost more),
//      softmax, and P·c as another, in sub-blocks of 64 keys (online softmax); a context is split into chunks (a
//      function of the token's own key count and the call's activation mode only: >= 128 keys each in fp32, >= 512 in
//      bf16, at most 16) that run on different threads and are combined in chunk order — the split never depends on the
//      other tokens or the thread count, so a token's result is bit-identical whatever else is in the step. While a
//      sub-block computes, the kernels prefetch the next one's rows (or the first rows of the next item the thread
//      claims), spread over their inner steps (cpu_kernels.h PrefetchCursor);
//   3. per head: the chunk partials combined, then o = W_UV[h]·o_lat for all tokens (the batched matmul tiles).
#pragma once
#include <cstdint>

#include "core/threads.h"
#include "kernels/cpu/cpu_kernels.h"
#include "quant/weight_format.h"

namespace latent::cpu {

struct AbsorbedCall {
  int64_t heads = 0, nope = 0, rope = 0, v = 0, latent = 0;  // H, dn, dr, dv, dc
  const float* q = nullptr;                                  // [rows, H, dn + dr] (q_pe rotated)
  const QuantWeight* kv_b = nullptr;                         // kv_b_proj [H·(dn+dv), dc], stored format
  // Keys: a paged pool (pool != null: rows [blocks · block_tokens, width] of fp32 or bf16, c = columns 0..dc,
  // k_pe = dc..dc+dr, sequence s's blocks at block_table[s · max_blocks ..]) or one sequence's contiguous cache
  // (c [T, dc], k_pe [T, dr], fp32; n_seqs = 1).
  const void* pool = nullptr;
  bool pool_bf16 = false;
  int64_t block_tokens = 0, width = 0, max_blocks = 0;
  const int32_t* block_table = nullptr;
  const float* c = nullptr;
  const float* k_pe = nullptr;
  // Sequences: rows q_begin[s] .. q_begin[s+1] (absolute rows of q, o, pos and sel), ctx_len[s] keys.
  int64_t n_seqs = 0;
  const int32_t* q_begin = nullptr;
  const int32_t* ctx_len = nullptr;
  const int64_t* pos = nullptr;  // [rows]: row i sees keys t <= pos[i] (t < ctx_len)
  // DSA selection (sel != null): row i sees only keys sel[i·stride + j], j < count[i] (and causal).
  const int32_t* sel = nullptr;
  const int32_t* sel_count = nullptr;
  int64_t sel_stride = 0;
  float scale = 1.0f;
  float* o = nullptr;  // [rows, H, dv]
  bool bf16 = false;
};

void absorbed_attention(const Kernels& k, ThreadPool& pool, const AbsorbedCall& a);

}  // namespace latent::cpu
