// The block allocator of the paged latent KV cache: which blocks of the pool (model/kv_cache.h PagedKvCache, the
// storage itself) each sequence owns. The cache budget (--kv-cache-bytes) is cut into blocks of `block_tokens`
// tokens (--kv-block-tokens); a sequence's block table lists the blocks holding its tokens 0, 1, 2, … in order.
// Blocks are reference counted: n > 1 shares the prompt's full blocks between the choices (fork), and a shared
// block is never written (a sequence only appends after its last token; the partial last block is copied at fork).
// The scheduler reserves blocks before a step writes the tokens and releases them when a sequence finishes, is
// cancelled or is preempted, so the sum of all sequences' caches never exceeds the pool.
// Not thread-safe: owned by the scheduler thread (used_blocks() is an atomic for other readers).
#pragma once
#include <atomic>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace latent {

class KvBlockAllocator {
 public:
  // total_blocks >= 1, block_tokens >= 1.
  KvBlockAllocator(int64_t total_blocks, int64_t block_tokens);

  int64_t block_tokens() const { return block_tokens_; }
  int64_t total_blocks() const { return total_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return used_.load(std::memory_order_relaxed); }
  // Blocks needed to hold n tokens.
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + block_tokens_ - 1) / block_tokens_; }
  // Tokens the whole budget can hold.
  int64_t capacity_tokens() const { return total_ * block_tokens_; }

  // Makes sequence `seq` own enough blocks for n_tokens (it never shrinks here). False, with nothing changed,
  // when the free blocks do not suffice.
  bool reserve(int64_t seq, int64_t n_tokens);
  // Additional blocks `seq` would need to hold n_tokens.
  int64_t extra_blocks(int64_t seq, int64_t n_tokens) const;
  // Drops `seq`'s references; blocks no longer referenced return to the free list (no-op for an unknown sequence).
  void release(int64_t seq);
  int64_t blocks_of(int64_t seq) const;
  const std::vector<int32_t>* block_table(int64_t seq) const;

  // What the engine must copy after a fork: the first `n_tokens` slots of block `src` into block `dst`.
  struct BlockCopy {
    int32_t src = -1, dst = -1;
    int64_t n_tokens = 0;
  };
  // `to` (owning no block) shares the full blocks of `from` covering its first n_tokens tokens (reference counts
  // + 1) and gets a fresh block for the partial last one, if any, returned as the copy to make. nullopt, with
  // nothing changed, when that fresh block is not free. n_tokens <= tokens `from`'s blocks hold.
  std::optional<std::optional<BlockCopy>> fork(int64_t from, int64_t to, int64_t n_tokens);
  // Reference count of a block (0 = free).
  int32_t ref_count(int32_t block) const { return refs_[static_cast<size_t>(block)]; }

 private:
  int32_t take_free();
  void drop(int32_t block);

  int64_t total_, block_tokens_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::vector<int32_t> refs_;  // [total] reference counts
  std::unordered_map<int64_t, std::vector<int32_t>> tables_;
  std::atomic<int64_t> used_{0};
};

}  // namespace latent
