// CollectingSink: a GenerationSink for a one-choice request that keeps the tokens it is given (stop tokens
// included), counts the speculative drafts, and lets another thread wait for the end. `latent run`'s scheduler
// path uses it (printing each token as it arrives), and so do the speculative-decoding tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/scheduler.h"

namespace latent {

class CollectingSink : public GenerationSink {
 public:
  // each_token (optional) sees every token as it arrives, on the scheduler's thread, under the sink's lock.
  explicit CollectingSink(std::function<void(int32_t)> each_token = {}) : each_token_(std::move(each_token)) {}

  bool on_token(int, const SampleResult& s, bool) override {
    std::lock_guard lk(mu);
    toks.push_back(s.token);
    if (each_token_) each_token_(s.token);
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
  // Blocks until the request finished or aborted (or the timeout passed, when one is given): true when it
  // finished; false on an abort (`aborted` says why) or at the timeout.
  bool wait(std::optional<std::chrono::seconds> timeout = std::nullopt) {
    std::unique_lock lk(mu);
    const auto ended = [&] { return done || !aborted.empty(); };
    if (timeout)
      cv.wait_for(lk, *timeout, ended);
    else
      cv.wait(lk, ended);
    return done && aborted.empty();
  }

  // Read them after wait() returned (or under mu).
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> toks;
  int64_t proposed = 0, accepted = 0;
  bool done = false;
  std::string aborted;

 private:
  std::function<void(int32_t)> each_token_;
};

}  // namespace latent
