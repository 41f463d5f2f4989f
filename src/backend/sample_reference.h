// The host reference of Backend::sample_rows and of the host Sampler's draw (the rules are in backend/sampling.h):
// the default Backend::sample_rows of the host backends, the oracle of the CUDA kernel's tests.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/sampling.h"

namespace latent {

// Greedy argmax over the non-banned ids (ties to the lowest); 0 when every id is banned.
inline int32_t sample_argmax(const float* x, int64_t V, const std::vector<bool>* banned) {
  int32_t best = -1;
  float bv = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) {
    if (banned && (*banned)[static_cast<size_t>(i)]) continue;
    if (best < 0 || x[i] > bv) {
      best = static_cast<int32_t>(i);
      bv = x[i];
    }
  }
  return best < 0 ? 0 : best;
}

// A candidate of the host draw: its sort key, weight and id.
struct SampleCand {
  uint64_t key = 0, w = 0;
  int32_t id = 0;
};

// The draw on final scores x [V] (see the top of this file). scratch: reused between calls.
inline int32_t sample_pick(const float* x, int64_t V, const std::vector<bool>* banned, const SampleRowParams& p,
                           std::vector<SampleCand>& scratch) {
  if (p.temperature <= 0.0f) return sample_argmax(x, V, banned);
  const float ninf = -std::numeric_limits<float>::infinity();
  float xmax = ninf;
  for (int64_t i = 0; i < V; ++i) xmax = x[i] > xmax ? x[i] : xmax;
  if (!(xmax > ninf)) return sample_argmax(x, V, banned);  // no candidate
  scratch.clear();
  for (int64_t i = 0; i < V; ++i)
    if (x[i] > ninf) {
      const int32_t id = static_cast<int32_t>(i);
      scratch.push_back({sample_key(x[i], id), sample_weight(sample_fsub(x[i], xmax)), id});
    }
  size_t keep = scratch.size();
  const bool top_k = p.top_k > 0 && static_cast<size_t>(p.top_k) < keep;
  if (top_k || p.top_p < 1.0f || p.min_p > 0.0f) {  // truncation: the kept prefix of the sorted order
    auto desc = [](const SampleCand& a, const SampleCand& b) { return a.key > b.key; };
    if (top_k) {
      std::partial_sort(scratch.begin(), scratch.begin() + p.top_k, scratch.end(), desc);
      keep = static_cast<size_t>(p.top_k);
    } else {
      std::sort(scratch.begin(), scratch.end(), desc);
    }
    if (p.top_p < 1.0f) {
      uint64_t W = 0;
      for (size_t j = 0; j < keep; ++j) W += scratch[j].w;
      const uint64_t T = sample_top_p_target(p.top_p, W);
      uint64_t cum = 0;
      size_t c = 0;
      while (c < keep) {
        cum += scratch[c++].w;
        if (cum >= T) break;
      }
      keep = c;
    }
    if (p.min_p > 0.0f) {
      const uint64_t T = sample_min_p_threshold(p.min_p);
      size_t c = 0;
      while (c < keep && scratch[c].w >= T) ++c;
      keep = c < 1 ? 1 : c;
    }
    scratch.resize(keep);
    std::sort(scratch.begin(), scratch.end(), [](const SampleCand& a, const SampleCand& b) { return a.id < b.id; });
  }
  // The kept candidates in ascending id order.
  uint64_t W = 0;
  for (size_t j = 0; j < keep; ++j) W += scratch[j].w;
  const uint64_t r = sample_mulhi(sample_random(p.rng_key, p.rng_counter), W);
  uint64_t acc = 0;
  for (size_t j = 0; j < keep; ++j) {
    acc += scratch[j].w;
    if (acc > r) return scratch[j].id;
  }
  return scratch[keep - 1].id;  // (unreachable: r < W)
}

inline void sample_rows_reference(float* logits, int64_t rows, int64_t V, const SampleRowParams* params,
                                  const SampleEdit* edits, const uint32_t* allow, const uint32_t* banned_bits,
                                  int32_t* ids) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<bool> banned;
  if (banned_bits) {
    banned.resize(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) banned[static_cast<size_t>(i)] = (banned_bits[i >> 5] >> (i & 31)) & 1u;
  }
  std::vector<SampleCand> scratch;
  for (int64_t r = 0; r < rows; ++r) {
    const SampleRowParams& p = params[r];
    float* x = logits + r * V;
    const uint32_t* a = p.allow_offset >= 0 && allow ? allow + p.allow_offset : nullptr;
    for (int64_t i = 0; i < V; ++i)
      if ((banned_bits && banned[static_cast<size_t>(i)]) || (a && !((a[i >> 5] >> (i & 31)) & 1u))) x[i] = ninf;
    for (int32_t e = 0; e < p.n_edits; ++e) {
      const SampleEdit& ed = edits[p.edit_begin + e];
      if (ed.token >= 0 && ed.token < V) x[ed.token] = sample_apply_edit(x[ed.token], ed, p);
    }
    if (p.temperature > 0.0f && p.temperature != 1.0f)
      for (int64_t i = 0; i < V; ++i) x[i] = sample_fdiv(x[i], p.temperature);
    ids[r] = sample_pick(x, V, banned_bits ? &banned : nullptr, p, scratch);
  }
}

inline std::vector<uint32_t> sample_bitmask(const std::vector<bool>& v) {
  std::vector<uint32_t> w((v.size() + 31) / 32, 0u);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i]) w[i >> 5] |= 1u << (i & 31);
  return w;
}

}  // namespace latent
