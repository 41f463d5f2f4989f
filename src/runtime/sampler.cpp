#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace latent {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

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
  uint64_t seed = p_.seed ? splitmix64(static_cast<uint64_t>(*p_.seed)) ^ splitmix64(stream + 1)
                          : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  rng_.seed(seed);
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
  // log-softmax for logprobs (before truncation).
  float mx = kNegInf;
  for (float l : logits) mx = std::max(mx, l);
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - mx));
  const float lse = mx + static_cast<float>(std::log(sum));

  if (greedy) {
    res.token = argmax(logits, banned);
  } else {
    // Candidates sorted by logit (descending, ties by id).
    scratch_.clear();
    for (int64_t i = 0; i < V; ++i)
      if (logits[static_cast<size_t>(i)] > kNegInf) scratch_.emplace_back(logits[static_cast<size_t>(i)], static_cast<int32_t>(i));
    if (scratch_.empty()) {
      res.token = argmax(logits, banned);
    } else {
      auto cmp = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
      size_t keep = scratch_.size();
      if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < keep) {
        std::partial_sort(scratch_.begin(), scratch_.begin() + p_.top_k, scratch_.end(), cmp);
        keep = static_cast<size_t>(p_.top_k);
      } else {
        std::sort(scratch_.begin(), scratch_.end(), cmp);
      }
      scratch_.resize(keep);
      // Probabilities of the kept candidates.
      std::vector<double> prob(keep);
      double z = 0.0;
      for (size_t i = 0; i < keep; ++i) z += prob[i] = std::exp(static_cast<double>(scratch_[i].first - scratch_[0].first));
      for (auto& q : prob) q /= z;
      if (p_.top_p < 1.0f) {
        double cum = 0.0;
        size_t k = 0;
        for (; k < keep; ++k) {
          cum += prob[k];
          if (cum >= p_.top_p) {
            ++k;
            break;
          }
        }
        keep = std::max<size_t>(1, std::min(k, keep));
      }
      if (p_.min_p > 0.0f) {
        const double thr = p_.min_p * prob[0];
        size_t k = 1;
        while (k < keep && prob[k] >= thr) ++k;
        keep = k;
      }
      double tot = 0.0;
      for (size_t i = 0; i < keep; ++i) tot += prob[i];
      std::uniform_real_distribution<double> u(0.0, tot);
      double r = u(rng_), acc = 0.0;
      res.token = scratch_[keep - 1].second;
      for (size_t i = 0; i < keep; ++i) {
        acc += prob[i];
        if (r < acc) {
          res.token = scratch_[i].second;
          break;
        }
      }
    }
  }
  if (p_.logprobs || p_.top_logprobs > 0) {
    res.logprob = logits[static_cast<size_t>(res.token)] - lse;
    if (p_.top_logprobs > 0) {
      std::vector<std::pair<float, int32_t>> all;
      all.reserve(static_cast<size_t>(V));
      for (int64_t i = 0; i < V; ++i) all.emplace_back(logits[static_cast<size_t>(i)], static_cast<int32_t>(i));
      const size_t n = std::min<size_t>(static_cast<size_t>(p_.top_logprobs), all.size());
      std::partial_sort(all.begin(), all.begin() + static_cast<int64_t>(n), all.end(),
                        [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
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
    std::partial_sort(all.begin(), all.begin() + static_cast<int64_t>(n), all.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    for (size_t i = 0; i < n; ++i) r.top.emplace_back(all[i].second, all[i].first - lse);
  }
  return r;
}

}  // namespace latent
