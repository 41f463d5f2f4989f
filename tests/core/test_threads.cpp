#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/threads.h"

namespace latent {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  for (int n_threads : {1, 2, 5}) {
    ThreadPool pool(n_threads);
    EXPECT_EQ(pool.size(), n_threads);
    for (int64_t n : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
        EXPECT_LT(b, e);
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPool, NestedAndConcurrentCalls) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  auto work = [&] {
    for (int rep = 0; rep < 20; ++rep)
      pool.parallel_for(10, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          pool.parallel_for(4, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });  // nested: inline
      });
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  EXPECT_EQ(total.load(), 2 * 20 * 10 * 4);
}

}  // namespace
}  // namespace latent
