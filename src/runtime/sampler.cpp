#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace latent {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

int32_t argmax(std::span<const float> logits, const std::vector<bool>* banned) {
  int32_t best = -1;
  float bv = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (banned && (*banned)[i]) continue;
    if (best < 0 || logits[i] > bv) {
      best = static_cast<int32_t>(i);
      bv = logits[i];
    }
  }
  return best < 0 ? 0 : best;
}

Sampler::Sampler(SamplingParams p, uint64_t stream) : p_(std::move(p)) {
  if (p_.seed) {
    key_ = sample_stream_key(static_cast<uint64_t>(*p_.seed), stream);
  } else {
    std::random_device rd;
    key_ = sample_stream_key((static_cast<uint64_t>(rd()) << 32) ^ rd(), stream);
  }
}

SampleRowParams Sampler::row_params() const {
  SampleRowParams r;
  r.temperature = p_.temperature;
  r.top_p = p_.top_p;
  r.min_p = p_.min_p;
  r.top_k = p_.top_k <= 0 ? 0 : static_cast<int32_t>(std::min<int64_t>(p_.top_k, std::numeric_limits<int32_t>::max()));
  r.repetition_penalty = p_.repetition_penalty;
  r.presence_penalty = p_.presence_penalty;
  r.frequency_penalty = p_.frequency_penalty;
  r.rng_key = key_;
  r.rng_counter = counter_;
  return r;
}

bool Sampler::device_row(std::span<const int32_t> prompt, std::span<const int32_t> generated, int64_t vocab,
                         SampleRowParams& row, std::vector<SampleEdit>& edits) const {
  if (p_.logprobs || p_.top_logprobs > 0 || vocab <= 0 || vocab > kSampleMaxVocab) return false;
  for (size_t i = 0; i < p_.logit_bias.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (p_.logit_bias[i].first == p_.logit_bias[j].first) return false;
  row = row_params();
  row.edit_begin = static_cast<int64_t>(edits.size());
  const size_t e0 = edits.size();
  // One edit per distinct token: (token, bias, generated count, seen) gathered by sorting.
  std::vector<SampleEdit> tmp;
  for (auto [id, b] : p_.logit_bias)
    if (id >= 0 && id < vocab) tmp.push_back({id, b, 0, kSampleEditBias});
  const bool rep = p_.repetition_penalty != 1.0f, pf = p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  if (rep)
    for (int32_t t : prompt)
      if (t >= 0 && t < vocab) tmp.push_back({t, 0.0f, 0, kSampleEditSeen});
  if (rep || pf)
    for (int32_t t : generated)
      if (t >= 0 && t < vocab) tmp.push_back({t, 0.0f, pf ? 1 : 0, rep ? kSampleEditSeen : 0u});
  std::sort(tmp.begin(), tmp.end(), [](const SampleEdit& a, const SampleEdit& b) { return a.token < b.token; });
  for (const SampleEdit& e : tmp) {
    if (edits.size() > e0 && edits.back().token == e.token) {
      SampleEdit& m = edits.back();
      if (e.flags & kSampleEditBias) m.bias = e.bias;
      m.flags |= e.flags;
      m.count += e.count;
    } else {
      edits.push_back(e);
    }
  }
  row.n_edits = static_cast<int32_t>(edits.size() - e0);
  return true;
}

SampleResult Sampler::sample(std::span<float> logits, std::span<const int32_t> prompt,
                             std::span<const int32_t> generated, const std::vector<bool>* banned) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (banned)
    for (int64_t i = 0; i < V; ++i)
      if ((*banned)[static_cast<size_t>(i)]) logits[static_cast<size_t>(i)] = kNegInf;
  for (auto [id, b] : p_.logit_bias)
    if (id >= 0 && id < V) logits[static_cast<size_t>(id)] += b;
  if (p_.repetition_penalty != 1.0f) {
    std::vector<bool> seen(static_cast<size_t>(V), false);
    auto mark = [&](std::span<const int32_t> ids) {
      for (int32_t t : ids)
        if (t >= 0 && t < V) seen[static_cast<size_t>(t)] = true;
    };
    mark(prompt);
    mark(generated);
    for (int64_t i = 0; i < V; ++i)
      if (seen[static_cast<size_t>(i)]) {
        float& l = logits[static_cast<size_t>(i)];
        l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
      }
  }
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : generated) ++counts[t];
    for (auto [t, c] : counts)
      if (t >= 0 && t < V)
        logits[static_cast<size_t>(t)] -= p_.frequency_penalty * static_cast<float>(c) + p_.presence_penalty;
  }
  const bool greedy = p_.temperature <= 0.0f;
  const float temp = greedy ? 1.0f : p_.temperature;
  if (temp != 1.0f)
    for (auto& l : logits) l /= temp;

  SampleResult res;
  res.token = sample_pick(logits.data(), V, banned, row_params(), scratch_);
  ++counter_;
  if (p_.logprobs || p_.top_logprobs > 0) {
    // log-softmax for logprobs (before truncation; sample_pick leaves the logits as they are). Only when asked
    // for: a vocabulary of exp() per token is a tenth of a small model's decode step.
    float mx = kNegInf;
    for (float l : logits) mx = std::max(mx, l);
    double sum = 0.0;
    for (float l : logits) sum += std::exp(static_cast<double>(l - mx));
    const float lse = mx + static_cast<float>(std::log(sum));
    res.logprob = logits[static_cast<size_t>(res.token)] - lse;
    if (p_.top_logprobs > 0) {
      std::vector<std::pair<float, int32_t>> all;
      all.reserve(static_cast<size_t>(V));
      for (int64_t i = 0; i < V; ++i) all.emplace_back(logits[static_cast<size_t>(i)], static_cast<int32_t>(i));
      const size_t n = std::min<size_t>(static_cast<size_t>(p_.top_logprobs), all.size());
      std::partial_sort(all.begin(), all.begin() + static_cast<int64_t>(n), all.end(),
                        [](const auto& a, const auto& b) {
                          return a.first > b.first || (a.first == b.first && a.second < b.second);
                        });
      // Ids masked out (a grammar constraint, banned padding) are not alternatives: fewer than n may be listed.
      for (size_t i = 0; i < n && all[i].first > kNegInf; ++i) res.top.emplace_back(all[i].second, all[i].first - lse);
    }
  }
  return res;
}

SampleResult token_logprob(std::span<const float> logits, int32_t token, int top_n, const std::vector<bool>* banned) {
  const size_t V = logits.size();
  auto allowed = [&](size_t i) { return !banned || !(*banned)[i]; };
  float mx = kNegInf;
  for (size_t i = 0; i < V; ++i)
    if (allowed(i)) mx = std::max(mx, logits[i]);
  double sum = 0.0;
  for (size_t i = 0; i < V; ++i)
    if (allowed(i)) sum += std::exp(static_cast<double>(logits[i] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  SampleResult r;
  r.token = token;
  r.logprob = token >= 0 && static_cast<size_t>(token) < V && allowed(static_cast<size_t>(token))
                  ? logits[static_cast<size_t>(token)] - lse
                  : kNegInf;
  if (top_n > 0) {
    std::vector<std::pair<float, int32_t>> all;
    all.reserve(V);
    for (size_t i = 0; i < V; ++i)
      if (allowed(i)) all.emplace_back(logits[i], static_cast<int32_t>(i));
    const size_t n = std::min<size_t>(static_cast<size_t>(top_n), all.size());
    std::partial_sort(all.begin(), all.begin() + static_cast<int64_t>(n), all.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (size_t i = 0; i < n; ++i) r.top.emplace_back(all[i].second, all[i].first - lse);
  }
  return r;
}

}  // namespace latent
