// Shared by the speculative-decoding tests of the CPU (tests/server/test_speculative.cpp) and the CUDA backend
// (tests/cuda/test_cuda_mtp.cpp): a sink that collects a request's tokens and draft counts, an engine wrapper that
// can replace the model's drafts by a known continuation, and the submit / wait loop over a set of prompts.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/collecting_sink.h"
#include "runtime/scheduler.h"
#include "server/model_engine.h"

namespace latent::spec_test {

// The harness's sink: tokens and draft counts of one request (runtime/collecting_sink.h); wait() defaults to 120 s.
class Sink : public CollectingSink {
 public:
  bool wait(int seconds = 120) { return CollectingSink::wait(std::chrono::seconds(seconds)); }
};

// Prompt -> its known greedy continuation.
using Continuations = std::map<std::vector<int32_t>, std::vector<int32_t>>;

// Passes everything to the model engine (device sampling included); with `truth`, the drafts the model proposed
// are replaced by the known continuation (every `wrong`-th one off by one), so that long accepted runs go through
// the verify path too (the tiny models' random MTP layers accept little).
class OracleEngine : public Engine {
 public:
  OracleEngine(server::ModelEngine& e, const Continuations* truth, int wrong) : e_(e), truth_(truth), wrong_(wrong) {}
  int64_t vocab_size() const override { return e_.vocab_size(); }
  int64_t kv_bytes_per_token() const override { return e_.kv_bytes_per_token(); }
  void copy_block(int32_t s, int32_t d, int64_t n) override { e_.copy_block(s, d, n); }
  void step(std::span<const EngineStepItem> items, float* logits) override {
    record(items);
    e_.step(items, logits);
  }
  bool samples_on_device() const override { return e_.samples_on_device(); }
  void step_sampled(std::span<const EngineStepItem> items, const SampleBatch& sampling, int32_t* ids) override {
    record(items);
    ++sampled_steps;
    e_.step_sampled(items, sampling, ids);
  }
  bool lost() const override { return e_.lost(); }
  int64_t draft_layers() const override { return e_.draft_layers(); }
  void draft(std::span<const EngineDraftItem> items, int32_t* drafts) override {
    e_.draft(items, drafts);
    int64_t at = 0;
    for (const auto& d : items) {
      std::vector<int32_t> entry{static_cast<int32_t>(d.seq), static_cast<int32_t>(d.start),
                                 static_cast<int32_t>(d.tokens.size())};
      entry.insert(entry.end(), drafts + at, drafts + at + d.n_draft);
      draft_log.push_back(std::move(entry));
      at += d.n_draft;
    }
    if (!truth_) return;
    at = 0;
    for (const auto& d : items) {
      std::vector<int32_t> h = hist_[d.seq];
      h.resize(static_cast<size_t>(d.start));
      h.insert(h.end(), d.tokens.begin(), d.tokens.end());
      for (int32_t j = 0; j < d.n_draft; ++j, ++at) {
        for (const auto& [prompt, cont] : *truth_) {
          if (h.size() < prompt.size() || !std::equal(prompt.begin(), prompt.end(), h.begin())) continue;
          const size_t gi = h.size() - prompt.size() + static_cast<size_t>(j);
          if (gi < cont.size()) drafts[at] = cont[gi];
          if (wrong_ > 0 && (gi + static_cast<size_t>(d.seq)) % static_cast<size_t>(wrong_) == 0)
            drafts[at] = (drafts[at] + 1) % static_cast<int32_t>(vocab_size());
        }
      }
    }
  }
  int64_t sampled_steps = 0;
  // Per drafting sequence of every draft step: {seq, first slot, slots, the model's drafts ...} (before any
  // replacement by the continuation).
  std::vector<std::vector<int32_t>> draft_log;

 private:
  void record(std::span<const EngineStepItem> items) {
    for (const auto& it : items) {
      auto& h = hist_[it.seq];
      h.resize(static_cast<size_t>(it.start));
      h.insert(h.end(), it.tokens.begin(), it.tokens.end());
    }
  }
  server::ModelEngine& e_;
  const Continuations* truth_;
  int wrong_;
  std::map<SeqId, std::vector<int32_t>> hist_;
};

struct Outputs {
  std::vector<std::vector<int32_t>> toks;  // per prompt
  int64_t proposed = 0, accepted = 0, kv_used = -1;
};

// Submits every prompt (greedy, `max_tokens` each) to a started scheduler — one at a time, or all at once when
// `batched` — waits for all, then for the scheduler to release them, and returns their tokens, the draft counts and
// the KV blocks still in use.
inline Outputs generate_all(Scheduler& sched, const std::vector<std::vector<int32_t>>& prompts, bool batched,
                            int max_tokens = 24) {
  Outputs r;
  std::vector<std::shared_ptr<Sink>> sinks;
  for (const auto& prompt : prompts) {
    auto sink = std::make_shared<Sink>();
    GenerationRequest g;
    g.prompt = prompt;
    g.max_tokens = max_tokens;
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

}  // namespace latent::spec_test
