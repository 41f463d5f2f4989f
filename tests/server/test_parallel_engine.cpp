// The scheduler's Engine over a parallel model: ModelEngine(ParallelModel) — one block pool per rank, the same
// block ids on every rank — gives the one-rank engine's logits for a batched prefill, copy on write of a shared
// partial block (prefix cache) and decode steps reading the copied block.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/parallel_model.h"
#include "server/model_engine.h"

namespace latent::server {
namespace {

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST(ParallelEngine, StepsAndCopyOnWriteEqualOneRank) {
  ModelFiles f = open_model_files(std::string(LATENT_SOURCE_DIR) + "/tests/models/glm5-tiny");
  const ModelConfig& cfg = *f.cfg;
  auto be = make_backend("cpu", 1);
  Model one(cfg, *f.plan, *be);
  ParallelModel pm(cfg, *f.plan, "cpu", 2, {2, true, true});
  ModelEngine e1(one), ep(pm);
  const int64_t bt = 4, budget = 64 * kv_bytes_per_token(cfg, DType::F32) * 2;
  const int64_t n1 = e1.configure(budget, bt, 64, 4, 64), np = ep.configure(budget, bt, 64, 4, 64);
  EXPECT_EQ(np, n1 / 2);  // host memory: the ranks share the budget (each holds the whole cache)
  ASSERT_GE(np, 8);
  ASSERT_NE(ep.cache(), nullptr);
  const int64_t V = cfg.vocab_size;
  // Sequence A: 6 prompt tokens in blocks {0, 1} (block 1 half full). Sequence B shares A's first 6 tokens: block 0
  // by reference, block 1 copied to block 2 (copy on write), then both decode (into blocks 3 and 4).
  const std::vector<int32_t> prompt = {5, 9, 44, 3, 120, 7};
  const std::vector<int32_t> ba = {0, 1, 3}, bb = {0, 2, 4};
  auto run = [&](ModelEngine& e) {
    std::vector<float> out;
    std::vector<float> lg(static_cast<size_t>(2 * V));
    EngineStepItem a;
    a.seq = 1;
    a.tokens = prompt;
    a.start = 0;
    a.blocks = ba;
    a.want_logits = true;
    e.step(std::span<const EngineStepItem>(&a, 1), lg.data());
    out.insert(out.end(), lg.begin(), lg.begin() + V);
    e.copy_block(1, 2, 2);
    for (int t = 0; t < 3; ++t) {
      const int32_t ta = static_cast<int32_t>(10 + t), tb = static_cast<int32_t>(200 + t);
      EngineStepItem items[2];
      items[0].seq = 1;
      items[0].tokens = std::span<const int32_t>(&ta, 1);
      items[0].start = 6 + t;
      items[0].blocks = ba;
      items[1].seq = 2;
      items[1].tokens = std::span<const int32_t>(&tb, 1);
      items[1].start = 6 + t;
      items[1].blocks = bb;
      for (auto& it : items) {
        it.want_logits = true;
        it.decode = true;
      }
      e.step(items, lg.data());
      out.insert(out.end(), lg.begin(), lg.end());
    }
    return out;
  };
  const std::vector<float> ref = run(e1), got = run(ep);
  ASSERT_EQ(ref.size(), got.size());
  EXPECT_LE(rel_error(got, ref), 1e-5);
}

}  // namespace
}  // namespace latent::server
