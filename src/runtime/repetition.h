// Repetition-loop detector: finds a token cycle that repeats at the end of a stream (greedy decoding that fell
// into "No, the user asked … No, the user asked …"). Shared by `latent fidelity` and the runtime (/metrics
// counter, log warning, --stop-on-loop).
//
// A loop of period p is reported when the last `span` tokens satisfy t[i] == t[i-p] for every i in the span
// after its first p tokens, span >= min_repeats * p and span >= min_span. Incremental: O(max_period) per token.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace latent {

struct LoopInfo {
  int64_t period = 0;  // tokens per cycle
  int64_t span = 0;    // tokens at the end of the stream covered by the repetition (>= 2 cycles)
  int64_t start = 0;   // index of the first token of the span
  double repeats() const { return period ? static_cast<double>(span) / static_cast<double>(period) : 0.0; }
};

struct LoopDetectorOptions {
  int64_t max_period = 64;  // longest cycle looked for
  int64_t min_repeats = 3;  // cycles needed (span >= min_repeats * period)
  int64_t min_span = 12;    // and at least this many tokens (so "aaa" in normal text is not a loop)
};

class LoopDetector {
 public:
  explicit LoopDetector(LoopDetectorOptions o = {});
  // Appends one token; returns the loop that the stream now ends in, if any (the shortest qualifying period).
  std::optional<LoopInfo> push(int32_t token);
  std::optional<LoopInfo> current() const;  // state after the last push
  void reset();
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  LoopDetectorOptions o_;
  std::vector<int32_t> tokens_;
  std::vector<int64_t> run_;  // run_[p]: consecutive trailing positions with t[i] == t[i-p]
};

// Whole-stream check: the loop the stream ends in, if any.
std::optional<LoopInfo> detect_loop(std::span<const int32_t> tokens, LoopDetectorOptions o = {});
// Longest loop anywhere in the stream (the maximal periodic run over all periods), for reports.
std::optional<LoopInfo> find_longest_loop(std::span<const int32_t> tokens, LoopDetectorOptions o = {});

}  // namespace latent
