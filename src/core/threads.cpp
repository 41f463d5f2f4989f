#include "core/threads.h"

#include <algorithm>

namespace latent {

namespace {
thread_local bool t_in_pool = false;
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t b;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (next_ >= n_) return;
      b = next_;
      next_ += chunk_;
    }
    (*fn_)(b, std::min(n_, b + chunk_));
  }
}

void ThreadPool::worker(int) {
  t_in_pool = true;
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunks();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--active_ == 0) cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (n_threads_ == 1 || n <= grain || t_in_pool) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  // About 4 chunks per thread for balance, never below the grain.
  int64_t chunk = std::max(grain, (n + 4 * n_threads_ - 1) / (4 * n_threads_));
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_ = 0;
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  cv_start_.notify_all();
  t_in_pool = true;
  run_chunks();
  t_in_pool = false;
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return active_ == 0; });
  fn_ = nullptr;
}

}  // namespace latent
