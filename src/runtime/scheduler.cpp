#include "runtime/scheduler.h"

#include <fmt/format.h>
#include <algorithm>
#include <limits>

#include "core/log.h"
#include "runtime/repetition.h"

namespace latent {

const char* abort_reason_name(AbortReason r) {
  switch (r) {
    case AbortReason::QueueTimeout: return "queue_timeout";
    case AbortReason::Timeout: return "timeout";
    case AbortReason::Shutdown: return "shutdown";
    case AbortReason::EngineError: return "error";
  }
  return "?";
}

void RequestHandle::cancel() { cancelled_.store(true); }

struct Scheduler::Seq {
  SeqId id = -1;
  Req* req = nullptr;
  int j = 0;                    // choice within the request
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t n_prompt = 0;
  int64_t n_computed = 0;  // tokens whose KV is in the engine's cache
  int64_t generated = 0;
  Sampler sampler;
  bool await_fork = false;  // n > 1: waits for choice 0's prompt, then copies its cache
  bool in_engine = false;
  bool done = false;
  uint64_t order = 0;
  Clock::time_point last_token{};
  std::unique_ptr<LoopDetector> loop;
  bool loop_seen = false;
  bool cache_reported = false;  // choice 0 told its sink how many prompt tokens came from the prefix cache
  std::unique_ptr<LogitConstraint> constraint;
  // Speculative decoding: the drafts proposed for the next step (they follow tokens.back()), the verify tokens
  // staged for the engine ([tokens.back(), drafts...]) and the draft layer's slots 0 .. mtp_filled - 1 in the cache.
  std::vector<int32_t> draft, verify;
  int64_t mtp_filled = 0;
  Seq(const SamplingParams& p, uint64_t stream) : sampler(p, stream) {}
  int choice() const;
};

struct Scheduler::Req {
  GenerationRequest g;
  std::shared_ptr<RequestHandle> handle;
  std::vector<std::unique_ptr<Seq>> seqs;
  int remaining = 0;
  bool first_token = false;
  bool ended = false;
  bool loop_warned = false;  // the repetition-loop warning is logged at most once per request
  int64_t generated = 0;
  std::vector<SampleResult> prompt_lp;  // prompt_logprobs >= 0: filled by position while choice 0 prefills
  bool prompt_lp_sent = false;
  bool wants_prompt_lp() const { return g.prompt_logprobs >= 0 && !prompt_lp_sent; }
};

struct Scheduler::Plan {
  Seq* s;
  int64_t len;
  int64_t start;  // n_computed when planned; a preempted sequence no longer matches
  bool valid = true;
  bool verify = false;  // the last token and the sequence's drafts (len = 1 + drafts)
};

struct Scheduler::StepPlan {
  std::vector<Plan> plan;
  std::vector<EngineStepItem> items;
  std::vector<Plan*> ran;
  std::vector<int64_t> offset;  // each item's first row in the step's flat token order
  int64_t want = 0;             // logits rows
  bool on_device = false;
  bool drafting = false;  // this step makes drafts for the next one (speculative decoding, batch not too large)
};

struct Scheduler::DraftFork {
  Seq* sib;
  Seq* parent;
  std::optional<KvBlockAllocator::BlockCopy> copy;
};

int Scheduler::Seq::choice() const { return req->g.choice_offset + j; }

Scheduler::Scheduler(Engine& engine, SchedulerOptions opt, Metrics* metrics)
    : engine_(engine), opt_(opt), metrics_(metrics), alloc_(opt.kv_total_blocks, opt.kv_block_tokens) {
  if (opt_.num_speculative_tokens < 0)
    throw std::invalid_argument(
        fmt::format("num_speculative_tokens must be >= 0 (got {})", opt_.num_speculative_tokens));
  if (opt_.num_speculative_tokens > 0 && engine_.draft_layers() == 0)
    throw std::invalid_argument("speculative decoding needs a draft layer (an MTP layer) the engine does not have");
  spec_k_ = opt_.num_speculative_tokens;
  spec_prop_at_.assign(static_cast<size_t>(spec_k_), 0);
  spec_acc_at_.assign(static_cast<size_t>(spec_k_), 0);
  opt_.max_num_seqs = std::max<int64_t>(1, opt_.max_num_seqs);
  opt_.max_batch_tokens = std::max<int64_t>(1, opt_.max_batch_tokens);
  opt_.prefill_chunk = std::max<int64_t>(1, opt_.prefill_chunk);
  if (opt_.prefix_cache) alloc_.enable_prefix_cache(opt_.prefix_cache_salt);
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::wake() { cv_.notify_all(); }

std::shared_ptr<RequestHandle> Scheduler::submit(GenerationRequest req) {
  using K = SchedulerRejected::Kind;
  const int64_t P = static_cast<int64_t>(req.prompt.size());
  if (P == 0) throw SchedulerRejected(K::TooLarge, "the prompt has no tokens");
  if (req.n < 1) req.n = 1;
  if (req.max_tokens < 0) throw SchedulerRejected(K::TooLarge, "max_tokens is negative");
  if (P >= opt_.max_context)
    throw SchedulerRejected(K::TooLarge,
                            fmt::format("the prompt has {} tokens; the context holds {}", P, opt_.max_context));
  if (req.n > opt_.max_num_seqs)
    throw SchedulerRejected(
        K::TooLarge,
        fmt::format("n = {} exceeds the running batch of {} sequences (--max-num-seqs)", req.n, opt_.max_num_seqs));
  const int64_t need = alloc_.blocks_for(P + 1) * req.n;
  if (need > alloc_.total_blocks())
    throw SchedulerRejected(
        K::TooLarge,
        fmt::format(
            "the request needs {} KV cache blocks ({} choice(s) x {} prompt tokens) but the KV cache holds only "
            "{} blocks of {} tokens (--kv-cache-bytes)",
            need, req.n, P, alloc_.total_blocks(), alloc_.block_tokens()));
  auto r = std::make_shared<Req>();
  r->handle = std::make_shared<RequestHandle>();
  r->g = std::move(req);
  {
    std::lock_guard lk(mu_);
    if (dead_) throw SchedulerRejected(K::Dead, "the engine loop failed; restart the server");
    if (draining_ || stop_) throw SchedulerRejected(K::Draining, "the server is shutting down");
    if (queued_ >= opt_.max_queue_len)
      throw SchedulerRejected(K::Overloaded, fmt::format("the request queue is full ({} waiting)", queued_));
    incoming_.push_back(r);
    ++queued_;
  }
  if (metrics_) metrics_->requests_total.inc();
  cv_.notify_all();
  return r->handle;
}

void Scheduler::begin_drain() {
  std::lock_guard lk(mu_);
  draining_ = true;
}

bool Scheduler::wait_idle(double timeout_s) {
  const auto until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (true) {
    {
      std::lock_guard lk(mu_);
      if (queued_ == 0 && st_running_reqs_.load() == 0) return true;
    }
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int64_t Scheduler::abort_all(AbortReason reason, const std::string& message) {
  // Run on the loop thread: stop it, abort, and restart it.
  bool was_running = false;
  {
    std::lock_guard lk(mu_);
    was_running = thread_.joinable() && !stop_;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  collect_new_and_cancelled();
  int64_t aborted = static_cast<int64_t>(waiting_.size());
  for (auto& r : waiting_) abort_request(*r, reason, message);
  {
    std::lock_guard lk(mu_);
    queued_ -= static_cast<int64_t>(waiting_.size());
  }
  waiting_.clear();
  for (auto& r : running_)
    if (!r->ended) {
      abort_request(*r, reason, message);
      ++aborted;
    }
  retire_finished_requests(Clock::now());
  update_gauges();
  {
    std::lock_guard lk(mu_);
    stop_ = false;
  }
  if (was_running) start();
  return aborted;
}

void Scheduler::stop() {
  {
    std::lock_guard lk(mu_);
    if (!thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  collect_new_and_cancelled();
  for (auto& r : waiting_) abort_request(*r, AbortReason::Shutdown, "the server is shutting down");
  {
    std::lock_guard lk(mu_);
    queued_ -= static_cast<int64_t>(waiting_.size());
  }
  waiting_.clear();
  for (auto& r : running_)
    if (!r->ended) abort_request(*r, AbortReason::Shutdown, "the server is shutting down");
  retire_finished_requests(Clock::now());
  update_gauges();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  // The queue count first, then the running gauges: admit() publishes a request as running before it leaves the
  // queue count, so a request admitted between the two reads is seen in one of them at least.
  {
    std::lock_guard lk(mu_);
    s.waiting = queued_;
    s.dead = dead_;
    s.draining = draining_;
  }
  s.running_requests = st_running_reqs_.load();
  s.running_seqs = st_running_seqs_.load();
  s.kv_used = alloc_.used_blocks();
  s.kv_total = alloc_.total_blocks();
  s.prefix_cached_blocks = alloc_.cached_blocks();
  s.prefix_requests = static_cast<int64_t>(alloc_.prefix_queries());
  s.prefix_hit_tokens = static_cast<int64_t>(alloc_.prefix_hit_tokens());
  s.prefix_query_tokens = static_cast<int64_t>(alloc_.prefix_query_tokens());
  s.steps = st_steps_.load();
  s.max_batch_seqs = st_max_batch_.load();
  s.spec_verifies = st_spec_verifies_.load();
  s.spec_proposed = st_spec_proposed_.load();
  s.spec_accepted = st_spec_accepted_.load();
  {
    std::lock_guard lk(spec_mu_);
    s.spec_proposed_at = spec_prop_at_;
    s.spec_accepted_at = spec_acc_at_;
  }
  return s;
}

void Scheduler::loop() {
  while (true) {
    {
      std::lock_guard lk(mu_);
      if (stop_) break;
    }
    bool did = false;
    try {
      did = step();
    } catch (const std::exception& e) {
      log::error("scheduler: {}", e.what());
      did = false;
    }
    if (!did) {
      std::unique_lock lk(mu_);
      const bool idle = waiting_.empty() && running_.empty();
      cv_.wait_for(lk, idle ? std::chrono::milliseconds(500) : std::chrono::milliseconds(5),
                   [&] { return stop_ || !incoming_.empty(); });
    }
  }
}

void Scheduler::collect_new_and_cancelled() {
  {
    std::lock_guard lk(mu_);
    while (!incoming_.empty()) {
      waiting_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
    }
  }
  // Cancelled waiting requests leave the queue count before their handles say done, so that a caller who sees its
  // request done never sees it still counted as waiting (stats().waiting, /metrics).
  std::vector<std::shared_ptr<Req>> cancelled;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->handle->cancelled()) {
      cancelled.push_back(std::move(*it));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  if (!cancelled.empty()) {
    {
      std::lock_guard lk(mu_);
      queued_ -= static_cast<int64_t>(cancelled.size());
    }
    for (auto& r : cancelled) abort_request(*r, std::nullopt, "");
  }
  for (auto& r : running_)
    if (!r->ended && r->handle->cancelled()) abort_request(*r, std::nullopt, "");
}

void Scheduler::expire(Clock::time_point now) {
  auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  int64_t removed = 0;
  if (opt_.max_queue_wait_s > 0) {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (secs(now - (*it)->g.arrival) > opt_.max_queue_wait_s) {
        abort_request(**it, AbortReason::QueueTimeout,
                      fmt::format("the request waited more than {} s in the queue", opt_.max_queue_wait_s));
        it = waiting_.erase(it);
        ++removed;
      } else {
        ++it;
      }
    }
  }
  if (removed) {
    std::lock_guard lk(mu_);
    queued_ -= removed;
  }
  if (opt_.request_timeout_s > 0)
    for (auto& r : running_)
      if (!r->ended && secs(now - r->g.arrival) > opt_.request_timeout_s)
        abort_request(
            *r, AbortReason::Timeout,
            fmt::format("the request did not finish within {} s (--request-timeout)", opt_.request_timeout_s));
}

void Scheduler::admit(Clock::time_point now) {
  // A sequence that lost its cache (preempted) or waits for room has priority over new requests.
  for (Seq* s : active_)
    if (!s->done && !s->await_fork && !s->in_engine) return;
  int64_t seqs = static_cast<int64_t>(active_.size());
  // Blocks the running sequences still need to hold their known tokens (+1 for the next one).
  int64_t pending = 0;
  for (Seq* s : active_)
    if (!s->done) pending += alloc_.extra_blocks(s->id, static_cast<int64_t>(s->tokens.size()) + 1 + spec_k_);
  int64_t admitted = 0;
  while (!waiting_.empty()) {
    Req& r = *waiting_.front();
    const int64_t P = static_cast<int64_t>(r.g.prompt.size());
    const int64_t need = alloc_.blocks_for(P + 1) * r.g.n;
    if (seqs + r.g.n > opt_.max_num_seqs) break;
    if (alloc_.free_blocks() - pending < need) break;
    std::shared_ptr<Req> rp = std::move(waiting_.front());
    waiting_.pop_front();
    ++admitted;
    seqs += r.g.n;
    pending += need;
    for (int j = 0; j < r.g.n; ++j) {
      auto s = std::make_unique<Seq>(r.g.sampling, static_cast<uint64_t>(r.g.choice_offset + j));
      s->id = next_seq_++;
      s->req = &r;
      s->j = j;
      s->tokens = r.g.prompt;
      s->n_prompt = P;
      s->await_fork = j > 0;
      s->order = next_order_++;
      if (opt_.stop_on_loop || metrics_) s->loop = std::make_unique<LoopDetector>();
      if (r.g.constraint) s->constraint = r.g.constraint(r.g.choice_offset + j);
      active_.push_back(s.get());
      r.seqs.push_back(std::move(s));
    }
    r.remaining = r.g.n;
    if (metrics_) {
      metrics_->queue_time.observe(std::chrono::duration<double>(now - r.g.arrival).count());
      metrics_->prompt_tokens.inc(static_cast<uint64_t>(P));
      metrics_->prompt_len.observe(static_cast<double>(P));
    }
    running_.push_back(rp);
    try {
      r.g.sink->on_scheduled();
    } catch (const std::exception& e) {
      log::error("scheduler: sink: {}", e.what());
    }
  }
  if (admitted) {
    // The admitted requests count as running before they leave the queue count, so that a reader of stats() never
    // sees a request in neither (running 0 and waiting 0 while one is being admitted: /metrics scraped as idle).
    update_gauges();
    std::lock_guard lk(mu_);
    queued_ -= admitted;
  }
}

void Scheduler::release_seq(Seq& s) {
  s.in_engine = false;
  alloc_.release(s.id);
}

void Scheduler::preempt(Seq& s) {
  release_seq(s);
  s.n_computed = 0;
  s.mtp_filled = 0;
  s.draft.clear();
  if (metrics_) metrics_->preemptions.inc();
  log::debug("scheduler: preempted sequence {} ({} tokens)", s.id, s.tokens.size());
}

void Scheduler::abort_request(Req& r, std::optional<AbortReason> reason, const std::string& message) {
  if (r.ended) return;
  for (auto& s : r.seqs)
    if (!s->done) {
      s->done = true;
      release_seq(*s);
    }
  r.remaining = 0;
  r.ended = true;
  if (metrics_) metrics_->requests_aborted.inc(reason ? abort_reason_name(*reason) : "client_disconnect");
  if (reason) {
    try {
      r.g.sink->on_abort(*reason, message);
    } catch (const std::exception& e) {
      log::error("scheduler: sink: {}", e.what());
    }
  }
  r.handle->done_.store(true);
}

void Scheduler::finish_seq(Seq& s, FinishReason why) {
  if (s.done) return;
  s.done = true;
  release_seq(s);
  Req& r = *s.req;
  --r.remaining;
  try {
    r.g.sink->on_finish(s.choice(), why);
  } catch (const std::exception& e) {
    log::error("scheduler: sink: {}", e.what());
  }
}

bool Scheduler::reserve_or_preempt(Seq& s, int64_t n_tokens) {
  while (!alloc_.reserve(s.id, n_tokens)) {
    // Victim: the most recently admitted sequence holding blocks, if it is newer than s.
    Seq* victim = nullptr;
    for (auto it = active_.rbegin(); it != active_.rend(); ++it)
      if (!(*it)->done && alloc_.blocks_of((*it)->id) > 0) {
        victim = *it;
        break;
      }
    if (!victim || victim == &s || victim->order < s.order) {
      if (alloc_.blocks_of(s.id) > 0 && victim == &s) preempt(s);
      return false;
    }
    preempt(*victim);
  }
  return true;
}

void Scheduler::sample_and_emit(Seq& s, float* row, Clock::time_point now) {
  const int64_t V = engine_.vocab_size();
  const std::span<const int32_t> prompt(s.tokens.data(), static_cast<size_t>(s.n_prompt));
  const std::span<const int32_t> gen(s.tokens.data() + s.n_prompt, static_cast<size_t>(s.generated));
  if (s.constraint) s.constraint->mask(std::span<float>(row, static_cast<size_t>(V)));
  SampleResult res = s.sampler.sample(std::span<float>(row, static_cast<size_t>(V)), prompt, gen, opt_.banned);
  emit(s, res, now);
}

bool Scheduler::plan_device_sampling(std::span<const EngineStepItem> items, const std::vector<Seq*>& seqs) {
  smp_rows_.clear();
  smp_edits_.clear();
  smp_allow_.clear();
  const int64_t V = engine_.vocab_size();
  std::vector<int32_t> gen;
  for (size_t i = 0; i < items.size(); ++i) {
    const bool verify = items[i].decode && items[i].all_logits;
    if (items[i].all_logits && !verify) return false;  // prompt logprobs
    if (!items[i].want_logits) continue;
    Seq& s = *seqs[i];
    Req& r = *s.req;
    const int64_t n_rows = verify ? static_cast<int64_t>(items[i].tokens.size()) : 1;
    SampleRowParams row;
    if (s.done || r.ended) {  // nothing will use these rows: the cheapest draw
      row.temperature = 0.0f;
      for (int64_t j = 0; j < n_rows; ++j) smp_rows_.push_back(row);
      continue;
    }
    // The end of choice 0's prompt may report prompt logprobs, end a max_tokens 0 request or fork siblings
    // from the logits row: those take the host path.
    if (s.generated == 0 && s.j == 0 && (r.wants_prompt_lp() || r.g.max_tokens == 0 || r.g.n > 1)) return false;
    // A verify's row j follows drafts 1 .. j: the constraint's state there is known on the host only.
    if (s.constraint && n_rows > 1) return false;
    const std::span<const int32_t> prompt(s.tokens.data(), static_cast<size_t>(s.n_prompt));
    for (int64_t j = 0; j < n_rows; ++j) {
      // Row j's penalties see the generated tokens and drafts 1 .. j (the row is used only if they are accepted).
      gen.assign(s.tokens.begin() + s.n_prompt, s.tokens.end());
      gen.insert(gen.end(), items[i].tokens.begin() + 1, items[i].tokens.begin() + 1 + j);
      if (!s.sampler.device_row(prompt, gen, V, row, smp_edits_)) return false;
      row.rng_counter += static_cast<uint64_t>(j);
      if (s.constraint) {  // the constraint's mask as an allowed-id bitmask
        const size_t off = smp_allow_.size();
        smp_allow_.resize(off + static_cast<size_t>((V + 31) / 32), 0u);
        if (s.constraint->allowed_bits(std::span<uint32_t>(smp_allow_.data() + off, smp_allow_.size() - off), V))
          row.allow_offset = static_cast<int64_t>(off);
        else
          smp_allow_.resize(off);  // nothing masked now (e.g. reasoning before the constraint starts)
      }
      smp_rows_.push_back(row);
    }
  }
  return !smp_rows_.empty();
}

void Scheduler::emit(Seq& s, const SampleResult& res, Clock::time_point now) {
  Req& r = *s.req;
  if (s.constraint) s.constraint->accept(res.token);
  s.tokens.push_back(res.token);
  ++s.generated;
  ++r.generated;
  if (metrics_) {
    metrics_->generation_tokens.inc();
    if (s.last_token != Clock::time_point{})
      metrics_->itl.observe(std::chrono::duration<double>(now - s.last_token).count());
    if (!r.first_token) metrics_->ttft.observe(std::chrono::duration<double>(now - r.g.arrival).count());
  }
  r.first_token = true;
  s.last_token = now;
  const bool is_stop = std::find(r.g.stop_ids.begin(), r.g.stop_ids.end(), res.token) != r.g.stop_ids.end();
  bool end = false;
  try {
    end = r.g.sink->on_token(s.choice(), res, is_stop);
  } catch (const std::exception& e) {
    log::error("scheduler: sink: {}", e.what());
    abort_request(r, AbortReason::EngineError, "internal error while processing the output");
    return;
  }
  if (is_stop || end || (s.constraint && s.constraint->finished())) return finish_seq(s, FinishReason::Stop);
  if (s.generated >= r.g.max_tokens || static_cast<int64_t>(s.tokens.size()) >= opt_.max_context)
    return finish_seq(s, FinishReason::Length);
  if (s.loop) {
    auto li = s.loop->push(res.token);
    if (li && !s.loop_seen) {
      s.loop_seen = true;
      if (metrics_) metrics_->repetition_loops.inc();
      // Detected; the choice goes on unless --stop-on-loop ends it (then it is a warning: output was cut).
      if (!r.g.ignore_eos && !r.loop_warned) {
        r.loop_warned = true;
        if (opt_.stop_on_loop)
          log::warn(
              "sequence {}: repetition loop detected (period {}, {} tokens): stopped (--stop-on-loop), "
              "finish_reason length",
              s.id, li->period, li->span);
        else
          log::info(
              "sequence {}: repetition loop detected (period {}, {} tokens); it keeps generating "
              "(--stop-on-loop would end it)",
              s.id, li->period, li->span);
      }
      if (opt_.stop_on_loop) return finish_seq(s, FinishReason::Length);
    }
  }
}

void Scheduler::on_prefill_done(Seq& s, float* row, Clock::time_point now) {
  Req& r = *s.req;
  const int64_t V = engine_.vocab_size();
  std::vector<float> copy;
  for (auto& sib : r.seqs) {
    if (!sib->await_fork || sib->done || r.ended) continue;
    sib->await_fork = false;
    // Share the prompt's full blocks; the partial last block is copied. No room: it prefills on its own later.
    const auto forked = alloc_.fork(s.id, sib->id, s.n_prompt);
    if (!forked) continue;
    // With a draft layer the copy waits for the draft step that writes the draft layer's slots of the prompt
    // (they are in the copied block too): draft_step copies, then drafts the siblings.
    if (spec_k_ > 0)
      forks_.push_back({sib.get(), &s, *forked});
    else if (*forked)
      engine_.copy_block((*forked)->src, (*forked)->dst, (*forked)->n_tokens);
    sib->in_engine = true;
    sib->n_computed = s.n_prompt;
    sib->mtp_filled = s.n_prompt;
    copy.assign(row, row + V);
    sample_and_emit(*sib, copy.data(), now);
  }
}

void Scheduler::retire_finished_requests(Clock::time_point now) {
  std::vector<std::shared_ptr<Req>> retired;
  for (auto it = running_.begin(); it != running_.end();) {
    Req& r = **it;
    if (r.remaining > 0 && !r.ended) {
      ++it;
      continue;
    }
    if (!r.ended && metrics_) {
      metrics_->e2e.observe(std::chrono::duration<double>(now - r.g.arrival).count());
      metrics_->generation_len.observe(static_cast<double>(r.generated));
    }
    r.ended = true;
    r.handle->done_.store(true);
    retired.push_back(std::move(*it));  // keeps its Seqs alive until active_ no longer points at them
    it = running_.erase(it);
  }
  // Every Seq of a retired request is done (finish_seq / abort_request); drop them from active_ while `retired`
  // still owns them.
  active_.erase(std::remove_if(active_.begin(), active_.end(), [](Seq* s) { return s->done; }), active_.end());
}

MetricsGauges Scheduler::gauges() const {
  const SchedulerStats st = stats();
  MetricsGauges g;
  g.requests_running = st.running_requests;
  g.requests_waiting = st.waiting;
  g.sequences_running = st.running_seqs;
  g.kv_blocks_used = st.kv_used;
  g.kv_blocks_total = st.kv_total;
  g.prefix_cached_blocks = st.prefix_cached_blocks;
  g.prefix_requests = st.prefix_requests;
  return g;
}

void Scheduler::update_gauges() {
  st_running_reqs_.store(static_cast<int64_t>(running_.size()));
  st_running_seqs_.store(static_cast<int64_t>(active_.size()));
}

int64_t Scheduler::commit_bound(const Seq& s) const {
  // With a draft layer a block is registered once its draft-layer slots are in it too.
  return spec_k_ > 0 ? std::min(s.n_computed, s.mtp_filled) : s.n_computed;
}

void Scheduler::count_drafts(Seq& s, int64_t proposed, int64_t accepted) {
  if (proposed <= 0) return;
  st_spec_verifies_.fetch_add(1);
  st_spec_proposed_.fetch_add(proposed);
  st_spec_accepted_.fetch_add(accepted);
  {
    std::lock_guard lk(spec_mu_);
    for (int64_t j = 0; j < proposed && j < spec_k_; ++j) {
      ++spec_prop_at_[static_cast<size_t>(j)];
      if (j < accepted) ++spec_acc_at_[static_cast<size_t>(j)];
    }
  }
  if (metrics_) metrics_->count_spec_verify(proposed, accepted);
  try {
    s.req->g.sink->on_draft_tokens(s.choice(), proposed, accepted);
  } catch (const std::exception& e) {
    log::error("scheduler: sink: {}", e.what());
  }
}

bool Scheduler::step() {
  collect_new_and_cancelled();
  Clock::time_point now = Clock::now();
  expire(now);
  bool dead;
  {
    std::lock_guard lk(mu_);
    dead = dead_;
  }
  if (!dead) admit(now);
  retire_finished_requests(now);
  update_gauges();
  StepPlan sp;
  if (!plan_step(sp)) {
    update_gauges();
    return false;
  }
  const Clock::time_point t_run = Clock::now();
  if (!run_step(sp)) return true;
  note_step_time(sp, std::chrono::duration<double>(Clock::now() - t_run).count());
  apply_step(sp, Clock::now());
  retire_finished_requests(Clock::now());
  update_gauges();
  return true;
}

void Scheduler::note_step_time(const StepPlan& sp, double seconds) {
  int64_t decode = 0, prompt = 0;
  for (const EngineStepItem& it : sp.items) (it.decode ? decode : prompt) += static_cast<int64_t>(it.tokens.size());
  if (opt_.step_seconds) seconds = opt_.step_seconds(decode, prompt);
  constexpr double kA = 0.25;  // weight of the newest sample
  auto ema = [](double& avg, double v) { avg = avg > 0 ? (1 - kA) * avg + kA * v : v; };
  if (prompt == 0 && decode > 0) {
    ema(decode_step_s_, seconds);
  } else if (prompt > 0) {
    // A mixed step: what it took beyond a decode-only step, per prompt token (a prompt-only step: all of it).
    const double extra = decode > 0 ? seconds - decode_step_s_ : seconds;
    if (decode == 0 || decode_step_s_ > 0) ema(prompt_token_s_, std::max(extra, 0.0) / static_cast<double>(prompt));
  }
}

bool Scheduler::plan_step(StepPlan& sp) {
  // A sequence that starts (or restarts after preemption) from nothing takes the cached blocks of its prefix; at
  // least its last token is computed, for the logits.
  if (alloc_.prefix_cache_enabled())
    for (Seq* s : active_) {
      if (s->done || s->await_fork || s->n_computed != 0 || alloc_.blocks_of(s->id) != 0) continue;
      if (s->j == 0 && s->req->wants_prompt_lp()) continue;  // every prompt row's logits are needed
      const int64_t n = static_cast<int64_t>(s->tokens.size());
      const uint64_t q0 = alloc_.prefix_query_tokens(), h0 = alloc_.prefix_hit_tokens();
      s->n_computed = alloc_.attach_prefix(s->id, s->tokens, n - 1);
      s->mtp_filled = s->n_computed;  // the cached blocks hold the draft layer's slots of their tokens too
      if (metrics_) {
        metrics_->prefix_cache_queries.inc(alloc_.prefix_query_tokens() - q0);
        metrics_->prefix_cache_hits.inc(alloc_.prefix_hit_tokens() - h0);
      }
      if (s->j == 0 && !s->cache_reported) {
        s->cache_reported = true;
        try {
          s->req->g.sink->on_cached_prompt_tokens(std::min(s->n_computed, s->n_prompt));
        } catch (const std::exception& e) {
          log::error("scheduler: sink: {}", e.what());
        }
      }
    }
  // Every decoding sequence advances: its last token plus its drafts (verified in the same step).
  int64_t n_decoding = 0;
  for (Seq* s : active_)
    if (!s->done && !s->await_fork && static_cast<int64_t>(s->tokens.size()) - s->n_computed == 1) ++n_decoding;
  sp.drafting = spec_k_ > 0 && (opt_.speculative_max_batch == 0 ||
                                (opt_.speculative_max_batch > 0 && n_decoding <= opt_.speculative_max_batch));
  std::vector<Plan>& plan = sp.plan;
  int64_t decodes = 0;
  for (Seq* s : active_) {
    if (s->done || s->await_fork) continue;
    if (static_cast<int64_t>(s->tokens.size()) - s->n_computed != 1) continue;
    int64_t len = 1;
    const bool verify = sp.drafting && !s->draft.empty() && s->n_computed >= s->n_prompt &&
                        decodes + 1 + static_cast<int64_t>(s->draft.size()) <= opt_.max_batch_tokens;
    if (verify)
      len += static_cast<int64_t>(s->draft.size());
    else
      s->draft.clear();
    plan.push_back({s, len, s->n_computed, true, verify});
    decodes += len;
  }
  int64_t budget = std::max<int64_t>(opt_.max_batch_tokens - decodes, 0);
  // Beside decodes, only the prompt tokens that keep the step within mixed_step_factor of a decode-only step.
  if (decodes > 0 && opt_.mixed_step_factor > 1 && decode_step_s_ > 0 && prompt_token_s_ > 0) {
    const double fit = (opt_.mixed_step_factor - 1) * decode_step_s_ / prompt_token_s_;
    budget = std::min(budget, std::max<int64_t>(kMinMixedPrefill, static_cast<int64_t>(fit)));
  }
  for (Seq* s : active_) {
    if (s->done || s->await_fork) continue;
    const int64_t len_total = static_cast<int64_t>(s->tokens.size());
    if (len_total - s->n_computed <= 1) continue;
    // Up to --prefill-chunk tokens from where the prompt stands (a prompt's KV and logits do not depend on how it
    // is chunked: docs/design.md). A chunk larger than what the step's budget leaves: as much as fits now, the rest
    // in the next steps (a chunk that never fits beside the running decodes would otherwise wait until no sequence
    // decodes: starved).
    int64_t len = std::min(len_total - s->n_computed, opt_.prefill_chunk);
    if (len > budget && !plan.empty()) {
      if (budget <= 0) break;
      len = budget;
    }
    plan.push_back({s, len, s->n_computed});
    budget -= std::min(budget, len);
  }
  if (plan.empty()) return false;
  // Reserve blocks oldest first; newer sequences are preempted when the budget runs out. With a draft layer the
  // reservation also covers the draft step's slots (up to spec_k_ past the tokens of this step).
  const int64_t draft_room = spec_k_ > 0 ? std::max<int64_t>(spec_k_, 1) : 0;
  std::vector<Plan*> by_age;
  for (auto& p : plan) by_age.push_back(&p);
  std::sort(by_age.begin(), by_age.end(), [](Plan* a, Plan* b) { return a->s->order < b->s->order; });
  for (Plan* p : by_age) {
    Seq& s = *p->s;
    if (s.done || s.n_computed != p->start) {
      p->valid = false;  // preempted by an older sequence in this loop
      continue;
    }
    if (!reserve_or_preempt(s, s.n_computed + p->len + draft_room)) {
      p->valid = false;
      continue;
    }
    s.in_engine = true;
  }
  int64_t flat = 0;
  for (auto& p : plan) {
    if (!p.valid || p.s->done || !p.s->in_engine || p.s->n_computed != p.start) continue;
    Seq& s = *p.s;
    const int64_t total = static_cast<int64_t>(s.tokens.size());
    if (alloc_.blocks_of(s.id) < alloc_.blocks_for(s.n_computed + p.len)) continue;
    EngineStepItem it;
    it.seq = s.id;
    it.decode = s.n_computed >= s.n_prompt;
    if (p.verify) {  // the last token and the drafts
      s.verify.assign(1, s.tokens.back());
      s.verify.insert(s.verify.end(), s.draft.begin(), s.draft.end());
      it.tokens = std::span<const int32_t>(s.verify.data(), s.verify.size());
    } else {
      it.tokens = std::span<const int32_t>(s.tokens.data() + s.n_computed, static_cast<size_t>(p.len));
    }
    it.start = s.n_computed;
    const std::vector<int32_t>* table = alloc_.block_table(s.id);
    it.blocks = std::span<const int32_t>(table->data(), table->size());
    it.want_logits = p.verify || s.n_computed + p.len == total;
    it.all_logits = p.verify || (!it.decode && s.j == 0 && s.req->wants_prompt_lp());
    sp.want += it.all_logits ? p.len : it.want_logits ? 1 : 0;
    sp.items.push_back(it);
    sp.ran.push_back(&p);
    sp.offset.push_back(flat);
    flat += p.len;
  }
  return !sp.items.empty();
}

bool Scheduler::run_step(StepPlan& sp) {
  const int64_t V = engine_.vocab_size();
  std::vector<Seq*> item_seqs;
  item_seqs.reserve(sp.ran.size());
  for (Plan* p : sp.ran) item_seqs.push_back(p->s);
  sp.on_device =
      opt_.device_sampling && sp.want > 0 && engine_.samples_on_device() && plan_device_sampling(sp.items, item_seqs);
  if (!sp.on_device) logits_.resize(static_cast<size_t>(std::max<int64_t>(sp.want, 1) * V));
  try {
    if (sp.on_device) {
      SampleBatch sb;
      sb.rows = smp_rows_.data();
      sb.n_rows = static_cast<int64_t>(smp_rows_.size());
      sb.edits = smp_edits_.data();
      sb.n_edits = static_cast<int64_t>(smp_edits_.size());
      sb.allow = smp_allow_.data();
      sb.n_allow = static_cast<int64_t>(smp_allow_.size());
      sb.banned = opt_.banned;
      smp_ids_.assign(smp_rows_.size(), 0);
      engine_.step_sampled(sp.items, sb, smp_ids_.data());
    } else {
      engine_.step(sp.items, logits_.data());
    }
    consecutive_failures_ = 0;
  } catch (const std::exception& e) {
    log::error("engine step failed: {}", e.what());
    // Dead before the requests hear of their abort: a client woken by it must already see the scheduler dead.
    const bool lost = engine_.lost();
    if (++consecutive_failures_ >= 3 || lost) {
      std::lock_guard lk(mu_);
      dead_ = true;
    }
    for (Plan* p : sp.ran) abort_request(*p->s->req, AbortReason::EngineError, "internal error in the engine");
    if (lost) {
      log::error("the engine is lost (its device context is unusable): no request can be served any more");
      if (opt_.on_engine_lost && !lost_reported_) opt_.on_engine_lost(e.what());
      lost_reported_ = true;
    }
    retire_finished_requests(Clock::now());
    update_gauges();
    return false;
  }
  st_steps_.fetch_add(1);
  st_max_batch_.store(std::max<int64_t>(st_max_batch_.load(), static_cast<int64_t>(sp.items.size())));
  return true;
}

// A verify of [last token, d1 .. dk]: row j is sampled exactly as a decode step after d1 .. dj would be (the
// constraint and the penalties have seen exactly the tokens emitted before it) and emitted; the run goes on while
// the emitted token equals the next draft. The draw is the Sampler's counter-based one, so an accepted draft is
// the token the target would have drawn anyway and a rejected one is replaced by that token: the output is the
// target's sample, token for token (rejection sampling with the draft as a point mass: a draft d is accepted with
// probability p(d), and on rejection the token is drawn from p restricted to the other ids).
void Scheduler::emit_verified(Seq& s, const EngineStepItem& it, int64_t row, Clock::time_point now, int64_t& accepted) {
  const int64_t V = engine_.vocab_size(), len = static_cast<int64_t>(it.tokens.size());
  accepted = 0;
  for (int64_t j = 0; j < len; ++j) {
    if (s.done || s.req->ended) return;
    if (sp_on_device_) {
      const int32_t id = smp_ids_[static_cast<size_t>(row + j)];
      s.sampler.advance();
      SampleResult res;
      res.token = id;
      emit(s, res, now);
    } else {
      sample_and_emit(s, logits_.data() + (row + j) * V, now);
    }
    if (s.done || s.req->ended) return;
    if (j + 1 < len && s.tokens.back() == it.tokens[static_cast<size_t>(j + 1)]) {
      ++accepted;
      continue;
    }
    return;
  }
}

void Scheduler::apply_step(StepPlan& sp, Clock::time_point now) {
  const int64_t V = engine_.vocab_size();
  const std::vector<EngineStepItem>& items = sp.items;
  sp_on_device_ = sp.on_device;
  forks_.clear();
  // Per item: the leading tokens whose KV is now valid (all of a prompt chunk; of a verify the last token and
  // the accepted drafts), or -1 when the sequence needs no draft step (finished, nothing follows yet).
  std::vector<int64_t> valid(items.size(), -1);
  int64_t row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Seq& s = *sp.ran[i]->s;
    const EngineStepItem& it = items[i];
    const int64_t len = static_cast<int64_t>(it.tokens.size());
    const bool verify = it.decode && it.all_logits;
    if (verify) {
      const int64_t old = s.n_computed;
      s.n_computed = old + 1;
      alloc_.commit(s.id, s.tokens, commit_bound(s));
      int64_t acc = 0;
      emit_verified(s, it, row, now, acc);
      row += len;
      count_drafts(s, len - 1, acc);
      s.draft.clear();
      if (s.done || s.req->ended) continue;
      s.n_computed = old + 1 + acc;
      valid[i] = 1 + acc;
      continue;
    }
    s.n_computed += len;
    alloc_.commit(s.id, s.tokens, commit_bound(s));
    if (it.all_logits) {
      // Row k predicts the token at position start + k + 1; the prompt's positions 1 .. P-1 are recorded.
      Req& r = *s.req;
      r.prompt_lp.resize(static_cast<size_t>(s.n_prompt - 1));
      for (int64_t k = 0; k < len; ++k) {
        const int64_t pos = it.start + k + 1;
        if (pos >= s.n_prompt) break;
        r.prompt_lp[static_cast<size_t>(pos - 1)] =
            token_logprob(std::span<const float>(logits_.data() + (row + k) * V, static_cast<size_t>(V)),
                          s.tokens[static_cast<size_t>(pos)], r.g.prompt_logprobs, opt_.banned);
      }
      row += len - 1;  // the last row is the want_logits row
    }
    if (!it.want_logits) {
      if (it.all_logits) ++row;
      if (!s.done && !s.req->ended && static_cast<int64_t>(s.tokens.size()) > s.n_computed) valid[i] = len;
      continue;
    }
    if (sp.on_device) {  // (plan_device_sampling: no prompt logprobs, forks or max_tokens 0 here)
      const int32_t id = smp_ids_[static_cast<size_t>(row)];
      ++row;
      if (s.done || s.req->ended) continue;
      s.sampler.advance();
      SampleResult res;
      res.token = id;
      emit(s, res, now);
      if (!s.done && !s.req->ended) valid[i] = len;
      continue;
    }
    float* rowp = logits_.data() + row * V;
    ++row;
    if (s.done || s.req->ended) continue;
    if (s.generated == 0 && s.j == 0) {
      Req& r = *s.req;
      if (r.wants_prompt_lp()) {
        r.prompt_lp_sent = true;
        r.prompt_lp.resize(static_cast<size_t>(s.n_prompt - 1));
        try {
          r.g.sink->on_prompt_logprobs(r.g.choice_offset, r.g.n, std::move(r.prompt_lp));
        } catch (const std::exception& e) {
          log::error("scheduler: sink: {}", e.what());
        }
        r.prompt_lp = {};
      }
      if (r.g.max_tokens == 0) {  // nothing to generate: every choice ends with the prompt
        for (auto& sib : r.seqs) finish_seq(*sib, FinishReason::Length);
        continue;
      }
      on_prefill_done(s, rowp, now);
    }
    sample_and_emit(s, rowp, now);
    if (!s.done && !s.req->ended) valid[i] = len;
  }
  if (spec_k_ > 0) draft_step(sp, valid);
}

void Scheduler::draft_step(StepPlan& sp, const std::vector<int64_t>& valid) {
  const int64_t bt = alloc_.block_tokens();
  // The drafts of a sequence: at most k, no more than it may still generate (the verify emits drafts + 1), and
  // within the context.
  auto n_draft_of = [&](const Seq& s) -> int32_t {
    if (!sp.drafting) return 0;
    const int64_t left = s.req->g.max_tokens - s.generated - 1;
    const int64_t ctx = opt_.max_context - static_cast<int64_t>(s.tokens.size());
    return static_cast<int32_t>(std::max<int64_t>(0, std::min({spec_k_, left, ctx})));
  };
  // Blocks for the slots (reserved at planning; a fork's sibling reserves here, without preempting anyone).
  auto fit = [&](Seq& s, int64_t start, int64_t n, int32_t nd) -> int32_t {
    while (nd >= 0 && !alloc_.reserve(s.id, start + n + std::max<int32_t>(nd - 1, 0))) --nd;
    return nd;
  };
  ditems_.clear();
  std::vector<Seq*> dseqs;
  auto run = [&]() -> bool {
    if (ditems_.empty()) return true;
    int64_t total = 0;
    for (const auto& d : ditems_) total += d.n_draft;
    dbuf_.assign(static_cast<size_t>(std::max<int64_t>(total, 1)), 0);
    try {
      engine_.draft(ditems_, dbuf_.data());
    } catch (const std::exception& e) {
      log::error("engine draft step failed: {}", e.what());
      for (Seq* s : dseqs) abort_request(*s->req, AbortReason::EngineError, "internal error in the engine");
      return false;
    }
    int64_t at = 0;
    for (size_t i = 0; i < ditems_.size(); ++i) {
      Seq& s = *dseqs[i];
      const EngineDraftItem& d = ditems_[i];
      s.draft.assign(dbuf_.begin() + at, dbuf_.begin() + at + d.n_draft);
      at += d.n_draft;
      s.mtp_filled = d.start + static_cast<int64_t>(d.tokens.size());
      alloc_.commit(s.id, s.tokens, commit_bound(s));
      alloc_.shrink(s.id, std::max(s.n_computed + 1, s.mtp_filled));
    }
    return true;
  };
  for (size_t i = 0; i < sp.items.size(); ++i) {
    if (valid[i] < 0) continue;
    Seq& s = *sp.ran[i]->s;
    if (s.done || s.req->ended || !s.in_engine) continue;
    const EngineStepItem& it = sp.items[i];
    const int64_t st = it.start, last = st + valid[i];  // the slot of the token after the valid ones
    if (static_cast<int64_t>(s.tokens.size()) <= last) continue;
    int64_t start = std::min(s.mtp_filled, st + 1);
    if (start < st) {
      log::debug("scheduler: sequence {} has no draft-layer slots {} .. {}", s.id, start, st - 1);
      start = st;
    }
    EngineDraftItem d;
    d.seq = s.id;
    d.start = start;
    d.tokens = std::span<const int32_t>(s.tokens.data() + start, static_cast<size_t>(last - start + 1));
    d.zero_first = start == st;  // the hidden state before this step's first token is not at hand
    d.hidden_row = sp.offset[i] + (start - 1 - st);
    // Drafts follow the last known token only (not a prompt chunk that more prompt tokens follow).
    d.n_draft = fit(s, start, last - start + 1, static_cast<int64_t>(s.tokens.size()) == last + 1 ? n_draft_of(s) : 0);
    if (d.n_draft < 0) continue;  // no block for the slots: the sequence goes on without drafts
    const std::vector<int32_t>* table = alloc_.block_table(s.id);
    d.blocks = std::span<const int32_t>(table->data(), table->size());
    d.decode = it.decode;
    ditems_.push_back(d);
    dseqs.push_back(&s);
  }
  if (!run()) return;
  // Forked siblings: their shared and copied blocks now hold the prompt's slots; each drafts from the parent's
  // last prompt row with its own first token.
  ditems_.clear();
  dseqs.clear();
  for (DraftFork& f : forks_) {
    if (f.copy) engine_.copy_block(f.copy->src, f.copy->dst, f.copy->n_tokens);
    Seq& s = *f.sib;
    if (s.done || s.req->ended || !s.in_engine) continue;
    size_t pi = 0;
    while (pi < sp.ran.size() && sp.ran[pi]->s != f.parent) ++pi;
    if (pi == sp.ran.size()) continue;
    const int64_t P = s.n_prompt, st = sp.items[pi].start;
    if (P < 1 || static_cast<int64_t>(s.tokens.size()) <= P || P - 1 < st) continue;
    EngineDraftItem d;
    d.seq = s.id;
    d.start = P;
    d.tokens = std::span<const int32_t>(s.tokens.data() + P, 1);
    d.hidden_row = sp.offset[pi] + (P - 1 - st);
    d.n_draft = fit(s, P, 1, n_draft_of(s));
    if (d.n_draft < 0) continue;
    const std::vector<int32_t>* table = alloc_.block_table(s.id);
    d.blocks = std::span<const int32_t>(table->data(), table->size());
    d.decode = true;
    ditems_.push_back(d);
    dseqs.push_back(&s);
  }
  run();
  forks_.clear();
  (void)bt;
}

}  // namespace latent
