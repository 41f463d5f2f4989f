// Plain autoregressive generation (no chat template): one prefill, then single-token decode steps through the
// latent cache. Greedy at temperature 0, else softmax sampling with a seeded generator.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"

namespace latent {

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  double temperature = 0.0;
  uint64_t seed = 0;
  std::vector<int64_t> stop_ids;  // generation ends after emitting one of these (empty: never)
};

// Returns the generated ids (without the prompt). on_token is called after each new token.
std::vector<int32_t> generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& opt,
                              const std::function<void(int32_t)>& on_token = {});
// The same over every rank of a parallel model (model/parallel_model.h).
class ParallelModel;
std::vector<int32_t> generate(ParallelModel& model, std::span<const int32_t> prompt, const GenerateOptions& opt,
                              const std::function<void(int32_t)>& on_token = {});

// Index of the largest value (first one on ties).
int32_t argmax(const float* x, int64_t n);

// Parses "1 2 3", "1,2,3" or "[1, 2, 3]" into ids. Throws latent::Error on anything else (names the bad item).
std::vector<int32_t> parse_token_ids(const std::string& text);

}  // namespace latent
