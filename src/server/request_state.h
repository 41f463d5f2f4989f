// RequestState: the scheduler's sink for one HTTP request. On the scheduler thread it runs each choice's output
// pipeline (choice_output.h) and queues events; the connection is notified (never blocking the scheduler) and takes
// them and turns them into SSE chunks or the final JSON.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/scheduler.h"
#include "server/choice_output.h"

namespace latent::server {

struct StreamEvent {
  enum class Kind { Delta, Finish, Abort };
  Kind kind = Kind::Delta;
  int choice = 0;
  ChoiceDelta delta;
  std::string finish_reason;
  AbortReason abort = AbortReason::EngineError;
  std::string message;
  // Delta / Finish: the generated tokens of this choice that this event completes (those since its previous
  // event), so the tokens a client was sent are the sum over the events written to it.
  int64_t tokens = 0;
};

class RequestState : public GenerationSink {
 public:
  explicit RequestState(std::vector<OutputConfig> choices);

  void on_scheduled() override;
  void on_cached_prompt_tokens(int64_t tokens) override { cached_tokens_.fetch_add(tokens); }
  void on_draft_tokens(int, int64_t proposed, int64_t accepted) override {
    spec_proposed_.fetch_add(proposed);
    spec_accepted_.fetch_add(accepted);
  }
  // Speculative decoding: draft tokens proposed / accepted for this request's choices.
  int64_t spec_proposed() const { return spec_proposed_.load(); }
  int64_t spec_accepted() const { return spec_accepted_.load(); }
  bool on_token(int choice, const SampleResult& s, bool stop_token) override;
  void on_prompt_logprobs(int first_choice, int n, std::vector<SampleResult> entries) override;
  void on_finish(int choice, FinishReason reason) override;
  void on_abort(AbortReason reason, const std::string& message) override;

  // Waits until an event is available, the request was scheduled (when wait_scheduled), or the timeout passes;
  // moves queued events to `out`. Returns true when something happened.
  bool wait(std::vector<StreamEvent>& out, std::chrono::milliseconds timeout, bool wait_scheduled = false);
  // Non-blocking: moves the queued events to `out`.
  void take(std::vector<StreamEvent>& out);
  // Called (on the scheduler thread, outside the lock) after every event; must not block. Replaces the previous.
  void set_notify(std::function<void()> f);
  size_t backlog() const;
  // Time of the first generated token (nullopt before it).
  std::optional<Clock::time_point> first_token_time() const;
  bool scheduled() const;
  bool all_finished() const;
  std::optional<StreamEvent> abort_event() const;

  // Valid after all_finished(): the per-choice results.
  const ChoiceOutput& output(int choice) const { return outputs_[static_cast<size_t>(choice)]; }
  int n_choices() const { return static_cast<int>(outputs_.size()); }
  // Prompt tokens served from the prefix cache (usage.prompt_tokens_details.cached_tokens).
  int64_t cached_tokens() const { return cached_tokens_.load(); }
  // Tokens generated so far over all choices (stop tokens included, as usage.completion_tokens counts them); safe
  // from any thread, also while the request runs or after it was cancelled or aborted.
  int64_t generated_tokens() const { return generated_.load(); }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ChoiceOutput> outputs_;
  std::deque<StreamEvent> events_;
  bool scheduled_ = false;
  std::atomic<int64_t> cached_tokens_{0}, generated_{0};
  std::vector<int64_t> unreported_;  // per choice: generated tokens not yet attached to an event (scheduler thread)
  std::atomic<int64_t> spec_proposed_{0}, spec_accepted_{0};
  int finished_ = 0;
  std::optional<StreamEvent> abort_;
  std::function<void()> notify_;
  std::optional<Clock::time_point> first_token_;
  void notify();
};

}  // namespace latent::server
