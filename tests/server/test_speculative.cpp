// Speculative decoding end to end on the tiny MTP models (scheduler + ModelEngine + the MTP layer, CPU backend):
// greedy output with speculation equals the output without it, token for token, at k = 1, 2, 3, for requests alone
// and batched — with the model's own (random, hence mostly rejected) drafts, and with an "oracle" that replaces
// them by the known continuation (every few made wrong) so that long accepted runs go through the verify path too.
// With graphs (decode and verify steps, MTP draft passes: tests/model/recording_backend.h runs them on the CPU with
// CUDA-graph semantics) the drafts and the text equal those without, greedy and sampled.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../model/recording_backend.h"
#include "../runtime/speculative_harness.h"
#include "backend/backend.h"
#include "model/model.h"
#include "runtime/scheduler.h"
#include "server/model_engine.h"

namespace latent {
namespace {

using spec_test::Continuations;
using spec_test::OracleEngine;
using Result = spec_test::Outputs;

Result run(const std::string& name, int64_t k, bool batched, const Continuations* truth,
           const std::vector<std::vector<int32_t>>& prompts, int wrong = 0) {
  PlanOptions po;
  po.mtp_layers = k > 0 ? 1 : 0;
  ModelFiles files = open_model_files(std::string(LATENT_SOURCE_DIR) + "/tests/models/" + name, po);
  auto be = make_backend("cpu", 2);
  ModelOptions mo;
  mo.mtp_layers = k > 0 ? 1 : 0;
  Model model(*files.cfg, *files.plan, *be, mo);
  server::ModelEngine engine(model);
  SchedulerOptions o;
  o.kv_block_tokens = 8;
  o.max_context = 120;
  o.prefill_chunk = 16;
  o.num_speculative_tokens = k;
  o.kv_total_blocks =
      engine.configure(200 * 8 * engine.kv_bytes_per_token(), 8, o.max_batch_tokens, o.max_num_seqs, o.max_context);
  OracleEngine oe(engine, truth, wrong);
  Scheduler sched(oe, o);
  sched.start();
  return spec_test::generate_all(sched, prompts, batched);
}

class SpeculativeModel : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativeModel, GreedyOutputEqualsPlainAloneAndBatched) {
  const std::string name = GetParam();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p;
    const int len = 3 + 7 * i;  // 3 .. 38 tokens: within and beyond index_topk, over several blocks and chunks
    for (int t = 0; t < len; ++t) p.push_back(static_cast<int32_t>((t * 37 + i * 11 + 5) % 200));
    prompts.push_back(p);
  }
  const Result plain = run(name, 0, true, nullptr, prompts);
  Continuations truth;
  for (size_t i = 0; i < prompts.size(); ++i) truth[prompts[i]] = plain.toks[i];
  for (int64_t k = 1; k <= 3; ++k)
    for (bool batched : {false, true}) {
      const std::string what = name + " k " + std::to_string(k) + (batched ? " batched" : " alone");
      const Result own = run(name, k, batched, nullptr, prompts);
      EXPECT_EQ(own.toks, plain.toks) << what << " (the model's drafts)";
      EXPECT_GT(own.proposed, 0) << what;
      EXPECT_EQ(own.kv_used, 0) << what;
      const Result orc = run(name, k, batched, &truth, prompts, 5);
      EXPECT_EQ(orc.toks, plain.toks) << what << " (oracle drafts)";
      EXPECT_GT(orc.accepted, orc.proposed / 2) << what;
      EXPECT_LT(orc.accepted, orc.proposed) << what;
      EXPECT_EQ(orc.kv_used, 0) << what;
    }
}

INSTANTIATE_TEST_SUITE_P(Models, SpeculativeModel,
                         ::testing::Values("glm5-tiny-mtp", "v3-tiny-mtp", "glm5-tiny-mxfp4-mtp"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string m = i.param;
                           for (char& c : m)
                             if (c == '-') c = '_';
                           return m;
                         });

// One scheduler run of 6 requests submitted together (before the scheduler starts, so that every run batches
// them alike) of different lengths — the batch shrinks as they end (other graph buckets, graphs re-captured) —
// with k = 3 oracle drafts, every 5th wrong (acceptance, hence the draft step's first-pass slots, change from step
// to step), through RecordingBackend reporting `device` (CUDA: the rows sampled on the "device", as on a GPU).
struct GraphRun {
  std::vector<std::vector<int32_t>> toks, drafts;
  int64_t step_replays = 0, draft_replays = 0, draft_captures = 0, draft_passes = 0, violations = 0;
  int64_t draft_passes_replayed = 0, draft_step_graphs = 0, draft_downloads = 0;
};

GraphRun run_with_graphs(const std::string& name, bool graphs, Device device, float temperature,
                         const Continuations& truth, const std::vector<std::vector<int32_t>>& prompts) {
  PlanOptions po;
  po.mtp_layers = 1;
  ModelFiles files = open_model_files(std::string(LATENT_SOURCE_DIR) + "/tests/models/" + name, po);
  auto cpu = make_backend("cpu", 2);
  test::RecordingBackend rb(*cpu, device);
  ModelOptions mo;
  mo.mtp_layers = 1;
  mo.graphs = graphs;
  Model model(*files.cfg, *files.plan, rb, mo);
  server::ModelEngine engine(model);
  SchedulerOptions o;
  o.kv_block_tokens = 8;
  o.max_context = 120;
  o.prefill_chunk = 16;
  o.max_num_seqs = 8;
  o.num_speculative_tokens = 3;
  o.kv_total_blocks =
      engine.configure(200 * 8 * engine.kv_bytes_per_token(), 8, o.max_batch_tokens, o.max_num_seqs, o.max_context);
  OracleEngine oe(engine, &truth, 5);
  GraphRun r;
  std::vector<std::shared_ptr<spec_test::Sink>> sinks;
  {
    Scheduler sched(oe, o);
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto sink = std::make_shared<spec_test::Sink>();
      GenerationRequest g;
      g.prompt = prompts[i];
      g.max_tokens = static_cast<int64_t>(4 + 4 * i);  // (at most 24: the plain run's length)
      g.sampling.temperature = temperature;
      g.sampling.seed = static_cast<int64_t>(1000 + i);
      g.sink = sink;
      sched.submit(g);
      sinks.push_back(sink);
    }
    sched.start();
    for (auto& sink : sinks) {
      EXPECT_TRUE(sink->wait()) << sink->aborted;
      r.toks.push_back(sink->toks);
    }
    sched.stop();
  }
  r.drafts = oe.draft_log;
  r.step_replays = model.graph_replays();
  r.draft_replays = model.draft_graph_replays();
  r.draft_captures = model.draft_graph_captures();
  r.draft_passes = model.draft_passes();
  r.draft_passes_replayed = model.draft_passes_replayed();
  r.draft_step_graphs = model.draft_step_graphs();
  r.draft_downloads = model.draft_id_downloads();
  r.violations = rb.violations();
  return r;
}

class SpeculativeGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativeGraphs, DraftsAndTextEqualEager) {
  const std::string name = GetParam();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < 3 + 5 * i; ++t) p.push_back(static_cast<int32_t>((t * 41 + i * 13 + 3) % 200));
    prompts.push_back(p);
  }
  const Result plain = run(name, 0, true, nullptr, prompts);
  Continuations truth;
  for (size_t i = 0; i < prompts.size(); ++i) truth[prompts[i]] = plain.toks[i];
  for (Device device : {Device::Cpu, Device::Cuda})
    for (float temperature : {0.0f, 0.8f}) {
      const std::string what = name + (device == Device::Cuda ? ", sampled on the device" : ", sampled on the host") +
                               (temperature > 0 ? ", seeded T 0.8" : ", greedy");
      const GraphRun e = run_with_graphs(name, false, device, temperature, truth, prompts);
      const GraphRun g = run_with_graphs(name, true, device, temperature, truth, prompts);
      EXPECT_EQ(g.toks, e.toks) << what;
      for (size_t i = 0; i < prompts.size() && temperature == 0.0f; ++i) {  // (plain: 24 tokens each)
        const std::vector<int32_t>& want = plain.toks[i];
        EXPECT_EQ(e.toks[i], std::vector<int32_t>(want.begin(), want.begin() + std::min(want.size(), e.toks[i].size())))
            << what << ", request " << i;
      }
      EXPECT_EQ(g.drafts, e.drafts) << what << ": the model's draft ids";
      EXPECT_GT(e.drafts.size(), 20u) << what;
      EXPECT_EQ(g.draft_passes, e.draft_passes) << what;
      EXPECT_GT(g.step_replays, 0) << what << ": no step ran from a graph";
      EXPECT_GT(g.draft_replays, 0) << what << ": no draft pass ran from a graph";
      EXPECT_GT(g.draft_captures, 1) << what;
      // k = 3: draft steps whose sequences all draft 3 ran as one graph, one download of ids each; eagerly, a
      // download per pass.
      EXPECT_GT(g.draft_step_graphs, 0) << what << ": no draft step ran as one graph";
      EXPECT_LT(g.draft_downloads, e.draft_downloads) << what;
      EXPECT_EQ(e.step_replays + e.draft_replays + e.draft_captures + e.draft_step_graphs, 0) << what;
      EXPECT_EQ(g.violations, 0) << what;
      std::printf(
          "[speculative graphs] %s: %zu draft steps' drafts equal; %lld of %lld draft passes replayed "
          "(%lld graphs captured), %lld draft steps as one graph, %lld downloads of draft ids (eager %lld), %lld steps "
          "replayed\n",
          what.c_str(), g.drafts.size(), static_cast<long long>(g.draft_passes_replayed),
          static_cast<long long>(g.draft_passes), static_cast<long long>(g.draft_captures),
          static_cast<long long>(g.draft_step_graphs), static_cast<long long>(g.draft_downloads),
          static_cast<long long>(e.draft_downloads), static_cast<long long>(g.step_replays));
    }
}

INSTANTIATE_TEST_SUITE_P(Models, SpeculativeGraphs,
                         ::testing::Values("glm5-tiny-mtp", "v3-tiny-mtp", "glm5-tiny-mxfp4-mtp"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string m = i.param;
                           for (char& c : m)
                             if (c == '-') c = '_';
                           return m;
                         });

}  // namespace
}  // namespace latent
