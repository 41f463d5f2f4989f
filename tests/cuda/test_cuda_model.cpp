// Model-level checks of the CUDA backend on the tiny models (tests/models) against the transformers fixtures
// (tests/golden): fp32 mode prefill logits and prefill-16-then-cached-decode logits within 1e-4 · max|logit|, and
// the greedy continuation; bf16 mode against the ref backend's bf16 emulation (on the tiny models every clearly
// decided row, on the demo model ≥ 99 % top-1; relative errors printed). The repository root is $LATENT_REPO
// (scripts/gpu_test sets it) or the source tree this was built from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/npy.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/model.h"
#include "runtime/sampler.h"

namespace latent {
namespace {

namespace fs = std::filesystem;

std::string repo() {
  const char* r = std::getenv("LATENT_REPO");
  return r ? r : LATENT_SOURCE_DIR;
}

struct Loaded {
  ModelFiles files;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};
std::unique_ptr<Loaded> load(const std::string& name, const std::string& backend, bool bf16) {
  auto l = std::make_unique<Loaded>();
  l->files = open_model_files(repo() + "/tests/models/" + name);
  l->backend = make_backend(backend, 2);
  ModelOptions o;
  o.bf16_activations = bf16;
  l->model = std::make_unique<Model>(*l->files.cfg, *l->files.plan, *l->backend, o);
  return l;
}

std::vector<int32_t> read_tokens(const std::string& path) {
  std::ifstream f(path);
  const auto j = nlohmann::json::parse(f);
  const auto& arr = j.is_array() ? j : j.at("tokens");
  std::vector<int32_t> ids;
  for (const auto& v : arr) ids.push_back(v.get<int32_t>());
  return ids;
}

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float v : a) m = std::max(m, std::fabs(static_cast<double>(v)));
  return m;
}
double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

class CudaModel : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModel, Fp32MatchesTransformers) {
  const std::string name = GetParam(), gold = repo() + "/tests/golden/" + name;
  const std::vector<int32_t> ids = read_tokens(gold + "/tokens.json");
  const NpyArray ref = read_npy(gold + "/logits.npy");
  auto m = load(name, "cuda", false);
  const int64_t V = m->model->config().vocab_size;
  const size_t T = ids.size();
  ASSERT_EQ(ref.f32.size(), T * static_cast<size_t>(V));
  const std::vector<float> lg = m->model->logits(ids);
  const double scale = max_abs(ref.f32), d = max_abs_diff(lg.data(), ref.f32.data(), lg.size());
  // Prefill of 16 tokens, then one cached decode step at a time (absorbed attention over the paged cache).
  std::vector<float> dec(T * static_cast<size_t>(V));
  KvCache cache(m->model->config());
  m->model->forward(std::span<const int32_t>(ids.data(), 16), cache, dec.data(), true);
  for (size_t t = 16; t < T; ++t)
    m->model->forward(std::span<const int32_t>(ids.data() + t, 1), cache, dec.data() + t * V, true);
  const double dd = max_abs_diff(dec.data(), ref.f32.data(), dec.size());
  std::printf("[cuda model] %-16s fp32 prefill vs HF max|d| %.3e, prefill 16 + decode %.3e (max|logit| %.3f)\n",
              name.c_str(), d, dd, scale);
  EXPECT_LE(d, 1e-4 * scale);
  EXPECT_LE(dd, 1e-4 * scale);
  // Greedy continuation (EOS disabled), as in greedy.json.
  const std::string gp = gold + "/greedy.json";
  if (fs::exists(gp)) {
    std::ifstream f(gp);
    const auto g = nlohmann::json::parse(f);
    std::vector<int32_t> seq(ids.begin(), ids.begin() + 8), want;
    for (const auto& v : g.at("generated")) want.push_back(v.get<int32_t>());
    KvCache gc(m->model->config());
    std::vector<float> row(static_cast<size_t>(V));
    m->model->forward(seq, gc, row.data(), false);
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      got.push_back(next);
      m->model->forward(std::span<const int32_t>(&next, 1), gc, row.data(), false);
    }
    EXPECT_EQ(got, want) << name << " greedy";
  }
}

// ModelOptions::naive_max_context: prompt rows past the limit take the absorbed form (the CUDA MLA decode block
// with many rows per sequence). fp32: one 70-token chunk and chunks of 10 + 30 + 30 equal the CPU backend's run
// within 1e-4 · max|logit|.
TEST_P(CudaModel, PromptRowsPastTheNaiveLimitTakeTheAbsorbedForm) {
  const std::string name = GetParam();
  ModelFiles files = open_model_files(repo() + "/tests/models/" + name);
  ModelOptions o;
  o.naive_max_context = 24;
  const int64_t V = files.cfg->vocab_size, len = 70;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < len; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 13) % V));
  auto run = [&](const std::string& backend, const std::vector<int64_t>& chunks) {
    std::unique_ptr<Backend> be = make_backend(backend, 2);
    Model m(*files.cfg, *files.plan, *be, o);
    KvCache cache(m.config());
    std::vector<float> lg(static_cast<size_t>(len * V));
    int64_t at = 0;
    for (int64_t n : chunks) {
      m.forward(std::span<const int32_t>(ids.data() + at, static_cast<size_t>(n)), cache, lg.data() + at * V, true);
      at += n;
    }
    return lg;
  };
  const std::vector<float> want = run("cpu", {len});
  const double scale = max_abs(want);
  for (const auto& chunks : {std::vector<int64_t>{len}, std::vector<int64_t>{10, 30, 30}}) {
    const std::vector<float> got = run("cuda", chunks);
    const double d = max_abs_diff(got.data(), want.data(), want.size());
    std::printf("[cuda model] %-16s fp32 naive limit 24, %zu chunk(s) of 70 tokens vs the CPU backend: max|d| %.3e\n",
                name.c_str(), chunks.size(), d);
    EXPECT_LE(d, 1e-4 * scale) << chunks.size() << " chunk(s)";
  }
}

// bf16 mode against the ref backend's bf16 emulation on a tiny random model. The CUDA kernels sum in another
// order (cuBLASLt tiles for M > 16, split reductions), so bf16-rounded activations differ by an ulp here and there
// and rows whose two best logits are a near-tie may swap: the tiny random models are full of those. Required: the
// same top-1 on every row the reference decides clearly (best − second ≥ 5 % of the row's max |logit|, far above
// the bf16 noise), ≥ 90 % of all rows, and an RMS relative error ≤ 5e-2 (bf16 keeps 8 bits: 3.9e-3 per rounding,
// compounded over the layers). The demo model below is docs/cuda.md §testing's criterion (top-1 ≥ 99 %).
TEST_P(CudaModel, Bf16MatchesRefEmulation) {
  const std::string name = GetParam(), gold = repo() + "/tests/golden/" + name;
  const std::vector<int32_t> ids = read_tokens(gold + "/tokens.json");
  auto g = load(name, "cuda", true);
  auto r = load(name, "ref", true);
  const int64_t V = g->model->config().vocab_size;
  const std::vector<float> lg = g->model->logits(ids), lr = r->model->logits(ids);
  ASSERT_EQ(lg.size(), lr.size());
  size_t agree = 0, decided = 0, decided_agree = 0;
  const size_t T = ids.size();
  for (size_t t = 0; t < T; ++t) {
    const float* a = lg.data() + t * V;
    const float* b = lr.data() + t * V;
    const int64_t ta = std::max_element(a, a + V) - a, tb = std::max_element(b, b + V) - b;
    float second = -INFINITY, row_max = 0.0f;
    for (int64_t v = 0; v < V; ++v) {
      if (v != tb) second = std::max(second, b[v]);
      row_max = std::max(row_max, std::fabs(b[v]));
    }
    const bool clear = b[tb] - second >= 0.05f * row_max;
    agree += ta == tb;
    decided += clear;
    decided_agree += clear && ta == tb;
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < lg.size(); ++i) {
    num += (static_cast<double>(lg[i]) - lr[i]) * (static_cast<double>(lg[i]) - lr[i]);
    den += static_cast<double>(lr[i]) * lr[i];
  }
  const double rel = std::sqrt(num / den), top1 = static_cast<double>(agree) / static_cast<double>(T);
  std::printf(
      "[cuda model] %-16s bf16 vs ref bf16 emulation: top-1 %.1f %% of %zu rows (%zu of %zu clearly "
      "decided rows), relative error %.3e\n",
      name.c_str(), 100.0 * top1, T, decided_agree, decided, rel);
  EXPECT_FALSE(std::isnan(rel));
  EXPECT_EQ(decided_agree, decided) << name << ": a clearly decided row changed its top-1";
  EXPECT_GE(top1, 0.90);
  EXPECT_LE(rel, 5e-2);
}

// The bf16 criterion of docs/cuda.md §testing on the trained demo model (models/latent-demo, MXFP4 experts): CUDA bf16
// against the ref backend's bf16 emulation over 8 fixture conversations (prompt + transformers' greedy
// continuation, one prefill each): top-1 ≥ 99 % of the rows; the relative error of every layer's hidden state is
// printed.
TEST(CudaDemoModel, Bf16MatchesRefEmulationTop1) {
  const std::string dir = repo() + "/models/latent-demo";
  if (!fs::exists(dir + "/model.safetensors")) GTEST_FAIL() << "demo model missing at " << dir;
  std::ifstream f(repo() + "/tests/golden/latent-demo/greedy.json");
  const auto fx = nlohmann::json::parse(f);
  ModelFiles files = open_model_files(dir);
  std::unique_ptr<Backend> bg = make_backend("cuda", 2), br = make_backend("ref", 16);
  ModelOptions o;
  o.bf16_activations = true;
  Model mg(*files.cfg, *files.plan, *bg, o), mr(*files.cfg, *files.plan, *br, o);
  const int64_t V = files.cfg->vocab_size, L = files.cfg->num_hidden_layers, D = files.cfg->hidden_size;
  size_t rows = 0, agree = 0;
  std::vector<double> num(static_cast<size_t>(L + 1), 0.0), den(static_cast<size_t>(L + 1), 0.0);
  const size_t n_items = std::min<size_t>(8, fx.at("items").size());
  for (size_t k = 0; k < n_items; ++k) {
    const auto& it = fx.at("items")[k];
    std::vector<int32_t> ids = it.at("prompt_ids").get<std::vector<int32_t>>();
    for (int32_t t : it.at("generated_ids").get<std::vector<int32_t>>()) ids.push_back(t);
    const int64_t S = static_cast<int64_t>(ids.size());
    KvCache cg(*files.cfg), cr(*files.cfg);
    std::vector<float> lg(static_cast<size_t>(S * V)), lr(lg.size()), hg, hr;
    mg.forward(ids, cg, lg.data(), true, &hg);
    mr.forward(ids, cr, lr.data(), true, &hr);
    for (int64_t t = 0; t < S; ++t) {
      const float* a = lg.data() + t * V;
      const float* b = lr.data() + t * V;
      agree += (std::max_element(a, a + V) - a) == (std::max_element(b, b + V) - b);
      ++rows;
    }
    for (int64_t l = 0; l <= L; ++l)
      for (int64_t i = 0; i < S * D; ++i) {
        const double x = hg[static_cast<size_t>((l * S) * D + i)], y = hr[static_cast<size_t>((l * S) * D + i)];
        num[static_cast<size_t>(l)] += (x - y) * (x - y);
        den[static_cast<size_t>(l)] += y * y;
      }
  }
  std::printf(
      "[cuda model] latent-demo bf16 vs ref bf16 emulation: top-1 %.1f %% of %zu rows; hidden-state "
      "relative error per layer:",
      100.0 * static_cast<double>(agree) / static_cast<double>(rows), rows);
  for (int64_t l = 0; l <= L; ++l)
    std::printf(" %s%lld %.2e", l == L ? "final-norm/" : "", static_cast<long long>(l),
                std::sqrt(num[static_cast<size_t>(l)] / std::max(den[static_cast<size_t>(l)], 1e-300)));
  std::printf("\n");
  EXPECT_GE(static_cast<double>(agree), 0.99 * static_cast<double>(rows));
}

// Decode steps in CUDA graphs (captured per bucketed batch size, replayed with the metadata uploaded into the same
// buffers) give the eager steps' logits bit for bit: batches of 1, 3 (padded to 4), 8, 16 and 20 sequences of
// different lengths over one paged pool, 6 decode steps each (the first captures, the rest replay), both activation
// modes; on the DSA models the sequences cross index_topk, so the graphs with the indexer's selection are covered.
// (The model in dir.)
void graphs_equal_eager(const std::string& dir, const std::string& name) {
  for (bool bf16 : {false, true}) {
    ModelFiles files = open_model_files(dir);
    std::unique_ptr<Backend> be = make_backend("cuda", 1);
    ModelOptions og, oe;
    og.bf16_activations = oe.bf16_activations = bf16;
    og.graphs = true;
    oe.graphs = false;
    Model mg(*files.cfg, *files.plan, *be, og), me(*files.cfg, *files.plan, *be, oe);
    const ModelConfig& cfg = mg.config();
    const int64_t V = cfg.vocab_size, bt = 16, per_seq = 4;  // 4 blocks (64 tokens) per sequence
    for (Model* m : {&mg, &me}) m->reserve(64, 32, per_seq * bt, per_seq);
    int64_t kernels1 = 0;
    for (int64_t n : {1, 3, 8, 16, 20}) {
      PagedKvCache cg(cfg, *be, 24 * per_seq, bt, mg.cache_dtype()), ce(cfg, *be, 24 * per_seq, bt, me.cache_dtype());
      std::vector<std::vector<int32_t>> blocks(static_cast<size_t>(n));
      std::vector<int32_t> tokens;
      std::vector<StepSequence> seqs(static_cast<size_t>(n));
      for (int64_t s = 0; s < n; ++s) {
        for (int64_t j = 0; j < per_seq; ++j) blocks[s].push_back(static_cast<int32_t>((n - 1 - s) * per_seq + j));
        const int64_t len = 3 + (s * 5) % 17;
        for (int64_t t = 0; t < len; ++t) tokens.push_back(static_cast<int32_t>((s * 131 + t * 17 + 7) % V));
        seqs[s].start = 0;
        seqs[s].n_tokens = len;
        seqs[s].blocks = blocks[s];
        seqs[s].logits = LogitRows::Last;
      }
      std::vector<float> lg(static_cast<size_t>(n * V)), le(lg.size());
      mg.step(Step{tokens, seqs}, cg, lg.data());
      me.step(Step{tokens, seqs}, ce, le.data());
      ASSERT_EQ(0, std::memcmp(lg.data(), le.data(), lg.size() * sizeof(float))) << "prefill, n " << n;
      const int64_t replays0 = mg.graph_replays(), captures0 = mg.graph_captures();
      for (int step = 0; step < 6; ++step) {
        tokens.assign(static_cast<size_t>(n), 0);
        for (int64_t s = 0; s < n; ++s) {
          const float* row = le.data() + s * V;
          tokens[s] = static_cast<int32_t>(std::max_element(row, row + V) - row);
          seqs[s].start += seqs[s].n_tokens;
          seqs[s].n_tokens = 1;
          seqs[s].decode = true;
        }
        std::fill(lg.begin(), lg.end(), std::nanf(""));
        mg.step(Step{tokens, seqs}, cg, lg.data());
        me.step(Step{tokens, seqs}, ce, le.data());
        ASSERT_EQ(0, std::memcmp(lg.data(), le.data(), lg.size() * sizeof(float)))
            << name << (bf16 ? " bf16" : " fp32") << ": graph logits differ from eager, batch " << n << ", decode step "
            << step << ", max|d| " << max_abs_diff(lg.data(), le.data(), lg.size());
      }
      // A new pool: captured once for this batch's bucket (twice on a DSA model whose sequences pass index_topk
      // during the steps: dense, then with the selection), replayed for the other steps.
      const int64_t caps = mg.graph_captures() - captures0;
      EXPECT_TRUE(caps == 1 || (caps == 2 && cfg.has_indexer())) << "batch " << n << ": " << caps << " captures";
      EXPECT_EQ(mg.graph_replays() - replays0 + caps, 6) << "batch " << n;
      EXPECT_GT(mg.graph_kernels(decode_graph_bucket(n)), 0);
      if (n == 1) kernels1 = mg.graph_kernels(1);
      EXPECT_EQ(me.graph_replays(), 0);
    }
    std::printf(
        "[cuda model] %-16s %s graphs = eager bit for bit at batch 1/3/8/16/20 over 6 steps: %lld captures, %lld "
        "replays, "
        "%lld kernels per batch-1 decode step (%lld layers)\n",
        name.c_str(), bf16 ? "bf16" : "fp32", static_cast<long long>(mg.graph_captures()),
        static_cast<long long>(mg.graph_replays()), static_cast<long long>(kernels1),
        static_cast<long long>(cfg.num_hidden_layers));
  }
}

TEST_P(CudaModel, GraphsEqualEagerBitForBit) { graphs_equal_eager(repo() + "/tests/models/" + GetParam(), GetParam()); }

// The demo model (kv_lora_rank 64) takes the bf16 MLA decode kernel that the tiny models (32) do not: its key splits
// come from the reserved context in both an eager step and a graph replay (StepSeqs::split_ctx), so the two agree
// bit for bit there too.
TEST(CudaDemoModel, GraphsEqualEagerBitForBit) { graphs_equal_eager(repo() + "/models/latent-demo", "latent-demo"); }

// --activations declared in the bf16 mode on the tiny block-FP8 DeepSeek-V3 model: the declared linears run the FP8 x
// FP8 cuBLASLt GEMM (counted); with the GEMM off the CUDA composition equals the ref backend's declared bf16
// emulation. The GEMM's logits cannot be held to a tight band here: each call is within ~1e-3 of the composition
// (CudaDispatch.MatmulActFp8, down to these shapes), but a different fp32 summation order moves a bf16 rounding, which
// moves an FP8 rounding of the next linear's input (an e4m3 step is 6-12 %), and this random 64-wide model amplifies
// that: measured on an H100, the declared route is 0.37 (relative RMS of the logits) away from the exact route, and
// the GEMM 0.40 from the exact route and 0.41 from the composition. What must hold: the GEMM's distance from the
// exact route is that of the declared scheme itself, not more.
TEST(CudaActDeclared, Bf16RunsTheFp8GemmNearTheRef) {
  const std::vector<int32_t> ids = {5, 17, 200, 3, 99, 42, 7, 130, 64, 255, 12, 8, 77, 150, 31, 2, 180, 90, 11, 45};
  const auto load = [](const std::string& backend, bool declared) {
    auto l = std::make_unique<Loaded>();
    l->files = open_model_files(repo() + "/tests/models/v3-tiny-fp8");
    l->backend = make_backend(backend, 2);
    ModelOptions o;
    o.bf16_activations = true;
    o.act_fp8_declared = declared;
    l->model = std::make_unique<Model>(*l->files.cfg, *l->files.plan, *l->backend, o);
    return l;
  };
  auto g = load("cuda", true), r = load("ref", true), x = load("cuda", false);
  ASSERT_TRUE(g->files.plan->act_fp8_declared());
  const int64_t V = g->model->config().vocab_size;
  const int64_t n0 = cuda_fp8_gemm_calls(*g->backend);
  const std::vector<float> lg = g->model->logits(ids), lr = r->model->logits(ids), lx = x->model->logits(ids);
  EXPECT_GT(cuda_fp8_gemm_calls(*g->backend), n0) << "no declared linear took the FP8 x FP8 GEMM";
  cuda_set_fp8_gemm_rows(*g->backend, 0);
  const int64_t n1 = cuda_fp8_gemm_calls(*g->backend);
  const std::vector<float> lc = g->model->logits(ids);
  EXPECT_EQ(cuda_fp8_gemm_calls(*g->backend), n1);
  cuda_set_fp8_gemm_rows(*g->backend, 1);
  const auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      den += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(num / den);
  };
  const auto top1 = [&](const std::vector<float>& a, const std::vector<float>& b) {
    size_t same = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* pa = a.data() + t * static_cast<size_t>(V);
      const float* pb = b.data() + t * static_cast<size_t>(V);
      same += std::max_element(pa, pa + V) - pa == std::max_element(pb, pb + V) - pb;
    }
    return static_cast<double>(same) / static_cast<double>(ids.size());
  };
  const double e_gx = rel(lg, lx), e_cx = rel(lc, lx), e_cr = rel(lc, lr);
  std::printf(
      "[cuda model] v3-tiny-fp8 bf16, 20 tokens, relative RMS of the logits (top-1 agreement): declared on the FP8 "
      "GEMM vs the exact route %.4f (%.2f); declared composition vs the exact route %.4f (%.2f); GEMM vs "
      "composition %.4f (%.2f); composition vs the ref emulation %.2e\n",
      e_gx, top1(lg, lx), e_cx, top1(lc, lx), rel(lg, lc), top1(lg, lc), e_cr);
  EXPECT_LT(e_cr, 1e-3) << "the CUDA composition left the ref backend's declared emulation";
  EXPECT_LE(e_gx, 1.25 * e_cx + 0.05) << "the FP8 GEMM moved the logits further from the exact route than the "
                                         "declared scheme does";
  EXPECT_GE(top1(lg, lx), top1(lc, lx) - 0.2);
}

// A decode graph recorded the backend's op scratch (DSA top-k, grouped matmul); a later eager step that needs more
// (a long prompt of another sequence) grows it. The graph must keep working on the buffer it recorded: replays
// after the growth equal the eager model bit for bit (run under compute-sanitizer memcheck by scripts/gpu_test
// --memcheck, a freed buffer would be reported).
TEST(CudaGraphs, ScratchGrownAfterCaptureKeepsTheGraphValid) {
  ModelFiles files = open_model_files(repo() + "/tests/models/glm5-tiny");
  std::unique_ptr<Backend> be = make_backend("cuda", 1);
  ModelOptions og, oe;
  og.graphs = true;
  oe.graphs = false;
  Model mg(*files.cfg, *files.plan, *be, og), me(*files.cfg, *files.plan, *be, oe);
  const ModelConfig& cfg = mg.config();
  ASSERT_TRUE(cfg.has_indexer());
  const int64_t V = cfg.vocab_size, bt = 16, per_seq = 16;  // 256 tokens per sequence
  for (Model* m : {&mg, &me}) m->reserve(256, 4, per_seq * bt, per_seq);
  PagedKvCache cg(cfg, *be, 2 * per_seq, bt, mg.cache_dtype()), ce(cfg, *be, 2 * per_seq, bt, me.cache_dtype());
  std::vector<int32_t> ba, bb;
  for (int32_t j = 0; j < per_seq; ++j) {
    ba.push_back(j);
    bb.push_back(static_cast<int32_t>(per_seq + j));
  }
  std::vector<float> lg(static_cast<size_t>(V)), le(lg.size());
  StepSequence a{0, 20, ba, LogitRows::Last, false};
  std::vector<int32_t> tokens;
  for (int t = 0; t < 20; ++t) tokens.push_back((t * 37 + 5) % static_cast<int32_t>(V));
  auto both = [&](const std::vector<int32_t>& tk, const StepSequence& q) {
    const Step st{tk, std::span<const StepSequence>(&q, 1)};
    mg.step(st, cg, lg.data());
    me.step(st, ce, le.data());
  };
  both(tokens, a);
  auto decode_a = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(le.begin(), le.end()) - le.begin());
      a.start += a.n_tokens;
      a.n_tokens = 1;
      a.decode = true;
      both({next}, a);
      ASSERT_EQ(0, std::memcmp(lg.data(), le.data(), lg.size() * sizeof(float)))
          << "decode step of A, start " << a.start;
    }
  };
  decode_a(3);  // the first captures the batch-1 graph(s), the rest replay
  const int64_t captures = mg.graph_captures();
  ASSERT_GT(captures, 0);
  // A 100-token prompt of sequence B (the tiny models hold 128 positions): a larger top-k selection and more
  // grouped rows than the 20-token prompt or any decode step, so the op scratch grows while the graphs are live.
  std::vector<int32_t> pb;
  for (int t = 0; t < 100; ++t) pb.push_back((t * 53 + 11) % static_cast<int32_t>(V));
  both(pb, StepSequence{0, 100, bb, LogitRows::Last, false});
  ASSERT_EQ(0, std::memcmp(lg.data(), le.data(), lg.size() * sizeof(float))) << "prefill of B";
  const int64_t replays = mg.graph_replays();
  decode_a(4);
  EXPECT_EQ(mg.graph_captures(), captures) << "the graphs were recaptured (the test would not test the old ones)";
  EXPECT_EQ(mg.graph_replays(), replays + 4);
}

std::vector<std::string> models() {
  std::vector<std::string> v;
  for (const char* n : {"glm5-tiny", "glm5-tiny-b", "glm5-tiny-mxfp4", "v3-tiny", "v3-tiny-fp8", "v32-tiny"})
    v.push_back(n);
  return v;
}
std::string param_name(const ::testing::TestParamInfo<std::string>& i) {
  std::string s = i.param;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}
INSTANTIATE_TEST_SUITE_P(Tiny, CudaModel, ::testing::ValuesIn(models()), param_name);

// DSA around and far past index_topk (2048, as GLM-5 and DeepSeek-V3.2 ship it) on the two tiny DSA models, fp32,
// prompts of 2,047 / 2,048 / 2,049 / 3,000 / 9,000 tokens prefilled in chunks of 1,024 (9,000 also takes the rows
// past naive_max_context into the absorbed form), against the CPU backend (itself held to the ref backend by the op
// harness): with the CPU run's selections and routing replayed, every logit within 1e-4 · max|logit|; left free, the
// same key set on at least 97 % of the rows. Not all: a row swaps its 2,048th and 2,049th keys when their scores tie
// to fp32 rounding (the indexer's inputs come out of matmuls that sum in another order), and a swapped row's hidden
// state then differs in every later layer and in the keys later rows read, so the swaps spread through the layers
// (measured on an H100, 2026-12-06: 99.8-99.9 % of the rows at 3,000 tokens, 98.7-98.8 % at 9,000; the free logits
// then differ by up to 0.03 / 0.95 of max|logit| 4.3 / 3.8 at 9,000 tokens on glm5-tiny / v32-tiny).
class CudaDsaLong : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaDsaLong, SelectionsAndLogitsMatchTheCpuBackendAroundIndexTopk) {
  const std::string name = GetParam();
  ModelFiles files = open_model_files(repo() + "/tests/models/" + name);
  files.cfg->index_topk = 2048;
  files.cfg->max_position_embeddings = 16384;
  const int64_t V = files.cfg->vocab_size, L = files.cfg->num_hidden_layers, k = 2048, chunk = 1024;
  ForwardDecisions cpu_rec, gpu_rec, forced;
  ModelOptions oc, og, of;
  oc.record_decisions = &cpu_rec;
  og.record_decisions = &gpu_rec;
  of.force_decisions = &forced;
  // The CPU side (9,000-token prefills: most of this test's 33-39 s a model on two threads) on the GPU host's cores, up
  // to 16; the thread count changes only the order of some of its sums, and the checks are tolerances.
  const int cpu_threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, 16u));
  std::unique_ptr<Backend> cb = make_backend("cpu", cpu_threads), gb = make_backend("cuda", 1),
                           fb = make_backend("cuda", 1);
  Model mc(*files.cfg, *files.plan, *cb, oc), mg(*files.cfg, *files.plan, *gb, og),
      mf(*files.cfg, *files.plan, *fb, of);
  for (int64_t len : {2047, 2048, 2049, 3000, 9000}) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < len; ++i) ids.push_back(static_cast<int32_t>((i * 2654435761u + 7) % V));
    KvCache kc(mc.config()), kg(mg.config()), kf(mf.config());
    int64_t rows = 0, same = 0, sparse_calls = 0;
    double dmax = 0.0, scale = 0.0, dfree = 0.0;
    for (int64_t at = 0; at < len; at += chunk) {
      const int64_t n = std::min(chunk, len - at);
      const std::span<const int32_t> part(ids.data() + at, static_cast<size_t>(n));
      std::vector<float> lc(static_cast<size_t>(n * V)), lg(lc.size()), lf(lc.size());
      mc.forward(part, kc, lc.data(), true);
      mg.forward(part, kg, lg.data(), true);
      forced = cpu_rec;
      mf.forward(part, kf, lf.data(), true);
      for (int64_t l = 0; l < L; ++l) {
        const auto &a = cpu_rec.index_sel[static_cast<size_t>(l)], &b = gpu_rec.index_sel[static_cast<size_t>(l)];
        const auto &ca = cpu_rec.index_count[static_cast<size_t>(l)], &cg = gpu_rec.index_count[static_cast<size_t>(l)];
        ASSERT_EQ(a.empty(), b.empty()) << name << " len " << len << " layer " << l << ": one backend selected";
        if (a.empty()) continue;
        ++sparse_calls;
        for (int64_t i = 0; i < n; ++i) {
          ++rows;
          if (ca[static_cast<size_t>(i)] != cg[static_cast<size_t>(i)]) continue;
          std::vector<int32_t> x(a.begin() + i * k, a.begin() + i * k + ca[static_cast<size_t>(i)]),
              y(b.begin() + i * k, b.begin() + i * k + cg[static_cast<size_t>(i)]);
          std::sort(x.begin(), x.end());
          std::sort(y.begin(), y.end());
          if (x == y) ++same;
        }
      }
      scale = std::max(scale, max_abs(lc));
      dmax = std::max(dmax, max_abs_diff(lf.data(), lc.data(), lc.size()));
      dfree = std::max(dfree, max_abs_diff(lg.data(), lc.data(), lc.size()));
    }
    std::printf(
        "[cuda model] %-10s DSA top-2048 fp32, %5lld-token prompt: selection = CPU on %lld of %lld rows (%d sparse "
        "layer calls); logits vs CPU max|d| %.3e with the CPU's selections replayed, %.3e free (max|logit| %.3f)\n",
        name.c_str(), static_cast<long long>(len), static_cast<long long>(same), static_cast<long long>(rows),
        static_cast<int>(sparse_calls), dmax, dfree, scale);
    if (len <= k) {
      EXPECT_EQ(rows, 0) << "a selection at " << len << " tokens (every query sees <= index_topk keys)";
    } else {
      EXPECT_GT(rows, 0) << "no selection at " << len << " tokens";
    }
    EXPECT_GE(static_cast<double>(same), 0.97 * static_cast<double>(rows)) << name << " len " << len;
    EXPECT_LE(dmax, 1e-4 * scale) << name << " len " << len;
  }
}
INSTANTIATE_TEST_SUITE_P(Tiny, CudaDsaLong, ::testing::Values("glm5-tiny", "v32-tiny"), param_name);

// Sampling on the device gives the tokens of the host Sampler on the same logits: the demo model in bf16 with
// decode graphs, 12 sequences with every sampling mix (greedy, temperature, top-k / top-p / min-p, penalties and
// bias, an allowed-id mask, banned ids), a batched prefill and 24 batched decode steps; one model downloads the
// logits and samples on the host, the other gets only the ids from Backend::sample_rows.
TEST(CudaSampling, DeviceEqualsHostOnTheDemoModel) {
  ModelFiles files = open_model_files(repo() + "/models/latent-demo");
  std::unique_ptr<Backend> be = make_backend("cuda", 1);
  ModelOptions o;
  o.bf16_activations = true;
  o.graphs = true;
  Model mh(*files.cfg, *files.plan, *be, o), md(*files.cfg, *files.plan, *be, o);
  const ModelConfig& cfg = mh.config();
  const int64_t V = cfg.vocab_size, bt = 16, per_seq = 4, n = 12, steps = 24;
  for (Model* m : {&mh, &md}) m->reserve(256, 32, per_seq * bt, per_seq);
  PagedKvCache ch(cfg, *be, n * per_seq, bt, mh.cache_dtype()), cd(cfg, *be, n * per_seq, bt, md.cache_dtype());
  std::vector<bool> banned(static_cast<size_t>(V), false);
  for (int64_t i = V - 20; i < V; ++i) banned[static_cast<size_t>(i)] = true;
  std::vector<std::vector<int32_t>> blocks(n), prompt(n), gen_h(n), gen_d(n);
  std::vector<Sampler> sh, sd;
  for (int64_t s = 0; s < n; ++s) {
    SamplingParams p;
    p.seed = 40 + s;
    switch (s % 8) {
      case 0: p.temperature = 0; break;
      case 1: p.temperature = 1.0f; break;
      case 2:
        p.temperature = 0.8f;
        p.top_k = 20;
        break;
      case 3: p.top_p = 0.9f; break;
      case 4:
        p.min_p = 0.05f;
        p.temperature = 1.3f;
        break;
      case 5:
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.3f;
        p.frequency_penalty = 0.2f;
        break;
      case 6:
        p.logit_bias = {{100, 4.0f}, {7, -3.0f}};
        p.top_k = 50;
        p.top_p = 0.95f;
        break;
      default: p.temperature = 0.9f; break;  // with an allowed-id mask (even ids)
    }
    sh.emplace_back(p, static_cast<uint64_t>(s));
    sd.emplace_back(p, static_cast<uint64_t>(s));
    for (int64_t j = 0; j < per_seq; ++j) blocks[s].push_back(static_cast<int32_t>(s * per_seq + j));
    for (int64_t t = 0; t < 4 + (s * 3) % 9; ++t) prompt[s].push_back(static_cast<int32_t>((s * 131 + t * 17 + 7) % V));
  }
  std::vector<bool> even(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) even[static_cast<size_t>(i)] = i % 2 == 0;
  const std::vector<uint32_t> even_bits = sample_bitmask(even);
  std::vector<float> lg(static_cast<size_t>(n * V));
  int64_t differ = 0, total = 0;
  for (int64_t step = 0; step <= steps; ++step) {
    std::vector<int32_t> tok_h, tok_d;
    std::vector<StepSequence> qh(n), qd(n);
    for (int64_t s = 0; s < n; ++s) {
      for (auto [q, gen, tok] : {std::tuple{&qh[s], &gen_h[s], &tok_h}, std::tuple{&qd[s], &gen_d[s], &tok_d}}) {
        q->blocks = blocks[s];
        q->logits = LogitRows::Last;
        if (step == 0) {
          q->start = 0;
          q->n_tokens = static_cast<int64_t>(prompt[s].size());
          tok->insert(tok->end(), prompt[s].begin(), prompt[s].end());
        } else {
          q->start = static_cast<int64_t>(prompt[s].size() + gen->size()) - 1;
          q->n_tokens = 1;
          q->decode = true;
          tok->push_back(gen->back());
        }
      }
    }
    mh.step(Step{tok_h, qh}, ch, lg.data());
    std::vector<SampleRowParams> rows(n);
    std::vector<SampleEdit> edits;
    for (int64_t s = 0; s < n; ++s) {
      float* row = lg.data() + s * V;
      if (s % 8 == 7)
        for (int64_t i = 1; i < V; i += 2) row[i] = -std::numeric_limits<float>::infinity();
      gen_h[s].push_back(
          sh[s].sample(std::span<float>(row, static_cast<size_t>(V)), prompt[s], gen_h[s], &banned).token);
      ASSERT_TRUE(sd[s].device_row(prompt[s], gen_d[s], V, rows[s], edits));
      if (s % 8 == 7) rows[s].allow_offset = 0;
    }
    SampleBatch sb{rows.data(),      n,
                   edits.data(),     static_cast<int64_t>(edits.size()),
                   even_bits.data(), static_cast<int64_t>(even_bits.size()),
                   &banned};
    std::vector<int32_t> ids(static_cast<size_t>(n), -1);
    md.step(Step{tok_d, qd}, cd, nullptr, nullptr, &sb, ids.data());
    for (int64_t s = 0; s < n; ++s) {
      sd[s].advance();
      gen_d[s].push_back(ids[s]);
      ++total;
      differ += gen_d[s].back() != gen_h[s].back();
      if (s % 8 == 7) {
        EXPECT_EQ(ids[s] % 2, 0);
      }
      EXPECT_FALSE(banned[static_cast<size_t>(ids[s])]);
    }
    ASSERT_EQ(gen_d, gen_h) << "step " << step;
  }
  EXPECT_GT(md.graph_replays(), 0);
  EXPECT_EQ(md.graph_replays(), mh.graph_replays());
  std::printf(
      "[cuda model] latent-demo bf16 device sampling = host sampling: %lld of %lld tokens equal (%lld graph "
      "replays)\n",
      static_cast<long long>(total - differ), static_cast<long long>(total),
      static_cast<long long>(md.graph_replays()));
}

}  // namespace
}  // namespace latent
