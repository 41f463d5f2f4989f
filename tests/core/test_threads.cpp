#include <gtest/gtest.h>

#include <algorithm>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "core/threads.h"

#if defined(__linux__)
#include <sched.h>
#endif

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

TEST(ThreadPool, StaticPartitionOneRangePerThread) {
  for (int n_threads : {2, 3, 4}) {
    ThreadPool pool(n_threads);
    for (int64_t n : {5, 64, 1000, 1001}) {
      for (int64_t grain : {1, 7, 300}) {
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> ranges;
        std::set<std::thread::id> ids;
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          std::lock_guard<std::mutex> lk(mu);
          ranges.emplace_back(b, e);
          ids.insert(std::this_thread::get_id());
        });
        const int64_t parts = pool.parts_for(n, grain);
        ASSERT_EQ(static_cast<int64_t>(ranges.size()), parts) << n << " " << grain;
        EXPECT_LE(parts, n_threads);
        EXPECT_EQ(static_cast<int64_t>(ids.size()), parts);  // each range on its own thread
        std::sort(ranges.begin(), ranges.end());
        int64_t at = 0;
        for (const auto& [b, e] : ranges) {
          EXPECT_EQ(b, at);
          if (parts > 1) {
            EXPECT_GE(e - b, grain);
          }
          at = e;
        }
        EXPECT_EQ(at, n);
      }
    }
  }
}

TEST(ThreadPool, ManyBackToBackCallsAndParkedWorkers) {
  ThreadPool pool(3);
  int64_t sum = 0;
  std::vector<int64_t> part(3);
  for (int rep = 0; rep < 2000; ++rep) {  // spinning workers: consecutive jobs must not mix
    std::fill(part.begin(), part.end(), 0);
    pool.parallel_for(3, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) part[static_cast<size_t>(i)] += rep + i;
    });
    sum += part[0] + part[1] + part[2];
  }
  EXPECT_EQ(sum, 3 * (int64_t{2000} * 1999 / 2) + 2000 * 3);
  for (int rep = 0; rep < 5; ++rep) {  // idle longer than the spin: workers park and must wake again
    std::this_thread::sleep_for(std::chrono::nanoseconds(3 * ThreadPool::kSpinNs));
    std::atomic<int64_t> total{0};
    pool.parallel_for(300, 1, [&](int64_t b, int64_t e) { total += e - b; });
    EXPECT_EQ(total.load(), 300);
  }
}

TEST(ThreadPool, CallableIsNotCopied) {
  ThreadPool pool(2);
  auto owned = std::make_unique<int64_t>(0);  // a move-only capture: the lambda cannot be copied
  std::atomic<int64_t> total{0};
  auto fn = [&total, p = std::move(owned)](int64_t b, int64_t e) { total += (e - b) + *p; };
  pool.parallel_for(100, 10, fn);
  EXPECT_EQ(total.load(), 100);
  const std::function<void(int64_t, int64_t)> f = [&](int64_t b, int64_t e) { total += e - b; };
  pool.parallel_for(100, 10, f);  // a std::function is just another callable
  EXPECT_EQ(total.load(), 200);
}

// A cgroup v2 cpu.max: quota and period in microseconds, rounded up to whole CPUs; "max" and anything malformed
// are no limit (0).
TEST(AvailableCpus, CgroupQuotaParsing) {
  EXPECT_EQ(cgroup_cpu_limit("max 100000\n"), 0);
  EXPECT_EQ(cgroup_cpu_limit("200000 100000\n"), 2);
  EXPECT_EQ(cgroup_cpu_limit("150000 100000"), 2);
  EXPECT_EQ(cgroup_cpu_limit("50000 100000"), 1);
  EXPECT_EQ(cgroup_cpu_limit("100000 100000"), 1);
  EXPECT_EQ(cgroup_cpu_limit(""), 0);
  EXPECT_EQ(cgroup_cpu_limit("abc 100000"), 0);
  EXPECT_EQ(cgroup_cpu_limit("12x 100000"), 0);
  EXPECT_EQ(cgroup_cpu_limit("100000 0"), 0);
  EXPECT_EQ(cgroup_cpu_limit("-1 100000"), 0);
}

// At least one CPU, never more than the host has; a pool of size 0 takes that many threads.
TEST(AvailableCpus, BoundedByTheHostAndUsedByDefaultPools) {
  const int n = available_cpus();
  EXPECT_GE(n, 1);
  const unsigned host = std::thread::hardware_concurrency();
  if (host > 0) {
    EXPECT_LE(n, static_cast<int>(host));
  }
  ThreadPool pool(0);
  EXPECT_EQ(pool.size(), n);
}

#if defined(__linux__)
// A thread limited to one CPU (what taskset -c 0 does to a process) sees one CPU, whatever the host has.
TEST(AvailableCpus, FollowTheAffinityMask) {
  int seen = 0;
  std::thread t([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
      if (CPU_ISSET(c, &set)) first = c;
    ASSERT_GE(first, 0);
    CPU_ZERO(&set);
    CPU_SET(first, &set);
    ASSERT_EQ(sched_setaffinity(0, sizeof(set), &set), 0);
    seen = available_cpus();
  });
  t.join();
  EXPECT_EQ(seen, 1);
}
#endif

}  // namespace
}  // namespace latent
