// Speculative decoding end to end on the tiny MTP models (scheduler + ModelEngine + the MTP layer, CPU backend):
// greedy output with speculation equals the output without it, token for token, at k = 1, 2, 3, for requests alone
// and batched — with the model's own (random, hence mostly rejected) drafts, and with an "oracle" that replaces
// them by the known continuation (every few made wrong) so that long accepted runs go through the verify path too.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/scheduler.h"
#include "server/model_engine.h"

namespace latent {
namespace {

class Sink : public GenerationSink {
 public:
  bool on_token(int, const SampleResult& s, bool) override {
    std::lock_guard lk(mu);
    toks.push_back(s.token);
    return false;
  }
  void on_draft_tokens(int, int64_t p, int64_t a) override {
    std::lock_guard lk(mu);
    proposed += p;
    accepted += a;
  }
  void on_finish(int, FinishReason) override {
    std::lock_guard lk(mu);
    done = true;
    cv.notify_all();
  }
  void on_abort(AbortReason, const std::string& m) override {
    std::lock_guard lk(mu);
    aborted = m.empty() ? "aborted" : m;
    cv.notify_all();
  }
  bool wait() {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(120), [&] { return done || !aborted.empty(); }) && aborted.empty();
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> toks;
  int64_t proposed = 0, accepted = 0;
  bool done = false;
  std::string aborted;
};

// Passes everything to the model engine; with `oracle`, the drafts the model proposed are replaced by the
// continuation of the sequence in `truth` (every `wrong`-th one off by one).
class OracleEngine : public Engine {
 public:
  OracleEngine(server::ModelEngine& e, std::map<std::vector<int32_t>, std::vector<int32_t>>* truth, int wrong)
      : e_(e), truth_(truth), wrong_(wrong) {}
  int64_t vocab_size() const override { return e_.vocab_size(); }
  int64_t kv_bytes_per_token() const override { return e_.kv_bytes_per_token(); }
  void copy_block(int32_t s, int32_t d, int64_t n) override { e_.copy_block(s, d, n); }
  void step(std::span<const EngineStepItem> items, float* logits) override {
    for (const auto& it : items) {
      auto& h = hist_[it.seq];
      h.resize(static_cast<size_t>(it.start));
      h.insert(h.end(), it.tokens.begin(), it.tokens.end());
    }
    e_.step(items, logits);
  }
  int64_t draft_layers() const override { return e_.draft_layers(); }
  void draft(std::span<const EngineDraftItem> items, int32_t* drafts) override {
    e_.draft(items, drafts);
    if (!truth_) return;
    int64_t at = 0;
    for (const auto& d : items) {
      std::vector<int32_t> h = hist_[d.seq];
      h.resize(static_cast<size_t>(d.start));
      h.insert(h.end(), d.tokens.begin(), d.tokens.end());
      for (int32_t j = 0; j < d.n_draft; ++j, ++at) {
        for (const auto& [prompt, cont] : *truth_) {
          if (h.size() < prompt.size() || !std::equal(prompt.begin(), prompt.end(), h.begin())) continue;
          const size_t g = h.size() - prompt.size() + static_cast<size_t>(j);
          if (g < cont.size()) drafts[at] = cont[g];
          if (wrong_ > 0 && (g + static_cast<size_t>(d.seq)) % static_cast<size_t>(wrong_) == 0)
            drafts[at] = (drafts[at] + 1) % static_cast<int32_t>(vocab_size());
        }
      }
    }
  }

 private:
  server::ModelEngine& e_;
  std::map<std::vector<int32_t>, std::vector<int32_t>>* truth_;
  int wrong_;
  std::map<SeqId, std::vector<int32_t>> hist_;
};

struct Result {
  std::vector<std::vector<int32_t>> toks;
  int64_t proposed = 0, accepted = 0, kv_used = -1;
};

Result run(const std::string& name, int64_t k, bool batched,
           std::map<std::vector<int32_t>, std::vector<int32_t>>* truth,
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
  Result r;
  std::vector<std::shared_ptr<Sink>> sinks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto sink = std::make_shared<Sink>();
    GenerationRequest g;
    g.prompt = prompts[i];
    g.max_tokens = 24;
    g.sampling.temperature = 0.0f;
    g.sink = sink;
    sched.submit(g);
    sinks.push_back(sink);
    if (!batched) {
      EXPECT_TRUE(sink->wait()) << sink->aborted;
    }
  }
  for (auto& s : sinks) {
    EXPECT_TRUE(s->wait()) << s->aborted;
    r.toks.push_back(s->toks);
    r.proposed += s->proposed;
    r.accepted += s->accepted;
  }
  for (int i = 0; i < 200 && sched.stats().running_requests > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  r.kv_used = sched.stats().kv_used;
  return r;
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
  std::map<std::vector<int32_t>, std::vector<int32_t>> truth;
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
