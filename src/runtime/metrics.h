// Serving metrics (docs/api.md §metrics) and their Prometheus text exposition (format 0.0.4). Counters and histograms
// are updated from the scheduler thread and the HTTP threads; gauges are sampled at render time through a callback.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace latent {

class Counter {
 public:
  void inc(uint64_t v = 1) { v_.fetch_add(v, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// A counter family with one label (e.g. reason="overloaded").
class LabeledCounter {
 public:
  void inc(const std::string& label, uint64_t v = 1);
  uint64_t value(const std::string& label) const;
  std::map<std::string, uint64_t> snapshot() const;
  // Labels always rendered (with 0 when never incremented), so dashboards see every series.
  void declare(const std::string& label);

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> v_;
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf last
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (non-cumulative), +Inf last
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct MetricsGauges {
  int64_t requests_running = 0;  // requests with at least one sequence scheduled
  int64_t requests_waiting = 0;  // requests in the queue
  int64_t sequences_running = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int64_t prefix_cached_blocks = 0;  // full blocks registered in the prefix cache (in use or evictable)
  int64_t prefix_requests = 0;       // sequences that looked up the prefix cache
};

class Metrics {
 public:
  Metrics();

  Counter requests_total;  // accepted into the queue
  Counter prompt_tokens;
  Counter generation_tokens;
  Counter reasoning_tokens;
  Counter unknown_fields;
  Counter repetition_loops;  // sequences in which a repetition loop was detected (runtime/repetition.h)
  Counter preemptions;       // sequences whose cache was dropped to make room (recomputed later)
  Counter prefix_cache_queries, prefix_cache_hits;  // prompt tokens looked up / found in the prefix cache
  Counter spec_draft_tokens, spec_accepted_tokens;
  Counter spec_drafts;                                // verifies of at least one draft token (a sequence in a step)
  LabeledCounter spec_proposed_at, spec_accepted_at;  // position="1" .. "k": drafts proposed / accepted there
  // One verify: `proposed` draft tokens of a sequence, the first `accepted` of them accepted.
  void count_spec_verify(int64_t proposed, int64_t accepted);
  LabeledCounter request_success;    // finished_reason: once per request (the first choice's reason)
  LabeledCounter choice_success;     // finished_reason: once per choice (n > 1 requests count n)
  LabeledCounter requests_rejected;  // reason: overloaded, validation, auth, context_length, ...
  LabeledCounter requests_aborted;   // reason: client_disconnect, timeout, shutdown, error
  LabeledCounter http_requests;      // by status code
  Histogram ttft, itl, e2e, queue_time, prompt_len, generation_len;

  void set_gauge_source(std::function<MetricsGauges()> f);
  MetricsGauges gauges() const;

  // Prometheus text; every name is prefix + metric (prefix "latent:" by default), label model_name="...".
  std::string render(const std::string& prefix, const std::string& model_name) const;

 private:
  mutable std::mutex gauge_mu_;
  std::function<MetricsGauges()> gauge_source_;
};

}  // namespace latent
