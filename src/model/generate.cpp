#include "model/generate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "model/parallel_model.h"

namespace latent {

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

namespace {
int32_t sample(const float* logits, int64_t n, double temperature, std::mt19937_64& rng) {
  if (temperature <= 0.0) return argmax(logits, n);
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  std::vector<double> p(static_cast<size_t>(n));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += p[i] = std::exp((logits[i] - mx) / temperature);
  double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (int64_t i = 0; i < n; ++i) {
    u -= p[i];
    if (u <= 0.0) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(n - 1);
}
}  // namespace

namespace {
KvCache make_cache(Model& m) { return KvCache(m.config(), 64, m.mtp_layers()); }  // pools the step validates
ParallelKvCache make_cache(ParallelModel& m) { return ParallelKvCache(m.config(), m.ranks()); }

template <class M>
std::vector<int32_t> generate_impl(M& model, std::span<const int32_t> prompt, const GenerateOptions& opt,
                                   const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) fail("generate: the prompt is empty");
  const int64_t V = model.config().vocab_size;
  auto cache = make_cache(model);
  std::vector<float> logits(static_cast<size_t>(V));
  std::mt19937_64 rng(opt.seed);
  std::vector<int32_t> out;
  model.forward(prompt, cache, logits.data(), /*all_rows=*/false);
  for (int64_t i = 0; i < opt.max_new_tokens; ++i) {
    const int32_t next = sample(logits.data(), V, opt.temperature, rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), next) != opt.stop_ids.end()) break;
    if (i + 1 == opt.max_new_tokens) break;
    const int32_t one[1] = {next};
    model.forward(one, cache, logits.data(), false);
  }
  return out;
}
}  // namespace

std::vector<int32_t> generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& opt,
                              const std::function<void(int32_t)>& on_token) {
  return generate_impl(model, prompt, opt, on_token);
}

std::vector<int32_t> generate(ParallelModel& model, std::span<const int32_t> prompt, const GenerateOptions& opt,
                              const std::function<void(int32_t)>& on_token) {
  return generate_impl(model, prompt, opt, on_token);
}

std::vector<int32_t> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  auto sep = [](char c) { return std::isspace(static_cast<unsigned char>(c)) || c == ',' || c == '[' || c == ']'; };
  while (i < text.size()) {
    if (sep(text[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && !sep(text[j])) ++j;
    const std::string item = text.substr(i, j - i);
    int64_t v = 0;
    bool ok = !item.empty() && item.size() <= 10;
    for (char c : item) ok = ok && std::isdigit(static_cast<unsigned char>(c));
    if (ok) {
      for (char c : item) v = v * 10 + (c - '0');
      ok = v <= std::numeric_limits<int32_t>::max();
    }
    if (!ok) fail("token list: '{}' is not a non-negative integer id", item);
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return ids;
}

}  // namespace latent
