// ThreadPool: a fixed set of worker threads for data-parallel loops (split rows of a matmul, heads of attention).
// parallel_for blocks until every part is done. Calls from inside a worker (nested) and concurrent calls from
// several threads are safe: a nested call runs inline; concurrent callers are serialized.
//
// Built for the many short ops of a decode step (~100 parallel ops per token, each tens of microseconds):
//   * the work is split once per call into one contiguous range per thread (static partition by thread index;
//     no shared chunk counter), the caller runs range 0;
//   * workers wait for the next call by spinning on an atomic generation counter for a bounded time
//     (kSpinNs), then park on a futex (Linux; std::atomic::wait elsewhere), so back-to-back ops never pay a
//     wake-up and an idle pool costs nothing;
//   * no allocation per call: the callable is passed by reference through a function-pointer trampoline
//     (parallel_for is a template; a std::function argument works too, it is just another callable).
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace latent {

// The CPUs this process may run on: the affinity mask (taskset, cpusets), capped by a cgroup CPU quota (a
// container's --cpus; cgroup v2 cpu.max or v1 cpu.cfs_quota_us, rounded up), at least 1. Not
// std::thread::hardware_concurrency(), which counts the host's CPUs: in a container limited to 2 of 64 CPUs a pool
// of 64 spinning threads runs every op ~30x slower.
int available_cpus();

// A cgroup CPU limit in CPUs (the quota over the period, rounded up) from the text of cgroup v2 `cpu.max`
// ("max 100000" or "200000 100000"); 0 when unlimited or unreadable.
int cgroup_cpu_limit(const std::string& cpu_max);

class ThreadPool {
 public:
  // How long an idle worker spins on the generation counter before it parks.
  static constexpr int64_t kSpinNs = 200000;

  // n_threads: total threads including the caller; <= 0 means available_cpus().
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end) on disjoint contiguous ranges covering [0, n), one per participating thread, each at
  // least `grain` items (a single range when n < 2·grain). Runs inline when n <= grain, the pool has one thread, or
  // the call is nested. fn must be callable as fn(int64_t, int64_t); it is not copied.
  template <class F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(
        n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // The number of ranges a parallel_for(n, grain, ...) splits into (1 when it runs inline on this thread).
  int64_t parts_for(int64_t n, int64_t grain) const;

 private:
  using Trampoline = void (*)(void* ctx, int64_t begin, int64_t end);
  void run(int64_t n, int64_t grain, Trampoline fn, void* ctx);
  void worker(int index);
  void wait_generation(uint32_t seen);
  void wake_workers();

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // serializes parallel_for callers

  // Current job (written by the caller before the generation bump, read by workers after it).
  Trampoline fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int64_t parts_ = 0;
  bool stop_ = false;

  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> sleepers_{0};  // workers parked (or about to park) on generation_
  alignas(64) std::atomic<int> pending_{0};   // workers that have not yet finished (or skipped) the current job
};

}  // namespace latent
