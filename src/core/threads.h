// ThreadPool: a fixed set of worker threads for data-parallel loops (split rows of a matmul, heads of attention).
// parallel_for blocks until every chunk is done. Calls from inside a worker (nested) and concurrent calls from
// several threads are safe: a nested call runs inline; concurrent callers are serialized.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace latent {

class ThreadPool {
 public:
  // n_threads: total threads including the caller; <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n), each chunk at least `grain` items (except possibly the
  // last). Runs inline when n is small, the pool has one thread, or the call is nested.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker(int index);
  void run_chunks();

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // serializes parallel_for callers
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  // Current job.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  int64_t next_ = 0;  // next chunk start (guarded by mu_)
  int active_ = 0;    // workers still running the current job
};

}  // namespace latent
