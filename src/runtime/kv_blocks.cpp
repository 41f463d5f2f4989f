#include "runtime/kv_blocks.h"

#include <algorithm>
#include <cassert>

#include "core/error.h"

namespace latent {

KvBlockAllocator::KvBlockAllocator(int64_t total_blocks, int64_t block_tokens)
    : total_(total_blocks), block_tokens_(block_tokens) {
  if (total_blocks < 1) fail("KV cache: the budget holds no block (total_blocks = {})", total_blocks);
  if (block_tokens < 1) fail("KV cache: --kv-block-tokens must be >= 1 (got {})", block_tokens);
  if (total_blocks > INT32_MAX) fail("KV cache: {} blocks exceed the block id range", total_blocks);
  free_.reserve(static_cast<size_t>(total_blocks));
  for (int64_t i = total_blocks - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
  refs_.assign(static_cast<size_t>(total_blocks), 0);
}

int32_t KvBlockAllocator::take_free() {
  const int32_t b = free_.back();
  free_.pop_back();
  assert(refs_[static_cast<size_t>(b)] == 0 && "a free block is referenced");
  refs_[static_cast<size_t>(b)] = 1;
  used_.fetch_add(1, std::memory_order_relaxed);
  return b;
}

void KvBlockAllocator::drop(int32_t b) {
  int32_t& r = refs_[static_cast<size_t>(b)];
  assert(r > 0 && "releasing a block that is not referenced");
  if (--r == 0) {
    free_.push_back(b);
    used_.fetch_sub(1, std::memory_order_relaxed);
  }
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
  for (int64_t i = 0; i < extra; ++i) t.push_back(take_free());
  return true;
}

void KvBlockAllocator::release(int64_t seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (int32_t b : it->second) drop(b);
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

std::optional<std::optional<KvBlockAllocator::BlockCopy>> KvBlockAllocator::fork(int64_t from, int64_t to,
                                                                                 int64_t n_tokens) {
  const auto* src = block_table(from);
  if (!src || blocks_of(to) != 0 || blocks_for(n_tokens) > static_cast<int64_t>(src->size()))
    fail("KV cache: cannot fork {} tokens of sequence {} into sequence {}", n_tokens, from, to);
  const int64_t full = n_tokens / block_tokens_, rest = n_tokens % block_tokens_;
  if (rest > 0 && free_.empty()) return std::nullopt;
  std::vector<int32_t> t(src->begin(), src->begin() + full);
  for (int32_t b : t) ++refs_[static_cast<size_t>(b)];
  std::optional<BlockCopy> copy;
  if (rest > 0) {
    const int32_t fresh = take_free();
    copy = BlockCopy{(*src)[static_cast<size_t>(full)], fresh, rest};
    t.push_back(fresh);
  }
  tables_[to] = std::move(t);
  return copy;
}

}  // namespace latent
