#include "runtime/repetition.h"

namespace latent {

LoopDetector::LoopDetector(LoopDetectorOptions o) : o_(o), run_(static_cast<size_t>(o.max_period) + 1, 0) {}

void LoopDetector::reset() {
  tokens_.clear();
  std::fill(run_.begin(), run_.end(), 0);
}

std::optional<LoopInfo> LoopDetector::push(int32_t token) {
  tokens_.push_back(token);
  const int64_t n = static_cast<int64_t>(tokens_.size());
  for (int64_t p = 1; p <= o_.max_period; ++p) {
    if (n - 1 - p < 0) {
      run_[static_cast<size_t>(p)] = 0;
      continue;
    }
    run_[static_cast<size_t>(p)] = tokens_[static_cast<size_t>(n - 1)] == tokens_[static_cast<size_t>(n - 1 - p)]
                                       ? run_[static_cast<size_t>(p)] + 1
                                       : 0;
  }
  return current();
}

std::optional<LoopInfo> LoopDetector::current() const {
  const int64_t n = static_cast<int64_t>(tokens_.size());
  for (int64_t p = 1; p <= o_.max_period; ++p) {
    const int64_t span = run_[static_cast<size_t>(p)] + p;
    if (run_[static_cast<size_t>(p)] > 0 && span >= o_.min_repeats * p && span >= o_.min_span && span <= n)
      return LoopInfo{p, span, n - span};
  }
  return std::nullopt;
}

std::optional<LoopInfo> detect_loop(std::span<const int32_t> tokens, LoopDetectorOptions o) {
  LoopDetector d(o);
  std::optional<LoopInfo> last;
  for (int32_t t : tokens) last = d.push(t);
  return last;
}

std::optional<LoopInfo> find_longest_loop(std::span<const int32_t> tokens, LoopDetectorOptions o) {
  std::optional<LoopInfo> best;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t p = 1; p <= o.max_period && p < n; ++p) {
    int64_t run = 0;
    for (int64_t i = p; i <= n; ++i) {
      const bool same = i < n && tokens[static_cast<size_t>(i)] == tokens[static_cast<size_t>(i - p)];
      if (same) {
        ++run;
        continue;
      }
      const int64_t span = run + p;
      if (run > 0 && span >= o.min_repeats * p && span >= o.min_span && (!best || span > best->span))
        best = LoopInfo{p, span, i - span};
      run = 0;
    }
  }
  return best;
}

}  // namespace latent
