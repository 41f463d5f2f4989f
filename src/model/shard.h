// Sharding of the model over ranks (tensor and expert parallelism, issue 18; docs/multi-host.md).
//
// What each rank holds (W = ranks, r = rank):
//   attention   q_a, kv_a, their norms: replicated (the latent c ‖ k_pe is shared by every head);
//               q_b_proj and kv_b_proj: rows of heads [r·H/W, (r+1)·H/W); o_proj: the same heads' columns;
//               the partial o_proj outputs are all-reduced. The latent cache is replicated per rank: every rank
//               computes the same c ‖ k_pe (kv_a is replicated) and its heads read all of it. Splitting it by
//               head is impossible (one latent serves all heads); by token it would need attention traffic per
//               layer. It is small: (dc + dr) values per token per layer (1,152 bytes in bf16 for GLM-5 and V3).
//   DSA indexer replicated (wq_b, wk, weights_proj, the key cache): its output is a discrete top-k selection that
//               must be identical on every rank and to one rank; split heads would need an all-reduce of the
//               [tokens, context] score matrix per layer (larger than the weights it saves) and a different
//               summation order that can flip near-tied selections.
//   dense MLP,  gate/up: rows [r·I/W, (r+1)·I/W); down: the same columns; the partial outputs are all-reduced
//   shared experts   (one all-reduce per layer for routed + shared together).
//   routed      --expert-parallel: whole experts [r·E/W, (r+1)·E/W) per rank; the router is replicated (every rank
//   experts     routes every token, identically); each rank computes its experts' contributions for all tokens of
//               the step and the partial outputs are all-reduced (small-batch combine; see model.cpp moe()).
//               Without it (tensor only): every expert split like the dense MLP.
//   embedding   vocab-parallel: rows [v0, v1) per rank (plus one zero row that out-of-range tokens read), the
//               partial embeddings all-reduced (exact: one rank contributes each row).
//   lm_head     vocab-parallel: rows [v0, v1) per rank, logits all-gathered (rank 0 writes the host rows).
//   norms, router, score bias, final norm: replicated.
// Quantized formats keep their scale blocks whole: a split inside an FP8 128×128 block or an MXFP4 32-element
// block (along the input dimension) is refused with an error naming the tensor.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/hf_config.h"
#include "model/weights.h"

namespace latent {

struct ParallelConfig {
  int ranks = 1;        // world size (one rank per GPU)
  bool tensor = false;  // attention heads, dense MLP, shared experts, embedding, lm_head split over the ranks
  bool expert = false;  // routed experts spread over the ranks (whole experts)
  bool active() const { return ranks > 1; }
  std::string describe() const;  // "1 rank", "tensor parallel 2", "tensor parallel 4 + expert parallel", …
};

// The CLI's flags: --tensor-parallel-size N [--expert-parallel] (N ranks; experts over the same ranks with
// --expert-parallel) and --expert-parallel-size N (N ranks, attention replicated, experts spread). Throws Error on
// an invalid combination.
ParallelConfig parallel_config(int tensor_parallel_size, bool expert_parallel, int expert_parallel_size = 0);

// The slice of each sharded dimension one rank holds ([x0, x0 + x) for each).
struct ShardDims {
  int64_t heads = 0, head0 = 0;
  int64_t inter = 0, inter0 = 0;          // dense MLP intermediate
  int64_t shared_inter = 0, shared0 = 0;  // shared experts' intermediate
  int64_t moe_inter = 0, moe0 = 0;        // each routed expert's intermediate
  int64_t expert0 = 0, expert1 = 0;       // routed experts [expert0, expert1)
  int64_t vocab0 = 0, vocab1 = 0;         // embedding / lm_head rows
  int64_t vocab_chunk = 0;                // the largest vocab slice of any rank (the logits all-gather stride)
  bool vocab_split = false;
};

// Validates divisibility (heads, intermediates, experts; errors name the config field and the sizes).
ShardDims shard_dims(const ModelConfig& cfg, const ParallelConfig& pc, int rank, const ModelWeights& w);

// Bytes of column slices and of the local embedding table (owned: a row slice is a view into the checkpoint).
struct ShardStorage {
  std::vector<std::unique_ptr<uint8_t[]>> blocks;
  int64_t bytes = 0;
};

// How one tensor is placed, for `latent plan --tensor-parallel-size N`.
struct ShardRecord {
  std::string tensor;  // checkpoint name
  std::string how;     // "replicated", "rows 0..48 of 96", "columns …", "expert on rank 1", "not on this rank"
  int64_t rows = 0, cols = 0;  // the rank's shape
};

// Replaces w's views by this rank's slices. storage == nullptr: a dry run (records only; column slices are not
// copied, for the plan). log (optional) receives one record per tensor. Throws Error naming the tensor when a split
// would cut a scale block.
void shard_weights(const ModelConfig& cfg, const ParallelConfig& pc, int rank, const ShardDims& sd, ModelWeights& w,
                   ShardStorage* storage, std::vector<ShardRecord>* log = nullptr);

// `latent plan --tensor-parallel-size N [--expert-parallel]`: per tensor, its placement and each rank's shape
// (the dry run of what loading does, with the same errors). Text table, or one JSON object per tensor
// {"tensor", "placement", "ranks": [[rows, cols] | null per rank]}.
std::string format_sharding_text(const ModelConfig& cfg, const PrecisionPlan& plan, const ParallelConfig& pc);
std::string format_sharding_json(const ModelConfig& cfg, const PrecisionPlan& plan, const ParallelConfig& pc);

// Row / column slices of one weight (exposed for tests). Column slices copy into `storage` (null: no copy, the
// returned view has data == nullptr).
QuantWeight slice_rows(const QuantWeight& w, int64_t r0, int64_t r1, const std::string& name);
QuantWeight slice_cols(const QuantWeight& w, int64_t c0, int64_t c1, const std::string& name, ShardStorage* storage);

}  // namespace latent
