// Speculative decoding (multi-token prediction) on the CUDA backend, on the tiny MTP models (tests/models/*-mtp):
//  * the MTP draft layer's logits (model/mtp.cpp on backend ops) in fp32 against the numpy reference's fixtures
//    (tests/golden/*-mtp) and the CPU backend, within the CPU MTP test's tolerance; in bf16 against the ref
//    backend's bf16 emulation with the main model's bf16 criterion (test_cuda_model.cpp);
//  * verify steps (k + 1 decode tokens per sequence, every row's logits) in CUDA graphs equal the eager steps bit
//    for bit, and so do the head-input rows the draft step reads after them;
//  * the MTP draft passes in CUDA graphs equal the eager passes bit for bit (draft ids, draft logits, the draft
//    layer's cache rows; tests/model/draft_graph_check.h, the CPU test's check), a graph per pass and the k passes
//    of a step as one graph with one download of its ids (k = 1, 2, 3), and exactly the eligible steps and passes
//    ran from graphs;
//  * the scheduler + ModelEngine on the device in fp32 (rows sampled there, only ids back): greedy output with
//    speculation equals the output without it, token for token, at k = 1, 2, 3, alone and 4 sequences batched;
//  * rejection sampling at temperature > 0 with the verify rows sampled by Backend::sample_rows on the device keeps
//    the target distribution (chi-square over 20000 draws on a small vocabulary, as the host test of
//    tests/runtime/test_scheduler.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "../model/draft_graph_check.h"
#include "../runtime/speculative_harness.h"
#include "../runtime/truncated_softmax.h"
#include "core/npy.h"
#include "model/model.h"
#include "runtime/scheduler.h"
#include "server/model_engine.h"

namespace latent {
namespace {

std::string repo() {
  const char* r = std::getenv("LATENT_REPO");
  return r ? r : LATENT_SOURCE_DIR;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

double max_abs(const float* a, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i])));
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
int32_t argmax_row(const float* r, int64_t V) { return static_cast<int32_t>(std::max_element(r, r + V) - r); }

struct MtpModel {
  ModelFiles files;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};
std::unique_ptr<MtpModel> load_mtp(const std::string& name, const std::string& backend, bool bf16, bool graphs = true,
                                   int64_t mtp_layers = 1) {
  auto m = std::make_unique<MtpModel>();
  PlanOptions po;
  po.mtp_layers = mtp_layers;
  m->files = open_model_files(repo() + "/tests/models/" + name, po);
  m->backend = make_backend(backend, backend == "ref" ? 16 : 2);
  ModelOptions mo;
  mo.mtp_layers = mtp_layers;
  mo.bf16_activations = bf16;
  mo.graphs = graphs;
  m->model = std::make_unique<Model>(*m->files.cfg, *m->files.plan, *m->backend, mo);
  return m;
}

// The draft logits of the fixture's sequence (tests/model/test_mtp.cpp's order): the main model prefills the
// prompt's T tokens, then for q = 0 .. T the MTP slots 0 .. q with one draft (row q), then slots 0 .. T with three
// recursive drafts (rows T + 1 .. T + 3); drafts = the three draft ids.
struct DraftRun {
  std::vector<float> logits;           // [T + 4, V]
  std::vector<int32_t> drafts, first;  // the 3 recursive drafts; the first draft of each q
};
DraftRun run_drafts(Model& m, const std::vector<int32_t>& toks) {
  const ModelConfig& cfg = m.config();
  const int64_t V = cfg.vocab_size, T = static_cast<int64_t>(toks.size()) - 1, bt = 8;
  PagedKvCache cache(cfg, m.backend(), 8, bt, m.cache_dtype(), 1);
  std::vector<int32_t> blocks(8);
  std::iota(blocks.begin(), blocks.end(), 0);
  DraftRun r;
  r.logits.assign(static_cast<size_t>((T + 4) * V), 0.0f);
  auto prefill = [&] {
    StepSequence s;
    s.start = 0;
    s.n_tokens = T;
    s.blocks = blocks;
    s.logits = LogitRows::Last;
    std::vector<float> row(static_cast<size_t>(V));
    m.step(Step{std::span<const int32_t>(toks.data(), static_cast<size_t>(T)), std::span<const StepSequence>(&s, 1)},
           cache, row.data());
  };
  for (int64_t q = 0; q <= T; ++q) {
    prefill();
    MtpSequence ms;
    ms.start = 0;
    ms.n_slots = q + 1;
    ms.tokens = std::span<const int32_t>(toks.data(), static_cast<size_t>(q + 1));
    ms.hidden_row = -1;
    ms.zero_first = true;
    ms.blocks = blocks;
    ms.n_draft = 1;
    ms.decode = q % 2 == 0;  // both attention forms
    int32_t d = -1;
    m.mtp_draft(std::span<const MtpSequence>(&ms, 1), cache, &d, nullptr, r.logits.data() + q * V);
    r.first.push_back(d);
  }
  prefill();
  MtpSequence ms;
  ms.start = 0;
  ms.n_slots = T + 1;
  ms.tokens = toks;
  ms.hidden_row = -1;
  ms.zero_first = true;
  ms.blocks = blocks;
  ms.n_draft = 3;
  r.drafts.assign(3, -1);
  m.mtp_draft(std::span<const MtpSequence>(&ms, 1), cache, r.drafts.data(), nullptr, r.logits.data() + (T + 1) * V);
  return r;
}

class CudaMtp : public ::testing::TestWithParam<std::string> {};

// fp32: every draft row within 2e-4 · max(1, max|ref|) of the numpy reference (the CPU MTP test's tolerance) and of
// the CPU backend's; the drafts equal the fixture's.
TEST_P(CudaMtp, Fp32DraftLogitsMatchTheReferenceAndTheCpu) {
  const std::string name = GetParam(), gold = repo() + "/tests/golden/" + name;
  const nlohmann::json fx = read_json(gold + "/mtp_draft.json");
  const std::vector<int32_t> toks = fx["tokens"].get<std::vector<int32_t>>();
  const std::vector<int32_t> want_drafts = fx["drafts"].get<std::vector<int32_t>>();
  const NpyArray ref = read_npy(gold + "/mtp_logits.npy");
  const NpyArray ref_d = read_npy(gold + "/mtp_draft_logits.npy");
  auto g = load_mtp(name, "cuda", false);
  auto c = load_mtp(name, "cpu", false);
  const int64_t V = g->model->config().vocab_size, T = static_cast<int64_t>(toks.size()) - 1;
  ASSERT_EQ(ref.f32.size(), static_cast<size_t>((T + 1) * V));
  ASSERT_EQ(ref_d.f32.size(), static_cast<size_t>(3 * V));
  const DraftRun rg = run_drafts(*g->model, toks), rc = run_drafts(*c->model, toks);
  const double tol = 2e-4 * std::max(1.0, max_abs(ref.f32.data(), ref.f32.size()));
  double d_ref = 0, d_cpu = 0;
  for (int64_t q = 0; q <= T; ++q) {
    const double a = max_abs_diff(rg.logits.data() + q * V, ref.f32.data() + q * V, static_cast<size_t>(V));
    EXPECT_LE(a, tol) << name << " slot " << q;
    EXPECT_EQ(rg.first[static_cast<size_t>(q)], argmax_row(rg.logits.data() + q * V, V)) << "slot " << q;
    d_ref = std::max(d_ref, a);
  }
  const double dd = max_abs_diff(rg.logits.data() + (T + 1) * V, ref_d.f32.data(), ref_d.f32.size());
  EXPECT_LE(dd, tol) << name << " recursive drafts";
  d_ref = std::max(d_ref, dd);
  EXPECT_EQ(rg.drafts, want_drafts) << name;
  EXPECT_EQ(rg.drafts, rc.drafts) << name;
  d_cpu = max_abs_diff(rg.logits.data(), rc.logits.data(), rg.logits.size());
  EXPECT_LE(d_cpu, tol) << name << " against the CPU backend";
  std::printf(
      "[cuda model] %-20s MTP fp32 draft logits: max|d| vs numpy reference %.3e, vs CPU backend %.3e "
      "(tolerance %.3e), drafts = reference\n",
      name.c_str(), d_ref, d_cpu, tol);
}

// bf16: the main model's criterion (test_cuda_model.cpp Bf16MatchesRefEmulation) over the draft rows: the same top-1
// on every row the reference decides clearly, >= 90 % of the rows, RMS relative error <= 5e-2. The recursive draft
// rows are compared while both backends drafted the same ids (a different id makes the next row another question).
TEST_P(CudaMtp, Bf16DraftLogitsMatchTheRefEmulation) {
  const std::string name = GetParam(), gold = repo() + "/tests/golden/" + name;
  const std::vector<int32_t> toks = read_json(gold + "/mtp_draft.json")["tokens"].get<std::vector<int32_t>>();
  auto g = load_mtp(name, "cuda", true);
  auto r = load_mtp(name, "ref", true);
  const int64_t V = g->model->config().vocab_size, T = static_cast<int64_t>(toks.size()) - 1;
  const DraftRun rg = run_drafts(*g->model, toks), rr = run_drafts(*r->model, toks);
  std::vector<int64_t> rows;
  for (int64_t q = 0; q <= T + 1; ++q) rows.push_back(q);
  for (int64_t j = 1; j < 3 && rg.drafts[static_cast<size_t>(j - 1)] == rr.drafts[static_cast<size_t>(j - 1)]; ++j)
    rows.push_back(T + 1 + j);
  size_t agree = 0, decided = 0, decided_agree = 0;
  double num = 0, den = 0;
  for (int64_t q : rows) {
    const float* a = rg.logits.data() + q * V;
    const float* b = rr.logits.data() + q * V;
    const int32_t ta = argmax_row(a, V), tb = argmax_row(b, V);
    float second = -INFINITY, row_max = 0.0f;
    for (int64_t v = 0; v < V; ++v) {
      if (v != tb) second = std::max(second, b[v]);
      row_max = std::max(row_max, std::fabs(b[v]));
      num += (static_cast<double>(a[v]) - b[v]) * (static_cast<double>(a[v]) - b[v]);
      den += static_cast<double>(b[v]) * b[v];
    }
    const bool clear = b[tb] - second >= 0.05f * row_max;
    agree += ta == tb;
    decided += clear;
    decided_agree += clear && ta == tb;
  }
  const double rel = std::sqrt(num / den), top1 = static_cast<double>(agree) / static_cast<double>(rows.size());
  std::printf(
      "[cuda model] %-20s MTP bf16 draft logits vs ref bf16 emulation: top-1 %.1f %% of %zu rows (%zu of %zu "
      "clearly decided rows), relative error %.3e\n",
      name.c_str(), 100.0 * top1, rows.size(), decided_agree, decided, rel);
  EXPECT_FALSE(std::isnan(rel));
  EXPECT_EQ(decided_agree, decided) << name << ": a clearly decided draft row changed its top-1";
  EXPECT_GE(top1, 0.90);
  EXPECT_LE(rel, 5e-2);
}

std::string param_name(const ::testing::TestParamInfo<std::string>& i) {
  std::string s = i.param;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}
INSTANTIATE_TEST_SUITE_P(Tiny, CudaMtp, ::testing::Values("glm5-tiny-mtp", "v3-tiny-mtp", "glm5-tiny-mxfp4-mtp"),
                         param_name);

// Verify steps in CUDA graphs: batches of n sequences of different lengths over one paged pool, each step every
// sequence's last token and k drafts (T = k + 1 tokens, every row's logits), 4 steps per (n, T) (the first
// captures the graph of graph_seqs_for(n, T) sequences, padded or not, the rest replay); logits bit for bit equal to
// the eager model's, both activation modes. On the MTP models the draft step after each verify (one slot per
// sequence from the verify's last row, two drafts) gives the same ids and logits too: the graph kept the same
// head-input rows. On the DSA models the sequences cross index_topk (graphs with the indexer's selection).
class CudaVerifyGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaVerifyGraphs, EqualEagerBitForBit) {
  const std::string name = GetParam();
  const bool mtp = name.size() > 4 && name.compare(name.size() - 4, 4, "-mtp") == 0;
  for (bool bf16 : {false, true}) {
    auto g = load_mtp(name, "cuda", bf16, true, mtp ? 1 : 0);
    ModelOptions oe = g->model->options();
    oe.graphs = false;
    Model me(*g->files.cfg, *g->files.plan, *g->backend, oe);
    Model& mg = *g->model;
    Backend& be = *g->backend;
    const ModelConfig& cfg = mg.config();
    const int64_t V = cfg.vocab_size, bt = 16, per_seq = 4, L = mtp ? 1 : 0;
    for (Model* m : {&mg, &me}) m->reserve(128, 32, per_seq * bt, per_seq);
    int64_t checked = 0;
    for (int64_t n : {1, 3, 5, 8, 20}) {
      for (int64_t T : {2, 3, 4}) {
        PagedKvCache cg(cfg, be, 24 * per_seq, bt, mg.cache_dtype(), L),
            ce(cfg, be, 24 * per_seq, bt, me.cache_dtype(), L);
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
        std::vector<float> lg(static_cast<size_t>(n * T * V)), le(lg.size());
        mg.step(Step{tokens, seqs}, cg, lg.data());
        me.step(Step{tokens, seqs}, ce, le.data());
        ASSERT_EQ(0, std::memcmp(lg.data(), le.data(), static_cast<size_t>(n * V) * sizeof(float))) << "prefill";
        std::vector<int32_t> last(static_cast<size_t>(n));
        for (int64_t s = 0; s < n; ++s) last[s] = argmax_row(le.data() + s * V, V);
        // The draft layer's slots are written as the scheduler writes them (every drafted token accepted): after
        // the prompt slots 0 .. len (slot j pairs row j - 1 with token j, slot 0 a zero row), after a verify of
        // positions p .. p + T - 1 the slots p + 1 .. p + T (rows of the verify, its tokens 1 .. T - 1 and the
        // token sampled from its last row), then two drafts: the same ids and logits from both models.
        std::vector<std::vector<int32_t>> slot_toks(static_cast<size_t>(n));
        auto draft_both = [&](std::vector<MtpSequence>& ms, const char* what, int64_t step) {
          int64_t nd = 0;
          for (const MtpSequence& q : ms) nd += q.n_draft;
          std::vector<int32_t> dg(static_cast<size_t>(std::max<int64_t>(nd, 1)), -1), de(dg.size(), -1);
          std::vector<float> lgd(static_cast<size_t>(std::max<int64_t>(nd, 1) * V), 0.0f), led(lgd.size(), 0.0f);
          mg.mtp_draft(ms, cg, dg.data(), nullptr, lgd.data());
          me.mtp_draft(ms, ce, de.data(), nullptr, led.data());
          ASSERT_EQ(dg, de) << what << ", batch " << n << ", T " << T << ", step " << step;
          ASSERT_EQ(0, std::memcmp(lgd.data(), led.data(), lgd.size() * sizeof(float)))
              << what << " (logits), batch " << n << ", T " << T << ", step " << step;
        };
        if (mtp) {
          std::vector<MtpSequence> ms(static_cast<size_t>(n));
          int64_t off = 0;
          for (int64_t s = 0; s < n; ++s) {
            const int64_t len = seqs[s].n_tokens;
            slot_toks[s].assign(tokens.begin() + off, tokens.begin() + off + len);
            slot_toks[s].push_back(last[s]);
            MtpSequence& q = ms[static_cast<size_t>(s)];
            q.start = 0;
            q.n_slots = len + 1;
            q.tokens = slot_toks[s];
            q.hidden_row = off - 1;
            q.zero_first = true;
            q.blocks = blocks[s];
            q.decode = false;
            off += len;
          }
          draft_both(ms, "the prompt's draft-layer slots", -1);
        }
        const int64_t replays0 = mg.graph_replays(), captures0 = mg.graph_captures();
        const int64_t steps = 4;
        for (int64_t step = 0; step < steps; ++step) {
          tokens.clear();
          for (int64_t s = 0; s < n; ++s) {
            seqs[s].start += seqs[s].n_tokens;
            seqs[s].n_tokens = T;
            seqs[s].decode = true;
            seqs[s].logits = LogitRows::All;
            tokens.push_back(last[s]);
            for (int64_t j = 1; j < T; ++j) tokens.push_back(static_cast<int32_t>((s * 29 + step * 7 + j * 3) % V));
          }
          std::fill(lg.begin(), lg.end(), std::nanf(""));
          mg.step(Step{tokens, seqs}, cg, lg.data());
          me.step(Step{tokens, seqs}, ce, le.data());
          ASSERT_EQ(0, std::memcmp(lg.data(), le.data(), lg.size() * sizeof(float)))
              << name << (bf16 ? " bf16" : " fp32") << ": verify-graph logits differ from eager, batch " << n << ", T "
              << T << ", step " << step << ", max|d| " << max_abs_diff(lg.data(), le.data(), lg.size());
          for (int64_t s = 0; s < n; ++s) last[s] = argmax_row(le.data() + (s * T + T - 1) * V, V);
          if (!mtp) continue;
          std::vector<MtpSequence> ms(static_cast<size_t>(n));
          for (int64_t s = 0; s < n; ++s) {
            slot_toks[s].assign(tokens.begin() + s * T + 1, tokens.begin() + (s + 1) * T);
            slot_toks[s].push_back(last[s]);
            MtpSequence& q = ms[static_cast<size_t>(s)];
            q.start = seqs[s].start + 1;
            q.n_slots = T;
            q.tokens = slot_toks[s];
            q.hidden_row = s * T;
            q.blocks = blocks[s];
            q.n_draft = 2;
          }
          draft_both(ms, "the draft step after the verify", step);
        }
        const int64_t caps = mg.graph_captures() - captures0;
        // At most one graph per (padded sequence count, T, DSA selection); none when an earlier batch size of the
        // loop padded to the same graph (batch 5 and 8 share the bucket of 8).
        EXPECT_LE(caps, cfg.has_indexer() ? 2 : 1) << "batch " << n << " T " << T << ": " << caps;
        EXPECT_EQ(mg.graph_replays() - replays0 + caps, steps) << "batch " << n << " T " << T;
        EXPECT_GT(mg.graph_kernels(graph_seqs_for(n, T), T), 0) << "batch " << n << " T " << T;
        EXPECT_EQ(me.graph_replays(), 0);
        if (mtp) {
          EXPECT_GT(mg.draft_graph_replays(), 0) << "batch " << n << " T " << T << ": no draft pass replayed";
        }
        ++checked;
      }
    }
    std::printf(
        "[cuda model] %-20s %s verify steps (k + 1 = 2, 3, 4 rows) in graphs = eager bit for bit at batch "
        "1/3/5/8/20%s: %lld shapes, %lld captures, %lld replays\n",
        name.c_str(), bf16 ? "bf16" : "fp32", mtp ? ", draft step after each equal too" : "",
        static_cast<long long>(checked), static_cast<long long>(mg.graph_captures()),
        static_cast<long long>(mg.graph_replays()));
  }
}

// MTP draft passes in CUDA graphs against eager ones (graphs off), both activation modes: a graph per pass
// (draft_step_graph off, k = 3) — the first pass of a draft step when every sequence fills the same slots (k + 1 or
// fewer), the later passes of one slot each — and the k passes of a step as one graph with one download of its ids
// (k = 1, 2, 3), at batch 1, 3, 5, 8, 20; ragged first passes in graphs of their exact layout (replayed in another
// layout of as many tokens); a sequence that does not draft or drafts fewer takes the per-pass route
// (draft_graph_check.h).
class CudaDraftGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaDraftGraphs, EqualEagerBitForBit) {
  const std::string name = GetParam();
  for (bool bf16 : {false, true}) {
    auto g = load_mtp(name, "cuda", bf16, true, 1);
    ModelOptions oe = g->model->options();
    oe.graphs = false;
    Model me(*g->files.cfg, *g->files.plan, *g->backend, oe);
    for (int64_t k : {0, 1, 2, 3}) {  // 0: a graph per pass at k = 3
      ModelOptions og = g->model->options();
      og.draft_step_graph = k > 0;
      g->model->set_options(og);
      const std::string what = name + (bf16 ? " bf16" : " fp32") + (k > 0 ? ", k " + std::to_string(k) : ", per pass");
      const testing::DraftGraphStats st = testing::check_draft_graphs(*g->model, me, what, k > 0 ? k : 3);
      std::printf(
          "[cuda model] %-32s MTP draft steps in graphs = eager bit for bit (ids, logits, draft-layer cache) at "
          "batch 1/3/5/8/20, k + 1 = 2/3/4 slots: %lld draft steps, %lld as one graph, %lld graphs run over %lld "
          "passes, %lld downloads of draft ids; kernels at 1 sequence: %lld in the one-slot pass graph, %lld in the "
          "one-graph step\n",
          what.c_str(), static_cast<long long>(st.draft_calls), static_cast<long long>(st.one_graph_steps),
          static_cast<long long>(st.graph_runs), static_cast<long long>(st.graphed_passes),
          static_cast<long long>(st.id_downloads), static_cast<long long>(st.one_slot_kernels),
          static_cast<long long>(st.step_graph_kernels));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, CudaDraftGraphs,
                         ::testing::Values("glm5-tiny-mtp", "v3-tiny-mtp", "glm5-tiny-mxfp4-mtp"), param_name);

INSTANTIATE_TEST_SUITE_P(Tiny, CudaVerifyGraphs,
                         ::testing::Values("glm5-tiny", "v3-tiny", "v32-tiny", "glm5-tiny-mxfp4", "v3-tiny-fp8",
                                           "glm5-tiny-mtp", "v3-tiny-mtp"),
                         param_name);

// ---- the scheduler over the device ----
using spec_test::Continuations;
using spec_test::OracleEngine;
using spec_test::Sink;

struct SpecResult {
  std::vector<std::vector<int32_t>> toks;
  int64_t proposed = 0, accepted = 0, kv_used = -1, sampled_steps = 0, replays = 0, verify_kernels = 0;
  int64_t draft_replays = 0, draft_step_graphs = 0;
};

// Every step of at most 16 tokens (prefill chunks of 8): the fp32 linears then always take the skinny kernels, whose
// rows do not depend on the batch, so that plain and speculative decoding see the same logits whatever the steps
// hold.
SpecResult run_spec(const std::string& name, int64_t k, bool batched, const Continuations* truth,
                    const std::vector<std::vector<int32_t>>& prompts, int wrong = 0) {
  PlanOptions po;
  po.mtp_layers = k > 0 ? 1 : 0;
  ModelFiles files = open_model_files(repo() + "/tests/models/" + name, po);
  auto be = make_backend("cuda", 1);
  ModelOptions mo;
  mo.mtp_layers = k > 0 ? 1 : 0;
  Model model(*files.cfg, *files.plan, *be, mo);
  server::ModelEngine engine(model);
  SchedulerOptions o;
  o.kv_block_tokens = 8;
  o.max_context = 120;
  o.prefill_chunk = 8;
  o.max_batch_tokens = 16;
  o.max_num_seqs = 8;
  o.num_speculative_tokens = k;
  o.kv_total_blocks =
      engine.configure(200 * 8 * engine.kv_bytes_per_token(), 8, o.max_batch_tokens, o.max_num_seqs, o.max_context);
  OracleEngine oe(engine, truth, wrong);
  SpecResult r;
  {
    Scheduler sched(oe, o);
    sched.start();
    const spec_test::Outputs out = spec_test::generate_all(sched, prompts, batched);
    r.toks = out.toks;
    r.proposed = out.proposed;
    r.accepted = out.accepted;
    r.kv_used = out.kv_used;
    sched.stop();
  }
  r.sampled_steps = oe.sampled_steps;
  r.replays = model.graph_replays();
  r.draft_replays = model.draft_graph_replays();
  r.draft_step_graphs = model.draft_step_graphs();
  if (k > 0) r.verify_kernels = model.graph_kernels(1, k + 1);
  EXPECT_EQ(model.workspace_grows(), 0) << name << " k " << k;
  return r;
}

class CudaSpeculative : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaSpeculative, Fp32GreedyOutputEqualsPlainAloneAndBatched) {
  const std::string name = GetParam();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p;
    const int len = 3 + 7 * i;  // 3 .. 24 tokens: within and beyond index_topk, over several blocks and chunks
    for (int t = 0; t < len; ++t) p.push_back(static_cast<int32_t>((t * 37 + i * 11 + 5) % 200));
    prompts.push_back(p);
  }
  const SpecResult plain = run_spec(name, 0, true, nullptr, prompts);
  EXPECT_GT(plain.sampled_steps, 0) << "the rows were not sampled on the device";
  Continuations truth;
  for (size_t i = 0; i < prompts.size(); ++i) truth[prompts[i]] = plain.toks[i];
  int64_t proposed = 0, accepted = 0;
  for (int64_t k = 1; k <= 3; ++k)
    for (bool batched : {false, true}) {
      const std::string what = name + " k " + std::to_string(k) + (batched ? " batched" : " alone");
      const SpecResult own = run_spec(name, k, batched, nullptr, prompts);
      EXPECT_EQ(own.toks, plain.toks) << what << " (the model's drafts)";
      EXPECT_GT(own.proposed, 0) << what;
      EXPECT_EQ(own.kv_used, 0) << what;
      EXPECT_GT(own.sampled_steps, 0) << what;
      const SpecResult orc = run_spec(name, k, batched, &truth, prompts, 5);
      EXPECT_EQ(orc.toks, plain.toks) << what << " (oracle drafts)";
      EXPECT_GT(orc.accepted, orc.proposed / 2) << what;
      EXPECT_LT(orc.accepted, orc.proposed) << what;
      EXPECT_EQ(orc.kv_used, 0) << what;
      EXPECT_GT(orc.replays, 0) << what << ": no step replayed a graph";
      EXPECT_GT(own.draft_replays, 0) << what << ": no draft pass replayed a graph";
      EXPECT_GT(orc.draft_replays, 0) << what << ": no draft pass replayed a graph";
      if (k >= 2) {  // (draft steps whose sequences all draft k: one graph, one download of the ids)
        EXPECT_GT(own.draft_step_graphs, 0) << what << ": no draft step ran as one graph";
        EXPECT_GT(orc.draft_step_graphs, 0) << what << ": no draft step ran as one graph";
      }
      if (!batched) {
        EXPECT_GT(orc.verify_kernels, 0) << what << ": no verify graph of 1 sequence of " << k + 1 << " tokens";
      }
      proposed += own.proposed + orc.proposed;
      accepted += own.accepted + orc.accepted;
    }
  std::printf(
      "[cuda model] %-20s fp32 speculative greedy (device sampling, graphs) = plain token for token at "
      "k = 1/2/3, alone and 4 batched (%lld of %lld drafts accepted, own and oracle drafts)\n",
      name.c_str(), static_cast<long long>(accepted), static_cast<long long>(proposed));
}

INSTANTIATE_TEST_SUITE_P(Tiny, CudaSpeculative,
                         ::testing::Values("glm5-tiny-mtp", "v3-tiny-mtp", "glm5-tiny-mxfp4-mtp"), param_name);

// Rejection sampling with the verify rows sampled on the device: an engine whose logits rows are a constant row
// in device memory and whose rows are sampled by the CUDA backend's sample_rows (the scheduler's SampleBatch
// uploaded as Model::step does, only the ids downloaded), 3 drafts per step that are always the same id, 20000
// tokens at temperature 1.3 with top_k 7: the emitted tokens' histogram against the exact truncated softmax
// (chi-square, 6 degrees of freedom), and the acceptance of the first draft position against its probability.
class DeviceConstEngine : public Engine {
 public:
  static constexpr int64_t kV = 64;
  explicit DeviceConstEngine(Backend& be) : be_(be) {
    for (int64_t v = 0; v < kV; ++v) row_[static_cast<size_t>(v)] = value(v);
  }
  ~DeviceConstEngine() override {
    for (void* p : {lg_, par_, ed_, ids_})
      if (p) be_.dealloc(p);
  }
  static float value(int64_t v) { return v < 8 ? 0.4f * static_cast<float>(v % 5) : -30.0f; }
  int64_t vocab_size() const override { return kV; }
  int64_t kv_bytes_per_token() const override { return 64; }
  void copy_block(int32_t, int32_t, int64_t) override {}
  void step(std::span<const EngineStepItem> items, float* logits) override {
    const int64_t n = rows_of(items);
    for (int64_t r = 0; r < n; ++r) std::memcpy(logits + r * kV, row_.data(), sizeof(float) * kV);
  }
  bool samples_on_device() const override { return true; }
  void step_sampled(std::span<const EngineStepItem> items, const SampleBatch& sb, int32_t* ids) override {
    const int64_t n = rows_of(items);
    if (sb.n_rows != n) throw std::runtime_error("sampling rows do not match the logits rows");
    if (n > cap_) {
      for (void* p : {lg_, par_, ids_})
        if (p) be_.dealloc(p);
      cap_ = std::max<int64_t>(n, 16);
      lg_ = be_.alloc(sizeof(float) * static_cast<size_t>(cap_ * kV), "test logits");
      par_ = be_.alloc(sizeof(SampleRowParams) * static_cast<size_t>(cap_), "test sampling rows");
      ids_ = be_.alloc(sizeof(int32_t) * static_cast<size_t>(cap_), "test ids");
    }
    if (sb.n_edits > ed_cap_) {
      if (ed_) be_.dealloc(ed_);
      ed_cap_ = std::max<int64_t>(sb.n_edits, 64);
      ed_ = be_.alloc(sizeof(SampleEdit) * static_cast<size_t>(ed_cap_), "test edits");
    }
    std::vector<float> lg(static_cast<size_t>(n * kV));
    for (int64_t r = 0; r < n; ++r) std::memcpy(lg.data() + r * kV, row_.data(), sizeof(float) * kV);
    be_.upload(lg_, lg.data(), lg.size() * sizeof(float));
    be_.upload(par_, sb.rows, sizeof(SampleRowParams) * static_cast<size_t>(n));
    if (sb.n_edits > 0) be_.upload(ed_, sb.edits, sizeof(SampleEdit) * static_cast<size_t>(sb.n_edits));
    be_.sample_rows(static_cast<float*>(lg_), n, kV, static_cast<const SampleRowParams*>(par_),
                    static_cast<const SampleEdit*>(ed_), nullptr, nullptr, static_cast<int32_t*>(ids_));
    be_.download(ids, ids_, sizeof(int32_t) * static_cast<size_t>(n));
    ++device_steps;
  }
  int64_t draft_layers() const override { return 1; }
  void draft(std::span<const EngineDraftItem> items, int32_t* out) override {
    int64_t at = 0;
    for (const auto& d : items)
      for (int32_t j = 0; j < d.n_draft; ++j) out[at++] = draft_fixed;
  }
  int32_t draft_fixed = 0;
  int64_t device_steps = 0;

 private:
  static int64_t rows_of(std::span<const EngineStepItem> items) {
    int64_t n = 0;
    for (const auto& it : items) n += it.all_logits ? static_cast<int64_t>(it.tokens.size()) : it.want_logits ? 1 : 0;
    return n;
  }
  Backend& be_;
  std::vector<float> row_ = std::vector<float>(static_cast<size_t>(kV));
  void *lg_ = nullptr, *par_ = nullptr, *ed_ = nullptr, *ids_ = nullptr;
  int64_t cap_ = 0, ed_cap_ = 0;
};

TEST(CudaSpeculativeSampling, RejectionSamplingKeepsTheTargetDistributionOnTheDevice) {
  std::unique_ptr<Backend> be = make_backend("cuda", 1);
  const int64_t N = 20000, V = DeviceConstEngine::kV;
  for (int32_t fixed : {4, 2}) {  // the most likely id, and a middle one
    DeviceConstEngine e(*be);
    e.draft_fixed = fixed;
    SchedulerOptions o;
    o.num_speculative_tokens = 3;
    o.max_context = N + 64;
    o.kv_total_blocks = (N + 64) / 64 + 8;
    std::shared_ptr<Sink> sink = std::make_shared<Sink>();
    SchedulerStats st;
    {
      Scheduler s(e, o);
      s.start();
      GenerationRequest g;
      g.prompt = {3, 4, 5};
      g.max_tokens = N;
      g.sampling.temperature = 1.3f;
      g.sampling.top_k = 7;
      g.sampling.seed = static_cast<uint64_t>(2024 + fixed);
      g.sink = sink;
      s.submit(std::move(g));
      ASSERT_TRUE(sink->wait(300)) << sink->aborted;
      for (int i = 0; i < 100 && s.stats().running_requests > 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      st = s.stats();
      s.stop();
    }
    const std::vector<int32_t>& toks = sink->toks;
    ASSERT_EQ(static_cast<int64_t>(toks.size()), N);
    EXPECT_GT(e.device_steps, N / 4) << "the verify rows were not sampled on the device";
    std::vector<float> row(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) row[static_cast<size_t>(v)] = DeviceConstEngine::value(v);
    SampleRowParams p;
    p.temperature = 1.3f;
    p.top_k = 7;
    const std::vector<double> q = truncated_softmax(row, p);
    std::vector<double> count(static_cast<size_t>(V), 0.0);
    for (int32_t t : toks) count[static_cast<size_t>(t)] += 1;
    double chi2 = 0;
    int dof = -1;
    for (int64_t v = 0; v < V; ++v) {
      if (q[static_cast<size_t>(v)] <= 0) {
        EXPECT_EQ(count[static_cast<size_t>(v)], 0) << "id " << v << " has probability 0";
        continue;
      }
      const double ex = q[static_cast<size_t>(v)] * static_cast<double>(N);
      chi2 += (count[static_cast<size_t>(v)] - ex) * (count[static_cast<size_t>(v)] - ex) / ex;
      ++dof;
    }
    EXPECT_EQ(dof, 6);
    EXPECT_LT(chi2, 22.46) << "draft " << fixed;  // P(chi2 > 22.46) = 0.001 at 6 degrees of freedom
    ASSERT_GE(st.spec_proposed_at.size(), 1u);
    const double rate1 = static_cast<double>(st.spec_accepted_at[0]) / static_cast<double>(st.spec_proposed_at[0]);
    const double qf = q[static_cast<size_t>(fixed)];
    const double sd = std::sqrt(qf * (1 - qf) / static_cast<double>(st.spec_proposed_at[0]));
    EXPECT_NEAR(rate1, qf, 4 * sd) << "draft " << fixed;
    std::printf(
        "[cuda model] rejection sampling on the device (draft id %d, T 1.3, top_k 7, %lld tokens, %lld "
        "device steps): chi-square %.2f (6 dof, limit 22.46), first-draft acceptance %.4f vs p %.4f\n",
        fixed, static_cast<long long>(N), static_cast<long long>(e.device_steps), chi2, rate1, qf);
  }
}

}  // namespace
}  // namespace latent
