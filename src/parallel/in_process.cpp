// The in-process communicator (parallel/communicator.h): ranks are threads sharing host memory.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "parallel/communicator.h"

namespace latent {

InProcessGroup::InProcessGroup(int size) : size_(size) {
  if (size < 1) fail("in-process group: size must be >= 1 (got {})", size);
  send_.assign(static_cast<size_t>(size), nullptr);
}

template <class F>
void InProcessGroup::arrive_and_wait(F&& last) {
  std::unique_lock<std::mutex> lk(mu_);
  if (aborted_) throw CollectiveAborted();
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    last();
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lk, [&] { return generation_ != gen || aborted_; });
  if (generation_ == gen) throw CollectiveAborted();
}

void InProcessGroup::arrive_and_wait() {
  arrive_and_wait([] {});
}

void InProcessGroup::abort() {
  std::lock_guard<std::mutex> lk(mu_);
  aborted_ = true;
  cv_.notify_all();
}

void InProcessGroup::reset() {
  std::lock_guard<std::mutex> lk(mu_);
  aborted_ = false;
  arrived_ = 0;
  std::fill(send_.begin(), send_.end(), nullptr);
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(InProcessGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size_; }
  const char* name() const override { return "in-process"; }

  void all_reduce_sum(float* data, int64_t n) override {
    const int R = g_.size_;
    if (R == 1 || n <= 0) return;
    publish(data);
    g_.arrive_and_wait([&] {
      if (g_.scratch_.size() < static_cast<size_t>(n)) g_.scratch_.resize(static_cast<size_t>(n));
    });
    // This rank sums its share [lo, hi) of the elements, in rank order.
    const int64_t lo = n * rank_ / R, hi = n * (rank_ + 1) / R;
    float* out = g_.scratch_.data();
    const float* src0 = static_cast<const float*>(g_.send_[0]);
    for (int64_t i = lo; i < hi; ++i) out[i] = src0[i];
    for (int r = 1; r < R; ++r) {
      const float* src = static_cast<const float*>(g_.send_[static_cast<size_t>(r)]);
      for (int64_t i = lo; i < hi; ++i) out[i] += src[i];
    }
    g_.arrive_and_wait();
    std::memcpy(data, out, static_cast<size_t>(n) * sizeof(float));
    // The next collective's first barrier cannot pass before every rank has copied the result out.
  }

  void all_gather(const void* send, size_t bytes, void* recv) override {
    const int R = g_.size_;
    publish(send);
    g_.arrive_and_wait();
    char* dst = static_cast<char*>(recv);
    for (int r = 0; r < R; ++r) {
      const char* src = static_cast<const char*>(g_.send_[static_cast<size_t>(r)]);
      if (src != dst + r * bytes && bytes) std::memmove(dst + r * bytes, src, bytes);
    }
    g_.arrive_and_wait();
  }

  void reduce_scatter_sum(const float* send, int64_t n, float* recv) override {
    const int R = g_.size_;
    publish(send);
    g_.arrive_and_wait();
    if (n > 0) {
      const float* src0 = static_cast<const float*>(g_.send_[0]) + rank_ * n;
      // Accumulate in a local copy first: recv may alias this rank's own send chunk, which peers still read.
      local_.assign(src0, src0 + n);
      for (int r = 1; r < R; ++r) {
        const float* src = static_cast<const float*>(g_.send_[static_cast<size_t>(r)]) + rank_ * n;
        for (int64_t i = 0; i < n; ++i) local_[static_cast<size_t>(i)] += src[i];
      }
    }
    g_.arrive_and_wait();
    if (n > 0) std::memcpy(recv, local_.data(), static_cast<size_t>(n) * sizeof(float));
  }

  void all_to_all(const void* send, size_t bytes, void* recv) override {
    const int R = g_.size_;
    publish(send);
    g_.arrive_and_wait();
    bytes_.resize(static_cast<size_t>(R) * bytes);
    for (int r = 0; r < R; ++r) {
      const char* src = static_cast<const char*>(g_.send_[static_cast<size_t>(r)]) + rank_ * bytes;
      if (bytes) std::memcpy(bytes_.data() + r * bytes, src, bytes);
    }
    g_.arrive_and_wait();
    if (!bytes_.empty()) std::memcpy(recv, bytes_.data(), bytes_.size());
  }

  void barrier() override { g_.arrive_and_wait(); }

 private:
  void publish(const void* p) {
    std::lock_guard<std::mutex> lk(g_.mu_);
    g_.send_[static_cast<size_t>(rank_)] = p;
  }

  InProcessGroup& g_;
  int rank_;
  std::vector<float> local_;  // grow-only staging (reduce_scatter)
  std::vector<char> bytes_;   // grow-only staging (all_to_all)
};

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  if (rank < 0 || rank >= size_) fail("in-process group: rank {} outside [0, {})", rank, size_);
  return std::make_unique<InProcessCommunicator>(*this, rank);
}

#ifndef LATENT_HAVE_NCCL
// Without the CUDA backend there is no NCCL: clear errors instead of link failures.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<Backend*>&,
                                                                   const std::vector<int>&) {
  fail("NCCL: this build has no CUDA backend (configure with LATENT_CUDA=ON on a machine with the CUDA toolkit)");
}
std::string nccl_unique_id() { fail("NCCL: this build has no CUDA backend"); }
std::unique_ptr<Communicator> make_nccl_communicator(int, int, const std::string&, Backend&) {
  fail("NCCL: this build has no CUDA backend");
}
void cuda_bind_device(int) { fail("CUDA: this build has no CUDA backend"); }
int cuda_device_count() { return 0; }
#endif

}  // namespace latent
