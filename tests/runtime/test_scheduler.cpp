// Scheduler with a fake engine: continuous batching, chunked prefill, cancellation, queue limit, n > 1, KV budget
// and preemption, failures.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"
#include "fake_paged_store.h"
#include "runtime/scheduler.h"
#include "truncated_softmax.h"

namespace latent {
namespace {

using namespace std::chrono_literals;

// Logits are a deterministic function of a sequence's whole history, so outputs do not depend on batching.
class FakeEngine : public Engine {
 public:
  static constexpr int64_t kV = 64;
  int64_t vocab_size() const override { return kV; }
  int64_t kv_bytes_per_token() const override { return 100; }
  void copy_block(int32_t src, int32_t dst, int64_t n_tokens) override {
    std::lock_guard lk(mu);
    store.copy_block(src, dst, n_tokens);
    if (drafts > 0) mtp.copy_block(src, dst, n_tokens);  // (throws when the draft slots are not there yet)
    ++forks;
  }
  // Speculative decoding: a draft layer whose slots hold token ids in a store of their own (a slot read before it
  // was written throws), fed from the last step's rows (checked: slot q must read the row of position q - 1 of a
  // sequence with the same tokens up to there: its own, or the parent of a forked choice). Its proposals are the greedy
  // continuation; every draft_wrong-th (by a hash of the history) is wrong, or all of them are draft_fixed.
  int64_t drafts = 0;
  int64_t draft_wrong = 0;
  int32_t draft_fixed = -1;
  testing::FakePagedStore mtp;
  std::vector<std::pair<int64_t, uint64_t>> rows;  // the last step's flat rows: (position, hash of tokens 0..it)
  static uint64_t prefix_hash(const std::vector<int32_t>& h, int64_t n) {
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < n; ++i) x = (x ^ static_cast<uint64_t>(h[static_cast<size_t>(i)] + 3)) * 1099511628211ull;
    return x;
  }
  int64_t draft_calls = 0, max_verify_len = 0;
  int64_t draft_layers() const override { return drafts > 0 ? 1 : 0; }
  std::unordered_map<int64_t, std::pair<SeqId, int64_t>> mtp_writer;  // slot -> (sequence, draft call)
  std::string diag(const EngineDraftItem& d, const std::vector<int32_t>& h, int64_t q) {
    std::string o;
    for (int64_t p = 0; p < q; ++p) {
      const int64_t sl =
          static_cast<int64_t>(d.blocks[static_cast<size_t>(p / store.block_tokens)]) * store.block_tokens +
          p % store.block_tokens;
      auto f = store.slot_token.find(sl);
      if (f == store.slot_token.end() || f->second != h[static_cast<size_t>(p)]) {
        auto w = mtp_writer.find(sl);
        o += " | pos " + std::to_string(p) + " slot " + std::to_string(sl) + " mtp " +
             std::to_string(h[static_cast<size_t>(p)]) + " target " +
             (f == store.slot_token.end() ? std::string("none") : std::to_string(f->second)) + " written by seq " +
             (w == mtp_writer.end() ? std::string("?")
                                    : std::to_string(w->second.first) + " call " + std::to_string(w->second.second));
        break;
      }
    }
    return o;
  }
  void draft(std::span<const EngineDraftItem> items, int32_t* out) override {
    std::lock_guard lk(mu);
    ++draft_calls;
    int64_t at = 0;
    for (const auto& d : items) {
      const int64_t n = static_cast<int64_t>(d.tokens.size());
      EngineStepItem w;
      w.blocks = d.blocks;
      w.start = d.start;
      w.tokens = d.tokens;
      std::vector<int32_t> h = mtp.apply(w);
      for (int64_t i = 0; i < n; ++i) mtp_writer[mtp.slot(w, d.start + i)] = {d.seq, draft_calls};
      for (int64_t i = d.zero_first ? 1 : 0; i < n; ++i) {
        const int64_t q = d.start + i;
        const auto want = std::make_pair(q - 1, prefix_hash(h, q));
        if (d.hidden_row + i < 0 || d.hidden_row + i >= static_cast<int64_t>(rows.size()) ||
            rows[static_cast<size_t>(d.hidden_row + i)] != want)
          throw std::runtime_error("fake draft: slot " + std::to_string(q) + " of sequence " + std::to_string(d.seq) +
                                   " reads row " + std::to_string(d.hidden_row + i) + " of " +
                                   std::to_string(rows.size()) + ", want position " + std::to_string(q - 1) +
                                   (d.hidden_row + i >= 0 && d.hidden_row + i < static_cast<int64_t>(rows.size())
                                        ? " got " + std::to_string(rows[static_cast<size_t>(d.hidden_row + i)].first)
                                        : std::string()) +
                                   " start " + std::to_string(d.start) + " n " + std::to_string(n) +
                                   (d.zero_first ? " zero_first" : "") + diag(d, h, q));
      }
      std::vector<int32_t> props;
      for (int32_t j = 0; j < d.n_draft; ++j) {
        uint64_t x = 1469598103934665603ull;
        for (int32_t t : h) x = (x ^ static_cast<uint64_t>(t + 7)) * 1099511628211ull;
        int32_t t = next_of(h, x);
        if (draft_fixed >= 0)
          t = draft_fixed;
        else if (draft_wrong > 0 && (x >> 7) % static_cast<uint64_t>(draft_wrong) == 0)
          t = static_cast<int32_t>(2 + (t - 2 + 1) % (kV - 2));
        props.push_back(t);
        h.push_back(t);
        out[at++] = t;
      }
      if (d.n_draft > 1) {  // the scratch slots of the recursion
        EngineStepItem sc;
        sc.blocks = d.blocks;
        sc.start = d.start + n;
        sc.tokens = std::span<const int32_t>(props.data(), static_cast<size_t>(d.n_draft - 1));
        mtp.apply(sc);
      }
    }
  }
  void step(std::span<const EngineStepItem> items, float* logits) override {
    if (delay.count() || per_token.count()) {
      int64_t n = 0;
      for (const auto& it : items) n += static_cast<int64_t>(it.tokens.size());
      std::this_thread::sleep_for(delay + per_token * n);
    }
    std::lock_guard lk(mu);
    if (fail) throw std::runtime_error("fake failure");
    if (lose) {
      is_lost = true;
      throw std::runtime_error("fake kernel fault");
    }
    std::vector<std::pair<SeqId, int64_t>> log;
    int64_t row = 0;
    rows.clear();
    for (const auto& it : items) {
      if (it.decode && it.all_logits)
        max_verify_len = std::max<int64_t>(max_verify_len, static_cast<int64_t>(it.tokens.size()));
      const std::vector<int32_t> h = store.apply(it);
      for (size_t i = 0; i < it.tokens.size(); ++i) {
        const int64_t pos = it.start + static_cast<int64_t>(i);
        rows.emplace_back(pos, prefix_hash(h, pos + 1));
      }
      tokens_processed += static_cast<int64_t>(it.tokens.size());
      log.emplace_back(it.seq, static_cast<int64_t>(it.tokens.size()));
      if (it.all_logits) {  // one row per token, each from the history up to that token
        const int64_t n = static_cast<int64_t>(it.tokens.size());
        all_rows_items += 1;
        for (int64_t k = 0; k < n; ++k) {
          const std::vector<int32_t> hk(h.begin(), h.begin() + it.start + k + 1);
          row_of(hk, logits + row * kV);
          ++row;
        }
        continue;
      }
      if (!it.want_logits) continue;
      row_of(h, logits + row * kV);
      ++row;
    }
    steps.push_back(std::move(log));
  }
  // The logits row after history h (a deterministic function of h).
  void row_of(const std::vector<int32_t>& h, float* r) const {
    uint64_t x = 1469598103934665603ull;
    for (int32_t t : h) x = (x ^ static_cast<uint64_t>(t + 7)) * 1099511628211ull;
    for (int64_t v = 0; v < kV; ++v) r[v] = static_cast<float>((x >> (v % 40)) & 7) * 0.1f;
    r[next_of(h, x)] = 5.0f;
  }
  int32_t next_of(const std::vector<int32_t>& h, uint64_t x) const {
    const auto n = static_cast<int64_t>(h.size());
    if (force_token >= 0 && n >= force_after) return force_token;
    if (!cycle.empty() && n >= force_after) return cycle[static_cast<size_t>(n - force_after) % cycle.size()];
    return static_cast<int32_t>(2 + (x % (kV - 2)));  // never 0 or 1 (used as EOS in tests)
  }
  std::mutex mu;
  testing::FakePagedStore store;
  std::vector<std::vector<std::pair<SeqId, int64_t>>> steps;
  int64_t tokens_processed = 0;
  int forks = 0;
  bool fail = false;
  bool lose = false;  // the next step fails and leaves the engine lost (a poisoned GPU context)
  std::atomic<bool> is_lost{false};
  bool lost() const override { return is_lost.load(); }
  int32_t force_token = -1;
  int64_t force_after = 0;
  std::vector<int32_t> cycle;  // from force_after on, the outputs repeat this cycle (a degenerate generation)
  std::chrono::milliseconds delay{0};
  std::chrono::microseconds per_token{0};  // step time grows with its tokens (mixed_step_factor's input)
  int64_t all_rows_items = 0;              // items that asked for every row's logits
};

class CollectSink : public GenerationSink {
 public:
  explicit CollectSink(int n, int stop_after = -1) : toks(static_cast<size_t>(n)), stop_after_(stop_after) {}
  void on_scheduled() override { scheduled = true; }
  bool on_token(int c, const SampleResult& s, bool stop_token) override {
    std::lock_guard lk(mu);
    auto& v = toks.at(static_cast<size_t>(c));
    if (stop_token) {
      stop_tokens.push_back(s.token);
      return false;
    }
    v.push_back(s.token);
    return stop_after_ >= 0 && static_cast<int>(v.size()) >= stop_after_;
  }
  void on_finish(int c, FinishReason r) override {
    std::lock_guard lk(mu);
    reasons[c] = r;
    cv.notify_all();
  }
  void on_prompt_logprobs(int first, int n, std::vector<SampleResult> e) override {
    std::lock_guard lk(mu);
    prompt_lp_calls.emplace_back(first, n);
    prompt_lp = std::move(e);
    prompt_lp_before_tokens = std::all_of(toks.begin(), toks.end(), [](const auto& v) { return v.empty(); });
  }
  void on_abort(AbortReason r, const std::string& m) override {
    std::lock_guard lk(mu);
    aborted = r;
    abort_msg = m;
    cv.notify_all();
  }
  // Polls until choice 0 has at least n tokens (or the time is up): a request that is decoding.
  void wait_tokens(size_t n, std::chrono::milliseconds t) {
    for (auto until = std::chrono::steady_clock::now() + t; std::chrono::steady_clock::now() < until;) {
      {
        std::lock_guard lk(mu);
        if (toks[0].size() >= n) return;
      }
      std::this_thread::sleep_for(1ms);
    }
  }
  bool wait(size_t n_choices, std::chrono::milliseconds t = 5000ms) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, t, [&] { return reasons.size() >= n_choices || aborted.has_value(); });
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int32_t>> toks;
  std::vector<int32_t> stop_tokens;
  std::map<int, FinishReason> reasons;
  std::optional<AbortReason> aborted;
  std::string abort_msg;
  std::atomic<bool> scheduled{false};
  std::vector<std::pair<int, int>> prompt_lp_calls;
  std::vector<SampleResult> prompt_lp;
  bool prompt_lp_before_tokens = false;

 private:
  int stop_after_;
};

GenerationRequest make_req(std::vector<int32_t> prompt, int64_t max_tokens, std::shared_ptr<GenerationSink> sink,
                           int n = 1) {
  GenerationRequest g;
  g.prompt = std::move(prompt);
  g.max_tokens = max_tokens;
  g.sampling.temperature = 0.0f;
  g.sink = std::move(sink);
  g.n = n;
  g.stop_ids = {1};
  return g;
}

std::vector<int32_t> prompt_of(int len, int seed) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(2 + (i * 7 + seed * 13) % 60);
  return p;
}

std::vector<int32_t> run_alone(std::vector<int32_t> prompt, int64_t max_tokens, SchedulerOptions o = {}) {
  FakeEngine e;
  Scheduler s(e, o);
  s.start();
  auto sink = std::make_shared<CollectSink>(1);
  s.submit(make_req(std::move(prompt), max_tokens, sink));
  EXPECT_TRUE(sink->wait(1));
  return sink->toks[0];
}

TEST(Scheduler, GreedyLengthAndKvFreed) {
  FakeEngine e;
  Metrics m;
  Scheduler s(e, {}, &m);
  s.start();
  auto sink = std::make_shared<CollectSink>(1);
  auto h = s.submit(make_req(prompt_of(10, 1), 7, sink));
  ASSERT_TRUE(sink->wait(1));
  EXPECT_EQ(sink->toks[0].size(), 7u);
  EXPECT_EQ(sink->reasons[0], FinishReason::Length);
  EXPECT_TRUE(sink->scheduled);
  for (int i = 0; i < 100 && !h->done(); ++i) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(h->done());
  EXPECT_EQ(s.stats().kv_used, 0);
  EXPECT_EQ(m.generation_tokens.value(), 7u);
  EXPECT_EQ(m.prompt_tokens.value(), 10u);
}

TEST(Scheduler, StopTokenEndsChoice) {
  FakeEngine e;
  e.force_token = 1;  // EOS
  e.force_after = 13;
  Scheduler s(e, {});
  s.start();
  auto sink = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(10, 2), 50, sink));
  ASSERT_TRUE(sink->wait(1));
  EXPECT_EQ(sink->reasons[0], FinishReason::Stop);
  EXPECT_EQ(sink->toks[0].size(), 3u);  // 10 prompt + 3 generated = 13, then EOS
  ASSERT_EQ(sink->stop_tokens.size(), 1u);
  EXPECT_EQ(sink->stop_tokens[0], 1);
}

TEST(Scheduler, SinkStopStringEndsChoice) {
  FakeEngine e;
  Scheduler s(e, {});
  s.start();
  auto sink = std::make_shared<CollectSink>(1, /*stop_after=*/4);
  s.submit(make_req(prompt_of(5, 3), 50, sink));
  ASSERT_TRUE(sink->wait(1));
  EXPECT_EQ(sink->reasons[0], FinishReason::Stop);
  EXPECT_EQ(sink->toks[0].size(), 4u);
}

// Allows only the ids of a fixed script, one per step; finished once the script is done.
class ScriptConstraint : public LogitConstraint {
 public:
  ScriptConstraint(std::vector<int32_t> script, std::vector<int32_t>* seen) : script_(std::move(script)), seen_(seen) {}
  void mask(std::span<float> logits) override {
    ++masks;
    for (size_t i = 0; i < logits.size(); ++i)
      if (pos_ >= script_.size() || static_cast<int32_t>(i) != script_[pos_])
        logits[i] = -std::numeric_limits<float>::infinity();
  }
  void accept(int32_t t) override {
    seen_->push_back(t);
    ++pos_;
  }
  bool finished() const override { return pos_ >= script_.size(); }
  int masks = 0;

 private:
  std::vector<int32_t> script_;
  std::vector<int32_t>* seen_;
  size_t pos_ = 0;
};

TEST(Scheduler, LogitConstraintMasksBeforeSamplingAndEndsTheChoice) {
  FakeEngine e;
  Scheduler s(e, {});
  s.start();
  auto sink = std::make_shared<CollectSink>(2);
  auto g = make_req(prompt_of(6, 9), 50, sink, /*n=*/2);
  g.sampling.temperature = 1.0f;  // sampling, not greedy: only the mask can force the script
  g.sampling.seed = 3;
  std::vector<int32_t> seen[2];
  g.constraint = [&](int choice) -> std::unique_ptr<LogitConstraint> {
    std::vector<int32_t> script = choice == 0 ? std::vector<int32_t>{5, 9, 33} : std::vector<int32_t>{40, 41};
    return std::make_unique<ScriptConstraint>(script, &seen[choice]);
  };
  s.submit(std::move(g));
  ASSERT_TRUE(sink->wait(2));
  EXPECT_EQ(sink->toks[0], (std::vector<int32_t>{5, 9, 33}));
  EXPECT_EQ(sink->toks[1], (std::vector<int32_t>{40, 41}));
  EXPECT_EQ(seen[0], sink->toks[0]);
  EXPECT_EQ(sink->reasons[0], FinishReason::Stop);
  EXPECT_EQ(sink->reasons[1], FinishReason::Stop);
}

TEST(Scheduler, ContextLimitIsLength) {
  SchedulerOptions o;
  o.max_context = 20;
  auto t = run_alone(prompt_of(15, 4), 100, o);
  EXPECT_EQ(t.size(), 5u);
}

TEST(Scheduler, BatchedEqualsAlone) {
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < 16; ++i) alone.push_back(run_alone(prompt_of(5 + i * 37, i), 20));
  FakeEngine e;
  SchedulerOptions o;
  o.prefill_chunk = 64;
  o.max_batch_tokens = 100;
  Scheduler s(e, o);
  s.start();
  std::vector<std::shared_ptr<CollectSink>> sinks;
  for (int i = 0; i < 16; ++i) {
    sinks.push_back(std::make_shared<CollectSink>(1));
    s.submit(make_req(prompt_of(5 + i * 37, i), 20, sinks.back()));
  }
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(sinks[static_cast<size_t>(i)]->wait(1));
    EXPECT_EQ(sinks[static_cast<size_t>(i)]->toks[0], alone[static_cast<size_t>(i)]) << "request " << i;
  }
  EXPECT_GT(s.stats().max_batch_seqs, 4);  // requests really ran together
}

TEST(Scheduler, ChunkedPrefillDoesNotStallDecoding) {
  FakeEngine e;
  e.delay = std::chrono::milliseconds(1);  // `a` (400 steps) outlives b's ~19 prefill chunks on a loaded machine
  SchedulerOptions o;
  o.prefill_chunk = 32;
  o.max_batch_tokens = 40;
  Scheduler s(e, o);
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(8, 1), 400, a));
  // Wait until `a` decodes, then send a long prompt.
  a->wait_tokens(3, 200ms);
  auto b = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(600, 2), 5, b));
  ASSERT_TRUE(b->wait(1));
  ASSERT_TRUE(a->wait(1));
  std::lock_guard lk(e.mu);
  // Every step that prefilled part of b's prompt also advanced a (if a was still running).
  int prefill_steps = 0;
  const SeqId sa = 1, sb = 2;
  for (const auto& st : e.steps) {
    bool has_b_chunk = false, has_a = false;
    for (auto [seq, n] : st) {
      if (seq == sb && n > 1) {
        has_b_chunk = true;
        EXPECT_LE(n, 32);
      }
      if (seq == sa) has_a = true;
    }
    if (has_b_chunk) {
      ++prefill_steps;
      EXPECT_TRUE(has_a);
    }
  }
  EXPECT_GE(prefill_steps, 600 / 32);
}

// A prefill chunk as large as the whole step budget (--prefill-chunk = --max-num-batched-tokens, as a GPU server
// sets them) still advances beside running decodes: the part of the chunk the budget leaves room for, the rest
// next step — not held back until no sequence decodes (which starved long prompts while streams kept decoding).
TEST(Scheduler, ChunkAsLargeAsTheBudgetIsSplitNotStarved) {
  FakeEngine e;
  e.delay = std::chrono::milliseconds(1);
  SchedulerOptions o;
  o.prefill_chunk = 32;
  o.max_batch_tokens = 32;
  Scheduler s(e, o);
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(8, 1), 400, a));
  a->wait_tokens(3, 200ms);
  auto b = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(300, 2), 5, b));
  ASSERT_TRUE(b->wait(1));
  {
    std::lock_guard lk(a->mu);
    EXPECT_TRUE(a->reasons.empty());  // b was prefilled and finished while a was still decoding
  }
  ASSERT_TRUE(a->wait(1));
  std::lock_guard lk(e.mu);
  const SeqId sa = 1, sb = 2;
  int shared_steps = 0, b_tokens = 0, slivers = 0;
  for (const auto& st : e.steps) {
    int64_t total = 0;
    bool has_a = false, b_chunk = false;
    for (auto [seq, n] : st) {
      total += n;
      if (seq == sa) has_a = true;
      if (seq == sb && n > 1) {
        b_chunk = true;
        b_tokens += static_cast<int>(n);
      }
      if (seq == sb && n == 1 && b_tokens < 300) ++slivers;  // one-token pieces of the prompt
    }
    EXPECT_LE(total, 32);  // the budget holds
    if (has_a && b_chunk) ++shared_steps;
  }
  EXPECT_GE(shared_steps, 300 / 32);  // b's prompt went through beside a, chunk by chunk
  EXPECT_EQ(b_tokens + slivers, 300);
  EXPECT_LE(slivers, 1);  // pieces as large as the budget allows, not a chunk and its one-token remainder in turn
}

// mixed_step_factor: with a step costing 2 ms + 0.1 ms per token, a prompt chunk beside a decode is held to
// (2 - 1) x 2.1 ms / 0.1 ms = 21 tokens (at least kMinMixedPrefill), where the token budget alone gives 63; the
// prompt still goes through beside the decode. The engine sleeps that long, and the scheduler takes the same cost
// model as its step times (SchedulerOptions::step_seconds), so that the bound does not depend on the machine's load
// (measured sleeps under ASan on a busy 2-core host once gave 49).
TEST(Scheduler, MixedStepFactorBoundsPromptTokensBesideDecodes) {
  for (double factor : {0.0, 2.0}) {
    FakeEngine e;
    e.delay = std::chrono::milliseconds(2);
    e.per_token = std::chrono::microseconds(100);
    SchedulerOptions o;
    o.prefill_chunk = 64;
    o.max_batch_tokens = 64;
    o.mixed_step_factor = factor;
    o.step_seconds = [](int64_t decode, int64_t prompt) {
      return 0.002 + 0.0001 * static_cast<double>(decode + prompt);
    };
    Scheduler s(e, o);
    s.start();
    auto a = std::make_shared<CollectSink>(1);
    s.submit(make_req(prompt_of(8, 1), 300, a));
    a->wait_tokens(8, 400ms);  // a few decode-only steps measured
    auto b = std::make_shared<CollectSink>(1);
    s.submit(make_req(prompt_of(600, 2), 3, b));
    ASSERT_TRUE(b->wait(1));
    {
      std::lock_guard lk(a->mu);
      EXPECT_TRUE(a->reasons.empty()) << factor;  // b went through while a decoded
    }
    ASSERT_TRUE(a->wait(1));
    std::lock_guard lk(e.mu);
    std::vector<int64_t> chunks;  // b's prompt pieces in steps beside a
    for (const auto& st : e.steps) {
      bool has_a = false;
      int64_t bn = 0;
      for (auto [seq, n] : st) {
        if (seq == 1) has_a = true;
        if (seq == 2 && n > 1) bn = n;
      }
      if (has_a && bn > 0) chunks.push_back(bn);
    }
    ASSERT_GE(chunks.size(), 5u) << factor;
    std::sort(chunks.begin() + 2, chunks.end());  // the first ones estimate a prompt token's cost
    const int64_t median = chunks[2 + (chunks.size() - 2) / 2];
    if (factor == 0.0) {
      EXPECT_EQ(median, 63);
    } else {
      EXPECT_GE(median, 20);  // 21, or 20 where the quotient's rounding falls below it
      EXPECT_LE(median, 21);
    }
  }
}

TEST(Scheduler, ContinuousAdmission) {
  FakeEngine e;
  e.delay = 1ms;
  Scheduler s(e, {});
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(4, 1), 100, a));
  std::this_thread::sleep_for(20ms);
  auto b = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(4, 2), 5, b));
  ASSERT_TRUE(b->wait(1));
  {
    std::lock_guard lk(a->mu);
    EXPECT_TRUE(a->reasons.empty());  // b joined and finished while a was still running
  }
  ASSERT_TRUE(a->wait(1));
}

TEST(Scheduler, CancelFreesBlocksWithinAStep) {
  FakeEngine e;
  e.delay = 2ms;
  Metrics m;
  Scheduler s(e, {}, &m);
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  auto h = s.submit(make_req(prompt_of(40, 1), 100000, a));
  while (true) {
    std::lock_guard lk(a->mu);
    if (a->toks[0].size() >= 5) break;
  }
  EXPECT_GT(s.stats().kv_used, 0);
  h->cancel();
  for (int i = 0; i < 200 && !h->done(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(h->done());
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.stats().kv_used, 0);
  EXPECT_EQ(s.stats().running_seqs, 0);
  EXPECT_FALSE(a->aborted.has_value());  // a cancelled request gets no callbacks
  EXPECT_EQ(m.requests_aborted.value("client_disconnect"), 1u);
}

TEST(Scheduler, CancelWhileQueued) {
  FakeEngine e;
  e.delay = 1ms;
  SchedulerOptions o;
  o.max_num_seqs = 1;
  Scheduler s(e, o);
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(4, 1), 100, a));
  auto b = std::make_shared<CollectSink>(1);
  auto hb = s.submit(make_req(prompt_of(4, 2), 5, b));
  std::this_thread::sleep_for(5ms);
  EXPECT_EQ(s.stats().waiting, 1);
  hb->cancel();
  for (int i = 0; i < 200 && !hb->done(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(hb->done());
  EXPECT_EQ(s.stats().waiting, 0);
  EXPECT_FALSE(b->scheduled);
}

TEST(Scheduler, QueueFullIsOverloaded) {
  FakeEngine e;
  e.delay = 2ms;
  SchedulerOptions o;
  o.max_num_seqs = 1;
  o.max_queue_len = 2;
  Scheduler s(e, o);
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(4, 1), 1000, a));
  std::this_thread::sleep_for(10ms);  // a is running
  s.submit(make_req(prompt_of(4, 2), 5, std::make_shared<CollectSink>(1)));
  s.submit(make_req(prompt_of(4, 3), 5, std::make_shared<CollectSink>(1)));
  try {
    s.submit(make_req(prompt_of(4, 4), 5, std::make_shared<CollectSink>(1)));
    FAIL() << "expected overload";
  } catch (const SchedulerRejected& r) {
    EXPECT_EQ(r.kind, SchedulerRejected::Kind::Overloaded);
  }
}

TEST(Scheduler, QueueWaitExpires) {
  FakeEngine e;
  e.delay = 2ms;
  SchedulerOptions o;
  o.max_num_seqs = 1;
  o.max_queue_wait_s = 0.02;
  Scheduler s(e, o);
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(4, 1), 200, a));
  auto b = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(4, 2), 5, b));
  ASSERT_TRUE(b->wait(1));
  ASSERT_TRUE(b->aborted.has_value());
  EXPECT_EQ(*b->aborted, AbortReason::QueueTimeout);
}

// Records the KV blocks in use when each choice receives its first token (on the scheduler thread).
class UsageSink : public CollectSink {
 public:
  UsageSink() : CollectSink(1) {}
  bool on_token(int c, const SampleResult& r, bool stop_token) override {
    bool first;
    {
      std::lock_guard lk(mu);
      first = toks[0].empty();
    }
    if (first && sched) used_at_first.store(sched->stats().kv_used);
    return CollectSink::on_token(c, r, stop_token);
  }
  Scheduler* sched = nullptr;
  std::atomic<int64_t> used_at_first{-1};
};

TEST(Scheduler, EightSequencesOfAThousandTokensOccupyExactlyTheirBlocks) {
  FakeEngine e;
  SchedulerOptions o;
  o.kv_block_tokens = 64;
  o.kv_total_blocks = 1000;
  o.max_batch_tokens = 8192;
  o.prefill_chunk = 1024;
  o.max_context = 4096;
  Scheduler s(e, o);
  std::vector<std::shared_ptr<UsageSink>> sinks;
  for (int i = 0; i < 8; ++i) {
    sinks.push_back(std::make_shared<UsageSink>());
    sinks.back()->sched = &s;
    s.submit(make_req(prompt_of(999, i), 8, sinks.back()));
  }
  s.start();  // all eight are queued: their prompts are prefilled in one step and sampled in that step
  for (auto& k : sinks) ASSERT_TRUE(k->wait(1));
  // When each sampled its first token, all eight held blocks for 1,000 tokens (999 prompt + the next one):
  // ceil(1000 / 64) = 16 blocks each, 128 in all.
  for (auto& k : sinks) EXPECT_EQ(k->used_at_first.load(), 8 * 16);
  s.stop();
  EXPECT_EQ(s.stats().kv_used, 0);
}

TEST(Scheduler, NGreaterThanOneSharesThePromptBlocks) {
  FakeEngine e;
  e.delay = 3ms;
  SchedulerOptions o;
  o.kv_block_tokens = 16;
  e.store.block_tokens = 16;
  Scheduler s(e, o);
  s.start();
  auto sink = std::make_shared<CollectSink>(4);
  s.submit(make_req(prompt_of(100, 3), 50, sink, 4));
  // 100 prompt tokens = 6 full blocks (shared by the 4 choices) + a partial one (copied: one per choice).
  int64_t min_used = 1 << 30;
  for (int i = 0; i < 2000; ++i) {
    {
      std::lock_guard lk(sink->mu);
      bool all = true;
      for (auto& t : sink->toks) all = all && !t.empty();
      if (all) {
        min_used = std::min(min_used, s.stats().kv_used);
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(min_used, 6 + 4);
  ASSERT_TRUE(sink->wait(4));
  EXPECT_EQ(sink->toks[0], sink->toks[1]);
  EXPECT_EQ(s.stats().kv_used, 0);
}

TEST(Scheduler, MemoryPressureEvictsCachedBlocksBeforePreempting) {
  FakeEngine e;
  Metrics m;
  SchedulerOptions o;
  o.kv_block_tokens = 8;
  e.store.block_tokens = 8;
  o.kv_total_blocks = 20;  // 160 tokens
  Scheduler s(e, o, &m);
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(60, 1), 4, a));
  ASSERT_TRUE(a->wait(1));
  const int64_t cached = s.stats().prefix_cached_blocks;
  EXPECT_EQ(cached, 7);  // 63 tokens computed: 7 full blocks stay cached after the request ended
  EXPECT_EQ(s.stats().kv_used, 0);
  // Two requests that need 9 blocks each (40 + 30 tokens): 18 of 20 blocks, more than the 13 never used.
  auto b = std::make_shared<CollectSink>(1), c = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(40, 2), 30, b));
  s.submit(make_req(prompt_of(40, 3), 30, c));
  ASSERT_TRUE(b->wait(1));
  ASSERT_TRUE(c->wait(1));
  EXPECT_EQ(m.preemptions.value(), 0u);
  EXPECT_LT(s.stats().prefix_cached_blocks, cached + 2 * 8);
  EXPECT_EQ(b->toks[0], run_alone(prompt_of(40, 2), 30));
}

TEST(Scheduler, PrefixCacheSkipsTheSharedPrompt) {
  FakeEngine e;
  Metrics m;
  SchedulerOptions o;
  o.kv_block_tokens = 16;
  e.store.block_tokens = 16;
  Scheduler s(e, o, &m);
  s.start();
  auto p = prompt_of(100, 4);
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(p, 3, a));
  ASSERT_TRUE(a->wait(1));
  int64_t before;
  {
    std::lock_guard lk(e.mu);
    before = e.tokens_processed;
  }
  p.push_back(9);
  auto b = std::make_shared<CollectSink>(1);
  s.submit(make_req(p, 3, b));
  ASSERT_TRUE(b->wait(1));
  std::lock_guard lk(e.mu);
  // 6 full blocks (96 tokens) of the shared prompt came from the cache: 5 computed for the prefill, 2 decodes.
  EXPECT_EQ(e.tokens_processed - before, 101 - 96 + 2);
  EXPECT_EQ(m.prefix_cache_hits.value(), 96u);
  EXPECT_EQ(b->toks[0], run_alone(p, 3));
}

TEST(Scheduler, NGreaterThanOneForksPrompt) {
  FakeEngine e;
  Scheduler s(e, {});
  s.start();
  auto sink = std::make_shared<CollectSink>(3);
  s.submit(make_req(prompt_of(50, 1), 6, sink, 3));
  ASSERT_TRUE(sink->wait(3));
  EXPECT_EQ(sink->toks[0], sink->toks[1]);  // greedy: identical
  EXPECT_EQ(sink->toks[0], sink->toks[2]);
  std::lock_guard lk(e.mu);
  EXPECT_EQ(e.forks, 2);
  EXPECT_EQ(e.tokens_processed, 50 + 3 * 5);  // prompt once; the last sampled token is never fed back
}

TEST(Scheduler, SeededSamplingPerChoice) {
  auto run = [](uint64_t seed) {
    FakeEngine e;
    Scheduler s(e, {});
    s.start();
    auto sink = std::make_shared<CollectSink>(2);
    auto g = make_req(prompt_of(10, 1), 12, sink, 2);
    g.sampling.temperature = 3.0f;
    g.sampling.seed = static_cast<int64_t>(seed);
    s.submit(g);
    EXPECT_TRUE(sink->wait(2));
    return sink->toks;
  };
  auto a = run(7), b = run(7);
  EXPECT_EQ(a, b);
  EXPECT_NE(a[0], a[1]);  // choices use different streams
}

// An engine that samples "on its device": the same logits, sampled by Backend::sample_rows' reference.
class DeviceSamplingEngine : public FakeEngine {
 public:
  bool samples_on_device() const override { return true; }
  void step_sampled(std::span<const EngineStepItem> items, const SampleBatch& sb, int32_t* ids) override {
    std::vector<float> logits(static_cast<size_t>(sb.n_rows * kV));
    step(items, logits.data());
    std::vector<uint32_t> banned_bits;
    if (sb.banned) banned_bits = sample_bitmask(*sb.banned);
    sample_rows_reference(logits.data(), sb.n_rows, kV, sb.rows, sb.edits, sb.allow,
                          sb.banned ? banned_bits.data() : nullptr, ids);
    std::lock_guard lk(mu);
    ++sampled_steps;
    sampled_rows += sb.n_rows;
  }
  int64_t sampled_steps = 0, sampled_rows = 0;
};

// Allows the even ids only; never finished.
class EvenConstraint : public LogitConstraint {
 public:
  void mask(std::span<float> logits) override {
    for (size_t i = 1; i < logits.size(); i += 2) logits[i] = -std::numeric_limits<float>::infinity();
  }
  void accept(int32_t) override {}
  bool finished() const override { return false; }
};

// Seeded sampling with every parameter gives the same tokens whether the engine samples on its device or the
// scheduler samples the logits on the host; rows that need the host (logprobs, n > 1 forks) still work there.
TEST(Scheduler, DeviceSamplingEqualsHostSampling) {
  std::vector<bool> banned(FakeEngine::kV, false);
  banned[12] = banned[13] = true;
  auto run = [&](FakeEngine& e, bool device) {
    SchedulerOptions o;
    o.device_sampling = device;
    o.banned = &banned;
    Scheduler s(e, o);
    s.start();
    std::vector<std::shared_ptr<CollectSink>> sinks;
    for (int k = 0; k < 8; ++k) {
      auto sink = std::make_shared<CollectSink>(k == 5 ? 2 : 1);
      auto g = make_req(prompt_of(9 + k, k), 14, sink, k == 5 ? 2 : 1);
      g.stop_ids = {};
      g.sampling.temperature = 3.0f;
      g.sampling.seed = 100 + k;
      if (k == 1) g.sampling.top_k = 5;
      if (k == 2) g.sampling.top_p = 0.6f;
      if (k == 3) g.sampling.min_p = 0.3f;
      if (k == 4) {
        g.sampling.repetition_penalty = 1.5f;
        g.sampling.presence_penalty = 0.4f;
        g.sampling.frequency_penalty = 0.3f;
        g.sampling.logit_bias = {{20, 3.0f}, {21, -2.0f}};
      }
      if (k == 6) g.constraint = [](int) { return std::make_unique<EvenConstraint>(); };
      if (k == 7) {
        g.sampling.logprobs = true;
        g.max_tokens = 3;
      }
      if (k == 0) g.sampling.temperature = 0.0f;
      s.submit(std::move(g));
      sinks.push_back(sink);
    }
    std::vector<std::vector<std::vector<int32_t>>> out;
    for (auto& sk : sinks) {
      EXPECT_TRUE(sk->wait(sk->toks.size()));
      out.push_back(sk->toks);
    }
    return out;
  };
  FakeEngine host;
  DeviceSamplingEngine dev;
  const auto a = run(host, false), b = run(dev, true);
  EXPECT_EQ(a, b);
  for (const auto& t : b[6][0]) EXPECT_EQ(t % 2, 0);
  for (const auto& r : b)
    for (const auto& c : r)
      for (int32_t t : c) EXPECT_TRUE(t != 12 && t != 13);
  std::lock_guard lk(dev.mu);
  EXPECT_GT(dev.sampled_steps, 0);  // the logprobs request runs beside: those steps take the host path
  EXPECT_GT(dev.sampled_rows, 14);
}

TEST(Scheduler, TooLargeForKvBudget) {
  FakeEngine e;
  SchedulerOptions o;
  o.kv_total_blocks = 4;
  o.kv_block_tokens = 16;
  e.store.block_tokens = 16;
  Scheduler s(e, o);
  s.start();
  try {
    s.submit(make_req(prompt_of(100, 1), 5, std::make_shared<CollectSink>(1)));
    FAIL() << "expected TooLarge";
  } catch (const SchedulerRejected& r) {
    EXPECT_EQ(r.kind, SchedulerRejected::Kind::TooLarge);
    EXPECT_NE(std::string(r.what()).find("KV cache"), std::string::npos);
  }
}

TEST(Scheduler, PreemptionRecomputesAndKeepsOutput) {
  const auto alone_a = run_alone(prompt_of(20, 1), 60);
  const auto alone_b = run_alone(prompt_of(20, 2), 60);
  FakeEngine e;
  Metrics m;
  SchedulerOptions o;
  o.kv_block_tokens = 8;
  e.store.block_tokens = 8;
  o.kv_total_blocks = 15;  // 120 tokens: two sequences of 80 cannot both stay
  Scheduler s(e, o, &m);
  s.start();
  auto a = std::make_shared<CollectSink>(1), b = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(20, 1), 60, a));
  s.submit(make_req(prompt_of(20, 2), 60, b));
  ASSERT_TRUE(a->wait(1));
  ASSERT_TRUE(b->wait(1));
  EXPECT_EQ(a->toks[0], alone_a);
  EXPECT_EQ(b->toks[0], alone_b);
  EXPECT_GE(m.preemptions.value(), 1u);
  EXPECT_EQ(s.stats().kv_used, 0);
}

TEST(Scheduler, EngineFailureAbortsRequest) {
  FakeEngine e;
  e.fail = true;
  Scheduler s(e, {});
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(4, 1), 5, a));
  ASSERT_TRUE(a->wait(1));
  ASSERT_TRUE(a->aborted.has_value());
  EXPECT_EQ(*a->aborted, AbortReason::EngineError);
}

// A failure that loses the engine (CUDA: a kernel fault poisons the context): the step's requests are aborted as
// engine errors, the scheduler is dead at once (new requests refused) and on_engine_lost is called once with the
// error, so that the server can exit non-zero.
TEST(Scheduler, LostEngineAbortsAndReportsOnce) {
  FakeEngine e;
  e.lose = true;
  std::mutex mu;
  std::vector<std::string> reports;
  SchedulerOptions o;
  o.on_engine_lost = [&](const std::string& what) {
    std::lock_guard lk(mu);
    reports.push_back(what);
  };
  Scheduler s(e, o);
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(4, 1), 5, a));
  ASSERT_TRUE(a->wait(1));
  ASSERT_TRUE(a->aborted.has_value());
  EXPECT_EQ(*a->aborted, AbortReason::EngineError);
  EXPECT_TRUE(s.stats().dead);
  EXPECT_THROW(s.submit(make_req(prompt_of(4, 3), 5, std::make_shared<CollectSink>(1))), SchedulerRejected);
  s.stop();
  std::lock_guard lk(mu);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].find("fake kernel fault"), std::string::npos);
}

TEST(Scheduler, DrainRefusesAndStopAborts) {
  FakeEngine e;
  e.delay = 1ms;
  Scheduler s(e, {});
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(4, 1), 100000, a));
  s.begin_drain();
  EXPECT_THROW(s.submit(make_req(prompt_of(4, 2), 5, std::make_shared<CollectSink>(1))), SchedulerRejected);
  EXPECT_FALSE(s.wait_idle(0.02));
  s.stop();
  ASSERT_TRUE(a->aborted.has_value());
  EXPECT_EQ(*a->aborted, AbortReason::Shutdown);
}

}  // namespace
}  // namespace latent

namespace latent {
namespace {

TEST(Scheduler, RequestTimeoutAborts) {
  FakeEngine e;
  e.delay = std::chrono::milliseconds(2);
  SchedulerOptions o;
  o.request_timeout_s = 0.03;
  Scheduler s(e, o);
  s.start();
  auto a = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(4, 1), 100000, a));
  ASSERT_TRUE(a->wait(1));
  ASSERT_TRUE(a->aborted.has_value());
  EXPECT_EQ(*a->aborted, AbortReason::Timeout);
  for (int i = 0; i < 100 && s.stats().kv_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(s.stats().kv_used, 0);
}

// A generation that falls into a cycle: counted once in /metrics; with stop_on_loop it ends (Length) soon after the
// detector's threshold (min_span 12 tokens, 3 cycles), without it it runs to max_tokens.
TEST(Scheduler, RepetitionLoopCountedAndStoppedOnRequest) {
  for (bool stop : {false, true}) {
    FakeEngine e;
    e.cycle = {5, 6, 7};
    e.force_after = 14;  // prompt 10 + 4 free tokens, then 5 6 7 5 6 7 ...
    Metrics m;
    SchedulerOptions o;
    o.stop_on_loop = stop;
    Scheduler s(e, o, &m);
    s.start();
    auto sink = std::make_shared<CollectSink>(1);
    s.submit(make_req(prompt_of(10, 9), 100, sink));
    ASSERT_TRUE(sink->wait(1));
    EXPECT_EQ(sink->reasons[0], FinishReason::Length);
    EXPECT_EQ(m.repetition_loops.value(), 1u) << "stop_on_loop " << stop;
    if (stop) {
      EXPECT_GE(sink->toks[0].size(), 4u + 12u);
      EXPECT_LE(sink->toks[0].size(), 4u + 15u);
    } else {
      EXPECT_EQ(sink->toks[0].size(), 100u);
    }
  }
  // A generation without a cycle is not counted.
  FakeEngine e;
  Metrics m;
  Scheduler s(e, {}, &m);
  s.start();
  auto sink = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt_of(10, 9), 60, sink));
  ASSERT_TRUE(sink->wait(1));
  EXPECT_EQ(m.repetition_loops.value(), 0u);
}

TEST(KvBlocks, ReserveReleaseAccounting) {
  KvBlockAllocator a(10, 16);
  EXPECT_EQ(a.blocks_for(0), 0);
  EXPECT_EQ(a.blocks_for(17), 2);
  EXPECT_TRUE(a.reserve(1, 100));  // 7 blocks
  EXPECT_EQ(a.used_blocks(), 7);
  EXPECT_FALSE(a.reserve(2, 64));  // 4 > 3 free: nothing changes
  EXPECT_EQ(a.blocks_of(2), 0);
  EXPECT_TRUE(a.reserve(2, 48));
  EXPECT_EQ(a.free_blocks(), 0);
  EXPECT_TRUE(a.reserve(1, 112));  // already covered
  a.release(1);
  EXPECT_EQ(a.used_blocks(), 3);
  a.release(1);  // idempotent
  EXPECT_EQ(a.free_blocks(), 7);
  EXPECT_THROW(KvBlockAllocator(0, 16), Error);
}

}  // namespace
}  // namespace latent

namespace latent {
namespace {

// Prompt logprobs (completions echo): every prompt row's logits, across prefill chunks, even when the prefix cache
// holds the prompt; the generated tokens are those of a plain run.
TEST(Scheduler, PromptLogprobsCoverEveryRowChunkedAndUncached) {
  const std::vector<int32_t> prompt = prompt_of(150, 5);
  SchedulerOptions o;
  o.prefill_chunk = 64;
  o.max_batch_tokens = 64;
  o.kv_block_tokens = 16;
  const std::vector<int32_t> plain = run_alone(prompt, 3, o);
  FakeEngine e;
  Scheduler s(e, o);
  s.start();
  auto warm = std::make_shared<CollectSink>(1);  // fills the prefix cache with the prompt's blocks
  s.submit(make_req(prompt, 3, warm));
  ASSERT_TRUE(warm->wait(1));
  ASSERT_GT(s.stats().prefix_cached_blocks, 0);
  const int64_t before = e.tokens_processed;
  auto sink = std::make_shared<CollectSink>(1);
  GenerationRequest g = make_req(prompt, 3, sink);
  g.prompt_logprobs = 2;
  s.submit(std::move(g));
  ASSERT_TRUE(sink->wait(1));
  EXPECT_EQ(sink->toks[0], plain);
  EXPECT_GE(e.tokens_processed - before, 150);  // the whole prompt was computed again
  EXPECT_EQ(e.all_rows_items, 3);               // chunks 0-63, 64-127, 128-149
  ASSERT_EQ(sink->prompt_lp_calls.size(), 1u);
  EXPECT_EQ(sink->prompt_lp_calls[0], std::make_pair(0, 1));
  EXPECT_TRUE(sink->prompt_lp_before_tokens);
  ASSERT_EQ(sink->prompt_lp.size(), prompt.size() - 1);
  std::vector<float> row(FakeEngine::kV);
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    const std::vector<int32_t> h(prompt.begin(), prompt.begin() + static_cast<int64_t>(p) + 1);
    e.row_of(h, row.data());
    const SampleResult want = token_logprob(row, prompt[p + 1], 2);
    const SampleResult& got = sink->prompt_lp[p];
    ASSERT_EQ(got.token, prompt[p + 1]) << p;
    EXPECT_FLOAT_EQ(got.logprob, want.logprob) << p;
    ASSERT_EQ(got.top.size(), 2u);
    EXPECT_EQ(got.top, want.top) << p;
    EXPECT_LE(got.logprob, 0.0f);
  }
  // The plain request after it still gets the cache (the echo request's blocks were offered to it too).
  auto again = std::make_shared<CollectSink>(1);
  s.submit(make_req(prompt, 3, again));
  ASSERT_TRUE(again->wait(1));
  EXPECT_EQ(again->toks[0], plain);
  EXPECT_TRUE(again->prompt_lp_calls.empty());
}

TEST(Scheduler, MaxTokensZeroComputesOnlyThePrompt) {
  FakeEngine e;
  Scheduler s(e, {});
  s.start();
  auto sink = std::make_shared<CollectSink>(2);
  GenerationRequest g = make_req(prompt_of(10, 4), 0, sink, /*n=*/2);
  g.prompt_logprobs = 0;
  auto h = s.submit(std::move(g));
  ASSERT_TRUE(sink->wait(2));
  EXPECT_EQ(sink->reasons[0], FinishReason::Length);
  EXPECT_EQ(sink->reasons[1], FinishReason::Length);
  EXPECT_TRUE(sink->toks[0].empty());
  EXPECT_TRUE(sink->toks[1].empty());
  ASSERT_EQ(sink->prompt_lp_calls.size(), 1u);
  EXPECT_EQ(sink->prompt_lp_calls[0], std::make_pair(0, 2));
  EXPECT_EQ(sink->prompt_lp.size(), 9u);
  for (const auto& x : sink->prompt_lp) EXPECT_TRUE(x.top.empty());
  for (int i = 0; i < 100 && !h->done(); ++i) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(h->done());
  EXPECT_EQ(s.stats().kv_used, 0);
  GenerationRequest bad = make_req(prompt_of(4, 1), -1, sink);
  EXPECT_THROW(s.submit(std::move(bad)), SchedulerRejected);
}

// ---------------------------------------------------------------------------------------------------------------
// Speculative decoding (SchedulerOptions::num_speculative_tokens) with the fake draft layer.
// ---------------------------------------------------------------------------------------------------------------
struct SpecOut {
  std::vector<std::vector<std::vector<int32_t>>> toks;
  std::vector<std::map<int, FinishReason>> reasons;
  std::vector<std::vector<SampleResult>> prompt_lp;
  SchedulerStats st;
};

// A mixed batch: greedy and seeded sampling with every parameter, n > 1, stop ids and a stop string inside runs,
// max_tokens of every size, a repeated prompt (prefix cache), prompt logprobs and logprobs, a constraint.
std::vector<GenerationRequest> spec_requests(std::vector<std::shared_ptr<CollectSink>>& sinks,
                                             std::vector<std::vector<int32_t>>* seen = nullptr,
                                             bool device_rows = false) {
  std::vector<GenerationRequest> v;
  sinks.clear();
  for (int k = 0; k < 12; ++k) {
    if (device_rows && (k == 3 || k == 8 || k == 9)) continue;  // rows that need the host: n > 1, logprobs
    const int n = k == 3 ? 3 : k == 8 ? 2 : 1;
    auto sink = std::make_shared<CollectSink>(n, k == 4 ? 9 : -1);
    auto g = make_req(prompt_of(k == 10 ? 5 + 2 : 5 + 3 * k, k == 10 ? 2 : k), 7 + (k * 5) % 23, sink, n);
    g.stop_ids = {1, static_cast<int32_t>(2 + k % 3)};
    if (k % 2 == 1) {
      g.sampling.temperature = 0.7f + 0.4f * static_cast<float>(k % 3);
      g.sampling.seed = 40 + k;
    }
    if (k == 5) g.sampling.top_k = 4;
    if (k == 7) {
      g.sampling.top_p = 0.7f;
      g.sampling.repetition_penalty = 1.3f;
      g.sampling.frequency_penalty = 0.5f;
      g.sampling.presence_penalty = 0.2f;
    }
    if (k == 9) {
      g.sampling.min_p = 0.05f;
      g.sampling.logprobs = true;
      g.sampling.top_logprobs = 3;
      g.prompt_logprobs = 2;
    }
    if (k == 6) g.constraint = [](int) { return std::make_unique<EvenConstraint>(); };
    if (k == 11 && seen) {
      seen->assign(1, {});
      g.constraint = [seen](int) {
        return std::make_unique<ScriptConstraint>(std::vector<int32_t>{6, 8, 10, 12, 14, 16, 20}, &(*seen)[0]);
      };
    }
    v.push_back(std::move(g));
    sinks.push_back(sink);
  }
  return v;
}

SpecOut run_spec(FakeEngine& e, SchedulerOptions o, std::vector<std::vector<int32_t>>* seen = nullptr,
                 bool device_rows = false) {
  e.store.block_tokens = o.kv_block_tokens;
  e.mtp.block_tokens = o.kv_block_tokens;
  Scheduler s(e, o);
  s.start();
  std::vector<std::shared_ptr<CollectSink>> sinks;
  for (auto& g : spec_requests(sinks, seen, device_rows)) s.submit(std::move(g));
  SpecOut out;
  for (auto& sk : sinks) {
    EXPECT_TRUE(sk->wait(sk->toks.size(), 20000ms));
    std::lock_guard lk(sk->mu);
    EXPECT_FALSE(sk->aborted.has_value()) << sk->abort_msg;
    out.toks.push_back(sk->toks);
    out.reasons.push_back(sk->reasons);
    out.prompt_lp.push_back(sk->prompt_lp);
  }
  for (int i = 0; i < 200 && s.stats().running_requests > 0; ++i) std::this_thread::sleep_for(5ms);
  out.st = s.stats();
  return out;
}

// Greedy and seeded sampling give the same tokens, finish reasons and prompt logprobs with speculation as
// without, token for token, at k = 1, 2, 3, with drafts that are right, wrong now and then, or always wrong; with
// small blocks, chunked prefill, n > 1 forks, the prefix cache and a KV budget that forces preemption.
TEST(Speculative, OutputEqualsPlainDecoding) {
  SchedulerOptions base;
  base.kv_block_tokens = 4;
  base.prefill_chunk = 8;
  base.max_batch_tokens = 40;
  FakeEngine plain_e;
  std::vector<std::vector<int32_t>> seen_plain;
  const SpecOut plain = run_spec(plain_e, base, &seen_plain);
  for (int64_t k = 1; k <= 3; ++k)
    for (int64_t wrong : {0, 3, 1}) {
      for (int64_t blocks : {1024, 40}) {
        SchedulerOptions o = base;
        o.num_speculative_tokens = k;
        o.kv_total_blocks = blocks;
        FakeEngine e;
        e.drafts = 1;
        e.draft_wrong = wrong;
        std::vector<std::vector<int32_t>> seen;
        const SpecOut spec = run_spec(e, o, &seen);
        const std::string what =
            "k " + std::to_string(k) + " wrong " + std::to_string(wrong) + " blocks " + std::to_string(blocks);
        EXPECT_EQ(spec.toks, plain.toks) << what;
        EXPECT_EQ(spec.reasons, plain.reasons) << what;
        EXPECT_EQ(seen, seen_plain) << what;  // the constraint advanced over exactly the emitted tokens
        ASSERT_EQ(spec.prompt_lp.size(), plain.prompt_lp.size());
        for (size_t r = 0; r < plain.prompt_lp.size(); ++r) {
          ASSERT_EQ(spec.prompt_lp[r].size(), plain.prompt_lp[r].size());
          for (size_t i = 0; i < plain.prompt_lp[r].size(); ++i)
            EXPECT_EQ(spec.prompt_lp[r][i].logprob, plain.prompt_lp[r][i].logprob);
        }
        EXPECT_GT(spec.st.spec_proposed, 0) << what;
        if (wrong == 1) {
          EXPECT_EQ(spec.st.spec_accepted, 0) << what;
        }
        if (wrong == 0) {
          EXPECT_GT(spec.st.spec_accepted, spec.st.spec_proposed / 2) << what;
        }
        if (wrong == 0 && blocks == 1024) {
          EXPECT_LT(spec.st.steps, plain.st.steps) << what;
        }
        EXPECT_EQ(e.max_verify_len, k + 1) << what;
        EXPECT_EQ(spec.st.kv_used, 0) << what;
        ASSERT_EQ(spec.st.spec_proposed_at.size(), static_cast<size_t>(k));
        int64_t sum = 0;
        for (int64_t a : spec.st.spec_accepted_at) sum += a;
        EXPECT_EQ(sum, spec.st.spec_accepted);
      }
    }
}

// The per-position counters: position j counts the verifies that proposed a j-th draft; with right drafts
// nearly every one is accepted, and fewer steps are needed.
TEST(Speculative, MetricsAndFewerSteps) {
  SchedulerOptions o;
  o.num_speculative_tokens = 3;
  FakeEngine plain_e, e;
  e.drafts = 1;
  Metrics m;
  auto run = [&](FakeEngine& eng, SchedulerOptions so, Metrics* met) {
    Scheduler s(eng, so, met);
    s.start();
    auto sink = std::make_shared<CollectSink>(1);
    auto g = make_req(prompt_of(10, 1), 60, sink);
    g.stop_ids = {};
    s.submit(std::move(g));
    EXPECT_TRUE(sink->wait(1));
    for (int i = 0; i < 100 && s.stats().running_requests > 0; ++i) std::this_thread::sleep_for(5ms);
    return std::make_pair(sink->toks[0], s.stats());
  };
  SchedulerOptions po;
  const auto [pt, pst] = run(plain_e, po, nullptr);
  const auto [st, sst] = run(e, o, &m);
  EXPECT_EQ(st, pt);
  // 60 tokens: the first from the prompt, then verifies of 3 drafts emit 4 each.
  EXPECT_LE(sst.steps, 1 + (59 + 3) / 4 + 1);
  EXPECT_EQ(sst.spec_accepted, sst.spec_proposed);
  EXPECT_EQ(m.spec_draft_tokens.value(), static_cast<uint64_t>(sst.spec_proposed));
  EXPECT_EQ(m.spec_accepted_tokens.value(), static_cast<uint64_t>(sst.spec_accepted));
  EXPECT_EQ(m.spec_drafts.value(), static_cast<uint64_t>(sst.spec_verifies));
  const std::string text = m.render("latent:", "x");
  EXPECT_NE(text.find("latent:spec_decode_acceptance_rate{model_name=\"x\",position=\"1\"} 1.0"), std::string::npos)
      << text;
  EXPECT_NE(text.find("latent:spec_decode_mean_acceptance_length"), std::string::npos);
  EXPECT_NE(text.find("latent:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"x\",position=\"3\"}"),
            std::string::npos);
}

// Rejection sampling keeps the target distribution: a row that does not depend on the history, sampled at
// temperature 1.3 with top_k, 20000 tokens with 3 drafts per step that are always the same id: the histogram of
// the emitted tokens against the exact truncated softmax (chi-square), and the acceptance of the first draft
// position against its probability.
TEST(Speculative, RejectionSamplingKeepsTheTargetDistribution) {
  class ConstEngine : public FakeEngine {
   public:
    void step(std::span<const EngineStepItem> items, float* logits) override {
      std::lock_guard lk(mu);
      int64_t row = 0;
      for (const auto& it : items) {
        const int64_t n = it.all_logits ? static_cast<int64_t>(it.tokens.size()) : it.want_logits ? 1 : 0;
        for (int64_t r = 0; r < n; ++r, ++row)
          for (int64_t v = 0; v < kV; ++v) logits[row * kV + v] = v < 8 ? 0.4f * static_cast<float>(v % 5) : -30.0f;
      }
    }
    void draft(std::span<const EngineDraftItem> items, int32_t* out) override {
      int64_t at = 0;
      for (const auto& d : items)
        for (int32_t j = 0; j < d.n_draft; ++j) out[at++] = draft_fixed;
    }
  };
  const int64_t N = 20000;
  for (int32_t fixed : {4, 2}) {  // the most likely id, and a middle one
    ConstEngine e;
    e.drafts = 1;
    e.draft_fixed = fixed;
    SchedulerOptions o;
    o.num_speculative_tokens = 3;
    o.max_context = N + 64;
    o.kv_total_blocks = (N + 64) / 64 + 8;
    Scheduler s(e, o);
    s.start();
    auto sink = std::make_shared<CollectSink>(1);
    auto g = make_req({3, 4, 5}, N, sink);
    g.stop_ids = {};
    g.sampling.temperature = 1.3f;
    g.sampling.top_k = 7;
    g.sampling.seed = 2024 + fixed;
    s.submit(std::move(g));
    ASSERT_TRUE(sink->wait(1, 60000ms));
    for (int i = 0; i < 100 && s.stats().running_requests > 0; ++i) std::this_thread::sleep_for(5ms);
    const auto& toks = sink->toks[0];
    ASSERT_EQ(static_cast<int64_t>(toks.size()), N);
    std::vector<float> row(FakeEngine::kV);
    for (int64_t v = 0; v < FakeEngine::kV; ++v) row[v] = v < 8 ? 0.4f * static_cast<float>(v % 5) : -30.0f;
    SampleRowParams p;
    p.temperature = 1.3f;
    p.top_k = 7;
    const std::vector<double> q = truncated_softmax(row, p);
    std::vector<double> count(FakeEngine::kV, 0.0);
    for (int32_t t : toks) count[static_cast<size_t>(t)] += 1;
    double chi2 = 0;
    int dof = -1;
    for (int64_t v = 0; v < FakeEngine::kV; ++v) {
      if (q[v] <= 0) {
        EXPECT_EQ(count[v], 0) << "id " << v << " has probability 0";
        continue;
      }
      const double ex = q[v] * N;
      chi2 += (count[v] - ex) * (count[v] - ex) / ex;
      ++dof;
    }
    // 6 degrees of freedom: P(chi2 > 22.46) = 0.001.
    EXPECT_EQ(dof, 6);
    EXPECT_LT(chi2, 22.46) << "draft " << fixed;
    const SchedulerStats st = s.stats();
    ASSERT_GE(st.spec_proposed_at.size(), 1u);
    const double rate1 = static_cast<double>(st.spec_accepted_at[0]) / static_cast<double>(st.spec_proposed_at[0]);
    const double sd = std::sqrt(q[fixed] * (1 - q[fixed]) / static_cast<double>(st.spec_proposed_at[0]));
    EXPECT_NEAR(rate1, q[fixed], 4 * sd) << "draft " << fixed;
  }
}

// Device sampling with drafts: the verify rows are sampled where the logits are (only ids back), each with the
// penalties of the drafts before it and its own draw counter; the same tokens as the host path and as plain
// decoding. A constrained request's verify rows go to the host (the matcher state after a draft is host-only).
TEST(Speculative, DeviceSamplingEqualsHost) {
  SchedulerOptions o;
  o.kv_block_tokens = 8;
  o.num_speculative_tokens = 2;
  DeviceSamplingEngine dev;
  dev.drafts = 1;
  dev.draft_wrong = 3;
  FakeEngine host;
  host.drafts = 1;
  host.draft_wrong = 3;
  SchedulerOptions ho = o;
  ho.device_sampling = false;
  FakeEngine plain;
  SchedulerOptions po;
  po.kv_block_tokens = 8;
  const SpecOut a = run_spec(dev, o, nullptr, true), b = run_spec(host, ho, nullptr, true),
                c = run_spec(plain, po, nullptr, true);
  EXPECT_EQ(a.toks, b.toks);
  EXPECT_EQ(a.toks, c.toks);
  std::lock_guard lk(dev.mu);
  EXPECT_GT(dev.sampled_rows, dev.sampled_steps);  // verify steps sampled several rows per sequence there
}

// Above speculative_max_batch decoding sequences no drafts are verified (the output is the same).
TEST(Speculative, NoDraftsAboveTheBatchLimit) {
  SchedulerOptions o;
  o.num_speculative_tokens = 2;
  o.speculative_max_batch = 1;
  FakeEngine e;
  e.drafts = 1;
  FakeEngine plain;
  const SpecOut a = run_spec(e, o), b = run_spec(plain, {});
  EXPECT_EQ(a.toks, b.toks);
  // Drafts are verified only while one sequence decodes (the end of the run).
  EXPECT_GT(a.st.spec_proposed, 0);
  EXPECT_LT(a.st.spec_verifies, 60);
}

TEST(Speculative, NeedsADraftLayer) {
  FakeEngine e;
  SchedulerOptions o;
  o.num_speculative_tokens = 2;
  EXPECT_THROW(Scheduler(e, o), std::invalid_argument);
}

}  // namespace
}  // namespace latent
