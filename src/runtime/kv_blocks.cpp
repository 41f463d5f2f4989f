#include "runtime/kv_blocks.h"

#include <algorithm>

#include "core/error.h"

namespace latent {

KvBlockAllocator::KvBlockAllocator(int64_t total_blocks, int64_t block_tokens)
    : total_(total_blocks), block_tokens_(block_tokens) {
  if (total_blocks < 1) fail("KV cache: the budget holds no block (total_blocks = {})", total_blocks);
  if (block_tokens < 1) fail("KV cache: --kv-block-tokens must be >= 1 (got {})", block_tokens);
  free_.reserve(static_cast<size_t>(total_blocks));
  for (int64_t i = total_blocks - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

int64_t KvBlockAllocator::extra_blocks(int64_t seq, int64_t n_tokens) const {
  const int64_t need = blocks_for(n_tokens);
  return std::max<int64_t>(0, need - blocks_of(seq));
}

bool KvBlockAllocator::reserve(int64_t seq, int64_t n_tokens) {
  const int64_t extra = extra_blocks(seq, n_tokens);
  if (extra == 0) return true;
  if (extra > free_blocks()) return false;
  auto& t = tables_[seq];
  for (int64_t i = 0; i < extra; ++i) {
    t.push_back(free_.back());
    free_.pop_back();
  }
  used_.fetch_add(extra, std::memory_order_relaxed);
  return true;
}

void KvBlockAllocator::release(int64_t seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (int32_t b : it->second) free_.push_back(b);
  used_.fetch_sub(static_cast<int64_t>(it->second.size()), std::memory_order_relaxed);
  tables_.erase(it);
}

int64_t KvBlockAllocator::blocks_of(int64_t seq) const {
  auto it = tables_.find(seq);
  return it == tables_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

const std::vector<int32_t>* KvBlockAllocator::block_table(int64_t seq) const {
  auto it = tables_.find(seq);
  return it == tables_.end() ? nullptr : &it->second;
}

}  // namespace latent
