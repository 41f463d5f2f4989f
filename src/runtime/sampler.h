// Token sampling (docs/api.md §sampling). Pipeline per step: logit_bias (added) -> repetition_penalty (HF style, over
// prompt + generated tokens) -> presence / frequency penalties (OpenAI definition, generated tokens only) ->
// temperature -> top_k -> top_p -> min_p -> sample. temperature == 0 -> greedy argmax (ties -> lowest id), the
// truncations are ignored. Logprobs are taken after bias, penalties and temperature (temperature 0 -> 1), before
// truncation (docs/api.md §logprobs). The draw itself (truncations and the seeded choice) is backend/sampling.h's,
// shared with Backend::sample_rows: a seeded request draws the same tokens whether its logits are sampled here or
// on a device.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/sample_reference.h"

namespace latent {

struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int64_t top_k = 0;  // <= 0: disabled
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<int64_t> seed;
  int top_logprobs = 0;  // number of alternatives to report (0..20)
  bool logprobs = false;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                        // of `token` (when logprobs requested)
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs alternatives, descending
};

class Sampler {
 public:
  // `stream` distinguishes the choices of one request (n > 1): the draws are derived from (seed, stream) and the
  // token index (a counter-based generator: draw i of a stream does not depend on how earlier ones were made).
  Sampler(SamplingParams p, uint64_t stream);
  // logits [V] are modified in place. `banned` (optional, size V): ids that must never be sampled (vocabulary
  // padding without a token string). prompt and generated feed the penalties.
  SampleResult sample(std::span<float> logits, std::span<const int32_t> prompt, std::span<const int32_t> generated,
                      const std::vector<bool>* banned = nullptr);
  const SamplingParams& params() const { return p_; }

  // Sampling on a backend (Backend::sample_rows): the row's parameters for the next draw and its edits (bias and
  // penalties over prompt / generated, one per distinct token, appended to `edits`; row.edit_begin is set to where
  // they start). False when the row needs the host (logprobs, top_logprobs, a logit_bias naming one id twice, a
  // vocabulary above kSampleMaxVocab): then nothing is appended.
  bool device_row(std::span<const int32_t> prompt, std::span<const int32_t> generated, int64_t vocab,
                  SampleRowParams& row, std::vector<SampleEdit>& edits) const;
  // The draw of the next token was made elsewhere (device_row's row was sampled on a backend).
  void advance() { ++counter_; }
  uint64_t counter() const { return counter_; }

 private:
  SamplingParams p_;
  uint64_t key_ = 0, counter_ = 0;
  std::vector<SampleCand> scratch_;
  SampleRowParams row_params() const;
};

// Log-probability of `token` under the raw distribution softmax(logits) (no bias, penalties or temperature: the
// model's own scores, as prompt logprobs are reported) and the top_n most likely ids (descending, ties by id).
// Banned ids (optional) have probability 0 and are never listed.
SampleResult token_logprob(std::span<const float> logits, int32_t token, int top_n,
                           const std::vector<bool>* banned = nullptr);

// Greedy argmax with ties to the lowest id, skipping banned ids.
int32_t argmax(std::span<const float> logits, const std::vector<bool>* banned = nullptr);

}  // namespace latent
