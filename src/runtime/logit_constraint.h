// A per-sequence constraint on what may be sampled (structured output, tool-call syntax). The scheduler calls
// mask() on the logits of every step before the sampler (so the mask comes before logit_bias, penalties,
// temperature, top-k / top-p and the logprobs), then accept() with the token that was emitted, and ends the choice
// (finish reason stop) once finished() says nothing may follow. Implementations live outside the runtime
// (src/structured); the runtime only knows this interface. Called on the scheduler thread only.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

namespace latent {

class LogitConstraint {
 public:
  virtual ~LogitConstraint() = default;
  // logits [V]: ids that may not come next are set to -inf.
  virtual void mask(std::span<float> logits) = 0;
  // The token the sequence emitted (always one mask() allowed).
  virtual void accept(int32_t token) = 0;
  // No token may follow: the choice ends here.
  virtual bool finished() const = 0;
};

// Makes the constraint of one choice (index within the request).
using LogitConstraintFactory = std::function<std::unique_ptr<LogitConstraint>(int choice)>;

}  // namespace latent
