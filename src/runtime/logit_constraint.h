// A per-sequence constraint on what may be sampled (structured output, tool-call syntax). The scheduler calls
// mask() on the logits of every step before the sampler (so the mask comes before logit_bias, penalties,
// temperature, top-k / top-p and the logprobs), then accept() with the token that was emitted, and ends the choice
// (finish reason stop) once finished() says nothing may follow. Implementations live outside the runtime
// (src/structured); the runtime only knows this interface. Called on the scheduler thread only.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <vector>

namespace latent {

class LogitConstraint {
 public:
  virtual ~LogitConstraint() = default;
  // logits [V]: ids that may not come next are set to -inf.
  virtual void mask(std::span<float> logits) = 0;
  // The same rule as an allowed-id bitmask (bit t of words[t / 32] = id t may come next; words covers the
  // vocabulary, zero on entry). Returns false when nothing is masked now (words untouched). The default goes
  // through mask() on a scratch row; a constraint that holds a bitmask already overrides it.
  virtual bool allowed_bits(std::span<uint32_t> words, int64_t vocab);
  // The token the sequence emitted (always one mask() allowed).
  virtual void accept(int32_t token) = 0;
  // No token may follow: the choice ends here.
  virtual bool finished() const = 0;
};

inline bool LogitConstraint::allowed_bits(std::span<uint32_t> words, int64_t vocab) {
  thread_local std::vector<float> row;
  row.assign(static_cast<size_t>(vocab), 0.0f);
  mask(std::span<float>(row.data(), row.size()));
  for (int64_t t = 0; t < vocab; ++t)
    if (row[static_cast<size_t>(t)] != -std::numeric_limits<float>::infinity())
      words[static_cast<size_t>(t >> 5)] |= 1u << (t & 31);
  return true;
}

// Makes the constraint of one choice (index within the request).
using LogitConstraintFactory = std::function<std::unique_ptr<LogitConstraint>(int choice)>;

}  // namespace latent
