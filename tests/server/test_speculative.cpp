// Speculative decoding end to end on the tiny MTP models (scheduler + ModelEngine + the MTP layer, CPU backend):
// greedy output with speculation equals the output without it, token for token, at k = 1, 2, 3, for requests alone
// and batched — with the model's own (random, hence mostly rejected) drafts, and with an "oracle" that replaces
// them by the known continuation (every few made wrong) so that long accepted runs go through the verify path too.
#include <gtest/gtest.h>

#include <map>

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

}  // namespace
}  // namespace latent
