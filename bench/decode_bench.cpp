// decode_bench: prefill and decode throughput of a model directory through the engine's own step (Model::step over
// a paged KV cache, exactly what `latent serve` runs), against this machine's memory bandwidth and FMA peak probed
// in the same run.
//
//   decode_bench --model DIR [--model DIR2 ...] [--threads 1,2] [--ctx 0,512,4096] [--batch 1,16,64]
//                [--steps 16] [--prefill 512] [--activations fp32|bf16] [--backends cpu[,ref]] [--fill 4096]
//                [--max-kv-gb 8] [--profile] [--mb 512]
//
// Probes first, per thread count: the streaming read bandwidth (a sum over a buffer much larger than the caches)
// and the FMA peak (independent FMA chains on every thread, 512-bit where the CPU backend runs AVX-512).
//
// Per model and thread count:
//   * prefill: one sequence of --prefill random tokens in one step (tok/s and the roofline fraction);
//   * decode, for every context C of --ctx and batch size B of --batch: B sequences, each with C tokens already in
//     its own blocks of the cache, then one untimed step and --steps timed steps in which every sequence decodes one
//     greedy token (tokens/s = B · steps / time; the step time is the median step). The contexts are real KV
//     entries: a prefill of min(max C, --fill) tokens is run once per model and its cache rows are copied into
//     every sequence (repeated when C is longer; the attention and DSA indexer costs do not depend on the values,
//     the DSA selection is made over them as usual). C = 0: the first step is a one-token prompt.
//
// Columns: weight and KV bytes per step (counted by a pass-through Backend wrapper: every weight an op streams —
// attention projections with kv_b, dense MLP, router, the routed experts selected, shared experts, embedding rows,
// lm_head, scales included — and the latent / indexer cache rows attention reads), FLOPs per step, GB/s =
// (weights + KV) / step time, %bw = that over the read probe, %roof = the larger floor (bytes / bandwidth, FLOPs /
// FMA peak) over the step time, x1t = tok/s over the same row's tok/s on one thread, cpu% = the process's CPU time
// over (wall time x threads): well below 100 % means the machine was shared (spinning pool threads count as busy).
// --profile adds the time per op class and step (ms, and GFLOP/s where the op has FLOPs).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "counting_backend.h"
#include "fma_peak.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/generate.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/weights.h"
#include "read_bandwidth.h"

namespace {

using namespace latent;
using bench::CountingBackend;
using bench::dtype_size;
using bench::now_s;
using bench::print_profile;
using bench::scale_bytes;

// ---------------------------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------------------------
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) v.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return v;
}

// CPU time of the whole process (all threads), to tell how much of the machine the run actually got.
double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Machine {
  double bw_gbs = 0, fma_gflops = 0;
};

// Time of the larger roofline floor over the measured time.
double roofline_fraction(const Machine& mc, double bytes, double flops, double seconds, const char** bound) {
  const double t_bw = mc.bw_gbs > 0 ? bytes / (mc.bw_gbs * 1e9) : 0.0;
  const double t_fma = mc.fma_gflops > 0 ? flops / (mc.fma_gflops * 1e9) : 0.0;
  if (bound) *bound = t_bw >= t_fma ? "bw" : "fma";
  return seconds > 0 ? std::max(t_bw, t_fma) / seconds : 0.0;
}

// Touches every page of every weight once (the checkpoint is memory-mapped: without this the first steps would
// time page faults of experts and embedding rows not used before).
void touch_weights(const ModelWeights& W) {
  uint64_t sink = 0;
  auto touch = [&](const QuantWeight& w) {
    const uint8_t* d = static_cast<const uint8_t*>(w.data);
    const uint64_t n = static_cast<uint64_t>(w.rows * w.row_bytes());
    for (uint64_t i = 0; i < n; i += 4096) sink += d[i];
    if (w.scale) {
      const uint8_t* sc = static_cast<const uint8_t*>(w.scale);
      const uint64_t ns = scale_bytes(w, w.rows);
      for (uint64_t i = 0; i < ns; i += 4096) sink += sc[i];
    }
  };
  touch(W.embed);
  touch(W.lm_head);
  for (const LayerWeights& L : W.layers) {
    for (const QuantWeight* w : {&L.attn.q_a, &L.attn.q_b, &L.attn.kv_a, &L.attn.kv_b, &L.attn.o}) touch(*w);
    if (L.indexer.present)
      for (const QuantWeight* w : {&L.indexer.wq_b, &L.indexer.wk, &L.indexer.weights_proj}) touch(*w);
    auto mlp = [&](const MlpWeights& m) {
      touch(m.gate);
      touch(m.up);
      touch(m.down);
    };
    if (!L.is_moe) {
      mlp(L.dense);
    } else {
      touch(L.moe.router);
      for (const MlpWeights& e : L.moe.experts) mlp(e);
      if (L.moe.has_shared) mlp(L.moe.shared);
    }
  }
  if (sink == 42) std::printf(" ");
}

// The cache rows of one prefilled sequence (host copy), per layer: latent rows [n, width] and indexer rows.
struct Template {
  int64_t n = 0;
  std::vector<std::vector<uint8_t>> latent, index;
};

constexpr int64_t kBlockTokens = 64;

// Prefills n random tokens (seed 7) into a fresh cache and keeps its rows.
Template make_template(Model& model, Backend& be, int64_t n) {
  const ModelConfig& cfg = model.config();
  Template t;
  t.n = n;
  const int64_t nb = (n + kBlockTokens - 1) / kBlockTokens;
  PagedKvCache cache(cfg, be, nb, kBlockTokens, model.cache_dtype());
  std::vector<int32_t> blocks(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) blocks[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::mt19937 g(7);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& v : ids) v = static_cast<int32_t>(g() % static_cast<uint32_t>(cfg.vocab_size));
  const int64_t chunk = 1024;
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t k = std::min(chunk, n - at);
    StepSequence q;
    q.start = at;
    q.n_tokens = k;
    q.blocks = blocks;
    q.logits = LogitRows::None;
    const Step st{std::span<const int32_t>(ids.data() + at, static_cast<size_t>(k)),
                  std::span<const StepSequence>(&q, 1)};
    model.step(st, cache, nullptr);
  }
  const int64_t esz = dtype_size(cache.dtype());
  for (int64_t l = 0; l < cache.num_layers(); ++l) {
    const KvPool& lp = cache.latent(l);
    t.latent.emplace_back(static_cast<size_t>(n * lp.width * esz));
    be.download(t.latent.back().data(), lp.data, t.latent.back().size());
    const KvPool& ip = cache.index(l);
    t.index.emplace_back(ip.data ? static_cast<size_t>(n * ip.width * esz) : 0);
    if (ip.data) be.download(t.index.back().data(), ip.data, t.index.back().size());
  }
  return t;
}

// Rows [row0, row0 + n) of `pool` <- the template's rows 0, 1, ..., repeated.
void fill_rows(Backend& be, const KvPool& pool, const std::vector<uint8_t>& src, int64_t tn, int64_t row0, int64_t n) {
  if (!pool.data || n <= 0) return;
  const int64_t rb = pool.width * dtype_size(pool.dtype);
  for (int64_t at = 0; at < n; at += tn) {
    const int64_t k = std::min(tn, n - at);
    be.upload(static_cast<uint8_t*>(pool.data) + (row0 + at) * rb, src.data(), static_cast<size_t>(k * rb));
  }
}

struct DecodeResult {
  double tps = 0, step_s = 0, weight_mb = 0, kv_mb = 0, gflop = 0, cpu = 0, wall = 0;
  bool skipped = false;
};

// B sequences with ctx cached tokens each, one untimed step, then `steps` timed decode steps.
DecodeResult run_decode(Model& model, CountingBackend& cb, const Template* tpl, int64_t ctx, int64_t B, int64_t steps,
                        double max_kv_gb, bool profile) {
  const ModelConfig& cfg = model.config();
  const int64_t V = cfg.vocab_size, per = (ctx + steps + 1 + kBlockTokens - 1) / kBlockTokens;
  DecodeResult r;
  const double kv_gb = static_cast<double>(B * per * kBlockTokens) *
                       static_cast<double>(kv_bytes_per_token(cfg, model.cache_dtype())) / 1e9;
  if (kv_gb > max_kv_gb) {
    r.skipped = true;
    return r;
  }
  PagedKvCache cache(cfg, cb, B * per, kBlockTokens, model.cache_dtype());
  std::vector<std::vector<int32_t>> blocks(static_cast<size_t>(B));
  for (int64_t s = 0; s < B; ++s) {
    for (int64_t j = 0; j < per; ++j) blocks[s].push_back(static_cast<int32_t>(s * per + j));
    if (ctx > 0)
      for (int64_t l = 0; l < cache.num_layers(); ++l) {
        fill_rows(cb, cache.latent(l), tpl->latent[static_cast<size_t>(l)], tpl->n, s * per * kBlockTokens, ctx);
        fill_rows(cb, cache.index(l), tpl->index[static_cast<size_t>(l)], tpl->n, s * per * kBlockTokens, ctx);
      }
  }
  std::vector<StepSequence> seqs(static_cast<size_t>(B));
  std::vector<int32_t> tokens(static_cast<size_t>(B));
  std::vector<float> logits(static_cast<size_t>(B * V));
  std::mt19937 g(11);
  for (int32_t& t : tokens) t = static_cast<int32_t>(g() % static_cast<uint32_t>(V));
  std::vector<double> times;
  double wall = 0, cpu = 0;
  for (int64_t i = 0; i <= steps; ++i) {
    for (int64_t s = 0; s < B; ++s) {
      StepSequence& q = seqs[static_cast<size_t>(s)];
      q.start = ctx + i;
      q.n_tokens = 1;
      q.blocks = blocks[static_cast<size_t>(s)];
      q.logits = LogitRows::Last;
      q.decode = q.start > 0;
    }
    if (i == 1) cb.reset();  // step 0 is the untimed first touch
    const double t0 = now_s(), c0 = process_cpu_s();
    model.step(Step{tokens, seqs}, cache, logits.data());
    const double dt = now_s() - t0;
    if (i > 0) {
      times.push_back(dt);
      wall += dt;
      cpu += process_cpu_s() - c0;
    }
    for (int64_t s = 0; s < B; ++s) tokens[static_cast<size_t>(s)] = argmax(logits.data() + s * V, V);
  }
  std::sort(times.begin(), times.end());
  r.step_s = times[times.size() / 2];
  r.tps = static_cast<double>(B) / r.step_s;
  const double n = static_cast<double>(steps);
  r.weight_mb = static_cast<double>(cb.weight_bytes_read) / n / 1e6;
  r.kv_mb = static_cast<double>(cb.kv_bytes_read) / n / 1e6;
  r.gflop = cb.flops / n / 1e9;
  r.cpu = cpu / (wall * static_cast<double>(cb.num_threads()));
  r.wall = wall;
  if (profile) print_profile(cb, n, wall, "per step");
  return r;
}

struct PrefillResult {
  double tps = 0, seconds = 0, bytes = 0, flops = 0;
};

PrefillResult run_prefill(Model& model, CountingBackend& cb, int64_t n, bool profile) {
  const ModelConfig& cfg = model.config();
  const int64_t nb = (n + kBlockTokens - 1) / kBlockTokens;
  PagedKvCache cache(cfg, cb, nb, kBlockTokens, model.cache_dtype());
  std::vector<int32_t> blocks(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) blocks[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::mt19937 g(5);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& v : ids) v = static_cast<int32_t>(g() % static_cast<uint32_t>(cfg.vocab_size));
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  StepSequence q;
  q.n_tokens = n;
  q.blocks = blocks;
  q.logits = LogitRows::Last;
  cb.reset();
  const double t0 = now_s();
  model.step(Step{ids, std::span<const StepSequence>(&q, 1)}, cache, logits.data());
  PrefillResult r;
  r.seconds = now_s() - t0;
  r.tps = static_cast<double>(n) / r.seconds;
  r.bytes = static_cast<double>(cb.weight_bytes_read + cb.kv_bytes_read);
  r.flops = cb.flops;
  if (profile) print_profile(cb, 1.0, r.seconds, "prefill");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::vector<int> threads = {1, 2};
  std::vector<std::string> backends = {"cpu"};
  std::vector<int64_t> ctxs = {0, 512, 4096}, batches = {1, 16, 64};
  int64_t n_prefill = 512, steps = 16, fill = 4096;
  double max_kv_gb = 8.0;
  size_t mb = 512;
  bool profile = false, bf16 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "decode_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](const std::string& v, long long lo) {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < lo) {
        std::fprintf(stderr, "decode_bench: %s wants integers >= %lld, got '%s'\n", a.c_str(), lo, v.c_str());
        std::exit(2);
      }
      return static_cast<int64_t>(n);
    };
    auto list = [&](long long lo) {
      std::vector<int64_t> v;
      for (const auto& s : split(next())) v.push_back(number(s, lo));
      if (v.empty()) {
        std::fprintf(stderr, "decode_bench: %s wants a list of integers\n", a.c_str());
        std::exit(2);
      }
      return v;
    };
    if (a == "--model") {
      models.push_back(next());
    } else if (a == "--threads") {
      threads.clear();
      for (int64_t t : list(1)) threads.push_back(static_cast<int>(t));
    } else if (a == "--backends") {
      backends = split(next());
    } else if (a == "--ctx") {
      ctxs = list(0);
    } else if (a == "--batch") {
      batches = list(1);
    } else if (a == "--steps" || a == "--decode") {
      steps = number(next(), 1);
    } else if (a == "--prefill") {
      n_prefill = number(next(), 0);
    } else if (a == "--fill") {
      fill = number(next(), 1);
    } else if (a == "--max-kv-gb") {
      max_kv_gb = static_cast<double>(number(next(), 1));
    } else if (a == "--mb") {
      mb = static_cast<size_t>(number(next(), 16));
    } else if (a == "--activations") {
      const std::string v = next();
      if (v != "fp32" && v != "bf16") {
        std::fprintf(stderr, "decode_bench: --activations is fp32 or bf16, got '%s'\n", v.c_str());
        return 2;
      }
      bf16 = v == "bf16";
    } else if (a == "--profile") {
      profile = true;
    } else {
      std::fprintf(stderr,
                   "usage: decode_bench --model DIR [--model DIR ...] [--threads 1,2] [--ctx 0,512,4096]\n"
                   "                    [--batch 1,16,64] [--steps 16] [--prefill 512] [--activations fp32|bf16]\n"
                   "                    [--backends cpu[,ref]] [--fill 4096] [--max-kv-gb 8] [--profile] [--mb 512]\n");
      return 2;
    }
  }
  if (models.empty()) {
    std::fprintf(stderr, "decode_bench: --model DIR is required (see bench/README.md to make the bench models)\n");
    return 2;
  }
  const CpuIsa isa = cpu_isa_default();
  std::printf("cpu backend ISA: %s\n", cpu_isa_name(isa));
  std::map<int, Machine> mach;
  for (int t : threads) {
    Machine& m = mach[t];
    m.bw_gbs = bench::read_bandwidth_mb(mb, t, 3);
    m.fma_gflops = bench::fma_peak_gflops(t, isa == CpuIsa::Avx512);
    std::printf("machine, %d thread%s: streaming read bandwidth %.2f GB/s, fp32 FMA peak %.1f GFLOP/s (%s)\n", t,
                t == 1 ? "" : "s", m.bw_gbs, m.fma_gflops, isa == CpuIsa::Avx512 ? "512-bit" : "256-bit");
  }
  try {
    for (const std::string& dir : models) {
      ModelFiles f = open_model_files(dir);
      std::string name = dir;
      while (!name.empty() && name.back() == '/') name.pop_back();
      if (auto p = name.rfind('/'); p != std::string::npos) name = name.substr(p + 1);
      const int64_t max_ctx = *std::max_element(ctxs.begin(), ctxs.end());
      const int64_t need = std::max(max_ctx + steps + 1, n_prefill);
      if (f.cfg->max_position_embeddings > 0 && need > f.cfg->max_position_embeddings) {
        // Random bench weights, plain RoPE: positions past the trained range cost the same.
        std::printf("\n%s: max_position_embeddings %lld raised to %lld for the bench (random weights)\n", name.c_str(),
                    static_cast<long long>(f.cfg->max_position_embeddings), static_cast<long long>(need));
        f.cfg->max_position_embeddings = need;
      }
      ModelOptions mo;
      mo.bf16_activations = bf16;
      std::printf("\n%s: %s, %lld layers, activations and KV cache %s (%lld bytes per token), blocks of %lld\n",
                  name.c_str(), f.cfg->has_indexer() ? "MLA + MoE + DSA indexer" : "MLA + MoE",
                  static_cast<long long>(f.cfg->num_hidden_layers), bf16 ? "bf16" : "fp32",
                  static_cast<long long>(kv_bytes_per_token(*f.cfg, bf16 ? DType::BF16 : DType::F32)),
                  static_cast<long long>(kBlockTokens));
      for (const std::string& bname : backends) {
        std::unique_ptr<Template> tpl;
        std::map<std::pair<int64_t, int64_t>, double> one_thread;  // (ctx, B) -> tok/s on 1 thread
        for (int t : threads) {
          std::unique_ptr<Backend> be = make_backend(bname, t);
          CountingBackend cb(*be, profile);
          Model model(*f.cfg, *f.plan, cb, mo);
          touch_weights(model.weights());
          if (!tpl && max_ctx > 0) {
            const double t0 = now_s();
            tpl = std::make_unique<Template>(make_template(model, cb, std::min(max_ctx, fill)));
            std::printf("  (context template: a prefill of %lld tokens in %.1f s, repeated for longer contexts)\n",
                        static_cast<long long>(tpl->n), now_s() - t0);
          }
          const Machine& mc = mach[t];
          if (n_prefill > 0) {
            const PrefillResult p = run_prefill(model, cb, n_prefill, profile);
            const char* bound = "";
            const double roof = roofline_fraction(mc, p.bytes, p.flops, p.seconds, &bound);
            std::printf("  %-4s thr %2d  prefill %lld: %9.1f tok/s  %7.1f GFLOP/s  %5.1f%% of the roofline (%s)\n",
                        bname.c_str(), t, static_cast<long long>(n_prefill), p.tps, p.flops / p.seconds / 1e9,
                        100.0 * roof, bound);
          }
          std::printf("  %-4s %3s %6s %5s %9s %8s %9s %9s %10s %7s %6s %11s %5s %5s\n", "be", "thr", "ctx", "batch",
                      "tok/s", "step ms", "wMB/step", "kvMB/step", "GFLOP/step", "GB/s", "%bw", "%roof", "x1t", "cpu%");
          for (int64_t ctx : ctxs)
            for (int64_t B : batches) {
              const DecodeResult r = run_decode(model, cb, tpl.get(), ctx, B, steps, max_kv_gb, profile);
              if (r.skipped) {
                std::printf("  %-4s %3d %6lld %5lld  skipped: the cache would exceed --max-kv-gb %.0f\n", bname.c_str(),
                            t, static_cast<long long>(ctx), static_cast<long long>(B), max_kv_gb);
                continue;
              }
              const double bytes = (r.weight_mb + r.kv_mb) * 1e6;
              const char* bound = "";
              const double roof = roofline_fraction(mc, bytes, r.gflop * 1e9, r.step_s, &bound);
              const double gbs = bytes / r.step_s / 1e9;
              if (t == 1) one_thread[{ctx, B}] = r.tps;
              char x1[16] = "   -";
              if (t != 1 && one_thread.count({ctx, B}))
                std::snprintf(x1, sizeof(x1), "%5.2f", r.tps / one_thread[{ctx, B}]);
              std::printf(
                  "  %-4s %3d %6lld %5lld %9.1f %8.2f %9.2f %9.2f %10.3f %7.2f %5.1f%% %5.1f%% (%3s) %5s %4.0f%%\n",
                  bname.c_str(), t, static_cast<long long>(ctx), static_cast<long long>(B), r.tps, r.step_s * 1e3,
                  r.weight_mb, r.kv_mb, r.gflop, gbs, 100.0 * gbs / mc.bw_gbs, 100.0 * roof, bound, x1, 100.0 * r.cpu);
              std::fflush(stdout);
            }
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
