// Engine-internal consistency on synthetic tiny checkpoints (no HF fixtures needed): the two MLA forms agree,
// cached decode equals prefill, DSA with context <= index_topk equals dense attention, the sparse path changes
// exactly the rows that see more than index_topk keys, results do not depend on the thread count.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "model/generate.h"
#include "model_test_util.h"
#include "synthetic_model.h"

namespace latent::testing {
namespace {

std::vector<int32_t> random_ids(int n, int V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  return ids;
}

class Synthetic : public ::testing::TestWithParam<std::string> {
 protected:
  static std::string dir_for(const std::string& arch, bool bf16 = false) {
    SyntheticSpec s;
    s.arch = arch;
    s.bf16_weights = bf16;
    s.seed = 11;
    return write_synthetic_model(s);
  }
};

TEST_P(Synthetic, AbsorbedEqualsNaiveWholeModel) {
  for (bool bf16w : {false, true}) {
    const std::string dir = dir_for(GetParam(), bf16w);
    ModelOptions on, oa;
    on.attention = AttentionForm::Naive;
    oa.attention = AttentionForm::Absorbed;
    auto a = load_model(dir, on), b = load_model(dir, oa);
    const auto ids = random_ids(20, 96, 3);
    auto ln = a->model->logits(ids), la = b->model->logits(ids);
    const double scale = max_abs(ln.data(), ln.size());
    const double d = max_abs_diff(ln.data(), la.data(), ln.size());
    std::printf("[%s %s weights] absorbed vs naive: max|d| %.3e (max|logit| %.3f)\n", GetParam().c_str(),
                bf16w ? "bf16" : "f32", d, scale);
    EXPECT_LE(d, 1e-5 * scale);
    std::filesystem::remove_all(dir);
  }
}

TEST_P(Synthetic, DecodeEqualsPrefill) {
  const std::string dir = dir_for(GetParam());
  auto m = load_model(dir);
  const auto ids = random_ids(20, 96, 5);
  auto full = m->model->logits(ids);
  auto dec = prefill_then_decode(*m->model, ids, 12);
  const double scale = max_abs(full.data(), full.size());
  const double d = max_abs_diff(full.data(), dec.data(), full.size());
  std::printf("[%s] prefill 12 + 8 decode steps vs prefill: max|d| %.3e (max|logit| %.3f)\n", GetParam().c_str(), d,
              scale);
  EXPECT_LE(d, 1e-5 * scale);
  // Single-token steps from the very first token too.
  auto dec1 = prefill_then_decode(*m->model, ids, 1);
  EXPECT_LE(max_abs_diff(full.data(), dec1.data(), full.size()), 1e-5 * scale);
  std::filesystem::remove_all(dir);
}

TEST_P(Synthetic, ThreadCountDoesNotChangeResults) {
  const std::string dir = dir_for(GetParam());
  auto a = load_model(dir, {}, 1), b = load_model(dir, {}, 3);
  const auto ids = random_ids(13, 96, 8);
  auto la = a->model->logits(ids), lb = b->model->logits(ids);
  EXPECT_EQ(max_abs_diff(la.data(), lb.data(), la.size()), 0.0);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, Synthetic, ::testing::Values("glm", "v32", "v3"));

class SyntheticDsa : public ::testing::TestWithParam<std::string> {};

TEST_P(SyntheticDsa, ShortContextEqualsDense) {
  SyntheticSpec s;
  s.arch = GetParam();
  s.index_topk = 8;
  const std::string dir = write_synthetic_model(s);
  ModelOptions dense;
  dense.disable_indexer = true;
  auto a = load_model(dir), b = load_model(dir, dense);
  const auto ids = random_ids(8, 96, 21);  // T == index_topk
  auto la = a->model->logits(ids), lb = b->model->logits(ids);
  EXPECT_EQ(max_abs_diff(la.data(), lb.data(), la.size()), 0.0);
  std::filesystem::remove_all(dir);
}

TEST_P(SyntheticDsa, SparsePathChangesOnlyRowsBeyondTopk) {
  SyntheticSpec s;
  s.arch = GetParam();
  s.index_topk = 6;
  const std::string dir = write_synthetic_model(s);
  ModelOptions dense;
  dense.disable_indexer = true;
  auto a = load_model(dir), b = load_model(dir, dense);
  const auto ids = random_ids(20, 96, 22);
  auto la = a->model->logits(ids), lb = b->model->logits(ids);
  const size_t V = 96;
  // Rows 0..5 see <= 6 keys everywhere: identical to dense. Later rows: attention is restricted.
  EXPECT_EQ(max_abs_diff(la.data(), lb.data(), 6 * V), 0.0);
  for (size_t t = 6; t < 20; ++t) {
    const double d = max_abs_diff(la.data() + t * V, lb.data() + t * V, V);
    EXPECT_GT(d, 1e-6) << "row " << t << " unchanged by the DSA selection";
  }
  // Sparse rows through the cache: decode equals prefill.
  auto dec = prefill_then_decode(*a->model, ids, 10);
  const double scale = max_abs(la.data(), la.size());
  const double dd = max_abs_diff(la.data(), dec.data(), la.size());
  std::printf("[%s] sparse DSA (topk 6, T 20): decode vs prefill max|d| %.3e\n", GetParam().c_str(), dd);
  EXPECT_LE(dd, 1e-5 * scale);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, SyntheticDsa, ::testing::Values("glm", "v32"));

TEST(SyntheticModel, Bf16ActivationsCloseToFp32) {
  SyntheticSpec s;
  s.arch = "glm";
  s.bf16_weights = true;
  const std::string dir = write_synthetic_model(s);
  ModelOptions ob;
  ob.bf16_activations = true;
  auto a = load_model(dir), b = load_model(dir, ob);
  const auto ids = random_ids(20, 96, 9);
  auto la = a->model->logits(ids), lb = b->model->logits(ids);
  const double re = rel_error(lb.data(), la.data(), la.size());
  std::printf("[glm synthetic] bf16 activations vs fp32: logits rel err %.3e\n", re);
  EXPECT_GT(re, 0.0);
  EXPECT_LT(re, 0.1);
  std::filesystem::remove_all(dir);
}

TEST(SyntheticModel, DefaultRopeAndGreedy) {
  SyntheticSpec s;
  s.arch = "v3";
  s.yarn = false;
  const std::string dir = write_synthetic_model(s);
  auto m = load_model(dir);
  const auto ids = random_ids(6, 96, 4);
  GenerateOptions g;
  g.max_new_tokens = 5;
  auto out = generate(*m->model, ids, g);
  ASSERT_EQ(out.size(), 5u);
  // Greedy equals argmax of the teacher-forced prefill.
  std::vector<int32_t> all = ids;
  all.insert(all.end(), out.begin(), out.end() - 1);
  auto lg = m->model->logits(all);
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_EQ(out[i], argmax(lg.data() + (ids.size() - 1 + i) * 96, 96)) << "step " << i;
  std::filesystem::remove_all(dir);
}

TEST(SyntheticModel, BadTokenIdIsAnError) {
  SyntheticSpec s;
  s.arch = "v3";
  const std::string dir = write_synthetic_model(s);
  auto m = load_model(dir);
  std::vector<int32_t> ids = {1, 2, 96};
  KvCache cache(m->model->config());
  EXPECT_THROW(m->model->forward(ids, cache, nullptr), Error);
  EXPECT_EQ(cache.length(), 0);
  std::filesystem::remove_all(dir);
}

TEST(SyntheticModel, TokenListParsing) {
  EXPECT_EQ(parse_token_ids("1 2 3"), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_token_ids("[4, 5,6]"), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_TRUE(parse_token_ids("  ").empty());
  EXPECT_THROW(parse_token_ids("1 x 3"), Error);
  EXPECT_THROW(parse_token_ids("-1"), Error);
  EXPECT_THROW(parse_token_ids("99999999999"), Error);
}

}  // namespace
}  // namespace latent::testing
