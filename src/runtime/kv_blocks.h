// Paged accounting of the latent KV cache: the cache budget (--kv-cache-bytes) is cut into blocks of
// `block_tokens` tokens (--kv-block-tokens); every sequence owns a list of block ids covering its computed tokens.
// The scheduler reserves blocks before an engine step writes the tokens and frees them when a sequence finishes,
// is cancelled or is preempted, so the sum of all sequences' caches never exceeds the budget.
//
// The blocks are bookkeeping over whatever storage the engine uses: the CPU engine keeps one contiguous buffer
// per sequence and layer (model/model.h KvCache), whose size is bounded by the blocks reserved for it.
// Not thread-safe: owned by the scheduler thread (readers of the counters use used_blocks() via atomics).
#pragma once
#include <atomic>
#include <cstdint>
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
  // Releases every block of `seq` (no-op for an unknown sequence).
  void release(int64_t seq);
  int64_t blocks_of(int64_t seq) const;
  const std::vector<int32_t>* block_table(int64_t seq) const;

 private:
  int64_t total_, block_tokens_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::unordered_map<int64_t, std::vector<int32_t>> tables_;
  std::atomic<int64_t> used_{0};
};

}  // namespace latent
