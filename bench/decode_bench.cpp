// decode_bench: decode throughput of a model directory against this machine's memory bandwidth.
//
//   decode_bench --model DIR [--model DIR2 ...] [--threads 1,2] [--backends cpu,ref] [--prefill 32]
//                [--decode 64] [--ref-decode 4] [--mb 512] [--profile] [--batch 1,4,16,64] [--ctx 128]
//                [--steps 8]
//
// First measures the streaming read bandwidth for each thread count (sum over a buffer >> caches), then per model,
// backend and thread count: a prefill of --prefill random tokens, then --decode greedy single-token steps through
// the latent cache. Reports decode tokens/s, the weight bytes actually read per token (every weight an op
// streams: dense + attention (kv_b included) + router + the routed experts selected + shared experts + embedding
// row + lm_head; counted by a pass-through Backend wrapper), the achieved GB/s and its ratio to the measured
// bandwidth at the same thread count. KV-cache bytes are reported separately (not in GB/s).
//
// Machine probes (same run): the streaming read bandwidth and the FMA peak (independent FMA chains on every
// thread, 256-bit, or 512-bit where the CPU backend uses AVX-512) per thread count. Every row then gives the
// roofline fraction: the larger of the two floors (bytes read / bandwidth, FLOPs / FMA peak) over the measured
// time. cpu% = the process's CPU time over (wall time x threads) while measuring: well below 100 % means the
// machine was shared with other work (spinning pool threads count as busy).
//
// --batch B1,B2,..: aggregate decode throughput with B sequences in one step. The model's forward is one sequence
// at a time on this branch, so the bench drives the backend ops of one batched decode step itself, with the
// model's weights and shapes: embedding, every Linear with M = B rows (each weight read once per step), the
// router, the experts grouped over the B tokens (grouped_matmul: each selected expert read once per step), the
// shared expert, lm_head on B rows; attention = one mla_attention_absorbed over the B queries against one shared
// latent cache of --ctx tokens (kv_b read once per step; the cache counted once). Prints tokens/s (B / step
// time), weight + KV bytes and FLOPs per step, and the roofline fraction; --profile adds GFLOP/s per op class.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "fma_peak.h"
#include "read_bandwidth.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/weights.h"

namespace {

using namespace latent;
using bench::now_s;

// ---------------------------------------------------------------------------------------------------------------
// Counting pass-through backend
// ---------------------------------------------------------------------------------------------------------------
uint64_t scale_bytes(const QuantWeight& w, int64_t rows) {
  switch (w.format) {
    case WeightFormat::MXFP4: return static_cast<uint64_t>(rows * (w.cols / 32));
    case WeightFormat::FP8_E4M3_BLOCK:
      return static_cast<uint64_t>(((rows + w.block_rows - 1) / w.block_rows) * w.scale_cols() * 4);
    case WeightFormat::FP8_E4M3_CHANNEL: return static_cast<uint64_t>(rows * 4);
    case WeightFormat::FP8_E4M3_TENSOR: return 4;
    default: return 0;
  }
}
uint64_t weight_bytes(const QuantWeight& w, int64_t rows) {
  return static_cast<uint64_t>(rows * w.row_bytes()) + scale_bytes(w, rows);
}

enum Op { kMatmul, kGrouped, kEmbed, kNorm, kRope, kElem, kAttn, kIndexer, kRouter, kScatter, kOps };
const char* kOpNames[kOps] = {"matmul", "grouped_matmul", "embedding", "norms", "rope", "elementwise",
                              "mla_attention", "indexer+topk", "router", "scatter_add"};

class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(Backend& b, bool profile) : b_(b), profile_(profile) {}
  const char* name() const override { return b_.name(); }
  int num_threads() const override { return b_.num_threads(); }

  uint64_t weight_bytes_read = 0, kv_bytes_read = 0;
  double flops = 0;  // multiply-adds x 2 of the matmuls and the attention
  std::array<double, kOps> op_time{}, op_flops{};
  std::array<uint64_t, kOps> op_calls{};
  void reset() {
    weight_bytes_read = kv_bytes_read = 0;
    flops = 0;
    op_time.fill(0.0);
    op_flops.fill(0.0);
    op_calls.fill(0);
  }
  void add_flops(Op op, double f) {
    flops += f;
    op_flops[op] += f;
  }

  void matmul(const QuantWeight& w, const float* x, int64_t M, float* y) override {
    weight_bytes_read += weight_bytes(w, w.rows);
    add_flops(kMatmul, 2.0 * static_cast<double>(M) * static_cast<double>(w.rows) * static_cast<double>(w.cols));
    T t(this, kMatmul);
    b_.matmul(w, x, M, y);
  }
  void grouped_matmul(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const float* x,
                      float* y) override {
    for (int64_t g = 0; g < n_groups; ++g)
      if (offsets[g + 1] > offsets[g]) {
        weight_bytes_read += weight_bytes(*w[g], w[g]->rows);
        add_flops(kGrouped, 2.0 * static_cast<double>(offsets[g + 1] - offsets[g]) * static_cast<double>(w[g]->rows) *
                                static_cast<double>(w[g]->cols));
      }
    T t(this, kGrouped);
    b_.grouped_matmul(w, n_groups, offsets, x, y);
  }
  void embedding(const QuantWeight& table, const int32_t* ids, int64_t M, float* out) override {
    weight_bytes_read += static_cast<uint64_t>(M * table.row_bytes());
    T t(this, kEmbed);
    b_.embedding(table, ids, M, out);
  }
  void rms_norm(const float* x, const float* w, int64_t M, int64_t D, float eps, float* y, bool bf16) override {
    T t(this, kNorm);
    b_.rms_norm(x, w, M, D, eps, y, bf16);
  }
  void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t D, float eps, float* y,
                  bool bf16) override {
    T t(this, kNorm);
    b_.layer_norm(x, w, b, M, D, eps, y, bf16);
  }
  void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
            const int64_t* pos, const RopeParams& p, bool bf16) override {
    T t(this, kRope);
    b_.rope(x, n_tokens, n_heads, token_stride, head_stride, pos, p, bf16);
  }
  void silu_mul(const float* gate, const float* up, int64_t n, float* out, bool bf16) override {
    T t(this, kElem);
    b_.silu_mul(gate, up, n, out, bf16);
  }
  void add(float* y, const float* x, int64_t n, bool bf16) override {
    T t(this, kElem);
    b_.add(y, x, n, bf16);
  }
  void round_bf16(float* x, int64_t n) override {
    T t(this, kElem);
    b_.round_bf16(x, n);
  }
  void mla_attention_naive(const MlaDims& d, const float* q, const float* kvb, const float* k_pe, int64_t S,
                           int64_t T_, const int64_t* q_pos, const KeySelection& sel, float scale, float* o,
                           bool bf16) override {
    kv_bytes_read += static_cast<uint64_t>(T_ * (d.n_heads * (d.nope + d.v) + d.rope) * 4);
    T t(this, kAttn);
    b_.mla_attention_naive(d, q, kvb, k_pe, S, T_, q_pos, sel, scale, o, bf16);
  }
  void mla_attention_absorbed(const MlaDims& d, const float* q, const QuantWeight& kv_b, const float* c,
                              const float* k_pe, int64_t S, int64_t T_, const int64_t* q_pos,
                              const KeySelection& sel, float scale, float* o, bool bf16) override {
    weight_bytes_read += weight_bytes(kv_b, kv_b.rows);
    kv_bytes_read += static_cast<uint64_t>(T_ * (d.latent + d.rope) * 4);
    // per query and head: q absorption (dn·dc), scores (T·(dc+dr)), weighted latent sum (T·dc), W_UV (dv·dc)
    add_flops(kAttn, 2.0 * static_cast<double>(S) * static_cast<double>(d.n_heads) *
                         static_cast<double>(d.nope * d.latent + T_ * (2 * d.latent + d.rope) + d.v * d.latent));
    T t(this, kAttn);
    b_.mla_attention_absorbed(d, q, kv_b, c, k_pe, S, T_, q_pos, sel, scale, o, bf16);
  }
  void indexer_scores(const float* q, const float* w, const float* k, int64_t S, int64_t T_, int64_t n_heads,
                      int64_t head_dim, float scale, const int64_t* q_pos, float* scores) override {
    kv_bytes_read += static_cast<uint64_t>(T_ * head_dim * 4);
    T t(this, kIndexer);
    b_.indexer_scores(q, w, k, S, T_, n_heads, head_dim, scale, q_pos, scores);
  }
  void topk_select(const float* scores, int64_t S, int64_t T_, int64_t k, const int64_t* q_pos, int32_t* sel,
                   int32_t* count) override {
    T t(this, kIndexer);
    b_.topk_select(scores, S, T_, k, q_pos, sel, count);
  }
  void router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
              float* weights) override {
    T t(this, kRouter);
    b_.router(logits, bias, M, p, ids, weights);
  }
  void scatter_add_weighted(const float* x, const int32_t* token, const float* weight, int64_t n, int64_t D,
                            float* y, bool bf16) override {
    T t(this, kScatter);
    b_.scatter_add_weighted(x, token, weight, n, D, y, bf16);
  }

 private:
  struct T {  // per-op wall-clock timer (only with --profile)
    CountingBackend* c;
    Op op;
    double t0;
    T(CountingBackend* cb, Op o) : c(cb), op(o), t0(cb->profile_ ? now_s() : 0.0) {}
    ~T() {
      if (!c->profile_) return;
      c->op_time[op] += now_s() - t0;
      ++c->op_calls[op];
    }
  };
  Backend& b_;
  bool profile_;
};

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

void print_profile(const CountingBackend& cb, double per, double wall, const char* what) {
  std::printf("    %s time by op (ms):", what);
  double tot = 0;
  for (int o = 0; o < kOps; ++o) tot += cb.op_time[static_cast<size_t>(o)];
  for (int o = 0; o < kOps; ++o) {
    const size_t i = static_cast<size_t>(o);
    if (!cb.op_calls[i]) continue;
    std::printf(" %s %.3f (%llu calls", kOpNames[o], cb.op_time[i] * 1e3 / per,
                static_cast<unsigned long long>(static_cast<double>(cb.op_calls[i]) / per));
    if (cb.op_flops[i] > 0 && cb.op_time[i] > 0) std::printf(", %.1f GFLOP/s", cb.op_flops[i] / cb.op_time[i] / 1e9);
    std::printf(")");
  }
  std::printf("; ops %.3f of %.3f ms\n", tot * 1e3 / per, wall * 1e3 / per);
}

// ---------------------------------------------------------------------------------------------------------------
// One batched decode step driven op by op (see the header comment for what it contains).
// ---------------------------------------------------------------------------------------------------------------
struct BatchResult {
  double tps = 0, step_s = 0, weight_mb = 0, kv_mb = 0, gflop = 0, cpu_s = 0;
};

// Touches every page of every weight once (the checkpoint is memory-mapped: without this the first steps of a
// batch size would time page faults of experts and embedding rows not used before).
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

BatchResult run_batch(const ModelConfig& cfg, const ModelWeights& W, CountingBackend& cb, int64_t B, int64_t ctx,
                      int64_t steps, bool profile) {
  const int64_t D = cfg.hidden_size, H = cfg.num_attention_heads, dn = cfg.qk_nope_head_dim,
                dr = cfg.qk_rope_head_dim, dv = cfg.v_head_dim, dc = cfg.kv_lora_rank, dq = cfg.q_lora_rank,
                V = cfg.vocab_size, E = cfg.n_routed_experts, K = cfg.num_experts_per_tok;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  int64_t inter = 1;
  for (const LayerWeights& L : W.layers) {
    inter = std::max(inter, L.is_moe ? (L.moe.has_shared ? L.moe.shared.gate.rows : 1) : L.dense.gate.rows);
    if (L.is_moe && !L.moe.experts.empty()) inter = std::max(inter, L.moe.experts[0].gate.rows);
  }
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto vec = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  std::vector<float> x = vec(B * D), h = vec(B * D), qa = vec(B * dq), q = vec(B * H * (dn + dr)),
                     kva = vec(B * (dc + dr)), ao = vec(B * H * dv), y = vec(B * D), ga = vec(B * K * inter),
                     up = vec(B * K * inter), lr = vec(B * std::max<int64_t>(E, 1)), xs = vec(B * K * D),
                     dd = vec(B * K * D), lm = vec(B * V), lat = vec(std::max<int64_t>(ctx, 1) * dc),
                     kpe = vec(std::max<int64_t>(ctx, 1) * dr);
  for (float& v : lat) v = nd(g);
  for (float& v : kpe) v = nd(g);
  std::vector<int32_t> tokens(static_cast<size_t>(B)), ids(static_cast<size_t>(B * K)), tok(static_cast<size_t>(B * K));
  std::vector<float> wts(static_cast<size_t>(B * K)), aw(static_cast<size_t>(B * K));
  std::vector<int64_t> offsets(static_cast<size_t>(E + 1)), fill(static_cast<size_t>(E)),
      qpos(static_cast<size_t>(B), std::max<int64_t>(ctx, 1) - 1);
  std::vector<const QuantWeight*> wg(static_cast<size_t>(E)), wu(static_cast<size_t>(E)), wd(static_cast<size_t>(E));
  RouterParams rp;
  rp.n_experts = E;
  rp.n_group = std::max<int64_t>(1, cfg.n_group);
  rp.topk_group = cfg.topk_group;
  rp.top_k = K;
  rp.norm_topk_prob = cfg.norm_topk_prob;
  rp.routed_scaling_factor = static_cast<float>(cfg.routed_scaling_factor);
  const MlaDims md{H, dn, dr, dv, dc};
  const float scale = 1.0f / std::sqrt(static_cast<float>(dn + dr));
  Backend& be = cb;

  auto step = [&] {
    for (int32_t& t : tokens) t = static_cast<int32_t>(g() % static_cast<uint32_t>(V));
    be.embedding(W.embed, tokens.data(), B, x.data());
    for (const LayerWeights& L : W.layers) {
      const AttentionWeights& a = L.attn;
      be.rms_norm(x.data(), L.input_norm.data(), B, D, eps, h.data(), false);
      be.matmul(a.q_a, h.data(), B, qa.data());
      be.rms_norm(qa.data(), a.q_a_norm.data(), B, dq, eps, qa.data(), false);
      be.matmul(a.q_b, qa.data(), B, q.data());
      be.matmul(a.kv_a, h.data(), B, kva.data());
      if (ctx > 0)
        be.mla_attention_absorbed(md, q.data(), a.kv_b, lat.data(), kpe.data(), B, ctx, qpos.data(), KeySelection{},
                                  scale, ao.data(), false);
      be.matmul(a.o, ao.data(), B, y.data());
      be.add(x.data(), y.data(), B * D, false);
      be.rms_norm(x.data(), L.post_attn_norm.data(), B, D, eps, h.data(), false);
      if (!L.is_moe) {
        const int64_t I = L.dense.gate.rows;
        be.matmul(L.dense.gate, h.data(), B, ga.data());
        be.matmul(L.dense.up, h.data(), B, up.data());
        be.silu_mul(ga.data(), up.data(), B * I, ga.data(), false);
        be.matmul(L.dense.down, ga.data(), B, y.data());
      } else {
        const MoeWeights& m = L.moe;
        const int64_t Im = m.experts[0].gate.rows, n = B * K;
        be.matmul(m.router, h.data(), B, lr.data());
        be.router(lr.data(), m.score_bias.empty() ? nullptr : m.score_bias.data(), B, rp, ids.data(), wts.data());
        std::fill(offsets.begin(), offsets.end(), 0);
        for (int32_t e : ids) ++offsets[static_cast<size_t>(e) + 1];
        for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
        std::copy(offsets.begin(), offsets.end() - 1, fill.begin());
        for (int64_t s = 0; s < B; ++s)
          for (int64_t k = 0; k < K; ++k) {
            const int64_t at = fill[ids[s * K + k]]++;
            tok[at] = static_cast<int32_t>(s);
            aw[at] = wts[s * K + k];
          }
        for (int64_t i = 0; i < n; ++i) std::memcpy(&xs[i * D], &h[tok[i] * D], sizeof(float) * D);
        for (int64_t e = 0; e < E; ++e) {
          wg[e] = &m.experts[e].gate;
          wu[e] = &m.experts[e].up;
          wd[e] = &m.experts[e].down;
        }
        be.grouped_matmul(wg.data(), E, offsets.data(), xs.data(), ga.data());
        be.grouped_matmul(wu.data(), E, offsets.data(), xs.data(), up.data());
        be.silu_mul(ga.data(), up.data(), n * Im, ga.data(), false);
        be.grouped_matmul(wd.data(), E, offsets.data(), ga.data(), dd.data());
        std::fill(y.begin(), y.end(), 0.0f);
        be.scatter_add_weighted(dd.data(), tok.data(), aw.data(), n, D, y.data(), false);
        if (m.has_shared) {
          const int64_t Is = m.shared.gate.rows;
          be.matmul(m.shared.gate, h.data(), B, ga.data());
          be.matmul(m.shared.up, h.data(), B, up.data());
          be.silu_mul(ga.data(), up.data(), B * Is, ga.data(), false);
          be.matmul(m.shared.down, ga.data(), B, dd.data());
          be.add(y.data(), dd.data(), B * D, false);
        }
      }
      be.add(x.data(), y.data(), B * D, false);
    }
    be.rms_norm(x.data(), W.final_norm.data(), B, D, eps, h.data(), false);
    be.matmul(W.lm_head, h.data(), B, lm.data());
  };
  step();  // untimed: first touch of the buffers
  cb.reset();
  const double t0 = now_s(), c0 = process_cpu_s();
  for (int64_t i = 0; i < steps; ++i) step();
  const double dt = now_s() - t0;
  BatchResult r;
  r.cpu_s = process_cpu_s() - c0;
  r.step_s = dt / static_cast<double>(steps);
  r.tps = static_cast<double>(B) / r.step_s;
  r.weight_mb = static_cast<double>(cb.weight_bytes_read) / static_cast<double>(steps) / 1e6;
  r.kv_mb = static_cast<double>(cb.kv_bytes_read) / static_cast<double>(steps) / 1e6;
  r.gflop = cb.flops / static_cast<double>(steps) / 1e9;
  if (profile) print_profile(cb, static_cast<double>(steps), dt, "step");
  return r;
}

struct Result {
  double prefill_tps = 0, decode_tps = 0, weight_mb_per_tok = 0, kv_mb_per_tok = 0, gbs = 0, gflop_per_tok = 0;
  double prefill_s = 0, prefill_bytes = 0, prefill_flops = 0, decode_cpu_s = 0, decode_s = 0;
};

Result run(Model& model, CountingBackend& cb, const ModelConfig& cfg, int64_t n_prefill, int64_t n_decode,
           bool profile) {
  std::mt19937 g(7);
  std::vector<int32_t> prompt(static_cast<size_t>(n_prefill));
  for (int32_t& t : prompt) t = static_cast<int32_t>(g() % static_cast<uint32_t>(cfg.vocab_size));
  KvCache cache(cfg);
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  Result r;
  cb.reset();
  double t0 = now_s();
  model.forward(prompt, cache, logits.data(), /*all_rows=*/false);
  r.prefill_s = now_s() - t0;
  r.prefill_tps = static_cast<double>(n_prefill) / r.prefill_s;
  r.prefill_bytes = static_cast<double>(cb.weight_bytes_read + cb.kv_bytes_read);
  r.prefill_flops = cb.flops;
  if (profile) print_profile(cb, 1.0, r.prefill_s, "prefill");
  int32_t next = argmax(logits.data(), cfg.vocab_size);
  // One untimed step (first-touch of buffers), then the timed steps.
  model.forward(std::span<const int32_t>(&next, 1), cache, logits.data(), false);
  next = argmax(logits.data(), cfg.vocab_size);
  cb.reset();
  t0 = now_s();
  const double c0 = process_cpu_s();
  for (int64_t i = 0; i < n_decode; ++i) {
    model.forward(std::span<const int32_t>(&next, 1), cache, logits.data(), false);
    next = argmax(logits.data(), cfg.vocab_size);
  }
  const double dt = now_s() - t0;
  r.decode_cpu_s = process_cpu_s() - c0;
  r.decode_s = dt;
  r.decode_tps = static_cast<double>(n_decode) / dt;
  r.weight_mb_per_tok = static_cast<double>(cb.weight_bytes_read) / static_cast<double>(n_decode) / 1e6;
  r.kv_mb_per_tok = static_cast<double>(cb.kv_bytes_read) / static_cast<double>(n_decode) / 1e6;
  r.gbs = static_cast<double>(cb.weight_bytes_read) / dt / 1e9;
  r.gflop_per_tok = cb.flops / static_cast<double>(n_decode) / 1e9;
  if (profile) print_profile(cb, static_cast<double>(n_decode), dt, "decode (per token)");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::vector<int> threads = {1, 2};
  std::vector<std::string> backends = {"cpu", "ref"};
  std::vector<int64_t> batches;
  int64_t n_prefill = 32, n_decode = 64, n_ref_decode = 4, ctx = 128, steps = 8;
  size_t mb = 512;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto positive = [&](const std::string& v) {
      const long long n = std::atoll(v.c_str());
      if (n <= 0) {
        std::fprintf(stderr, "decode_bench: %s wants positive integers, got '%s'\n", a.c_str(), v.c_str());
        std::exit(2);
      }
      return static_cast<int64_t>(n);
    };
    if (a == "--model")
      models.push_back(next());
    else if (a == "--threads") {
      threads.clear();
      for (const auto& s : split(next())) threads.push_back(static_cast<int>(positive(s)));
    } else if (a == "--backends")
      backends = split(next());
    else if (a == "--batch") {
      batches.clear();
      for (const auto& s : split(next())) batches.push_back(positive(s));
    } else if (a == "--prefill")
      n_prefill = positive(next());
    else if (a == "--decode")
      n_decode = positive(next());
    else if (a == "--ref-decode")
      n_ref_decode = positive(next());
    else if (a == "--ctx")
      ctx = std::max<int64_t>(0, std::atoll(next().c_str()));
    else if (a == "--steps")
      steps = positive(next());
    else if (a == "--mb")
      mb = static_cast<size_t>(positive(next()));
    else if (a == "--profile")
      profile = true;
    else {
      std::fprintf(stderr,
                   "usage: decode_bench --model DIR [--model DIR ...] [--threads 1,2] [--backends cpu,ref]\n"
                   "                    [--prefill N] [--decode N] [--ref-decode N] [--mb N] [--profile]\n"
                   "                    [--batch 1,4,16,64 [--ctx N] [--steps N]]\n");
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
      std::string short_name = dir;
      while (!short_name.empty() && short_name.back() == '/') short_name.pop_back();
      if (auto p = short_name.rfind('/'); p != std::string::npos) short_name = short_name.substr(p + 1);
      if (!batches.empty()) {
        // Batched decode steps (cpu backend), op by op.
        const ModelWeights W = resolve_weights(*f.cfg, *f.plan);
        touch_weights(W);
        std::printf("\n%-20s %3s %5s %10s %9s %9s %9s %10s %8s %7s %11s %6s\n", "model (batched step)", "thr",
                    "batch", "tok/s", "step ms", "wMB/step", "kvMB/step", "GFLOP/step", "GB/s", "%roof", "", "cpu%");
        for (int t : threads) {
          std::unique_ptr<Backend> be = make_backend("cpu", t);
          CountingBackend cb(*be, profile);
          for (int64_t B : batches) {
            const BatchResult r = run_batch(*f.cfg, W, cb, B, ctx, steps, profile);
            const char* bound = "";
            const double bytes = (r.weight_mb + r.kv_mb) * 1e6;
            const double fr = roofline_fraction(mach[t], bytes, r.gflop * 1e9, r.step_s, &bound);
            std::printf("%-20s %3d %5lld %10.1f %9.2f %9.2f %9.3f %10.3f %8.2f %6.1f%% (%s-bound) %5.0f%%\n",
                        short_name.c_str(), t, static_cast<long long>(B), r.tps, r.step_s * 1e3, r.weight_mb, r.kv_mb,
                        r.gflop, bytes / r.step_s / 1e9, 100.0 * fr, bound,
                        100.0 * r.cpu_s / (r.step_s * static_cast<double>(steps) * t));
            std::fflush(stdout);
          }
        }
        continue;
      }
      std::printf("\n%-22s %-4s %3s %10s %6s %10s %9s %8s %9s %8s %7s %7s %6s\n", "model", "be", "thr", "prefill/s",
                  "%roof", "decode/s", "wMB/tok", "kvMB/tok", "GFLOP/tok", "GB/s", "%bw", "%roof", "cpu%");
      for (const std::string& bname : backends) {
        for (int t : threads) {
          std::unique_ptr<Backend> be = make_backend(bname, t);
          CountingBackend cb(*be, profile);
          Model model(*f.cfg, *f.plan, cb);
          const int64_t nd = bname == "ref" ? n_ref_decode : n_decode;
          const Result r = run(model, cb, *f.cfg, n_prefill, nd, profile);
          const double dec_s = 1.0 / r.decode_tps;
          const double dec_roof = roofline_fraction(mach[t], (r.weight_mb_per_tok + r.kv_mb_per_tok) * 1e6,
                                                    r.gflop_per_tok * 1e9, dec_s, nullptr);
          const double pre_roof = roofline_fraction(mach[t], r.prefill_bytes, r.prefill_flops, r.prefill_s, nullptr);
          std::printf("%-22s %-4s %3d %10.1f %5.1f%% %10.2f %9.2f %8.3f %9.4f %8.2f %6.1f%% %6.1f%% %5.0f%%\n",
                      short_name.c_str(), bname.c_str(), t, r.prefill_tps, 100.0 * pre_roof, r.decode_tps,
                      r.weight_mb_per_tok, r.kv_mb_per_tok, r.gflop_per_tok, r.gbs, 100.0 * r.gbs / mach[t].bw_gbs,
                      100.0 * dec_roof, 100.0 * r.decode_cpu_s / (r.decode_s * t));
          std::fflush(stdout);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
