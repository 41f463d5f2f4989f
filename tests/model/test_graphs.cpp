// Decode graphs and MTP draft graphs on the CPU: the model's graph logic (Model::run_graph — capture at a padded
// fixed shape, one metadata upload, replay) through RecordingBackend (recording_backend.h: the CPU backend with
// CUDA-graph semantics: recorded ops replayed over the pointers they were recorded with, no memory traffic inside a
// recording). Graphs on equal graphs off bit for bit (the CPU kernels are batch invariant, so padding changes
// nothing), and the counters say which steps and draft passes ran from graphs. The CUDA twins are in
// tests/cuda/test_cuda_model.cpp and tests/cuda/test_cuda_mtp.cpp.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "draft_graph_check.h"
#include "model/model.h"
#include "recording_backend.h"

namespace latent {
namespace {

// A checkpoint loaded twice over one CPU backend: `g` with graphs (through the recording wrapper), `e` eager.
struct GraphPair {
  ModelFiles files;
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<test::RecordingBackend> rec;
  std::unique_ptr<Model> g, e;
};

std::unique_ptr<GraphPair> load_graph_pair(const std::string& name, int64_t mtp_layers) {
  auto p = std::make_unique<GraphPair>();
  PlanOptions po;
  po.mtp_layers = mtp_layers;
  p->files = open_model_files(std::string(LATENT_SOURCE_DIR) + "/tests/models/" + name, po);
  p->cpu = make_backend("cpu", 2);
  p->rec = std::make_unique<test::RecordingBackend>(*p->cpu);
  ModelOptions o;
  o.mtp_layers = mtp_layers;
  o.graphs = true;
  p->g = std::make_unique<Model>(*p->files.cfg, *p->files.plan, *p->rec, o);
  o.graphs = false;
  p->e = std::make_unique<Model>(*p->files.cfg, *p->files.plan, *p->cpu, o);
  return p;
}

std::string graph_case_name(const ::testing::TestParamInfo<std::string>& i) {
  std::string m = i.param;
  for (char& c : m)
    if (c == '-') c = '_';
  return m;
}

// The wrapper itself: recorded ops do not run until replayed, then run over what their pointers hold at that time;
// memory traffic inside a recording fails the test.
TEST(RecordingBackend, RecordsReplaysAndRefusesMemoryTrafficInsideARecording) {
  auto cpu = make_backend("cpu", 1);
  test::RecordingBackend rb(*cpu);
  float* x = static_cast<float*>(rb.alloc(4 * sizeof(float), "x"));
  const Tensor t(x, DType::F32, 1, 4);
  rb.fill(t, 1.0f);
  rb.graph_begin();
  rb.scale(t, 3.0f);
  const int id = rb.graph_end();
  EXPECT_EQ(x[0], 1.0f) << "a recorded op ran";
  EXPECT_EQ(rb.graph_kernels(id), 1);
  rb.graph_replay(id);
  rb.graph_replay(id);
  EXPECT_EQ(x[3], 9.0f);
  const float v[4] = {2, 2, 2, 2};
  rb.graph_begin();
  EXPECT_NONFATAL_FAILURE(EXPECT_THROW(rb.upload(x, v, sizeof(v)), Error), "upload inside a graph recording");
  EXPECT_EQ(rb.violations(), 1);
  rb.dealloc(x);
}

// Decode steps (T = 1) and verify steps (T = 2, 3: every row's logits) of batches of 1 .. 20 sequences of different
// lengths over one paged pool, 4 steps per (n, T): the first captures the graph of graph_seqs_for(n, T) sequences
// (padded or not), the rest replay; logits equal the eager model's bit for bit. On the DSA models the sequences cross
// index_topk (graphs with the indexer's selection).
class DecodeGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodeGraphs, EqualEagerBitForBit) {
  auto p = load_graph_pair(GetParam(), 0);
  Model &mg = *p->g, &me = *p->e;
  const ModelConfig& cfg = mg.config();
  const int64_t V = cfg.vocab_size, bt = 16, per_seq = 4, steps = 4;
  for (Model* m : {&mg, &me}) m->reserve(128, 32, per_seq * bt, per_seq);
  for (int64_t n : {1, 3, 5, 8, 20}) {
    for (int64_t T : {1, 2, 3}) {
      const std::string at = GetParam() + ", batch " + std::to_string(n) + ", T " + std::to_string(T);
      PagedKvCache cg(cfg, *p->rec, 24 * per_seq, bt, mg.cache_dtype()),
          ce(cfg, *p->cpu, 24 * per_seq, bt, me.cache_dtype());
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
      ASSERT_EQ(0, std::memcmp(lg.data(), le.data(), static_cast<size_t>(n * V) * sizeof(float))) << at << ": prefill";
      std::vector<int32_t> last(static_cast<size_t>(n));
      for (int64_t s = 0; s < n; ++s) last[s] = testing::argmax_of(le.data() + s * V, V);
      const int64_t replays0 = mg.graph_replays(), captures0 = mg.graph_captures();
      for (int64_t step = 0; step < steps; ++step) {
        tokens.clear();
        for (int64_t s = 0; s < n; ++s) {
          seqs[s].start += seqs[s].n_tokens;
          seqs[s].n_tokens = T;
          seqs[s].decode = true;
          seqs[s].logits = T == 1 ? LogitRows::Last : LogitRows::All;
          tokens.push_back(last[s]);
          for (int64_t j = 1; j < T; ++j) tokens.push_back(static_cast<int32_t>((s * 29 + step * 7 + j * 3) % V));
        }
        std::fill(lg.begin(), lg.end(), std::nanf(""));
        mg.step(Step{tokens, seqs}, cg, lg.data());
        me.step(Step{tokens, seqs}, ce, le.data());
        ASSERT_EQ(0, std::memcmp(lg.data(), le.data(), lg.size() * sizeof(float))) << at << ", step " << step;
        for (int64_t s = 0; s < n; ++s) last[s] = testing::argmax_of(le.data() + (s * T + T - 1) * V, V);
      }
      const int64_t caps = mg.graph_captures() - captures0;
      EXPECT_GE(caps, 1) << at;
      EXPECT_LE(caps, cfg.has_indexer() ? 2 : 1) << at;
      EXPECT_EQ(mg.graph_replays() - replays0 + caps, steps) << at << ": every step ran from a graph";
      EXPECT_GT(mg.graph_kernels(graph_seqs_for(n, T), T), 0) << at;
    }
  }
  EXPECT_EQ(me.graph_replays() + me.graph_captures(), 0);
  EXPECT_EQ(p->rec->violations(), 0);
  EXPECT_GT(p->rec->replays(), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, DecodeGraphs,
                         ::testing::Values("glm5-tiny", "v3-tiny", "v32-tiny", "glm5-tiny-mxfp4", "v3-tiny-fp8"),
                         graph_case_name);

// MTP draft passes in graphs, a graph per pass (draft_graph_check.h, ModelOptions::draft_step_graph off): ids,
// logits and the draft layer's cache rows equal the eager passes bit for bit, and exactly the eligible passes ran
// from graphs, each downloading its ids.
class DraftGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(DraftGraphs, EqualEagerBitForBit) {
  auto p = load_graph_pair(GetParam(), 1);
  ModelOptions o = p->g->options();
  o.draft_step_graph = false;
  p->g->set_options(o);
  const testing::DraftGraphStats st = testing::check_draft_graphs(*p->g, *p->e, GetParam());
  EXPECT_EQ(st.shapes, 15);
  EXPECT_EQ(st.one_graph_steps, 0);
  EXPECT_EQ(p->rec->violations(), 0);
  std::printf(
      "[graphs] %-20s draft passes in graphs = eager bit for bit: %lld draft steps, %lld passes graphed "
      "(%lld captures, %lld replays), %lld downloads of draft ids\n",
      GetParam().c_str(), static_cast<long long>(st.draft_calls), static_cast<long long>(st.graphed_passes),
      static_cast<long long>(p->g->draft_graph_captures()), static_cast<long long>(p->g->draft_graph_replays()),
      static_cast<long long>(st.id_downloads));
}

// The k passes of a draft step as one graph (ModelOptions::draft_step_graph, on by default) at k = 1, 2, 3: ids,
// logits and the draft layer's cache rows equal the eager passes bit for bit; a step whose sequences all draft k
// tokens after a graph-eligible first pass (ragged or not) ran as one graph (captured or replayed) with one download
// of its ids, the others (a sequence drafting fewer or none) on the per-pass route (draft_graph_check.h). k = 1 is a
// single pass: a graph of its own, one download.
class DraftStepGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(DraftStepGraphs, OneGraphOneDownloadEqualEagerBitForBit) {
  auto p = load_graph_pair(GetParam(), 1);
  ASSERT_TRUE(p->g->options().draft_step_graph);
  for (int64_t k : {1, 2, 3}) {
    const int64_t replays0 = p->g->draft_passes_replayed();
    const std::string what = GetParam() + ", k " + std::to_string(k);
    const testing::DraftGraphStats st = testing::check_draft_graphs(*p->g, *p->e, what, k);
    EXPECT_EQ(st.shapes, 15) << what;
    if (k >= 2) {
      // Steps 0, 1, 2, 5 and 6 (2, 5, 6 ragged) of the 12 shapes of batch > 1; every step of the 3 shapes of batch
      // 1 (one sequence never drafts fewer than the others).
      EXPECT_EQ(st.one_graph_steps, 12 * 5 + 3 * 7) << what;
      EXPECT_GT(p->g->draft_passes_replayed() - replays0, k) << what << ": a one-graph step replayed its passes";
    } else {
      EXPECT_EQ(st.one_graph_steps, 0) << what;
    }
    std::printf(
        "[graphs] %-28s draft steps = eager bit for bit: %lld draft steps, %lld as one graph, %lld draft graphs "
        "run, %lld downloads of draft ids, %lld kernels in the one-graph step of 1 sequence\n",
        what.c_str(), static_cast<long long>(st.draft_calls), static_cast<long long>(st.one_graph_steps),
        static_cast<long long>(st.graph_runs), static_cast<long long>(st.id_downloads),
        static_cast<long long>(st.step_graph_kernels));
  }
  EXPECT_EQ(p->rec->violations(), 0);
}

// Ragged first passes get a graph per layout (sequences, tokens), while fewer than Model::kMaxRaggedGraphs are held:
// draft steps over 190 distinct ragged layouts after one verify step (the slots rewritten at the same positions each
// time) run as one graph while fewer than the cap are held, else with an eager first pass and the later pass in its
// own graph; the ragged graphs held never exceed the cap (they are released with the draft-step buffer when it
// grows); a layout whose graph is held replays it. Every draft equals the eager model's.
TEST(RaggedDraftGraphs, AreBounded) {
  auto p = load_graph_pair("v3-tiny-mtp", 1);  // (no DSA selection: the graph key is the layout alone)
  Model &mg = *p->g, &me = *p->e;
  const ModelConfig& cfg = mg.config();
  const int64_t V = cfg.vocab_size, bt = 16, per_seq = 2, n = 20, T = 4, k = 2;
  for (Model* m : {&mg, &me}) m->reserve(128, 32, per_seq * bt, per_seq);
  PagedKvCache cg(cfg, *p->rec, n * per_seq, bt, mg.cache_dtype(), 1),
      ce(cfg, *p->cpu, n * per_seq, bt, me.cache_dtype(), 1);
  std::vector<std::vector<int32_t>> blocks(static_cast<size_t>(n));
  std::vector<StepSequence> seqs(static_cast<size_t>(n));
  std::vector<int32_t> tokens;
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t j = 0; j < per_seq; ++j) blocks[s].push_back(static_cast<int32_t>(s * per_seq + j));
    for (int64_t t = 0; t < 3 + T; ++t) tokens.push_back(static_cast<int32_t>((s * 31 + t * 7 + 1) % V));
    seqs[s].start = 0;
    seqs[s].n_tokens = 3 + T;
    seqs[s].blocks = blocks[s];
    seqs[s].logits = LogitRows::Last;
  }
  mg.step(Step{tokens, seqs}, cg, nullptr);
  me.step(Step{tokens, seqs}, ce, nullptr);
  // A verify step of T tokens per sequence at positions 3 .. 6 (rewriting them): its rows are the hidden rows.
  tokens.clear();
  for (int64_t s = 0; s < n; ++s) {
    seqs[s].start = 3;
    seqs[s].n_tokens = T;
    seqs[s].decode = true;
    seqs[s].logits = LogitRows::All;
    for (int64_t t = 0; t < T; ++t) tokens.push_back(static_cast<int32_t>((s * 13 + t * 5 + 2) % V));
  }
  std::vector<float> lg(static_cast<size_t>(n * T * V));
  mg.step(Step{tokens, seqs}, cg, lg.data());
  me.step(Step{tokens, seqs}, ce, lg.data());
  // Layout (S, e): the first e of S sequences fill 4 slots, the others 1 (S + 3e tokens; ragged for 0 < e < S).
  auto draft = [&](int64_t S, int64_t e) {
    std::vector<MtpSequence> ms(static_cast<size_t>(S));
    for (int64_t s = 0; s < S; ++s) {
      MtpSequence& q = ms[static_cast<size_t>(s)];
      q.start = 4;
      q.n_slots = s < e ? 4 : 1;
      q.tokens = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(s * T), static_cast<size_t>(q.n_slots));
      q.hidden_row = s * T;
      q.blocks = blocks[s];
      q.n_draft = static_cast<int32_t>(k);
    }
    std::vector<int32_t> dg(static_cast<size_t>(S * k), -1), de(dg.size(), -2);
    const int64_t one0 = mg.draft_step_graphs();
    mg.mtp_draft(ms, cg, dg.data());
    me.mtp_draft(ms, ce, de.data());
    EXPECT_EQ(dg, de) << "layout (" << S << ", " << e << ")";
    return mg.draft_step_graphs() - one0 == 1;
  };
  int64_t layouts = 0, eager_first = 0;
  for (int64_t S = 2; S <= n; ++S)
    for (int64_t e = 1; e < S; ++e, ++layouts) {
      const std::string at = "layout (" + std::to_string(S) + ", " + std::to_string(e) + ")";
      const int64_t runs0 = mg.draft_graph_captures() + mg.draft_graph_replays();
      const bool room = mg.ragged_draft_graphs() < Model::kMaxRaggedGraphs;
      const bool one = draft(S, e);
      EXPECT_EQ(one, room) << at;
      // At the cap: the first pass eagerly, the later one in its graph.
      EXPECT_EQ(mg.draft_graph_captures() + mg.draft_graph_replays() - runs0, 1) << at;
      EXPECT_LE(mg.ragged_draft_graphs(), Model::kMaxRaggedGraphs) << at;
      eager_first += one ? 0 : 1;
      if (one) {
        EXPECT_TRUE(draft(S, e)) << at << ": its graph replays";
      }
    }
  EXPECT_EQ(layouts, 190);
  EXPECT_GT(eager_first, 0) << "the cap was never reached";
  std::printf("[graphs] ragged draft layouts: %lld, as one graph %lld, eager first pass (at the cap) %lld\n",
              static_cast<long long>(layouts), static_cast<long long>(layouts - eager_first),
              static_cast<long long>(eager_first));
  EXPECT_EQ(p->rec->violations(), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, DraftStepGraphs,
                         ::testing::Values("glm5-tiny-mtp", "v3-tiny-mtp", "glm5-tiny-mxfp4-mtp"), graph_case_name);

INSTANTIATE_TEST_SUITE_P(Models, DraftGraphs, ::testing::Values("glm5-tiny-mtp", "v3-tiny-mtp", "glm5-tiny-mxfp4-mtp"),
                         graph_case_name);

}  // namespace
}  // namespace latent
