#include "runtime/scheduler.h"

#include <algorithm>
#include <fmt/format.h>
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
  int j = 0;  // choice within the request
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

int Scheduler::Seq::choice() const { return req->g.choice_offset + j; }

Scheduler::Scheduler(Engine& engine, SchedulerOptions opt, Metrics* metrics)
    : engine_(engine), opt_(opt), metrics_(metrics), alloc_(opt.kv_total_blocks, opt.kv_block_tokens) {
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
    throw SchedulerRejected(K::TooLarge, fmt::format("the prompt has {} tokens; the context holds {}", P, opt_.max_context));
  if (req.n > opt_.max_num_seqs)
    throw SchedulerRejected(K::TooLarge, fmt::format("n = {} exceeds the running batch of {} sequences (--max-num-seqs)",
                                                     req.n, opt_.max_num_seqs));
  const int64_t need = alloc_.blocks_for(P + 1) * req.n;
  if (need > alloc_.total_blocks())
    throw SchedulerRejected(
        K::TooLarge,
        fmt::format("the request needs {} KV cache blocks ({} choice(s) x {} prompt tokens) but the KV cache holds only "
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
    st_waiting_.store(queued_);
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
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (true) {
    {
      std::lock_guard lk(mu_);
      if (queued_ == 0 && st_running_reqs_.load() == 0) return true;
    }
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void Scheduler::abort_all(AbortReason reason, const std::string& message) {
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
  for (auto& r : waiting_) abort_request(*r, reason, message);
  {
    std::lock_guard lk(mu_);
    queued_ -= static_cast<int64_t>(waiting_.size());
  }
  waiting_.clear();
  for (auto& r : running_)
    if (!r->ended) abort_request(*r, reason, message);
  retire_finished_requests(Clock::now());
  update_gauges();
  {
    std::lock_guard lk(mu_);
    stop_ = false;
  }
  if (was_running) start();
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
  s.waiting = st_waiting_.load();
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
  std::lock_guard lk(mu_);
  s.waiting = queued_;
  s.dead = dead_;
  s.draining = draining_;
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
  int64_t removed = 0;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->handle->cancelled()) {
      abort_request(**it, std::nullopt, "");
      it = waiting_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  if (removed) {
    std::lock_guard lk(mu_);
    queued_ -= removed;
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
        abort_request(*r, AbortReason::Timeout,
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
    if (!s->done) pending += alloc_.extra_blocks(s->id, static_cast<int64_t>(s->tokens.size()) + 1);
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
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].all_logits) return false;
    if (!items[i].want_logits) continue;
    Seq& s = *seqs[i];
    Req& r = *s.req;
    SampleRowParams row;
    if (s.done || r.ended) {  // nothing will use this row: the cheapest draw
      row.temperature = 0.0f;
      smp_rows_.push_back(row);
      continue;
    }
    // The end of choice 0's prompt may report prompt logprobs, end a max_tokens 0 request or fork siblings
    // from the logits row: those take the host path.
    if (s.generated == 0 && s.j == 0 && (r.wants_prompt_lp() || r.g.max_tokens == 0 || r.g.n > 1)) return false;
    const std::span<const int32_t> prompt(s.tokens.data(), static_cast<size_t>(s.n_prompt));
    const std::span<const int32_t> gen(s.tokens.data() + s.n_prompt, static_cast<size_t>(s.generated));
    if (!s.sampler.device_row(prompt, gen, V, row, smp_edits_)) return false;
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
      if (!r.g.ignore_eos && !r.loop_warned) {
        r.loop_warned = true;
        log::warn("sequence {} fell into a repetition loop (period {}, {} tokens)", s.id, li->period, li->span);
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
    if (*forked) engine_.copy_block((*forked)->src, (*forked)->dst, (*forked)->n_tokens);
    sib->in_engine = true;
    sib->n_computed = s.n_prompt;
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
  int64_t q;
  {
    std::lock_guard lk(mu_);
    q = queued_;
  }
  st_waiting_.store(q);
  st_running_reqs_.store(static_cast<int64_t>(running_.size()));
  st_running_seqs_.store(static_cast<int64_t>(active_.size()));
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

  // Plan: every decoding sequence advances one token, then prefill chunks fill the remaining budget.
  struct Plan {
    Seq* s;
    int64_t len;
    int64_t start;  // n_computed when planned; a preempted sequence no longer matches
    bool valid = true;
  };
  // A sequence that starts (or restarts after preemption) from nothing takes the cached blocks of its prefix; at
  // least its last token is computed, for the logits.
  if (alloc_.prefix_cache_enabled())
    for (Seq* s : active_) {
      if (s->done || s->await_fork || s->n_computed != 0 || alloc_.blocks_of(s->id) != 0) continue;
      if (s->j == 0 && s->req->wants_prompt_lp()) continue;  // every prompt row's logits are needed
      const int64_t n = static_cast<int64_t>(s->tokens.size());
      const uint64_t q0 = alloc_.prefix_query_tokens(), h0 = alloc_.prefix_hit_tokens();
      s->n_computed = alloc_.attach_prefix(s->id, s->tokens, n - 1);
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
  std::vector<Plan> plan;
  int64_t decodes = 0;
  for (Seq* s : active_) {
    if (s->done || s->await_fork) continue;
    if (static_cast<int64_t>(s->tokens.size()) - s->n_computed == 1) {
      plan.push_back({s, 1, s->n_computed});
      ++decodes;
    }
  }
  int64_t budget = std::max<int64_t>(opt_.max_batch_tokens - decodes, 0);
  for (Seq* s : active_) {
    if (s->done || s->await_fork) continue;
    const int64_t len_total = static_cast<int64_t>(s->tokens.size());
    if (len_total - s->n_computed <= 1) continue;
    const int64_t C = opt_.prefill_chunk;
    const int64_t end = std::min(len_total, (s->n_computed / C + 1) * C);
    const int64_t len = end - s->n_computed;
    if (len > budget && !plan.empty()) break;
    plan.push_back({s, len, s->n_computed});
    budget -= std::min(budget, len);
  }
  if (plan.empty()) {
    update_gauges();
    return false;
  }
  // Reserve blocks oldest first; newer sequences are preempted when the budget runs out.
  std::vector<Plan*> by_age;
  for (auto& p : plan) by_age.push_back(&p);
  std::sort(by_age.begin(), by_age.end(), [](Plan* a, Plan* b) { return a->s->order < b->s->order; });
  for (Plan* p : by_age) {
    Seq& s = *p->s;
    if (s.done || s.n_computed != p->start) {
      p->valid = false;  // preempted by an older sequence in this loop
      continue;
    }
    if (!reserve_or_preempt(s, s.n_computed + p->len)) {
      p->valid = false;
      continue;
    }
    s.in_engine = true;
  }
  std::vector<EngineStepItem> items;
  std::vector<Plan*> ran;
  int64_t want = 0;
  for (auto& p : plan) {
    if (!p.valid || p.s->done || !p.s->in_engine || p.s->n_computed != p.start) continue;
    Seq& s = *p.s;
    const int64_t total = static_cast<int64_t>(s.tokens.size());
    if (alloc_.blocks_of(s.id) < alloc_.blocks_for(s.n_computed + p.len)) continue;
    EngineStepItem it;
    it.seq = s.id;
    it.tokens = std::span<const int32_t>(s.tokens.data() + s.n_computed, static_cast<size_t>(p.len));
    it.start = s.n_computed;
    const std::vector<int32_t>* table = alloc_.block_table(s.id);
    it.blocks = std::span<const int32_t>(table->data(), table->size());
    it.want_logits = s.n_computed + p.len == total;
    it.decode = s.n_computed >= s.n_prompt;
    it.all_logits = !it.decode && s.j == 0 && s.req->wants_prompt_lp();
    want += it.all_logits ? p.len : it.want_logits ? 1 : 0;
    items.push_back(it);
    ran.push_back(&p);
  }
  if (items.empty()) {
    update_gauges();
    return false;
  }
  const int64_t V = engine_.vocab_size();
  std::vector<Seq*> item_seqs;
  item_seqs.reserve(ran.size());
  for (Plan* p : ran) item_seqs.push_back(p->s);
  const bool on_device = opt_.device_sampling && want > 0 && engine_.samples_on_device() &&
                         plan_device_sampling(items, item_seqs);
  if (!on_device) logits_.resize(static_cast<size_t>(std::max<int64_t>(want, 1) * V));
  try {
    if (on_device) {
      SampleBatch sb;
      sb.rows = smp_rows_.data();
      sb.n_rows = static_cast<int64_t>(smp_rows_.size());
      sb.edits = smp_edits_.data();
      sb.n_edits = static_cast<int64_t>(smp_edits_.size());
      sb.allow = smp_allow_.data();
      sb.n_allow = static_cast<int64_t>(smp_allow_.size());
      sb.banned = opt_.banned;
      smp_ids_.assign(smp_rows_.size(), 0);
      engine_.step_sampled(items, sb, smp_ids_.data());
    } else {
      engine_.step(items, logits_.data());
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
    for (Plan* p : ran) abort_request(*p->s->req, AbortReason::EngineError, "internal error in the engine");
    if (lost) {
      log::error("the engine is lost (its device context is unusable): no request can be served any more");
      if (opt_.on_engine_lost && !lost_reported_) opt_.on_engine_lost(e.what());
      lost_reported_ = true;
    }
    retire_finished_requests(Clock::now());
    update_gauges();
    return true;
  }
  st_steps_.fetch_add(1);
  st_max_batch_.store(std::max<int64_t>(st_max_batch_.load(), static_cast<int64_t>(items.size())));
  now = Clock::now();
  int64_t row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Seq& s = *ran[i]->s;
    s.n_computed += ran[i]->len;
    alloc_.commit(s.id, s.tokens, s.n_computed);
    if (items[i].all_logits) {
      // Row k predicts the token at position start + k + 1; the prompt's positions 1 .. P-1 are recorded.
      Req& r = *s.req;
      const int64_t n = static_cast<int64_t>(items[i].tokens.size());
      r.prompt_lp.resize(static_cast<size_t>(s.n_prompt - 1));
      for (int64_t k = 0; k < n; ++k) {
        const int64_t pos = items[i].start + k + 1;
        if (pos >= s.n_prompt) break;
        r.prompt_lp[static_cast<size_t>(pos - 1)] =
            token_logprob(std::span<const float>(logits_.data() + (row + k) * V, static_cast<size_t>(V)),
                          s.tokens[static_cast<size_t>(pos)], r.g.prompt_logprobs, opt_.banned);
      }
      row += n - 1;  // the last row is the want_logits row
    }
    if (!items[i].want_logits) {
      if (items[i].all_logits) ++row;
      continue;
    }
    if (on_device) {  // (plan_device_sampling: no prompt logprobs, forks or max_tokens 0 here)
      const int32_t id = smp_ids_[static_cast<size_t>(row)];
      ++row;
      if (s.done || s.req->ended) continue;
      s.sampler.advance();
      SampleResult res;
      res.token = id;
      emit(s, res, now);
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
  }
  retire_finished_requests(now);
  update_gauges();
  return true;
}

}  // namespace latent
