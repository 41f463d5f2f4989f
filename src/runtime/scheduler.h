// Continuous-batching scheduler (docs/api.md §scheduling). Requests enter a bounded FIFO queue; one engine thread
// admits them as sequences (one per choice, n > 1 forks the computed prompt) and runs steps in which every decoding
// sequence advances by one token and prompts are prefilled in chunks with the remaining token budget, so a long
// prompt never stalls running streams. Chunk boundaries are fixed multiples of the chunk size from position 0, so a
// sequence's computation does not depend on what else is in the batch.
//
// KV memory is the engine's block pool, allocated in blocks (runtime/kv_blocks.h): a request is admitted only when
// its prompts fit; n > 1 shares the prompt's full blocks (the partial last one is copied); a sequence that needs a
// block when none is free preempts the most recently admitted sequence (its blocks are returned at the step
// boundary and its cache recomputed later from prompt + generated tokens; output continues unchanged). A request
// that could never fit is refused at submit().
//
// Cancellation (client disconnect) takes effect at the next step boundary: the sequences leave the batch and their
// blocks are freed. Sinks are called on the engine thread and must not block.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "runtime/kv_blocks.h"
#include "runtime/logit_constraint.h"
#include "runtime/metrics.h"
#include "runtime/sampler.h"

namespace latent {

using Clock = std::chrono::steady_clock;

enum class FinishReason { Stop, Length };
enum class AbortReason { QueueTimeout, Timeout, Shutdown, EngineError };
const char* abort_reason_name(AbortReason r);

// Receives the output of one request; called on the scheduler thread.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  // The request left the queue (its first sequence was scheduled).
  virtual void on_scheduled() {}
  // The first choice found this many prompt tokens in the prefix cache (called once, before its first token).
  virtual void on_cached_prompt_tokens(int64_t tokens) {}
  // GenerationRequest::prompt_logprobs >= 0: entry i is the log-probability of prompt token i + 1 given the tokens
  // before it (prompt size - 1 entries; the first prompt token has none), with its alternatives. Called once per
  // request (for its choices first_choice .. first_choice + n - 1), after the prompt was computed and before the
  // first token (or the finish of a max_tokens 0 request).
  virtual void on_prompt_logprobs(int first_choice, int n, std::vector<SampleResult> entries) {}
  // Choice `choice` (request choice_offset + j) sampled token s. stop_token: an EOS / stop id, which ends the choice
  // and is not text. Return true to end the choice now (a stop string matched): finish reason Stop.
  virtual bool on_token(int choice, const SampleResult& s, bool stop_token) = 0;
  // Speculative decoding: one verify of `proposed` draft tokens of choice `choice`, `accepted` of them accepted
  // (called after the accepted tokens' on_token calls of that step).
  virtual void on_draft_tokens(int choice, int64_t proposed, int64_t accepted) {}
  virtual void on_finish(int choice, FinishReason reason) = 0;
  // The request ended abnormally (never after cancel()): no more calls follow.
  virtual void on_abort(AbortReason reason, const std::string& message) = 0;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;  // non-empty
  int n = 1;
  int choice_offset = 0;
  SamplingParams sampling;
  int64_t max_tokens = 16;  // per choice, >= 0 (0: the prompt is only computed, e.g. for its logprobs)
  // >= 0: the prompt tokens' logprobs with this many alternatives are delivered (GenerationSink::on_prompt_logprobs).
  // The prompt is then computed in full: the prefix cache is not attached for it (the logits of every row are
  // needed), though its blocks are still offered to the cache for later requests.
  int prompt_logprobs = -1;
  std::vector<int32_t> stop_ids;  // EOS set (unless ignore_eos) + stop_token_ids
  bool ignore_eos = false;        // runs past EOS on purpose (benchmarks): a repetition loop is not warned about
  std::shared_ptr<GenerationSink> sink;
  Clock::time_point arrival = Clock::now();
  // Optional: one LogitConstraint per choice (structured output); it masks the logits before sampling and ends
  // the choice (Stop) when it is finished.
  LogitConstraintFactory constraint;
};

// Why submit() refused a request.
class SchedulerRejected : public std::runtime_error {
 public:
  enum class Kind { Overloaded, Draining, TooLarge, Dead };
  SchedulerRejected(Kind k, const std::string& msg) : std::runtime_error(msg), kind(k) {}
  Kind kind;
};

class RequestHandle {
 public:
  // The client went away: the request stops within one step and frees its blocks. Idempotent.
  void cancel();
  bool cancelled() const { return cancelled_.load(); }
  bool done() const { return done_.load(); }

 private:
  friend class Scheduler;
  std::atomic<bool> cancelled_{false}, done_{false};
};

// The fewest prompt tokens a step beside decodes takes when SchedulerOptions::mixed_step_factor limits them.
inline constexpr int64_t kMinMixedPrefill = 16;

struct SchedulerOptions {
  int64_t max_num_seqs = 64;       // sequences in the running batch
  int64_t max_queue_len = 1024;    // waiting requests
  int64_t max_batch_tokens = 512;  // tokens per engine step (decodes + prefill chunks)
  int64_t prefill_chunk = 256;     // prefill chunk size (tokens)
  // Decode latency under prefill (0 = off): a step that runs decodes takes only as many prompt tokens as keep it
  // within this factor of a decode-only step, by the engine times the scheduler measures (moving averages of a
  // decode-only step and of one prompt token's share of a mixed step); at least kMinMixedPrefill tokens, so prompts
  // always progress. Until both are measured: the token budget alone.
  double mixed_step_factor = 0;
  // The engine time of a step with these decode and prompt tokens, in seconds, for those moving averages instead of
  // the measured time (empty, the default: measured with steady_clock around Engine::step). Tests give their fake
  // engine's cost model here, so that what the scheduler decides does not depend on the machine's load.
  std::function<double(int64_t decode_tokens, int64_t prompt_tokens)> step_seconds;
  int64_t max_context = 4096;     // tokens per sequence (prompt + generated)
  double max_queue_wait_s = 600;  // 0 = unlimited
  double request_timeout_s = 0;   // 0 = off; from arrival
  int64_t kv_block_tokens = 64;
  int64_t kv_total_blocks = 1024;
  bool stop_on_loop = false;                  // end a choice (reason Length) that falls into a repetition loop
  bool prefix_cache = true;                   // reuse cached full KV blocks of identical prefixes (runtime/kv_blocks.h)
  uint64_t prefix_cache_salt = 0;             // hashes what else decides a block's contents (model, plan, cache dtype)
  const std::vector<bool>* banned = nullptr;  // [vocab] ids never sampled (padding without a token string)
  // Sample on the engine's device when it can (Engine::samples_on_device): a step whose logits rows all sample
  // there (no logprobs, no prompt logprobs, no n > 1 fork at the prompt's end) gets only the ids back. The draws
  // equal the host Sampler's (backend/sampling.h).
  bool device_sampling = true;
  // Called once, on the scheduler thread, when a step failed and Engine::lost() says no later step can succeed
  // (the scheduler is dead from then on; the server shuts down and exits non-zero). Argument: the step's error.
  std::function<void(const std::string&)> on_engine_lost;
  // Speculative decoding (needs Engine::draft_layers() > 0): every decoding sequence carries up to this many draft
  // tokens, which the next step verifies in one batched step with its last token (k + 1 rows); the sampled tokens
  // are emitted in order while they equal the drafts (the rest is discarded, its KV slots returned). Each row is
  // sampled exactly as without speculation (same Sampler, same counter-based draw), so the output is the same
  // token for token and the target distribution is kept exactly. 0 = off.
  int64_t num_speculative_tokens = 0;
  // No drafts in a step whose decoding sequences are more than this (0: no limit, < 0: never): above it a verify
  // costs more than the drafts save (measured by the caller, e.g. ModelEngine::speculation_crossover).
  int64_t speculative_max_batch = 0;
};

struct SchedulerStats {
  int64_t waiting = 0, running_requests = 0, running_seqs = 0, kv_used = 0, kv_total = 0;
  int64_t steps = 0, max_batch_seqs = 0;
  int64_t prefix_cached_blocks = 0, prefix_requests = 0, prefix_hit_tokens = 0, prefix_query_tokens = 0;
  // Speculative decoding: verifies of at least one draft, draft tokens proposed / accepted, and per draft
  // position (1 .. k) the drafts proposed / accepted there.
  int64_t spec_verifies = 0, spec_proposed = 0, spec_accepted = 0;
  std::vector<int64_t> spec_proposed_at, spec_accepted_at;
  bool dead = false, draining = false;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, SchedulerOptions opt, Metrics* metrics = nullptr);
  ~Scheduler();  // stops the thread (aborting what is left with Shutdown)
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void start();
  // Throws SchedulerRejected (queue full, draining, too large for the KV budget, engine dead).
  std::shared_ptr<RequestHandle> submit(GenerationRequest req);

  // Shutdown: refuse new requests, wait until idle (up to timeout), then abort the rest (Shutdown) and stop.
  void begin_drain();
  bool wait_idle(double timeout_s);
  // Returns how many requests (waiting or running) it aborted.
  int64_t abort_all(AbortReason reason, const std::string& message);
  void stop();

  SchedulerStats stats() const;
  // The /metrics gauges (running / waiting requests, running sequences, KV blocks) from stats(); pass
  // [&s] { return s.gauges(); } to Metrics::set_gauge_source.
  MetricsGauges gauges() const;
  const SchedulerOptions& options() const { return opt_; }
  int64_t blocks_for(int64_t tokens) const { return alloc_.blocks_for(tokens); }
  int64_t block_tokens() const { return alloc_.block_tokens(); }

 private:
  friend class RequestHandle;
  struct Req;
  struct Seq;
  struct Plan;
  struct StepPlan;
  struct DraftFork;
  void wake();
  void loop();
  bool step();  // one iteration; false when nothing was run
  // The measured engine time of a step (seconds; SchedulerOptions::step_seconds's instead when it is given) into
  // the moving averages mixed_step_factor uses.
  void note_step_time(const StepPlan& sp, double seconds);
  double decode_step_s_ = 0, prompt_token_s_ = 0;  // moving averages (0: not measured yet)
  // The parts of a step: what runs (decodes with their drafts, prefill chunks, block reservations), the engine
  // call, then the outcome (acceptance, emission, the draft step, commits and returned blocks).
  bool plan_step(StepPlan& sp);
  bool run_step(StepPlan& sp);
  void apply_step(StepPlan& sp, Clock::time_point now);
  // Speculative decoding: the draft step after the target step (the draft layer's slots of every sequence that
  // ran, the next drafts); then forked siblings (their shared slots exist only after the first pass).
  void draft_step(StepPlan& sp, const std::vector<int64_t>& valid);
  void emit_verified(Seq& s, const EngineStepItem& it, int64_t row, Clock::time_point now, int64_t& accepted);
  int64_t commit_bound(const Seq& s) const;
  void count_drafts(Seq& s, int64_t proposed, int64_t accepted);
  void collect_new_and_cancelled();
  void expire(Clock::time_point now);
  void admit(Clock::time_point now);
  void abort_request(Req& r, std::optional<AbortReason> reason, const std::string& message);
  void finish_seq(Seq& s, FinishReason why);
  void release_seq(Seq& s);
  void preempt(Seq& s);
  bool reserve_or_preempt(Seq& s, int64_t n_tokens);
  void sample_and_emit(Seq& s, float* row, Clock::time_point now);
  void emit(Seq& s, const SampleResult& res, Clock::time_point now);
  // Fills smp_* for a device-sampled step; false when some row needs its logits on the host.
  bool plan_device_sampling(std::span<const EngineStepItem> items, const std::vector<Seq*>& seqs);
  void on_prefill_done(Seq& s, float* row, Clock::time_point now);
  void retire_finished_requests(Clock::time_point now);
  void update_gauges();  // st_running_reqs_ / st_running_seqs_ (the queue count stats() reads live, under mu_)

  Engine& engine_;
  SchedulerOptions opt_;
  Metrics* metrics_;
  KvBlockAllocator alloc_;

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::shared_ptr<Req>> incoming_;  // submitted, not yet seen by the loop (guarded by mu_)
  int64_t queued_ = 0;                         // incoming + waiting (guarded by mu_)
  bool stop_ = false, draining_ = false, dead_ = false;
  bool lost_reported_ = false;  // scheduler thread only
  std::thread thread_;

  // Loop-thread state.
  std::deque<std::shared_ptr<Req>> waiting_;
  std::vector<std::shared_ptr<Req>> running_;
  std::vector<Seq*> active_;  // running sequences in admission order
  SeqId next_seq_ = 1;
  uint64_t next_order_ = 1;
  int consecutive_failures_ = 0;
  std::vector<float> logits_;
  int64_t spec_k_ = 0;            // draft tokens per sequence (0: off)
  bool sp_on_device_ = false;     // the step being applied was sampled on the engine's device
  std::vector<DraftFork> forks_;  // siblings forked this step, drafted after the first draft pass
  std::vector<EngineDraftItem> ditems_;
  std::vector<int32_t> dbuf_;
  mutable std::mutex spec_mu_;
  std::vector<int64_t> spec_prop_at_, spec_acc_at_;
  std::atomic<int64_t> st_spec_verifies_{0}, st_spec_proposed_{0}, st_spec_accepted_{0};
  std::vector<SampleRowParams> smp_rows_;
  std::vector<SampleEdit> smp_edits_;
  std::vector<uint32_t> smp_allow_;
  std::vector<int32_t> smp_ids_;

  std::atomic<int64_t> st_running_reqs_{0}, st_running_seqs_{0}, st_steps_{0}, st_max_batch_{0};
};

}  // namespace latent
