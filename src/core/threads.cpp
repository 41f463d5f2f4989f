#include "core/threads.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>

#if defined(__linux__)
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace latent {

namespace {

thread_local bool t_in_pool = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void futex_wait(std::atomic<uint32_t>& a, uint32_t expected) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&a), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
#else
  a.wait(expected, std::memory_order_acquire);
#endif
}

void futex_wake_all(std::atomic<uint32_t>& a) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&a), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
  a.notify_all();
#endif
}

std::string read_small_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// CPUs in this process's affinity mask (0 when unknown).
int affinity_cpus() {
#if defined(__linux__)
  for (int n = 1024; n <= (1 << 16); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) return 0;
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    if (sched_getaffinity(0, bytes, set) == 0) {
      const int c = CPU_COUNT_S(bytes, set);
      CPU_FREE(set);
      return c;
    }
    CPU_FREE(set);
    if (errno != EINVAL) return 0;  // EINVAL: the mask is wider than n CPUs; try a larger one
  }
#endif
  return 0;
}

// The cgroup CPU limit of this process (0 when none): cgroup v2 cpu.max in the process's own cgroup or at the
// mount's root (what a container sees), else cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us.
int cgroup_cpus() {
  std::string rel;
  std::istringstream lines(read_small_file("/proc/self/cgroup"));
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("0::", 0) == 0) rel = line.substr(3);
  int lim = 0;
  for (const std::string& dir : {"/sys/fs/cgroup" + rel, std::string("/sys/fs/cgroup")}) {
    const std::string t = read_small_file(dir + "/cpu.max");
    if (!t.empty()) {
      lim = cgroup_cpu_limit(t);
      break;
    }
  }
  if (lim > 0) return lim;
  const std::string q = read_small_file("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
  const std::string p = read_small_file("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  if (!q.empty() && !p.empty()) {
    const long long quota = std::atoll(q.c_str()), period = std::atoll(p.c_str());
    if (quota > 0 && period > 0) return static_cast<int>((quota + period - 1) / period);
  }
  return 0;
}

}  // namespace

int cgroup_cpu_limit(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str() || *end != '\0' || q <= 0) return 0;
  return static_cast<int>(std::min<long long>(INT_MAX, (q + period - 1) / period));
}

int available_cpus() {
  int n = affinity_cpus();
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  const int lim = cgroup_cpus();
  if (lim > 0 && (n <= 0 || lim < n)) n = lim;
  return std::max(1, n);
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = available_cpus();
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> call(call_mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(generation_);
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::wake_workers() {
  // Dekker pairing with wait_generation: the bump (seq_cst) happens before this load, a parking worker's
  // sleepers_ increment before its re-check of the generation, so one of the two sees the other.
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(generation_);
}

void ThreadPool::wait_generation(uint32_t seen) {
  // Spin (bounded by time), then park.
  int64_t deadline = 0;
  for (uint32_t i = 0;; ++i) {
    if (generation_.load(std::memory_order_acquire) != seen) return;
    cpu_relax();
    if ((i & 63) == 63) {
      // Give the core away now and then: on an oversubscribed machine the thread we wait for may need it.
      std::this_thread::yield();
      const int64_t t = now_ns();
      if (deadline == 0)
        deadline = t + kSpinNs;
      else if (t >= deadline)
        break;
    }
  }
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  while (generation_.load(std::memory_order_seq_cst) == seen) futex_wait(generation_, seen);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
}

void ThreadPool::worker(int index) {
  t_in_pool = true;
  uint32_t seen = 0;
  for (;;) {
    wait_generation(seen);
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    // Every worker acknowledges every job (an empty part when index >= parts_), so the caller cannot publish the
    // next job while a worker still reads this one's fields.
    if (index < parts_) {
      const int64_t b = n_ * index / parts_, e = n_ * (index + 1) / parts_;
      if (b < e) fn_(ctx_, b, e);
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

int64_t ThreadPool::parts_for(int64_t n, int64_t grain) const {
  grain = std::max<int64_t>(grain, 1);
  if (n <= 0) return 0;
  if (n_threads_ == 1 || n <= grain || t_in_pool) return 1;
  return std::max<int64_t>(1, std::min<int64_t>(n_threads_, n / grain));
}

void ThreadPool::run(int64_t n, int64_t grain, Trampoline fn, void* ctx) {
  if (n <= 0) return;
  const int64_t parts = parts_for(n, grain);
  if (parts <= 1) {
    fn(ctx, 0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  fn_ = fn;
  ctx_ = ctx;
  n_ = n;
  parts_ = parts;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);  // publishes the job (release) to workers
  wake_workers();
  t_in_pool = true;
  fn(ctx, 0, n / parts);
  t_in_pool = false;
  // The other parts are about as long as ours: spin, yielding the core now and then (it may be shared with
  // the worker we wait for when the machine is oversubscribed).
  for (uint32_t i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) {
    if ((i & 63) == 63)
      std::this_thread::yield();
    else
      cpu_relax();
  }
}

}  // namespace latent
