// membw_bench: this machine's streaming read bandwidth (GB/s) on 1 and 2 threads (sum over a buffer much larger
// than the caches), and, with --ops, the achieved weight-read GB/s of the CPU backend's decode matmul (M = 1)
// per weight format — the op-harness "perf mode"; with --gemm, the batched matmul (M activation rows through one
// 1024 x 1024 weight, the deepseek_v3 bench shape's o_proj) in GFLOP/s and as a fraction of the FMA peak measured in
// the same run (best repetition: on a shared machine the best one is the least disturbed).
//
//   membw_bench [--mb 1024] [--threads 1,2] [--reps 5] [--ops] [--gemm [--m 1,4,16,64,256,512]]
//               [--isa avx512|avx2|scalar] [--attn [--ctx 512,4096] [--batch 1,16] [--bf16]]
//               [--step [--mxfp4] [--rounds 5] [--isa avx512,avx2]]
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "fma_peak.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/weight_arena.h"
#include "quant/float_formats.h"
#include "read_bandwidth.h"

namespace {

using latent::bench::now_s;

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    v.push_back(std::atoi(s.substr(i, j - i).c_str()));
    i = j + 1;
  }
  return v;
}

// ---- --ops: decode matmul GB/s per format ----
struct OwnedWeight {
  std::vector<uint8_t> data, scale;
  latent::QuantWeight q;
};
OwnedWeight make_weight(latent::WeightFormat f, int64_t rows, int64_t cols, std::mt19937& g) {
  using latent::WeightFormat;
  OwnedWeight w;
  w.q.format = f;
  w.q.rows = rows;
  w.q.cols = cols;
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t n = rows * w.q.row_bytes();
  w.data.resize(static_cast<size_t>(n));
  if (f == WeightFormat::BF16) {
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (int64_t i = 0; i < n / 2; ++i) {
      const uint16_t h = latent::f32_to_bf16(nd(g));
      std::memcpy(w.data.data() + 2 * i, &h, 2);
    }
  } else {
    for (auto& b : w.data) b = static_cast<uint8_t>(byte(g) & 0x77);  // no NaN fp8 codes
  }
  if (f == WeightFormat::MXFP4) {
    w.scale.assign(static_cast<size_t>(rows * cols / 32), 120);
  } else if (f == WeightFormat::FP8_E4M3_BLOCK) {
    const int64_t ns = ((rows + 127) / 128) * ((cols + 127) / 128);
    w.scale.resize(static_cast<size_t>(ns * 4));
    const float one = 0.01f;
    for (int64_t i = 0; i < ns; ++i) std::memcpy(w.scale.data() + 4 * i, &one, 4);
  }
  w.q.data = w.data.data();
  w.q.scale = w.scale.empty() ? nullptr : w.scale.data();
  return w;
}

void run_ops(const std::vector<int>& threads, latent::CpuIsa isa) {
  using latent::WeightFormat;
  std::mt19937 g(1);
  struct F {
    WeightFormat f;
    const char* name;
    int64_t rows, cols;
  };
  // ≈ 128 MiB (bf16, fp8) / 72 MiB (mxfp4) of weights: far beyond the last-level cache.
  const F fmts[] = {{WeightFormat::BF16, "bf16", 16384, 4096},
                    {WeightFormat::FP8_E4M3_BLOCK, "fp8_block128", 32768, 4096},
                    {WeightFormat::MXFP4, "mxfp4", 32768, 4096}};
  std::printf("\ndecode matmul (M = 1), isa %s: weight GB/s (incl. scales)\n", latent::cpu_isa_name(isa));
  for (const F& f : fmts) {
    OwnedWeight w = make_weight(f.f, f.rows, f.cols, g);
    const double bytes = static_cast<double>(w.data.size() + w.scale.size());
    std::vector<float> x(static_cast<size_t>(f.cols), 0.5f), y(static_cast<size_t>(f.rows));
    for (int t : threads) {
      auto be = latent::make_cpu_backend(t, isa);
      // As the model loads it (SIMD ISAs: a 64-byte aligned copy).
      const latent::QuantWeight q = be->prepare_weight(w.q);
      be->matmul(q, latent::Tensor(x.data(), latent::DType::F32, 1, f.cols),
                 latent::Tensor(y.data(), latent::DType::F32, 1, f.rows));  // warm
      double best = 1e30;
      for (int r = 0; r < 5; ++r) {
        const double t0 = now_s();
        be->matmul(q, latent::Tensor(x.data(), latent::DType::F32, 1, f.cols),
                   latent::Tensor(y.data(), latent::DType::F32, 1, f.rows));
        best = std::min(best, now_s() - t0);
      }
      std::printf("  %-14s threads %d: %7.2f ms  %6.2f GB/s\n", f.name, t, best * 1e3, bytes / best / 1e9);
    }
  }
  // Expert-shaped weights (the decode of a MoE layer): one grouped matmul over E distinct [256, 1024] experts with
  // one token each. Rows are short (512 B in MXFP4), so this is where the prefetching of a format's kernel shows.
  const F experts[] = {{WeightFormat::BF16, "bf16", 256, 1024}, {WeightFormat::MXFP4, "mxfp4", 256, 1024}};
  for (const F& f : experts) {
    const int64_t E = f.f == WeightFormat::MXFP4 ? 512 : 192;  // ≈ 71 MB (mxfp4) / 101 MB (bf16)
    std::vector<OwnedWeight> ws;
    ws.reserve(static_cast<size_t>(E));
    std::vector<const latent::QuantWeight*> wp;
    double bytes = 0;
    for (int64_t e = 0; e < E; ++e) {
      ws.push_back(make_weight(f.f, f.rows, f.cols, g));
      bytes += static_cast<double>(ws.back().data.size() + ws.back().scale.size());
    }
    std::vector<int64_t> offsets(static_cast<size_t>(E + 1));
    for (int64_t e = 0; e <= E; ++e) offsets[static_cast<size_t>(e)] = e;
    std::vector<float> x(static_cast<size_t>(E * f.cols), 0.5f), y(static_cast<size_t>(E * f.rows));
    for (int t : threads) {
      auto be = latent::make_cpu_backend(t, isa);
      std::vector<latent::QuantWeight> qs;  // as the model loads them (AVX-512: 64-byte aligned)
      for (const OwnedWeight& w : ws) qs.push_back(be->prepare_weight(w.q));
      wp.clear();
      for (const latent::QuantWeight& q : qs) wp.push_back(&q);
      be->grouped_matmul(wp.data(), E, offsets.data(), latent::Tensor(x.data(), latent::DType::F32, E, f.cols),
                         latent::Tensor(y.data(), latent::DType::F32, E, f.rows));  // warm
      double best = 1e30;
      for (int r = 0; r < 5; ++r) {
        const double t0 = now_s();
        be->grouped_matmul(wp.data(), E, offsets.data(), latent::Tensor(x.data(), latent::DType::F32, E, f.cols),
                           latent::Tensor(y.data(), latent::DType::F32, E, f.rows));
        best = std::min(best, now_s() - t0);
      }
      std::printf("  %-5s experts %lldx%lld (x%lld, M = 1 each) threads %d: %7.2f ms  %6.2f GB/s\n", f.name,
                  static_cast<long long>(f.rows), static_cast<long long>(f.cols), static_cast<long long>(E), t,
                  best * 1e3, bytes / best / 1e9);
    }
  }
}

// ---- --step: the matmuls of one decode step, ISAs interleaved ----
// The linear ops of one batch-1 decode step of the deepseek_v3 bench shape (tools/make_bench_model.py: hidden 1024,
// 8 layers, 16 heads, q_lora 384, kv_lora 512, layer 0 dense (1024), 32 experts of 256 top-4 + 1 shared, vocab
// 32000), each layer its own weights (~170 MB read per step; kv_b, read by the attention, left out), through the
// backend's matmul / grouped_matmul as the model calls them, weights prepared as the model loads them. Every round
// times one step per ISA in turn (ABAB..., the same minute for each), a fresh random choice of 4 experts per MoE
// layer per round; printed per round and as the range over rounds, by op class, in ms and GB/s.
struct StepWeights {
  std::vector<OwnedWeight> attn, dense, shared, experts, lm_head;  // experts: [layer][32][gate, up, down]
};
OwnedWeight fast_weight(latent::WeightFormat f, int64_t rows, int64_t cols, uint64_t& st,
                        latent::cpu::WeightArena& arena) {
  using latent::WeightFormat;
  OwnedWeight w;
  w.q.format = f;
  w.q.rows = rows;
  w.q.cols = cols;
  // Stored at 32 mod 64 bytes, as the tensors of the bench checkpoints (the safetensors header length): the
  // backend copies them to 64-byte aligned memory on huge pages in prepare_weight (both SIMD ISAs). On huge pages
  // here too (the arena the backend copies into), so that LATENT_CPU_REALIGN=0 reads through the same kind of pages.
  const size_t n = static_cast<size_t>(rows * w.q.row_bytes());
  uint8_t* d = arena.alloc(n + 32) + 32;
  auto next = [&st]() {
    st = st * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(st >> 33);
  };
  if (f == WeightFormat::BF16) {
    for (size_t i = 0; i + 1 < n; i += 2) {
      const uint32_t r = next();
      const uint16_t h = static_cast<uint16_t>(0x3C00u | (r & 0x807Fu));  // +-[2^-7, 2^-6): no NaN, no denormal
      std::memcpy(d + i, &h, 2);
    }
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>(next() & 0x77);
  }
  if (f == WeightFormat::MXFP4) w.scale.assign(static_cast<size_t>(rows * cols / 32), 120);
  w.q.data = d;
  w.q.scale = w.scale.empty() ? nullptr : w.scale.data();
  return w;
}

void run_step(const std::vector<int>& threads, const std::vector<latent::CpuIsa>& isas, int rounds, bool mx_experts) {
  using latent::DType;
  using latent::Tensor;
  using latent::WeightFormat;
  constexpr int64_t D = 1024, L = 8, E = 32, TopK = 4, I = 256, V = 32000;
  const int64_t attn_shapes[4][2] = {{384, D}, {16 * 128, 384}, {512 + 64, D}, {D, 16 * 64}};
  uint64_t st = 7;
  latent::cpu::WeightArena arena;
  StepWeights sw;
  const WeightFormat bf = WeightFormat::BF16, ef = mx_experts ? WeightFormat::MXFP4 : WeightFormat::BF16;
  for (int64_t l = 0; l < L; ++l) {
    for (const auto& s : attn_shapes) sw.attn.push_back(fast_weight(bf, s[0], s[1], st, arena));
    if (l == 0) {
      for (int i = 0; i < 2; ++i) sw.dense.push_back(fast_weight(bf, D, D, st, arena));
      sw.dense.push_back(fast_weight(bf, D, D, st, arena));
      continue;
    }
    sw.shared.push_back(fast_weight(bf, E, D, st, arena));  // router
    for (int i = 0; i < 2; ++i) sw.shared.push_back(fast_weight(bf, I, D, st, arena));
    sw.shared.push_back(fast_weight(bf, D, I, st, arena));
    for (int64_t e = 0; e < E; ++e) {
      for (int i = 0; i < 2; ++i) sw.experts.push_back(fast_weight(ef, I, D, st, arena));
      sw.experts.push_back(fast_weight(ef, D, I, st, arena));
    }
  }
  sw.lm_head.push_back(fast_weight(bf, V, D, st, arena));
  std::vector<float> x(static_cast<size_t>(TopK * D), 0.25f), y(static_cast<size_t>(V * TopK), 0.0f);
  auto bytes_of = [](const OwnedWeight& w) { return static_cast<double>(w.q.rows * w.q.row_bytes() + w.scale.size()); };
  std::printf("\ndecode-step matmuls (deepseek_v3 bench shape, batch 1, experts %s), %d rounds, ISAs interleaved\n",
              mx_experts ? "mxfp4" : "bf16", rounds);
  std::mt19937 g(11);
  for (int t : threads) {
    struct Run {
      latent::CpuIsa isa;
      std::unique_ptr<latent::Backend> be;
      std::vector<latent::QuantWeight> attn, dense, shared, experts, lm_head;
      std::vector<std::array<double, 5>> ms;  // attention projections, dense + shared MLP + router, experts, lm_head,
                                              // all
    };
    std::vector<Run> runs;
    for (latent::CpuIsa isa : isas) {
      Run r{isa, latent::make_cpu_backend(t, isa), {}, {}, {}, {}, {}, {}};
      auto prep = [&](const std::vector<OwnedWeight>& ws, std::vector<latent::QuantWeight>& out) {
        for (const OwnedWeight& w : ws) out.push_back(r.be->prepare_weight(w.q));
      };
      prep(sw.attn, r.attn);
      prep(sw.dense, r.dense);
      prep(sw.shared, r.shared);
      prep(sw.experts, r.experts);
      prep(sw.lm_head, r.lm_head);
      runs.push_back(std::move(r));
    }
    auto mm = [&](latent::Backend& be, const latent::QuantWeight& w) {
      be.matmul(w, Tensor(x.data(), DType::F32, 1, w.cols), Tensor(y.data(), DType::F32, 1, w.rows));
    };
    std::vector<int64_t> off = {0, 1, 2, 3, 4};
    double bytes[4] = {0, 0, 0, 0};
    for (const OwnedWeight& w : sw.attn) bytes[0] += bytes_of(w);
    for (const OwnedWeight& w : sw.dense) bytes[1] += bytes_of(w);
    for (const OwnedWeight& w : sw.shared) bytes[1] += bytes_of(w);
    bytes[2] = static_cast<double>(L - 1) * TopK * (2 * bytes_of(sw.experts[0]) + bytes_of(sw.experts[2]));
    bytes[3] = bytes_of(sw.lm_head[0]);
    for (int round = -1; round < rounds; ++round) {  // round -1: warm-up, not printed
      std::vector<int> pick(static_cast<size_t>((L - 1) * TopK));
      for (int64_t l = 1; l < L; ++l) {
        std::vector<int> all(E);
        for (int e = 0; e < E; ++e) all[static_cast<size_t>(e)] = e;
        std::shuffle(all.begin(), all.end(), g);
        for (int k = 0; k < TopK; ++k) pick[static_cast<size_t>((l - 1) * TopK + k)] = all[static_cast<size_t>(k)];
      }
      for (Run& r : runs) {
        latent::Backend& be = *r.be;
        std::array<double, 5> ms{};
        const double s0 = now_s();
        for (int64_t l = 0; l < L; ++l) {
          double t0 = now_s();
          for (int i = 0; i < 4; ++i) mm(be, r.attn[static_cast<size_t>(l * 4 + i)]);
          ms[0] += now_s() - t0;
          t0 = now_s();
          if (l == 0) {
            for (const latent::QuantWeight& w : r.dense) mm(be, w);
            ms[1] += now_s() - t0;
            continue;
          }
          for (int i = 0; i < 4; ++i) mm(be, r.shared[static_cast<size_t>((l - 1) * 4 + i)]);
          ms[1] += now_s() - t0;
          t0 = now_s();
          for (int j = 0; j < 3; ++j) {
            const latent::QuantWeight* wp[TopK];
            for (int k = 0; k < TopK; ++k)
              wp[k] = &r.experts[static_cast<size_t>(((l - 1) * E + pick[static_cast<size_t>((l - 1) * TopK + k)]) * 3 +
                                                     j)];
            const int64_t K = wp[0]->cols, N = wp[0]->rows;
            be.grouped_matmul(wp, TopK, off.data(), Tensor(x.data(), DType::F32, TopK, K),
                              Tensor(y.data(), DType::F32, TopK, N));
          }
          ms[2] += now_s() - t0;
        }
        const double t0 = now_s();
        mm(be, r.lm_head[0]);
        ms[3] = now_s() - t0;
        ms[4] = now_s() - s0;
        if (round >= 0) r.ms.push_back(ms);
      }
    }
    const char* names[5] = {"attn proj", "dense+shared", "experts", "lm_head", "all"};
    const double tot = bytes[0] + bytes[1] + bytes[2] + bytes[3];
    std::printf(
        "  threads %d, MB per step: attn proj %.1f, dense+shared+router %.1f, experts %.1f, lm_head %.1f, all %.1f\n",
        t, bytes[0] / 1e6, bytes[1] / 1e6, bytes[2] / 1e6, bytes[3] / 1e6, tot / 1e6);
    for (int c = 0; c < 5; ++c) {
      const double b = c < 4 ? bytes[c] : tot;
      for (const Run& r : runs) {
        std::vector<double> v;
        for (const auto& ms : r.ms) v.push_back(ms[static_cast<size_t>(c)]);
        std::sort(v.begin(), v.end());
        std::printf("    %-13s %-6s ms min %7.3f med %7.3f max %7.3f | GB/s %6.2f (best) %6.2f (median)\n", names[c],
                    latent::cpu_isa_name(r.isa), v.front() * 1e3, v[v.size() / 2] * 1e3, v.back() * 1e3,
                    b / v.front() / 1e9, b / v[v.size() / 2] / 1e9);
      }
    }
  }
}

double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

void run_gemm(const std::vector<int>& threads, latent::CpuIsa isa, const std::vector<int>& ms) {
  using latent::WeightFormat;
  std::mt19937 g(2);
  const int64_t N = 1024, K = 1024;
  std::printf("\nbatched matmul [M, %lld] x [%lld, %lld]^T, isa %s: GFLOP/s (best of reps) and %% of the FMA peak\n",
              static_cast<long long>(K), static_cast<long long>(N), static_cast<long long>(K),
              latent::cpu_isa_name(isa));
  std::vector<double> peak;
  for (int t : threads) {
    peak.push_back(latent::bench::fma_peak_gflops(t, isa == latent::CpuIsa::Avx512));
    std::printf("  fp32 FMA peak, threads %d: %.1f GFLOP/s\n", t, peak.back());
  }
  const std::pair<WeightFormat, const char*> fmts[] = {
      {WeightFormat::BF16, "bf16"}, {WeightFormat::FP8_E4M3_BLOCK, "fp8_block128"}, {WeightFormat::MXFP4, "mxfp4"}};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const auto& [f, name] : fmts) {
    OwnedWeight w = make_weight(f, N, K, g);
    for (size_t ti = 0; ti < threads.size(); ++ti) {
      auto be = latent::make_cpu_backend(threads[ti], isa);
      for (int M : ms) {
        std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M * N));
        for (float& v : x) v = nd(g);
        be->matmul(w.q, latent::Tensor(x.data(), latent::DType::F32, M, K),
                   latent::Tensor(y.data(), latent::DType::F32, M, N));  // warm
        const double flops = 2.0 * M * N * K;
        const int reps = static_cast<int>(std::clamp(4e9 / flops, 5.0, 400.0));
        double best = 1e30, best_cpu = 1e30;
        for (int r = 0; r < reps; ++r) {
          const double t0 = now_s(), c0 = thread_cpu_s();
          be->matmul(w.q, latent::Tensor(x.data(), latent::DType::F32, M, K),
                     latent::Tensor(y.data(), latent::DType::F32, M, N));
          best = std::min(best, now_s() - t0);
          best_cpu = std::min(best_cpu, thread_cpu_s() - c0);
        }
        const double gf = flops / best / 1e9;
        std::printf("  %-14s threads %d  M %4d: %8.3f ms  %7.1f GFLOP/s  %5.1f%% of peak", name, threads[ti], M,
                    best * 1e3, gf, peak[ti] > 0 ? 100.0 * gf / peak[ti] : 0.0);
        // One thread: also per second of this thread's CPU time (not disturbed by preemption on a shared machine).
        if (threads[ti] == 1) std::printf("  | %7.1f GFLOP/s of thread CPU time", flops / best_cpu / 1e9);
        std::printf("\n");
      }
    }
  }
}

// ---- --attn: the decode attention (absorbed MLA over a paged latent pool) ----
// One layer of the deepseek_v3 bench shape (H 16, dn = dr = dv = 64, dc 512, kv_b bf16), B sequences of `ctx` keys
// each in their own blocks of 64 tokens, one decode token per sequence: time per call (best of reps), the KV +
// kv_b bytes it must read in GB/s and its FLOPs in GFLOP/s, against the probes.
void run_attn(const std::vector<int>& threads, latent::CpuIsa isa, const std::vector<int>& ctxs,
              const std::vector<int>& batches, bool bf16, int min_reps) {
  using namespace latent;
  std::mt19937 g(3);
  const int64_t H = 16, dn = 64, dr = 64, dv = 64, dc = 512, bt = 64, width = dc + dr;
  MlaDims d{H, dn, dr, dv, dc};
  OwnedWeight kvb = make_weight(WeightFormat::BF16, H * (dn + dv), dc, g);
  std::printf("\ndecode attention (absorbed MLA, paged, %s pool), H %lld dc %lld dr %lld, isa %s\n",
              bf16 ? "bf16" : "fp32", static_cast<long long>(H), static_cast<long long>(dc), static_cast<long long>(dr),
              cpu_isa_name(isa));
  std::vector<double> peak;
  for (int t : threads) peak.push_back(bench::fma_peak_gflops(t, isa == CpuIsa::Avx512));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int B : batches)
    for (int ctx : ctxs) {
      const int64_t per = (ctx + bt - 1) / bt, nblk = B * per, esz = bf16 ? 2 : 4;
      std::vector<uint8_t> pool_mem(static_cast<size_t>(nblk * bt * width * esz));
      for (size_t i = 0; i < pool_mem.size(); i += 2) {
        const uint16_t h = f32_to_bf16(nd(g));
        std::memcpy(&pool_mem[i], &h, 2);
      }
      if (!bf16)
        for (size_t i = 0; i < pool_mem.size(); i += 4) {
          const float v = nd(g);
          std::memcpy(&pool_mem[i], &v, 4);
        }
      KvPool pool{pool_mem.data(), bf16 ? DType::BF16 : DType::F32, nblk, bt, width};
      std::vector<int32_t> table(static_cast<size_t>(nblk)), qb(static_cast<size_t>(B + 1)),
          cl(static_cast<size_t>(B), ctx);
      for (int64_t i = 0; i < nblk; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      for (int b = 0; b <= B; ++b) qb[static_cast<size_t>(b)] = b;
      std::vector<int64_t> pos(static_cast<size_t>(B), ctx - 1);
      StepSeqs seqs{B, qb.data(), cl.data(), table.data(), per, ctx};
      std::vector<float> q(static_cast<size_t>(B * H * (dn + dr))), o(static_cast<size_t>(B * H * dv));
      for (float& v : q) v = 0.1f * nd(g);
      // Activations in the pool's dtype (the bf16 mode stores bf16; its rounding points follow the output).
      std::vector<uint16_t> qh(q.size()), oh(o.size());
      for (size_t i = 0; i < q.size(); ++i) qh[i] = f32_to_bf16(q[i]);
      const DType adt = bf16 ? DType::BF16 : DType::F32;
      const latent::Tensor qt(bf16 ? static_cast<void*>(qh.data()) : static_cast<void*>(q.data()), adt, B,
                              H * (dn + dr));
      const latent::Tensor ot(bf16 ? static_cast<void*>(oh.data()) : static_cast<void*>(o.data()), adt, B, H * dv);
      const double bytes = static_cast<double>(B) * ctx * width * esz + static_cast<double>(kvb.data.size());
      const double flops = 2.0 * B * H * (static_cast<double>(ctx) * (2 * dc + dr) + (dn + dv) * dc);
      for (size_t ti = 0; ti < threads.size(); ++ti) {
        auto be = make_cpu_backend(threads[ti], isa);
        be->mla_attention_absorbed_paged(d, qt, kvb.q, pool, seqs, pos.data(), KeySelection{}, 0.1f, ot);
        const int reps = std::max(min_reps, static_cast<int>(std::clamp(2e9 / flops, 3.0, 200.0)));
        double best = 1e30, best_cpu = 1e30;
        for (int r = 0; r < reps; ++r) {
          const double t0 = now_s(), c0 = thread_cpu_s();
          be->mla_attention_absorbed_paged(d, qt, kvb.q, pool, seqs, pos.data(), KeySelection{}, 0.1f, ot);
          best = std::min(best, now_s() - t0);
          best_cpu = std::min(best_cpu, thread_cpu_s() - c0);
        }
        std::printf("  batch %3d ctx %6d threads %d: %9.3f ms  %6.2f GB/s  %7.1f GFLOP/s (%4.1f%% of %.0f)", B, ctx,
                    threads[ti], best * 1e3, bytes / best / 1e9, flops / best / 1e9,
                    100.0 * flops / best / 1e9 / peak[ti], peak[ti]);
        if (threads[ti] == 1) std::printf("  | %7.1f GFLOP/s of thread CPU time", flops / best_cpu / 1e9);
        std::printf("\n");
      }
    }
}

}  // namespace

int main(int argc, char** argv) {
  size_t mb = 1024;
  int reps = 5;
  bool ops = false, gemm = false, attn = false, attn_bf16 = false, step = false, step_mx = false;
  int rounds = 5;
  std::vector<latent::CpuIsa> step_isas;
  std::vector<int> ctxs = {512, 4096}, batches = {1, 16};
  std::vector<int> ms = {1, 4, 16, 64, 256, 512};
  std::vector<int> threads = {1, 2};
  latent::CpuIsa isa = latent::cpu_isa_default();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mb")
      mb = static_cast<size_t>(std::atol(next().c_str()));
    else if (a == "--reps")
      reps = std::atoi(next().c_str());
    else if (a == "--threads")
      threads = parse_list(next());
    else if (a == "--ops")
      ops = true;
    else if (a == "--gemm")
      gemm = true;
    else if (a == "--step")
      step = true;
    else if (a == "--mxfp4")
      step_mx = true;
    else if (a == "--rounds")
      rounds = std::atoi(next().c_str());
    else if (a == "--attn")
      attn = true;
    else if (a == "--bf16")
      attn_bf16 = true;
    else if (a == "--ctx")
      ctxs = parse_list(next());
    else if (a == "--batch")
      batches = parse_list(next());
    else if (a == "--m")
      ms = parse_list(next());
    else if (a == "--isa") {
      const std::string s = next();
      for (size_t p = 0; p < s.size();) {
        size_t e = s.find(',', p);
        if (e == std::string::npos) e = s.size();
        const std::string one = s.substr(p, e - p);
        isa = one == "avx512" ? latent::CpuIsa::Avx512 : one == "avx2" ? latent::CpuIsa::Avx2 : latent::CpuIsa::Scalar;
        step_isas.push_back(isa);
        p = e + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: membw_bench [--mb N] [--threads 1,2] [--reps N] [--ops] [--gemm [--m 1,4,..]] [--isa L]\n"
                   "                   [--attn [--ctx 512,4096] [--batch 1,16] [--bf16]]\n"
                   "                   [--step [--mxfp4] [--rounds 5] [--isa avx512,avx2]]\n");
      return 2;
    }
  }
  const bool avx2 = __builtin_cpu_supports("avx2");
  const size_t words = mb * 1024 * 1024 / 8;
  uint64_t* buf = static_cast<uint64_t*>(std::aligned_alloc(64, words * 8));
  if (!buf) {
    std::fprintf(stderr, "cannot allocate %zu MiB\n", mb);
    return 1;
  }
  for (size_t i = 0; i < words; ++i) buf[i] = i;  // touch every page
  std::printf("streaming read bandwidth (%zu MiB buffer, best of %d, %s loads):\n", mb, reps, avx2 ? "avx2" : "scalar");
  for (int t : threads)
    std::printf("  threads %d: %6.2f GB/s\n", t, latent::bench::read_bandwidth(buf, words, t, reps, avx2));
  std::free(buf);
  if (ops) run_ops(threads, isa);
  if (gemm) run_gemm(threads, isa, ms);
  if (attn) run_attn(threads, isa, ctxs, batches, attn_bf16, reps);
  if (step) {
    if (step_isas.empty()) step_isas = {latent::CpuIsa::Avx512, latent::CpuIsa::Avx2};
    run_step(threads, step_isas, rounds, step_mx);
  }
  return 0;
}
