// The block allocator of the paged KV cache: reservation, reference-counted sharing (fork), release.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "runtime/kv_blocks.h"

namespace latent {
namespace {

TEST(KvBlocks, ReserveTakesExactlyTheBlocksNeeded) {
  KvBlockAllocator a(200, 64);
  for (int64_t s = 0; s < 8; ++s) ASSERT_TRUE(a.reserve(s, 1000));
  EXPECT_EQ(a.used_blocks(), 8 * 16);  // ceil(1000 / 64) = 16
  EXPECT_EQ(a.free_blocks(), 200 - 8 * 16);
  std::set<int32_t> seen;
  for (int64_t s = 0; s < 8; ++s) {
    ASSERT_EQ(a.blocks_of(s), 16);
    for (int32_t b : *a.block_table(s)) EXPECT_TRUE(seen.insert(b).second) << "block " << b << " owned twice";
  }
  EXPECT_TRUE(a.reserve(0, 1024));  // still 16 blocks
  EXPECT_EQ(a.blocks_of(0), 16);
  EXPECT_TRUE(a.reserve(0, 1025));
  EXPECT_EQ(a.blocks_of(0), 17);
  for (int64_t s = 0; s < 8; ++s) a.release(s);
  EXPECT_EQ(a.used_blocks(), 0);
  EXPECT_EQ(a.free_blocks(), 200);
}

TEST(KvBlocks, ReserveFailsWithoutChange) {
  KvBlockAllocator a(4, 16);
  ASSERT_TRUE(a.reserve(1, 40));   // 3 blocks
  EXPECT_FALSE(a.reserve(2, 20));  // needs 2, 1 free
  EXPECT_EQ(a.blocks_of(2), 0);
  EXPECT_EQ(a.free_blocks(), 1);
}

TEST(KvBlocks, ForkSharesFullBlocksAndCopiesThePartialOne) {
  KvBlockAllocator a(10, 4);
  ASSERT_TRUE(a.reserve(1, 10));  // blocks for tokens 0..9: 3 blocks, the last one half full
  const std::vector<int32_t> t1 = *a.block_table(1);
  auto f = a.fork(1, 2, 10);
  ASSERT_TRUE(f.has_value());
  ASSERT_TRUE(f->has_value());
  const std::vector<int32_t> t2 = *a.block_table(2);
  ASSERT_EQ(t2.size(), 3u);
  EXPECT_EQ(t2[0], t1[0]);
  EXPECT_EQ(t2[1], t1[1]);
  EXPECT_NE(t2[2], t1[2]);  // the partial block is the fork's own
  EXPECT_EQ((*f)->src, t1[2]);
  EXPECT_EQ((*f)->dst, t2[2]);
  EXPECT_EQ((*f)->n_tokens, 2);
  EXPECT_EQ(a.ref_count(t1[0]), 2);
  EXPECT_EQ(a.ref_count(t1[2]), 1);
  EXPECT_EQ(a.used_blocks(), 4);
  // A block boundary: nothing to copy.
  auto g = a.fork(1, 3, 8);
  ASSERT_TRUE(g.has_value());
  EXPECT_FALSE(g->has_value());
  EXPECT_EQ(a.ref_count(t1[0]), 3);
  // Releasing the original keeps the shared blocks alive for the forks.
  a.release(1);
  EXPECT_EQ(a.ref_count(t1[0]), 2);
  EXPECT_EQ(a.ref_count(t1[2]), 0);
  a.release(2);
  a.release(3);
  EXPECT_EQ(a.used_blocks(), 0);
  EXPECT_EQ(a.free_blocks(), 10);
}

TEST(KvBlocks, ForkWithoutAFreeBlockChangesNothing) {
  KvBlockAllocator a(3, 4);
  ASSERT_TRUE(a.reserve(1, 10));
  auto f = a.fork(1, 2, 10);
  EXPECT_FALSE(f.has_value());
  EXPECT_EQ(a.blocks_of(2), 0);
  EXPECT_EQ(a.ref_count((*a.block_table(1))[0]), 1);
  EXPECT_THROW(a.fork(1, 2, 13), Error);  // more tokens than sequence 1 holds
}

}  // namespace
}  // namespace latent

namespace latent {
namespace {

std::vector<int32_t> seq_tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (i * 11 + seed * 7) % 97);
  return t;
}

TEST(PrefixCache, ReleasedBlocksStayCachedAndAreReused) {
  KvBlockAllocator a(16, 4);
  a.enable_prefix_cache(42);
  const auto t = seq_tokens(10, 1);
  EXPECT_EQ(a.attach_prefix(1, t, 9), 0);  // empty cache: a miss
  ASSERT_TRUE(a.reserve(1, 10));
  a.commit(1, t, 10);  // blocks 0 and 1 are full, block 2 holds 2 tokens
  EXPECT_EQ(a.cached_blocks(), 2);
  const std::vector<int32_t> first = *a.block_table(1);
  a.release(1);
  EXPECT_EQ(a.used_blocks(), 0);
  EXPECT_EQ(a.free_blocks(), 16);  // cached blocks are evictable, so they count as free
  EXPECT_EQ(a.cached_blocks(), 2);
  // Same prompt: both full blocks come back; at least one token is left to compute.
  EXPECT_EQ(a.attach_prefix(2, t, 9), 8);
  EXPECT_EQ((*a.block_table(2))[0], first[0]);
  EXPECT_EQ((*a.block_table(2))[1], first[1]);
  EXPECT_EQ(a.used_blocks(), 2);
  // Shares the first block only; a third sequence shares both while 2 still holds them (refcount 2).
  auto u = t;
  u[5] = 99;
  EXPECT_EQ(a.attach_prefix(3, u, 9), 4);
  EXPECT_EQ(a.ref_count(first[0]), 2);
  EXPECT_EQ(a.attach_prefix(4, t, 8), 8);  // max_tokens exactly on a block boundary
  EXPECT_EQ(a.ref_count(first[1]), 2);
  EXPECT_EQ(a.attach_prefix(5, t, 7), 4);  // fewer tokens allowed than two blocks
  EXPECT_EQ(a.prefix_queries(), 5u);
  EXPECT_EQ(a.prefix_hit_tokens(), 8u + 4u + 8u + 4u);
}

TEST(PrefixCache, ParentChainAndSaltDecide) {
  KvBlockAllocator a(16, 4);
  a.enable_prefix_cache(1);
  auto t = seq_tokens(12, 2);
  ASSERT_TRUE(a.reserve(1, 12));
  a.commit(1, t, 12);
  a.release(1);
  // Same second block after a different first block: no hit at all (hashes chain over the parent).
  auto u = t;
  u[0] += 1;
  EXPECT_EQ(a.attach_prefix(2, u, 11), 0);
  // Another salt (other model / plan / dtype): nothing matches.
  KvBlockAllocator b(16, 4);
  b.enable_prefix_cache(2);
  ASSERT_TRUE(b.reserve(1, 12));
  b.commit(1, t, 12);
  b.release(1);
  EXPECT_EQ(b.attach_prefix(2, t, 11), 8);
  KvBlockAllocator c(16, 4);
  c.enable_prefix_cache(3);
  EXPECT_EQ(c.attach_prefix(2, t, 11), 0);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedUnreferencedBlocksOnlyWhenNeeded) {
  KvBlockAllocator a(6, 2);
  a.enable_prefix_cache(0);
  const auto x = seq_tokens(4, 3), y = seq_tokens(4, 4);
  ASSERT_TRUE(a.reserve(1, 4));
  a.commit(1, x, 4);
  a.release(1);  // x's 2 blocks: cached, oldest
  ASSERT_TRUE(a.reserve(2, 4));
  a.commit(2, y, 4);
  a.release(2);  // y's 2 blocks: cached, newer
  EXPECT_EQ(a.cached_blocks(), 4);
  // A sequence holding y's blocks pins them.
  EXPECT_EQ(a.attach_prefix(3, y, 4), 4);
  // 4 more blocks needed: 2 truly free, then x's two (the only unreferenced cached ones) are evicted.
  ASSERT_TRUE(a.reserve(4, 8));
  EXPECT_EQ(a.prefix_evictions(), 2u);
  EXPECT_EQ(a.cached_blocks(), 2);
  EXPECT_FALSE(a.reserve(5, 2));  // y's blocks are referenced: never evicted
  a.release(4);
  EXPECT_EQ(a.attach_prefix(6, x, 4), 0);  // x was evicted
  EXPECT_EQ(a.attach_prefix(7, y, 4), 4);  // y still cached
}

TEST(PrefixCache, ForkedChoicesAndCommitOfSharedBlocks) {
  KvBlockAllocator a(16, 4);
  a.enable_prefix_cache(9);
  const auto t = seq_tokens(10, 5);
  ASSERT_TRUE(a.reserve(1, 10));
  a.commit(1, t, 10);
  auto f = a.fork(1, 2, 10);
  ASSERT_TRUE(f.has_value());
  // The fork continues with its own tokens; its shared blocks are already registered, its next full block is its own.
  auto t2 = t;
  t2.push_back(50);
  t2.push_back(51);
  ASSERT_TRUE(a.reserve(2, 12));
  a.commit(2, t2, 12);
  EXPECT_EQ(a.cached_blocks(), 3);
  a.release(1);
  a.release(2);
  EXPECT_EQ(a.attach_prefix(3, t2, 12), 12);
}

}  // namespace
}  // namespace latent
