// Streaming read bandwidth of this machine, shared by membw_bench and decode_bench: each thread sums its own
// contiguous slice of a buffer once per repetition (AVX2 when available: 4 independent 256-bit streams); the best
// repetition counts. Header-only: the benchmarks are single-file programs.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace latent::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__attribute__((target("avx2"))) inline uint64_t sum_avx2(const uint64_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t t[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(t),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  uint64_t s = t[0] + t[1] + t[2] + t[3];
  for (; i < n; ++i) s += p[i];
  return s;
}

inline uint64_t sum_scalar(const uint64_t* p, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}

// Best-of-reps read bandwidth in GB/s over buf[0, words) (64-byte aligned) with `threads` threads.
inline double read_bandwidth(const uint64_t* buf, size_t words, int threads, int reps, bool avx2) {
  double best = 0.0;
  std::atomic<uint64_t> sink{0};
  const size_t per = (words / static_cast<size_t>(threads)) & ~size_t(15);
  for (int r = 0; r < reps; ++r) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<double> t_end(static_cast<size_t>(threads));
    std::vector<std::thread> th;
    for (int t = 0; t < threads; ++t)
      th.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
        }
        const uint64_t* p = buf + static_cast<size_t>(t) * per;
        sink.fetch_add(avx2 ? sum_avx2(p, per) : sum_scalar(p, per));
        t_end[static_cast<size_t>(t)] = now_s();
      });
    while (ready.load() < threads) {
    }
    const double t0 = now_s();
    go.store(true, std::memory_order_release);
    for (auto& x : th) x.join();
    const double t1 = *std::max_element(t_end.begin(), t_end.end());
    best = std::max(best, static_cast<double>(per) * 8.0 * threads / (t1 - t0) / 1e9);
  }
  if (sink.load() == 42) std::printf(" ");  // keeps the sums observable
  return best;
}

// The same over a fresh buffer of `mb` MiB; 0 when it cannot be allocated.
inline double read_bandwidth_mb(size_t mb, int threads, int reps) {
  const size_t words = mb * 1024 * 1024 / 8;
  auto* buf = static_cast<uint64_t*>(std::aligned_alloc(64, words * 8));
  if (!buf) return 0.0;
  for (size_t i = 0; i < words; ++i) buf[i] = i;
  const double bw = read_bandwidth(buf, words, threads, reps, __builtin_cpu_supports("avx2"));
  std::free(buf);
  return bw;
}

}  // namespace latent::bench
