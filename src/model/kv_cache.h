// The paged latent KV cache (docs/design.md §engine-contract): the block pool IS the storage.
//   per layer:                       [num_blocks, block_tokens, dc + dr]  (c after kv_a_layernorm ‖ rotated k_pe)
//   per layer with its own indexer:  [num_blocks, block_tokens, dI]       (indexer keys after LayerNorm + RoPE)
// in the cache dtype (= the activation dtype: F32, or BF16 in bf16-activation mode, lossless there since those
// values are already bf16). One block id names the same slot range in every layer's pools. The pools are allocated
// once, through the backend, from a byte budget. Which sequence owns which block is the scheduler's business
// (runtime/kv_blocks.h); the model only reads and writes the slots a step's block tables name.
//
// KvCache is the one-sequence convenience over the same storage (CLI commands, fidelity, tests): a private pool that
// grows on demand, with the identity block table. It goes through the same batched step as the server.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "format/hf_config.h"

namespace latent {

// Bytes one token occupies in all layers' pools (the L decoder layers, plus mtp_layers MTP layers).
int64_t kv_bytes_per_token(const ModelConfig& cfg, DType dtype, int64_t mtp_layers = 0);

class PagedKvCache {
 public:
  // Allocates every pool through `be`. num_blocks >= 1, block_tokens >= 1, dtype F32 or BF16. mtp_layers > 0 adds
  // the pools of the MTP layers as layers L, L+1, ... (their slots are the MTP layer's own cache; one block id
  // names the same token range there too, so sharing, copying and freeing blocks covers them).
  PagedKvCache(const ModelConfig& cfg, Backend& be, int64_t num_blocks, int64_t block_tokens, DType dtype,
               int64_t mtp_layers = 0);
  ~PagedKvCache();
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;

  // The number of blocks a byte budget buys (at least 1 is required: throws Error naming the budget otherwise).
  static int64_t blocks_for_budget(const ModelConfig& cfg, int64_t budget_bytes, int64_t block_tokens, DType dtype,
                                   int64_t mtp_layers = 0);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_tokens() const { return block_tokens_; }
  int64_t capacity_tokens() const { return num_blocks_ * block_tokens_; }
  DType dtype() const { return dtype_; }
  Backend& backend() const { return be_; }
  // Bytes of all pools together.
  int64_t bytes() const { return bytes_; }
  int64_t num_layers() const { return static_cast<int64_t>(latent_.size()); }
  const KvPool& latent(int64_t layer) const { return latent_[static_cast<size_t>(layer)]; }
  // The indexer key pool (data == nullptr on layers without their own indexer).
  const KvPool& index(int64_t layer) const { return index_[static_cast<size_t>(layer)]; }
  // Copies the first n_tokens slots of block src into block dst in every pool (copy on write).
  void copy_block(int32_t src, int32_t dst, int64_t n_tokens);
  // Copies blocks [0, n) of `from` (same model, dtype and block size, n <= both capacities) into this pool.
  void copy_prefix_from(const PagedKvCache& from, int64_t n_blocks);

 private:
  Backend& be_;
  int64_t num_blocks_, block_tokens_;
  DType dtype_;
  int64_t bytes_ = 0;
  std::vector<KvPool> latent_, index_;
};

// One sequence's cache for single-sequence use (Model::forward): blocks 0, 1, 2, … of a private pool.
class KvCache {
 public:
  explicit KvCache(const ModelConfig& cfg, int64_t block_tokens = 64, int64_t mtp_layers = 0);
  int64_t length() const { return len_; }
  int64_t block_tokens() const { return block_tokens_; }
  void clear() { len_ = 0; }
  // Keeps the first n tokens (n <= length()).
  void truncate(int64_t n);
  // The pool (null before the first forward call).
  const PagedKvCache* pool() const { return pool_.get(); }

 private:
  friend class Model;
  // Makes room for n_tokens (grows the pool by doubling, keeping the contents); returns the block table.
  const std::vector<int32_t>& ensure(Backend& be, DType dtype, int64_t n_tokens);

  const ModelConfig& cfg_;
  int64_t block_tokens_;
  int64_t mtp_layers_ = 0;
  int64_t len_ = 0;
  std::unique_ptr<PagedKvCache> pool_;
  std::vector<int32_t> blocks_;
};

}  // namespace latent
