#include "runtime/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace latent {

void LabeledCounter::inc(const std::string& label, uint64_t v) {
  std::lock_guard lk(mu_);
  v_[label] += v;
}

uint64_t LabeledCounter::value(const std::string& label) const {
  std::lock_guard lk(mu_);
  auto it = v_.find(label);
  return it == v_.end() ? 0 : it->second;
}

std::map<std::string, uint64_t> LabeledCounter::snapshot() const {
  std::lock_guard lk(mu_);
  return v_;
}

void LabeledCounter::declare(const std::string& label) {
  std::lock_guard lk(mu_);
  v_.try_emplace(label, 0);
}

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  std::sort(bounds_.begin(), bounds_.end());
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double v) {
  if (!std::isfinite(v)) return;
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  std::lock_guard lk(mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard lk(mu_);
  uint64_t acc = 0;
  for (uint64_t c : counts_) s.cumulative.push_back(acc += c);
  s.sum = sum_;
  s.count = count_;
  return s;
}

namespace {

std::vector<double> latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> token_buckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000};
}

std::string fmt_double(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.1f}", v);
  return fmt::format("{}", v);
}

std::string escape_label(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

}  // namespace

Metrics::Metrics()
    : ttft(latency_buckets()),
      itl(latency_buckets()),
      e2e(latency_buckets()),
      queue_time(latency_buckets()),
      prompt_len(token_buckets()),
      generation_len(token_buckets()) {
  for (const char* r : {"stop", "length", "tool_calls"}) {
    request_success.declare(r);
    choice_success.declare(r);
  }
  for (const char* r : {"overloaded", "validation", "auth", "context_length", "too_large"})
    requests_rejected.declare(r);
  for (const char* r : {"client_disconnect", "timeout", "shutdown"}) requests_aborted.declare(r);
}

void Metrics::count_spec_verify(int64_t proposed, int64_t accepted) {
  if (proposed <= 0) return;
  spec_drafts.inc();
  spec_draft_tokens.inc(static_cast<uint64_t>(proposed));
  spec_accepted_tokens.inc(static_cast<uint64_t>(std::max<int64_t>(accepted, 0)));
  for (int64_t j = 0; j < proposed; ++j) {
    spec_proposed_at.inc(std::to_string(j + 1));
    spec_accepted_at.inc(std::to_string(j + 1), j < accepted ? 1 : 0);
  }
}

void Metrics::set_gauge_source(std::function<MetricsGauges()> f) {
  std::lock_guard lk(gauge_mu_);
  gauge_source_ = std::move(f);
}

MetricsGauges Metrics::gauges() const {
  std::function<MetricsGauges()> f;
  {
    std::lock_guard lk(gauge_mu_);
    f = gauge_source_;
  }
  return f ? f() : MetricsGauges{};
}

std::string Metrics::render(const std::string& prefix, const std::string& model_name) const {
  std::string out;
  const std::string ml = fmt::format("model_name=\"{}\"", escape_label(model_name));
  auto head = [&](const std::string& name, const char* type, const char* help) {
    out += fmt::format("# HELP {}{} {}\n# TYPE {}{} {}\n", prefix, name, help, prefix, name, type);
  };
  auto gauge = [&](const std::string& name, const char* help, double v) {
    head(name, "gauge", help);
    out += fmt::format("{}{}{{{}}} {}\n", prefix, name, ml, fmt_double(v));
  };
  auto counter = [&](const std::string& name, const char* help, uint64_t v) {
    head(name, "counter", help);
    out += fmt::format("{}{}{{{}}} {}\n", prefix, name, ml, v);
  };
  auto labeled = [&](const std::string& name, const char* label, const char* help, const LabeledCounter& c) {
    head(name, "counter", help);
    for (const auto& [k, v] : c.snapshot())
      out += fmt::format("{}{}{{{},{}=\"{}\"}} {}\n", prefix, name, ml, label, escape_label(k), v);
  };
  auto histogram = [&](const std::string& name, const char* help, const Histogram& h) {
    head(name, "histogram", help);
    const auto s = h.snapshot();
    for (size_t i = 0; i < s.bounds.size(); ++i)
      out +=
          fmt::format("{}{}_bucket{{{},le=\"{}\"}} {}\n", prefix, name, ml, fmt_double(s.bounds[i]), s.cumulative[i]);
    out += fmt::format("{}{}_bucket{{{},le=\"+Inf\"}} {}\n", prefix, name, ml, s.cumulative.back());
    out += fmt::format("{}{}_sum{{{}}} {}\n", prefix, name, ml, fmt_double(s.sum));
    out += fmt::format("{}{}_count{{{}}} {}\n", prefix, name, ml, s.count);
  };

  const MetricsGauges g = gauges();
  gauge("num_requests_running", "Requests with sequences in the running batch.",
        static_cast<double>(g.requests_running));
  gauge("num_requests_waiting", "Requests waiting in the queue.", static_cast<double>(g.requests_waiting));
  gauge("num_sequences_running", "Sequences (choices) in the running batch.", static_cast<double>(g.sequences_running));
  gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).",
        g.kv_blocks_total > 0 ? static_cast<double>(g.kv_blocks_used) / static_cast<double>(g.kv_blocks_total) : 0.0);
  gauge("kv_cache_blocks_used", "KV cache blocks in use.", static_cast<double>(g.kv_blocks_used));
  gauge("kv_cache_blocks_total", "KV cache blocks in the budget.", static_cast<double>(g.kv_blocks_total));
  counter("requests_total", "Generation requests admitted to the queue.", requests_total.value());
  counter("prompt_tokens_total", "Prompt tokens processed.", prompt_tokens.value());
  counter("generation_tokens_total", "Tokens generated.", generation_tokens.value());
  counter("reasoning_tokens_total", "Tokens generated in the reasoning channel.", reasoning_tokens.value());
  counter("request_unknown_fields_total", "Unknown top-level request fields ignored.", unknown_fields.value());
  counter("repetition_loops_total",
          "Sequences in which a repetition loop was detected (they keep generating unless --stop-on-loop ends them).",
          repetition_loops.value());
  counter("preemptions_total", "Sequences preempted for KV cache space (recomputed).", preemptions.value());
  counter("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", prefix_cache_queries.value());
  counter("prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", prefix_cache_hits.value());
  gauge("prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / tokens looked up (0..1).",
        prefix_cache_queries.value() > 0
            ? static_cast<double>(prefix_cache_hits.value()) / static_cast<double>(prefix_cache_queries.value())
            : 0.0);
  gauge("prefix_cache_blocks", "KV blocks held by the prefix cache (in use or evictable).",
        static_cast<double>(g.prefix_cached_blocks));
  gauge("prefix_cache_lookups", "Sequences that looked up the prefix cache since start.",
        static_cast<double>(g.prefix_requests));
  counter("spec_decode_num_draft_tokens_total", "Speculative draft tokens.", spec_draft_tokens.value());
  counter("spec_decode_num_accepted_tokens_total", "Accepted speculative tokens.", spec_accepted_tokens.value());
  counter("spec_decode_num_drafts_total", "Verifies of speculative drafts (one per sequence and step with drafts).",
          spec_drafts.value());
  labeled("spec_decode_num_draft_tokens_per_pos_total", "position", "Draft tokens proposed at each draft position.",
          spec_proposed_at);
  labeled("spec_decode_num_accepted_tokens_per_pos_total", "position", "Draft tokens accepted at each draft position.",
          spec_accepted_at);
  {
    head("spec_decode_acceptance_rate", "gauge", "Accepted / proposed draft tokens, per draft position (0..1).");
    const auto prop = spec_proposed_at.snapshot(), acc = spec_accepted_at.snapshot();
    for (const auto& [pos, n] : prop) {
      const auto a = acc.find(pos);
      const double r = n > 0 && a != acc.end() ? static_cast<double>(a->second) / static_cast<double>(n) : 0.0;
      out += fmt::format("{}spec_decode_acceptance_rate{{{},position=\"{}\"}} {}\n", prefix, ml, escape_label(pos),
                         fmt_double(r));
    }
  }
  gauge("spec_decode_mean_acceptance_length",
        "Tokens emitted per verify: 1 + accepted drafts / verifies (0 before the first verify).",
        spec_drafts.value() > 0
            ? 1.0 + static_cast<double>(spec_accepted_tokens.value()) / static_cast<double>(spec_drafts.value())
            : 0.0);
  labeled("request_success_total", "finished_reason", "Finished requests by the finish reason of their first choice.",
          request_success);
  labeled("choice_success_total", "finished_reason", "Finished choices (sequences) by finish reason.", choice_success);
  labeled("requests_rejected_total", "reason", "Rejected requests by reason.", requests_rejected);
  labeled("requests_aborted_total", "reason", "Aborted requests by reason.", requests_aborted);
  labeled("http_requests_total", "status", "HTTP responses by status code.", http_requests);
  histogram("time_to_first_token_seconds", "Time from arrival to the first generated token.", ttft);
  histogram("inter_token_latency_seconds", "Time between consecutive tokens of a sequence.", itl);
  histogram("e2e_request_latency_seconds", "Time from arrival to the end of a request.", e2e);
  histogram("request_queue_time_seconds", "Time a request waited in the queue.", queue_time);
  histogram("request_prompt_tokens", "Prompt tokens per request.", prompt_len);
  histogram("request_generation_tokens", "Generated tokens per request.", generation_len);
  return out;
}

}  // namespace latent
