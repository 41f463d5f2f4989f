// Test helper shared by the host and device sampling tests: the exact distribution the sampling rules
// (backend/sampling.h) define for a small row — temperature, then top_k, top_p, min_p as prefixes of the order
// "value descending, ties to the lower id" — in double precision with an exact softmax.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "backend/sampling.h"

namespace latent {

inline std::vector<double> truncated_softmax(std::vector<float> x, const SampleRowParams& p) {
  const size_t V = x.size();
  for (auto& v : x) v /= p.temperature;
  std::vector<size_t> order(V);
  for (size_t i = 0; i < V; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  const double mx = x[order[0]];
  std::vector<double> e(V);
  for (size_t i = 0; i < V; ++i) e[i] = std::exp(static_cast<double>(x[i]) - mx);
  size_t keep = p.top_k > 0 ? std::min<size_t>(V, static_cast<size_t>(p.top_k)) : V;
  double z = 0;
  for (size_t j = 0; j < keep; ++j) z += e[order[j]];
  if (p.top_p < 1.0f) {
    double cum = 0;
    size_t c = 0;
    while (c < keep) {
      cum += e[order[c++]] / z;
      if (cum >= p.top_p) break;
    }
    keep = c;
  }
  if (p.min_p > 0.0f) {
    size_t c = 0;
    while (c < keep && e[order[c]] >= p.min_p) ++c;
    keep = std::max<size_t>(c, 1);
  }
  std::vector<double> q(V, 0.0);
  double t = 0;
  for (size_t j = 0; j < keep; ++j) t += e[order[j]];
  for (size_t j = 0; j < keep; ++j) q[order[j]] = e[order[j]] / t;
  return q;
}

}  // namespace latent
