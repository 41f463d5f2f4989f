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
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    // Evict the least recently used cached block nobody references.
    b = lru_.front();
    lru_.pop_front();
    in_lru_[static_cast<size_t>(b)] = 0;
    uncache(b);
    st_evictions_.fetch_add(1, std::memory_order_relaxed);
  }
  assert(refs_[static_cast<size_t>(b)] == 0 && "a free block is referenced");
  refs_[static_cast<size_t>(b)] = 1;
  used_.fetch_add(1, std::memory_order_relaxed);
  return b;
}

void KvBlockAllocator::drop(int32_t b) {
  int32_t& r = refs_[static_cast<size_t>(b)];
  assert(r > 0 && "releasing a block that is not referenced");
  if (--r == 0) {
    used_.fetch_sub(1, std::memory_order_relaxed);
    if (cache_on_ && hash_[static_cast<size_t>(b)] != 0) {
      lru_.push_back(b);  // stays cached, evictable
      lru_at_[static_cast<size_t>(b)] = std::prev(lru_.end());
      in_lru_[static_cast<size_t>(b)] = 1;
    } else {
      free_.push_back(b);
    }
  }
}

void KvBlockAllocator::enable_prefix_cache(uint64_t salt) {
  cache_on_ = true;
  salt_ = salt;
  hash_.assign(static_cast<size_t>(total_), 0);
  parent_.assign(static_cast<size_t>(total_), 0);
  tokens_.assign(static_cast<size_t>(total_ * block_tokens_), 0);
  lru_at_.assign(static_cast<size_t>(total_), lru_.end());
  in_lru_.assign(static_cast<size_t>(total_), 0);
}

uint64_t KvBlockAllocator::block_hash(uint64_t parent, const int32_t* tokens) const {
  // FNV-1a over (salt, parent, tokens) with a final avalanche; 0 is reserved for "no hash".
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xFF;
      h *= 1099511628211ull;
    }
  };
  mix(salt_);
  mix(parent);
  for (int64_t i = 0; i < block_tokens_; ++i) mix(static_cast<uint32_t>(tokens[i]));
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h == 0 ? 1 : h;
}

void KvBlockAllocator::uncache(int32_t b) {
  uint64_t& h = hash_[static_cast<size_t>(b)];
  if (h == 0) return;
  auto it = cached_.find(h);
  if (it != cached_.end() && it->second == b) cached_.erase(it);
  h = 0;
  st_cached_.fetch_sub(1, std::memory_order_relaxed);
}

int64_t KvBlockAllocator::attach_prefix(int64_t seq, std::span<const int32_t> tokens, int64_t max_tokens) {
  if (!cache_on_) return 0;
  if (blocks_of(seq) != 0) fail("KV cache: sequence {} already owns blocks", seq);
  max_tokens = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  st_queries_.fetch_add(1, std::memory_order_relaxed);
  st_query_tokens_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(max_tokens, 0)), std::memory_order_relaxed);
  std::vector<int32_t> t;
  uint64_t parent = 0;
  for (int64_t j = 0; (j + 1) * block_tokens_ <= max_tokens; ++j) {
    const int32_t* tk = tokens.data() + j * block_tokens_;
    const uint64_t h = block_hash(parent, tk);
    auto it = cached_.find(h);
    if (it == cached_.end()) break;
    const int32_t b = it->second;
    const size_t bi = static_cast<size_t>(b);
    if (parent_[bi] != parent ||
        !std::equal(tk, tk + block_tokens_, tokens_.begin() + static_cast<std::ptrdiff_t>(bi * block_tokens_)))
      break;  // a hash collision: not the same block
    if (refs_[bi] == 0) {
      lru_.erase(lru_at_[bi]);
      in_lru_[bi] = 0;
      used_.fetch_add(1, std::memory_order_relaxed);
    }
    ++refs_[bi];
    t.push_back(b);
    parent = h;
  }
  const int64_t got = static_cast<int64_t>(t.size()) * block_tokens_;
  if (!t.empty()) {
    seq_state_[seq] = {static_cast<int64_t>(t.size()), parent};
    tables_[seq] = std::move(t);
  }
  st_hit_tokens_.fetch_add(static_cast<uint64_t>(got), std::memory_order_relaxed);
  return got;
}

void KvBlockAllocator::commit(int64_t seq, std::span<const int32_t> tokens, int64_t n_computed) {
  if (!cache_on_) return;
  auto tt = tables_.find(seq);
  if (tt == tables_.end()) return;
  SeqState& st = seq_state_[seq];
  const int64_t full = std::min<int64_t>(n_computed, static_cast<int64_t>(tokens.size())) / block_tokens_;
  for (int64_t j = st.hashed; j < full && j < static_cast<int64_t>(tt->second.size()); ++j) {
    const int32_t* tk = tokens.data() + j * block_tokens_;
    const uint64_t h = block_hash(st.last_hash, tk);
    const int32_t b = tt->second[static_cast<size_t>(j)];
    const size_t bi = static_cast<size_t>(b);
    if (hash_[bi] == 0 && cached_.find(h) == cached_.end()) {
      cached_[h] = b;
      hash_[bi] = h;
      parent_[bi] = st.last_hash;
      std::copy(tk, tk + block_tokens_, tokens_.begin() + static_cast<std::ptrdiff_t>(bi * block_tokens_));
      st_cached_.fetch_add(1, std::memory_order_relaxed);
    }
    st.last_hash = h;
    st.hashed = j + 1;
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
  seq_state_.erase(seq);
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (int32_t b : it->second) drop(b);
  tables_.erase(it);
}

void KvBlockAllocator::shrink(int64_t seq, int64_t n_tokens) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  std::vector<int32_t>& t = it->second;
  int64_t keep = std::max<int64_t>(blocks_for(n_tokens), 0);
  auto st = seq_state_.find(seq);
  if (st != seq_state_.end()) keep = std::max(keep, st->second.hashed);  // never a registered block
  while (static_cast<int64_t>(t.size()) > keep) {
    drop(t.back());
    t.pop_back();
  }
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
  if (rest > 0 && free_blocks() == 0) return std::nullopt;
  std::vector<int32_t> t(src->begin(), src->begin() + full);
  for (int32_t b : t) ++refs_[static_cast<size_t>(b)];
  std::optional<BlockCopy> copy;
  if (rest > 0) {
    const int32_t fresh = take_free();
    copy = BlockCopy{(*src)[static_cast<size_t>(full)], fresh, rest};
    t.push_back(fresh);
  }
  tables_[to] = std::move(t);
  if (cache_on_) {  // the shared full blocks are the parent's: registered as far as the parent registered them
    auto ps = seq_state_.find(from);
    if (ps != seq_state_.end() && ps->second.hashed <= full) seq_state_[to] = ps->second;
  }
  return copy;
}

}  // namespace latent
