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
  ASSERT_TRUE(a.reserve(1, 40));  // 3 blocks
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
