// decode_bench: prefill and decode throughput of a model directory through the engine's own step (Model::step over
// a paged KV cache, exactly what `latent serve` runs), against this machine's memory bandwidth and FMA peak probed
// in the same run.
//
//   decode_bench --model DIR [--model DIR2 ...] [--threads 1,2] [--ctx 0,512,4096] [--batch 1,16,64]
//                [--steps 16] [--prefill 512] [--activations fp32|bf16] [--backends cpu[,ref]] [--fill 4096]
//                [--max-kv-gb 8] [--profile] [--shapes] [--mb 512]
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
// --profile adds the time per op class and step (ms, and GFLOP/s where the op has FLOPs); --shapes (implies
// --profile) also per weight shape and format of the decode steps (matmuls, grouped matmuls, attention).
//
//   decode_bench --model DIR --speculative 0,1,2,3 --prompts FILE.json [--prompt-names heldout,long]
//                [--threads 1,2] [--max-tokens 64] [--rounds 5] [--profile]
//
// Speculative decoding with the checkpoint's MTP layer at batch 1: per thread count, first the step kinds timed
// at a context of 16 (median of 64 each): a decode step (1 row), a verify step of k + 1 rows and a draft step that
// fills k + 1 slots of the MTP layer and proposes k drafts (with --profile by op class and by weight shape); then
// the prompts of FILE.json ("items": [{"name", "prompt_ids"}], e.g. tests/golden/latent-demo/greedy.json; only
// the items whose name starts with one of --prompt-names) one request at a time through the scheduler (what
// `latent serve` runs), greedy to EOS or --max-tokens, for every k (k = 0: the model loaded without its MTP layer)
// in turn per prompt, in --rounds rounds. Columns: decode tok/s = tokens after each request's first / time from its
// first token to its last (median and range over the rounds), e2e tok/s = all tokens / request times (prefill
// included), x = over k = 0, steps, and the acceptance per draft position; a k whose output differs from k = 0 is
// an error (exit 1).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "counting_backend.h"
#include "fma_peak.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/generate.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/weights.h"
#include "read_bandwidth.h"
#include "runtime/collecting_sink.h"
#include "runtime/scheduler.h"
#include "server/model_engine.h"

namespace {

using namespace latent;
using bench::CountingBackend;
using bench::dtype_size;
using bench::kOpNames;
using bench::kOps;
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

// --shapes: the profile per weight shape and format (the counting wrapper's details), per step of n.
void print_shapes(const CountingBackend& cb, double n) {
  for (const auto& [key, d] : cb.details)
    std::printf("      %-52s %8.3f ms %5.1f calls %7.1f GFLOP/s\n", key.c_str(), d.time / n * 1e3,
                static_cast<double>(d.calls) / n, d.time > 0 ? d.flops / d.time / 1e9 : 0.0);
}

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
  if (profile && cb.detail) print_shapes(cb, n);
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

// ---------------------------------------------------------------------------------------------------------------
// Speculative decoding (--speculative K,..): the model's MTP layer drafts K tokens per step
// ---------------------------------------------------------------------------------------------------------------

// Prompts as token ids: a JSON file with "items": [{"name", "prompt_ids"}] (tests/golden/latent-demo/greedy.json).
struct BenchPrompt {
  std::string name;
  std::vector<int32_t> ids;
};

std::vector<BenchPrompt> read_prompts(const std::string& path, const std::string& prefixes) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  const nlohmann::json j = nlohmann::json::parse(f);
  const std::vector<std::string> want = split(prefixes);
  std::vector<BenchPrompt> out;
  for (const auto& it : j.at("items")) {
    BenchPrompt p;
    p.name = it.value("name", std::string());
    bool keep = want.empty();
    for (const auto& w : want) keep = keep || p.name.rfind(w, 0) == 0;
    if (!keep) continue;
    p.ids = it.at("prompt_ids").get<std::vector<int32_t>>();
    if (!p.ids.empty()) out.push_back(std::move(p));
  }
  if (out.empty()) throw std::runtime_error("no prompts in " + path);
  return out;
}

// One pass over the prompts, one request at a time (batch 1) through the scheduler, as `latent serve` runs them.
struct SpecRun {
  double e2e_s = 0, decode_s = 0;  // whole requests; from each request's first token to its last
  int64_t tokens = 0, decode_tokens = 0, steps = 0;
  std::vector<std::vector<int32_t>> outputs;
  std::vector<int64_t> proposed_at, accepted_at;
};

SpecRun run_spec_pass(server::ModelEngine& eng, int64_t k, std::span<const BenchPrompt> prompts, int64_t max_tokens,
                      const std::vector<int32_t>& stop_ids) {
  SchedulerOptions so;
  so.num_speculative_tokens = k;
  so.max_num_seqs = 1;
  so.prefix_cache = false;
  so.kv_block_tokens = kBlockTokens;
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.ids.size()));
  so.max_context = longest + max_tokens + 1;
  const int64_t blocks = (so.max_context + k + kBlockTokens) / kBlockTokens + 2;
  so.kv_total_blocks = eng.configure(blocks * kBlockTokens * eng.kv_bytes_per_token(), kBlockTokens,
                                     so.max_batch_tokens, 1, so.max_context);
  Scheduler sched(eng, so);
  sched.start();
  SpecRun r;
  for (const auto& p : prompts) {
    double t_first = 0, t_last = 0;
    auto sink = std::make_shared<CollectingSink>([&](int32_t) {
      t_last = now_s();
      if (t_first == 0) t_first = t_last;
    });
    GenerationRequest req;
    req.prompt = p.ids;
    req.max_tokens = max_tokens;
    req.sampling.temperature = 0.0f;
    req.stop_ids = stop_ids;
    req.sink = sink;
    const double t0 = now_s();
    sched.submit(std::move(req));
    if (!sink->wait()) throw std::runtime_error("generation aborted: " + sink->aborted);
    std::lock_guard lk(sink->mu);
    r.e2e_s += t_last - t0;
    r.decode_s += t_last - t_first;
    r.tokens += static_cast<int64_t>(sink->toks.size());
    r.decode_tokens += static_cast<int64_t>(sink->toks.size()) - 1;
    r.outputs.push_back(sink->toks);
  }
  sched.stop();  // joins the scheduler thread: the last verify's draft counts are in (they follow its tokens)
  const SchedulerStats st = sched.stats();
  r.steps = st.steps;
  r.proposed_at = st.spec_proposed_at;
  r.accepted_at = st.spec_accepted_at;
  return r;
}

// The step kinds of speculative decoding at batch 1 after a prompt of `ctx` tokens, each `reps` times, timed and
// (with --profile) by op: a decode step (1 row), a verify step of k + 1 rows (every row's logits) and a draft step
// that fills k + 1 slots of the MTP layer (all drafts accepted) and proposes k drafts.
void profile_spec_steps(server::ModelEngine& eng, CountingBackend& cb, int64_t k, int64_t ctx, int64_t reps,
                        bool profile) {
  const int64_t V = eng.vocab_size(), per = (ctx + 2 * reps * (k + 1) + 2 * k + 2 + kBlockTokens - 1) / kBlockTokens;
  eng.configure(per * kBlockTokens * eng.kv_bytes_per_token(), kBlockTokens, 512, 1, per * kBlockTokens);
  std::vector<int32_t> table(static_cast<size_t>(per));
  for (int64_t j = 0; j < per; ++j) table[static_cast<size_t>(j)] = static_cast<int32_t>(j);
  std::vector<int32_t> toks(static_cast<size_t>(std::max<int64_t>(ctx, k + 1)));
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 7 + 3) % V);
  std::vector<float> logits(static_cast<size_t>((k + 1) * V));
  std::vector<int32_t> drafts(static_cast<size_t>(k));
  auto step = [&](int64_t n, int64_t start, bool decode, bool all) {
    EngineStepItem it;
    it.seq = 0;
    it.tokens = std::span<const int32_t>(toks.data(), static_cast<size_t>(n));
    it.start = start;
    it.blocks = table;
    it.want_logits = true;
    it.all_logits = all;
    it.decode = decode;
    eng.step(std::span<const EngineStepItem>(&it, 1), logits.data());
  };
  auto draft = [&](int64_t start, int64_t slots) {
    EngineDraftItem d;
    d.seq = 0;
    d.start = start;
    d.tokens = std::span<const int32_t>(toks.data(), static_cast<size_t>(slots));
    d.hidden_row = 0;
    d.blocks = table;
    d.n_draft = static_cast<int32_t>(k);
    eng.draft(std::span<const EngineDraftItem>(&d, 1), drafts.data());
  };
  step(ctx, 0, false, false);
  draft(0, 1);  // warm up the MTP layer's buffers
  struct Kind {
    const char* name;
    std::vector<double> t;
    double mflop = 0, weight_mb = 0;  // summed over the reps (CountingBackend)
    std::array<double, kOps> op{};
    std::map<std::string, CountingBackend::Detail> det;
  };
  Kind kinds[3] = {{"decode step (1 row)", {}, 0, 0, {}, {}},
                   {"verify step (k+1 rows)", {}, 0, 0, {}, {}},
                   {"draft step (k+1 slots, k drafts)", {}, 0, 0, {}, {}}};
  int64_t pos = ctx;
  for (int64_t r = 0; r < reps; ++r) {
    for (int kind = 0; kind < 3; ++kind) {
      cb.reset();
      const double t0 = now_s();
      if (kind == 0) {
        step(1, pos, true, false);
      } else if (kind == 1) {
        step(k + 1, pos + 1, true, true);
      } else {
        draft(pos + 1, k + 1);
      }
      kinds[kind].t.push_back(now_s() - t0);
      kinds[kind].mflop += cb.flops / 1e6;
      kinds[kind].weight_mb += static_cast<double>(cb.weight_bytes_read) / 1e6;
      for (int o = 0; o < kOps; ++o) kinds[kind].op[static_cast<size_t>(o)] += cb.op_time[static_cast<size_t>(o)];
      for (const auto& [key, d] : cb.details) {
        auto& e = kinds[kind].det[key];
        e.time += d.time;
        e.calls += d.calls;
      }
    }
    pos += k + 2;
  }
  double med[3];
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<double> v = kinds[kind].t;
    std::sort(v.begin(), v.end());
    med[kind] = v[v.size() / 2];
  }
  std::printf(
      "    steps at batch 1, context %lld, median of %lld: decode %.3f ms, verify k+1=%lld %.3f ms (%.2fx), "
      "draft %.3f ms (%.2fx); verify+draft %.2fx a decode step\n",
      static_cast<long long>(ctx), static_cast<long long>(reps), med[0] * 1e3, static_cast<long long>(k + 1),
      med[1] * 1e3, med[1] / med[0], med[2] * 1e3, med[2] / med[0], (med[1] + med[2]) / med[0]);
  // The work each kind must do, counted (the same in every run): a floor of its cost where the step is bound by
  // arithmetic (the demo model's weights sit in the caches), weight bytes where it streams them.
  const double nr = static_cast<double>(reps);
  std::printf(
      "    work per step: decode %.2f MFLOP / %.2f MB of weights, verify %.2f / %.2f (%.2fx / %.2fx), draft "
      "%.2f / %.2f (%.2fx / %.2fx)\n",
      kinds[0].mflop / nr, kinds[0].weight_mb / nr, kinds[1].mflop / nr, kinds[1].weight_mb / nr,
      kinds[1].mflop / kinds[0].mflop, kinds[1].weight_mb / kinds[0].weight_mb, kinds[2].mflop / nr,
      kinds[2].weight_mb / nr, kinds[2].mflop / kinds[0].mflop, kinds[2].weight_mb / kinds[0].weight_mb);
  if (!profile) return;
  const double n = static_cast<double>(reps);
  for (const Kind& kd : kinds) {
    std::printf("      %s, ms by op:", kd.name);
    double tot = 0;
    for (int o = 0; o < kOps; ++o) {
      const double t = kd.op[static_cast<size_t>(o)];
      if (t <= 0) continue;
      tot += t;
      std::printf(" %s %.4f;", kOpNames[o], t * 1e3 / n);
    }
    double wall = 0;
    for (double t : kd.t) wall += t;
    std::printf(" ops %.3f of %.3f\n", tot * 1e3 / n, wall * 1e3 / n);
    std::vector<std::pair<double, std::string>> top;
    for (const auto& [key, d] : kd.det) top.emplace_back(d.time, key);
    std::sort(top.rbegin(), top.rend());
    for (size_t i = 0; i < top.size() && i < 16; ++i)
      std::printf("        %-60s %.4f ms %5.1f calls\n", top[i].second.c_str(), top[i].first * 1e3 / n,
                  double(kd.det.at(top[i].second).calls) / n);
  }
}

struct SpecAgg {
  std::vector<double> decode_tps, e2e_tps;
  SpecRun last;
};

std::string per_position(const SpecRun& r) {
  std::string s;
  for (size_t j = 0; j < r.proposed_at.size(); ++j) {
    char b[32];
    std::snprintf(b, sizeof(b), "%s%.3f", j ? " " : "",
                  r.proposed_at[j] ? double(r.accepted_at[j]) / double(r.proposed_at[j]) : 0.0);
    s += b;
  }
  return s.empty() ? "-" : s;
}

int run_speculative(const std::string& dir, const std::vector<int>& threads, const std::vector<int64_t>& ks,
                    const std::string& prompts_path, const std::string& prompt_names, int64_t max_tokens,
                    int64_t rounds, bool bf16, bool profile) {
  const std::vector<BenchPrompt> prompts = read_prompts(prompts_path, prompt_names);
  int64_t kmax = 0;
  for (int64_t k : ks) kmax = std::max(kmax, k);
  PlanOptions po;
  po.mtp_layers = kmax > 0 ? 1 : 0;
  ModelFiles f = open_model_files(dir, po);
  ModelOptions mo;
  mo.bf16_activations = bf16;
  std::vector<int32_t> stop_ids(f.cfg->eos_token_ids.begin(), f.cfg->eos_token_ids.end());
  std::printf(
      "\n%s: speculative decoding at batch 1, %zu prompts of %s (greedy, up to %lld new tokens, to EOS), "
      "%lld interleaved rounds; activations %s\n",
      dir.c_str(), prompts.size(), prompts_path.c_str(), static_cast<long long>(max_tokens),
      static_cast<long long>(rounds), bf16 ? "bf16" : "fp32");
  for (int t : threads) {
    std::unique_ptr<Backend> be = make_backend("cpu", t);
    CountingBackend cb(*be, profile);
    cb.detail = profile;
    // k = 0 runs the model without its MTP layer (speculation off), k > 0 with it.
    Model plain(*f.cfg, *f.plan, *be, mo);
    ModelOptions mo_mtp = mo;
    mo_mtp.mtp_layers = 1;
    std::unique_ptr<Model> mtp = kmax > 0 ? std::make_unique<Model>(*f.cfg, *f.plan, *be, mo_mtp) : nullptr;
    touch_weights(plain.weights());
    server::ModelEngine eng_plain(plain);
    std::unique_ptr<server::ModelEngine> eng_mtp = mtp ? std::make_unique<server::ModelEngine>(*mtp) : nullptr;
    if (mtp) {
      Model prof(*f.cfg, *f.plan, cb, mo_mtp);
      server::ModelEngine eng_prof(prof);
      for (int64_t k : ks)
        if (k > 0) {
          std::printf("  thr %d, k = %lld:\n", t, static_cast<long long>(k));
          profile_spec_steps(eng_prof, cb, k, 16, 64, profile);
        }
    }
    // Interleaved per prompt (every k runs prompt i before any runs prompt i + 1), so that the machine's slower
    // and faster moments fall on every k alike.
    std::map<int64_t, SpecAgg> agg;
    for (int64_t round = 0; round < rounds; ++round) {
      std::map<int64_t, SpecRun> runs;
      for (size_t i = 0; i < prompts.size(); ++i)
        for (int64_t k : ks) {
          const SpecRun r = run_spec_pass(k > 0 ? *eng_mtp : eng_plain, k, std::span<const BenchPrompt>(&prompts[i], 1),
                                          max_tokens, stop_ids);
          SpecRun& acc = runs[k];
          acc.e2e_s += r.e2e_s;
          acc.decode_s += r.decode_s;
          acc.tokens += r.tokens;
          acc.decode_tokens += r.decode_tokens;
          acc.steps += r.steps;
          acc.outputs.insert(acc.outputs.end(), r.outputs.begin(), r.outputs.end());
          acc.proposed_at.resize(std::max(acc.proposed_at.size(), r.proposed_at.size()), 0);
          acc.accepted_at.resize(std::max(acc.accepted_at.size(), r.accepted_at.size()), 0);
          for (size_t j = 0; j < r.proposed_at.size(); ++j) acc.proposed_at[j] += r.proposed_at[j];
          for (size_t j = 0; j < r.accepted_at.size(); ++j) acc.accepted_at[j] += r.accepted_at[j];
        }
      for (auto& [k, r] : runs) {
        SpecAgg& a = agg[k];
        a.decode_tps.push_back(static_cast<double>(r.decode_tokens) / r.decode_s);
        a.e2e_tps.push_back(static_cast<double>(r.tokens) / r.e2e_s);
        a.last = std::move(r);
      }
    }
    const SpecAgg* base = agg.count(0) ? &agg[0] : nullptr;
    std::printf("  %3s %2s %8s %19s %19s %7s %7s %9s  %s\n", "thr", "k", "tokens", "decode tok/s", "e2e tok/s", "x dec",
                "x e2e", "steps", "acceptance per position");
    for (int64_t k : ks) {
      const SpecAgg& a = agg[k];
      auto mm = [](const std::vector<double>& v) {
        return std::make_pair(*std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
      };
      auto med = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const auto [dlo, dhi] = mm(a.decode_tps);
      const auto [elo, ehi] = mm(a.e2e_tps);
      char xd[16] = "-", xe[16] = "-";
      if (base && k > 0) {
        std::snprintf(xd, sizeof(xd), "%.2f", med(a.decode_tps) / med(base->decode_tps));
        std::snprintf(xe, sizeof(xe), "%.2f", med(a.e2e_tps) / med(base->e2e_tps));
      }
      const bool same = !base || a.last.outputs == base->last.outputs;
      std::printf("  %3d %2lld %8lld %8.0f (%4.0f-%4.0f) %8.0f (%4.0f-%4.0f) %7s %7s %9lld  %s%s\n", t,
                  static_cast<long long>(k), static_cast<long long>(a.last.tokens), med(a.decode_tps), dlo, dhi,
                  med(a.e2e_tps), elo, ehi, xd, xe, static_cast<long long>(a.last.steps), per_position(a.last).c_str(),
                  same ? "" : "  OUTPUT DIFFERS FROM k = 0");
      if (!same) return 1;
    }
  }
  return 0;
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
  bool profile = false, bf16 = false, shapes = false;
  std::vector<int64_t> spec_ks;
  std::string prompts_path, prompt_names;
  int64_t spec_max_tokens = 64, rounds = 5;
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
    } else if (a == "--shapes") {
      profile = shapes = true;
    } else if (a == "--speculative") {
      spec_ks = list(0);
    } else if (a == "--prompts") {
      prompts_path = next();
    } else if (a == "--prompt-names") {
      prompt_names = next();
    } else if (a == "--max-tokens") {
      spec_max_tokens = number(next(), 1);
    } else if (a == "--rounds") {
      rounds = number(next(), 1);
    } else {
      std::fprintf(stderr,
                   "usage: decode_bench --model DIR [--model DIR ...] [--threads 1,2] [--ctx 0,512,4096]\n"
                   "                    [--batch 1,16,64] [--steps 16] [--prefill 512] [--activations fp32|bf16]\n"
                   "                    [--backends cpu[,ref]] [--fill 4096] [--max-kv-gb 8] [--profile] [--shapes]\n"
                   "                    [--mb 512]\n"
                   "       decode_bench --model DIR --speculative 0,1,2,3 --prompts FILE.json [--prompt-names P,..]\n"
                   "                    [--threads 1,2] [--max-tokens 64] [--rounds 5] [--activations fp32|bf16]\n"
                   "                    [--profile]\n");
      return 2;
    }
  }
  if (models.empty()) {
    std::fprintf(stderr, "decode_bench: --model DIR is required (see bench/README.md to make the bench models)\n");
    return 2;
  }
  const CpuIsa isa = cpu_isa_default();
  std::printf("cpu backend ISA: %s\n", cpu_isa_name(isa));
  if (!spec_ks.empty()) {
    if (prompts_path.empty()) {
      std::fprintf(stderr, "decode_bench: --speculative needs --prompts FILE.json\n");
      return 2;
    }
    try {
      for (const std::string& dir : models)
        if (int rc = run_speculative(dir, threads, spec_ks, prompts_path, prompt_names, spec_max_tokens, rounds, bf16,
                                     profile))
          return rc;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "decode_bench: %s\n", e.what());
      return 1;
    }
    return 0;
  }
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
          cb.detail = shapes;
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
