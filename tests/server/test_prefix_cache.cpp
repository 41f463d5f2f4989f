// Prefix caching end to end on a real model (scheduler + ModelEngine + paged pool, CPU backend): a request served
// from the prefix cache gives bit-identical logits to the same request computed from scratch, for prompts that share
// nothing, one token, exactly a block boundary, and all but one token with an earlier request; n > 1 keeps working.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/scheduler.h"
#include "server/model_engine.h"

namespace latent {
namespace {

// Records every logits row the engine produces, per sequence, in order.
class RecordingEngine : public Engine {
 public:
  explicit RecordingEngine(server::ModelEngine& e) : e_(e) {}
  int64_t vocab_size() const override { return e_.vocab_size(); }
  int64_t kv_bytes_per_token() const override { return e_.kv_bytes_per_token(); }
  void copy_block(int32_t src, int32_t dst, int64_t n) override { e_.copy_block(src, dst, n); }
  void step(std::span<const EngineStepItem> items, float* logits) override {
    e_.step(items, logits);
    const int64_t V = vocab_size();
    std::lock_guard lk(mu);
    int64_t row = 0;
    for (const auto& it : items)
      if (it.want_logits) {
        rows[it.seq].emplace_back(logits + row * V, logits + (row + 1) * V);
        ++row;
      }
  }
  std::mutex mu;
  std::map<SeqId, std::vector<std::vector<float>>> rows;

 private:
  server::ModelEngine& e_;
};

class Sink : public GenerationSink {
 public:
  explicit Sink(int n) : toks(static_cast<size_t>(n)) {}
  void on_cached_prompt_tokens(int64_t t) override { cached = t; }
  bool on_token(int c, const SampleResult& s, bool) override {
    std::lock_guard lk(mu);
    toks[static_cast<size_t>(c)].push_back(s.token);
    return false;
  }
  void on_finish(int, FinishReason) override {
    std::lock_guard lk(mu);
    ++finished;
    cv.notify_all();
  }
  void on_abort(AbortReason, const std::string& m) override {
    std::lock_guard lk(mu);
    aborted = m.empty() ? "aborted" : m;
    cv.notify_all();
  }
  bool wait(int n) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(60), [&] { return finished >= n || !aborted.empty(); }) &&
           aborted.empty();
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int32_t>> toks;
  int finished = 0;
  int64_t cached = -1;
  std::string aborted;
};

struct Served {
  ModelFiles files;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<server::ModelEngine> engine;
  std::unique_ptr<RecordingEngine> rec;
  std::unique_ptr<Scheduler> sched;
};

std::unique_ptr<Served> serve(const std::string& name, bool prefix_cache, int64_t bt) {
  auto s = std::make_unique<Served>();
  s->files = open_model_files(std::string(LATENT_SOURCE_DIR) + "/tests/models/" + name);
  s->backend = make_backend("cpu", 2);
  s->model = std::make_unique<Model>(*s->files.cfg, *s->files.plan, *s->backend);
  s->engine = std::make_unique<server::ModelEngine>(*s->model);
  SchedulerOptions o;
  o.kv_block_tokens = bt;
  o.max_context = 128;
  o.prefill_chunk = 16;
  o.prefix_cache = prefix_cache;
  o.kv_total_blocks = s->engine->configure(64 * bt * s->engine->kv_bytes_per_token(), bt, o.max_batch_tokens,
                                           o.max_num_seqs, o.max_context);
  s->rec = std::make_unique<RecordingEngine>(*s->engine);
  s->sched = std::make_unique<Scheduler>(*s->rec, o);
  s->sched->start();
  return s;
}

// Runs one greedy request to the end; returns its sequence id (ids are given in admission order from 1).
std::vector<int32_t> run(Served& s, const std::vector<int32_t>& prompt, int n, int64_t* cached,
                         std::vector<std::vector<int32_t>>* toks = nullptr) {
  auto sink = std::make_shared<Sink>(n);
  GenerationRequest g;
  g.prompt = prompt;
  g.n = n;
  g.max_tokens = 5;
  g.sampling.temperature = 0.0f;  // greedy
  g.sink = sink;
  s.sched->submit(g);
  EXPECT_TRUE(sink->wait(n)) << sink->aborted;
  if (cached) *cached = sink->cached;
  if (toks) *toks = sink->toks;
  return sink->toks[0];
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

class PrefixCacheExact : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefixCacheExact, CachedEqualsFromScratch) {
  const int64_t bt = 4;
  std::vector<int32_t> a;
  for (int i = 0; i < 22; ++i) a.push_back(5 + (i * 37) % 200);
  struct Variant {
    const char* what;
    int64_t shared;
  };
  // Each B has 22 tokens and shares `shared` leading tokens with A.
  const std::vector<Variant> variants = {
      {"nothing", 0}, {"one token", 1}, {"a block boundary", 8}, {"all but one token", 21}};
  auto cached_srv = serve(GetParam(), true, bt);
  run(*cached_srv, a, 1, nullptr);
  SeqId next = 2;
  for (const Variant& v : variants) {
    std::vector<int32_t> b(a.begin(), a.begin() + v.shared);
    for (int64_t i = v.shared; i < 22; ++i) b.push_back(7 + (i * 53 + 11) % 190);
    if (v.shared < 22 && b[static_cast<size_t>(v.shared)] == a[static_cast<size_t>(v.shared)]) b[v.shared] += 1;
    int64_t hit = -1;
    const auto out = run(*cached_srv, b, 1, &hit);
    const SeqId id = next++;
    EXPECT_EQ(hit, v.shared / bt * bt) << v.what;
    auto scratch_srv = serve(GetParam(), false, bt);
    const auto ref_out = run(*scratch_srv, b, 1, nullptr);
    EXPECT_EQ(out, ref_out) << v.what;
    std::lock_guard l1(cached_srv->rec->mu), l2(scratch_srv->rec->mu);
    EXPECT_TRUE(same_bits(cached_srv->rec->rows[id], scratch_srv->rec->rows[1])) << v.what;
  }
  // The same prompt again, with n = 3: all choices from the cached prefix, equal greedy outputs.
  int64_t hit = -1;
  std::vector<std::vector<int32_t>> toks;
  const auto first = run(*cached_srv, a, 3, &hit, &toks);
  EXPECT_EQ(hit, 20);  // 21 tokens may come from the cache: 5 full blocks
  EXPECT_EQ(toks[1], first);
  EXPECT_EQ(toks[2], first);
  const auto st = cached_srv->sched->stats();
  EXPECT_GT(st.prefix_cached_blocks, 0);
  EXPECT_GT(st.prefix_hit_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, PrefixCacheExact, ::testing::Values("glm5-tiny", "v3-tiny"), [](const auto& i) {
  std::string n = i.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
});

}  // namespace
}  // namespace latent
