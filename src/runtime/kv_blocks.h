// The block allocator of the paged latent KV cache: which blocks of the pool (model/kv_cache.h PagedKvCache, the
// storage itself) each sequence owns. The cache budget (--kv-cache-bytes) is cut into blocks of `block_tokens`
// tokens (--kv-block-tokens); a sequence's block table lists the blocks holding its tokens 0, 1, 2, … in order.
// Blocks are reference counted: n > 1 shares the prompt's full blocks between the choices (fork), and a shared
// block is never written (a sequence only appends after its last token; the partial last block is copied at fork).
// The scheduler reserves blocks before a step writes the tokens and releases them when a sequence finishes, is
// cancelled or is preempted, so the sum of all sequences' caches never exceeds the pool.
//
// Prefix caching (enable_prefix_cache): a full block is named by a hash of its tokens chained with its parent
// block's hash and a salt (whatever else changes its contents: model, plan transforms, cache dtype). Full blocks a
// sequence computed are registered under their hash (commit); a new sequence takes the longest chain of cached
// blocks that matches its tokens (attach_prefix) and computes only the rest. A cached block nobody references stays
// cached, evictable in LRU order: the allocator evicts such blocks before it reports that no block is free, so
// memory pressure evicts cached blocks before the scheduler preempts a running sequence. A referenced block is
// never evicted. A hit is verified against the stored tokens and parent hash (no silent hash collision).
// Not thread-safe: owned by the scheduler thread (used_blocks() and the counters are atomics for other readers).
#pragma once
#include <atomic>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace latent {

class KvBlockAllocator {
 public:
  // total_blocks >= 1, block_tokens >= 1.
  KvBlockAllocator(int64_t total_blocks, int64_t block_tokens);

  int64_t block_tokens() const { return block_tokens_; }
  int64_t total_blocks() const { return total_; }
  // Blocks a reservation can take: free ones plus cached ones nobody references (evictable).
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
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
  // Drops the blocks of `seq` beyond those holding n_tokens (speculative decoding: the slots of rejected drafts
  // and the draft layer's scratch slots). Only unregistered trailing blocks are dropped.
  void shrink(int64_t seq, int64_t n_tokens);
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
  // Reference count of a block (0 = free or cached-unreferenced).
  int32_t ref_count(int32_t block) const { return refs_[static_cast<size_t>(block)]; }

  // ---- prefix cache ----
  void enable_prefix_cache(uint64_t salt);
  bool prefix_cache_enabled() const { return cache_on_; }
  // `seq` (owning no block) takes the longest chain of cached full blocks matching tokens[0 .. max_tokens), counted
  // as one query. Returns the number of tokens it now holds (a multiple of block_tokens, <= max_tokens).
  int64_t attach_prefix(int64_t seq, std::span<const int32_t> tokens, int64_t max_tokens);
  // Registers the full blocks of `seq` covering tokens[0 .. n_computed) under their chained hashes.
  void commit(int64_t seq, std::span<const int32_t> tokens, int64_t n_computed);
  int64_t cached_blocks() const { return st_cached_.load(std::memory_order_relaxed); }
  uint64_t prefix_queries() const { return st_queries_.load(std::memory_order_relaxed); }
  uint64_t prefix_query_tokens() const { return st_query_tokens_.load(std::memory_order_relaxed); }
  uint64_t prefix_hit_tokens() const { return st_hit_tokens_.load(std::memory_order_relaxed); }
  uint64_t prefix_evictions() const { return st_evictions_.load(std::memory_order_relaxed); }

 private:
  struct SeqState {
    int64_t hashed = 0;  // leading blocks of the table registered (or matched) in the cache
    uint64_t last_hash = 0;
  };
  int32_t take_free();
  void drop(int32_t block);
  uint64_t block_hash(uint64_t parent, const int32_t* tokens) const;
  void uncache(int32_t block);

  int64_t total_, block_tokens_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::vector<int32_t> refs_;  // [total] reference counts
  std::unordered_map<int64_t, std::vector<int32_t>> tables_;
  std::atomic<int64_t> used_{0};

  bool cache_on_ = false;
  uint64_t salt_ = 0;
  std::unordered_map<int64_t, SeqState> seq_state_;
  std::unordered_map<uint64_t, int32_t> cached_;  // hash -> block
  std::vector<uint64_t> hash_, parent_;           // [total]: a cached block's hash and its parent's (0: none)
  std::vector<int32_t> tokens_;                   // [total * block_tokens]: a cached block's tokens
  std::list<int32_t> lru_;                        // cached blocks with no reference, oldest first
  std::vector<std::list<int32_t>::iterator> lru_at_;
  std::vector<char> in_lru_;
  std::atomic<int64_t> st_cached_{0};
  std::atomic<uint64_t> st_queries_{0}, st_query_tokens_{0}, st_hit_tokens_{0}, st_evictions_{0};
};

}  // namespace latent
