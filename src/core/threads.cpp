#include "core/threads.h"

#include <algorithm>
#include <chrono>
#include <climits>

#if defined(__linux__)
#include <linux/futex.h>
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

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
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
