// FMA peak of this machine, shared by membw_bench and decode_bench: independent FMA chains on every thread (enough
// chains to cover the FMA latency on two pipes), 256-bit or 512-bit; the best of 20 short repetitions counts.
// Header-only: the benchmarks are single-file programs.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "read_bandwidth.h"

namespace latent::bench {

__attribute__((target("avx2,fma"))) inline float fma_chains_256(int64_t iters) {
  __m256 a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm256_set1_ps(1.0f + 0.01f * static_cast<float>(j));
  const __m256 m = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-8f);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) a[j] = _mm256_fmadd_ps(a[j], m, c);
  __m256 s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, a[j]);
  return _mm256_cvtss_f32(s);
}
__attribute__((target("avx512f"))) inline float fma_chains_512(int64_t iters) {
  __m512 a[16];
  for (int j = 0; j < 16; ++j) a[j] = _mm512_set1_ps(1.0f + 0.01f * static_cast<float>(j));
  const __m512 m = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-8f);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) a[j] = _mm512_fmadd_ps(a[j], m, c);
  __m512 s = a[0];
  for (int j = 1; j < 16; ++j) s = _mm512_add_ps(s, a[j]);
  alignas(64) float t[16];
  _mm512_store_ps(t, s);
  float r = 0.0f;
  for (float v : t) r += v;
  return r;
}

// Best-of-20 fp32 GFLOP/s (an FMA = 2 FLOPs) with `threads` threads; 0 without AVX2.
inline double fma_peak_gflops(int threads, bool avx512) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0.0;
  const int64_t iters = int64_t{1} << 21;
  const double per_thread =
      avx512 ? 2.0 * 16 * 16 * static_cast<double>(iters) : 2.0 * 12 * 8 * static_cast<double>(iters);
  double best = 0.0;
  std::atomic<float> sink{0};
  for (int rep = 0; rep < 20; ++rep) {  // short repetitions: on a shared machine the best is undisturbed
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> th;
    for (int t = 0; t < threads; ++t)
      th.emplace_back([&] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
        }
        const float v = avx512 ? fma_chains_512(iters) : fma_chains_256(iters);
        sink.store(v, std::memory_order_relaxed);
      });
    while (ready.load() < threads) {
    }
    const double t0 = now_s();
    go.store(true, std::memory_order_release);
    for (auto& x : th) x.join();
    best = std::max(best, per_thread * threads / (now_s() - t0) / 1e9);
  }
  if (sink.load() == 42.0f) std::printf(" ");
  return best;
}

}  // namespace latent::bench
