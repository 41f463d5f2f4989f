// Helpers shared by the model tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace latent::testing {

struct LoadedModel {
  ModelFiles files;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

inline std::unique_ptr<LoadedModel> load_model(const std::string& dir, ModelOptions opt = {}, int threads = 2,
                                               const std::string& backend = "ref") {
  auto lm = std::make_unique<LoadedModel>();
  lm->files = open_model_files(dir);
  lm->backend = make_backend(backend, threads);
  lm->model = std::make_unique<Model>(*lm->files.cfg, *lm->files.plan, *lm->backend, opt);
  return lm;
}

inline double max_abs(const float* a, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i])));
  return m;
}
inline double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}
// ||a - b|| / ||b|| (Frobenius).
inline double rel_error(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Prefill of the first k tokens then single-token decode of the rest; returns [T, V] logits.
inline std::vector<float> prefill_then_decode(Model& m, const std::vector<int32_t>& ids, size_t k) {
  const int64_t V = m.config().vocab_size;
  std::vector<float> out(ids.size() * static_cast<size_t>(V));
  KvCache cache(m.config());
  m.forward(std::span<const int32_t>(ids.data(), k), cache, out.data(), true);
  for (size_t t = k; t < ids.size(); ++t)
    m.forward(std::span<const int32_t>(ids.data() + t, 1), cache, out.data() + t * V, true);
  return out;
}

// The bytes of the rows at positions [0, len) of a sequence (block table `blocks`) in a KV pool, through the
// backend (device pools too).
inline std::vector<char> pool_rows(Backend& be, const KvPool& pool, std::span<const int32_t> blocks, int64_t len) {
  const size_t row = static_cast<size_t>(pool.width) * ::latent::Tensor::size_of(pool.dtype);
  std::vector<char> out(row * static_cast<size_t>(len));
  for (int64_t p = 0; p < len && pool.data; ++p) {
    const int64_t slot = static_cast<int64_t>(blocks[static_cast<size_t>(p / pool.block_tokens)]) * pool.block_tokens +
                         p % pool.block_tokens;
    be.download(out.data() + row * static_cast<size_t>(p), static_cast<const char*>(pool.data) + row * slot, row);
  }
  return out;
}

}  // namespace latent::testing
