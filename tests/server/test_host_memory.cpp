// Host memory of the server (server/host_memory.h, server/model_engine.h): --kv-cache-bytes auto on the CPU, the
// available-memory figure it is capped against, and the large-request count that triggers giving memory back.
#include <gtest/gtest.h>

#include "core/error.h"
#include "server/host_memory.h"
#include "server/model_engine.h"

namespace latent::server {
namespace {

TEST(HostKvAuto, RunningBatchPlusTheStatedPrefixCacheShareInWholeBlocks) {
  // 3 x 512 = 1536 tokens + 25% (384) = 1920 tokens = 30 blocks of 64.
  HostKvAuto a = host_kv_auto(3, 512, /*prefix_cache=*/true, 640, 64, /*available=*/int64_t{16} << 30);
  EXPECT_EQ(a.running_tokens, 1536);
  EXPECT_EQ(a.prefix_tokens, 384);
  EXPECT_EQ(a.blocks, 30);
  EXPECT_EQ(a.tokens, 1920);
  EXPECT_EQ(a.bytes, 1920 * 640);
  EXPECT_FALSE(a.capped);
  // Prefix cache off: the running batch only; a partial block rounds up.
  a = host_kv_auto(3, 500, false, 640, 64, int64_t{16} << 30);
  EXPECT_EQ(a.prefix_tokens, 0);
  EXPECT_EQ(a.blocks, 24);  // ceil(1500 / 64)
  // The demo model's defaults: 64 sequences x 2048 tokens at 1792 bytes/token: 280 MiB, not the old fixed 4 GiB.
  a = host_kv_auto(64, 2048, true, 1792, 64, int64_t{16} << 30);
  EXPECT_EQ(a.tokens, 163840);
  EXPECT_EQ(a.bytes, int64_t{163840} * 1792);
  // Ranks of a parallel model on the CPU each hold a copy: the bytes count every one, the tokens do not change.
  HostKvAuto r = host_kv_auto(64, 2048, true, 1792, 64, int64_t{16} << 30, /*replicas=*/2);
  EXPECT_EQ(r.tokens, a.tokens);
  EXPECT_EQ(r.bytes, 2 * a.bytes);
}

TEST(HostKvAuto, CappedAtHalfTheAvailableMemory) {
  // GLM-5-like demand (64 x 202752 tokens) against 8 GiB available: half of it, in whole blocks.
  const int64_t bpt = 180000, avail = int64_t{8} << 30;
  const HostKvAuto a = host_kv_auto(64, 202752, true, bpt, 64, avail);
  EXPECT_TRUE(a.capped);
  EXPECT_EQ(a.available_bytes, avail);
  EXPECT_EQ(a.blocks, (avail / 2) / (bpt * 64));
  EXPECT_LE(a.bytes, avail / 2);
  EXPECT_GT(a.bytes, avail / 2 - bpt * 64);
  // Unknown available memory (0): no cap.
  EXPECT_FALSE(host_kv_auto(64, 202752, true, bpt, 64, 0).capped);
  // Not even one block fits: a clear error, not a pool of zero blocks.
  try {
    host_kv_auto(4, 1024, true, 640, 64, 1000);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-cache-bytes auto"), std::string::npos) << e.what();
  }
  EXPECT_THROW(host_kv_auto(0, 1024, true, 640, 64, 0), Error);
  // Flags at their limits (1e18) do not overflow: the demand saturates and the cap decides.
  const HostKvAuto big = host_kv_auto(int64_t{1000000000000000000}, 1000000, true, 640, 64, avail);
  EXPECT_TRUE(big.capped);
  EXPECT_EQ(big.blocks, (avail / 2) / (640 * 64));
  // ... and with the available memory unknown (no cap), a demand beyond any memory is a clear error, not a wrap.
  EXPECT_THROW(host_kv_auto(int64_t{1000000000000000000}, 1000000, true, 180000, 64, 0), Error);
  EXPECT_THROW(host_kv_auto(1, 64, true, int64_t{1} << 40, int64_t{1} << 30, avail), Error);
}

TEST(HostMemory, AvailableMemoryIsReadOnLinux) {
  const int64_t a = host_available_memory();
  EXPECT_GT(a, int64_t{16} << 20);  // /proc/meminfo (or the cgroup) gives a figure
}

TEST(HostMemory, LargeRequestTrackerSaysWhenTheLastOneEnds) {
  LargeRequestTracker t;
  t.begin();
  t.begin();
  EXPECT_EQ(t.in_flight(), 2);
  EXPECT_FALSE(t.end());
  t.begin();
  EXPECT_FALSE(t.end());
  EXPECT_TRUE(t.end());  // the last one: release now
  EXPECT_EQ(t.in_flight(), 0);
  release_free_memory();  // callable at any time
}

}  // namespace
}  // namespace latent::server
