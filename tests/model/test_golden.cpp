// Golden tests against Hugging Face transformers 5.17 fixtures (tools/dump_reference.py):
// tests/golden/<model>/{tokens.json, logits.npy, hidden.npy, decode_logits.npy, greedy.json, meta.json,
// tokens_short.json + logits_short.npy}. Each test is skipped when its fixture is missing.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/npy.h"
#include "model/generate.h"
#include "model_test_util.h"

namespace latent::testing {
namespace {

namespace fs = std::filesystem;

const std::string kSource = LATENT_SOURCE_DIR;

struct Fixture {
  std::string name, model_dir, golden_dir;
  bool present() const {
    return fs::exists(model_dir + "/config.json") && fs::exists(golden_dir + "/tokens.json") &&
           fs::exists(golden_dir + "/logits.npy");
  }
};

Fixture fixture(const std::string& name) {
  return {name, kSource + "/tests/models/" + name, kSource + "/tests/golden/" + name};
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

std::vector<int32_t> read_tokens(const std::string& path) {
  auto j = read_json(path);
  const auto& arr = j.is_array() ? j : j.at("tokens");
  std::vector<int32_t> ids;
  for (const auto& v : arr) ids.push_back(v.get<int32_t>());
  return ids;
}

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    fx_ = fixture(GetParam());
    ASSERT_TRUE(fx_.present()) << "fixtures for " << fx_.name << " missing (tools/dump_reference.py makes them)";
    ids_ = read_tokens(fx_.golden_dir + "/tokens.json");
    ref_ = read_npy(fx_.golden_dir + "/logits.npy");
  }
  Fixture fx_;
  std::vector<int32_t> ids_;
  NpyArray ref_;
};

TEST_P(Golden, PrefillLogitsFp32) {
  auto m = load_model(fx_.model_dir);
  const int64_t V = m->model->config().vocab_size;
  ASSERT_EQ(ref_.shape, (std::vector<int64_t>{static_cast<int64_t>(ids_.size()), V}));
  auto lg = m->model->logits(ids_);
  const double scale = max_abs(ref_.f32.data(), ref_.f32.size());
  const double d = max_abs_diff(lg.data(), ref_.f32.data(), lg.size());
  std::printf("[%s] fp32 prefill logits vs HF: max|d| %.3e  (max|logit| %.3f, rel %.3e)\n", fx_.name.c_str(), d, scale,
              d / scale);
  EXPECT_LE(d, 1e-4 * scale);
}

// The same check through the optimized CPU backend (src/kernels/cpu), when it is built.
TEST_P(Golden, PrefillAndDecodeCpuBackend) {
  auto m = load_model(fx_.model_dir, {}, 2, "cpu");
  ASSERT_STREQ(m->backend->name(), "cpu");
  auto lg = m->model->logits(ids_);
  const double scale = max_abs(ref_.f32.data(), ref_.f32.size());
  const double d = max_abs_diff(lg.data(), ref_.f32.data(), lg.size());
  auto dec = prefill_then_decode(*m->model, ids_, 16);
  const double dd = max_abs_diff(dec.data(), ref_.f32.data(), dec.size());
  std::printf("[%s] %s backend: prefill vs HF max|d| %.3e, prefill 16 + decode vs HF %.3e\n", fx_.name.c_str(),
              m->backend->name(), d, dd);
  EXPECT_LE(d, 1e-4 * scale);
  EXPECT_LE(dd, 1e-4 * scale);
}

TEST_P(Golden, HiddenStatesPerLayer) {
  const std::string hp = fx_.golden_dir + "/hidden.npy";
  ASSERT_TRUE(fs::exists(hp)) << hp;
  NpyArray ref = read_npy(hp);
  auto m = load_model(fx_.model_dir);
  const auto& cfg = m->model->config();
  const int64_t L = cfg.num_hidden_layers, T = static_cast<int64_t>(ids_.size()), D = cfg.hidden_size;
  ASSERT_EQ(ref.shape, (std::vector<int64_t>{L + 1, T, D}));
  std::string last = "post_norm";
  if (fs::exists(fx_.golden_dir + "/meta.json"))
    last = read_json(fx_.golden_dir + "/meta.json").value("hidden_last", last);
  std::vector<float> hid;
  KvCache cache(cfg);
  m->model->forward(ids_, cache, nullptr, true, &hid);
  std::printf("[%s] fp32 hidden-state relative error per layer:", fx_.name.c_str());
  for (int64_t l = 0; l <= L; ++l) {
    if (l == L && last != "post_norm") {
      std::printf(" (last entry is %s: not compared)", last.c_str());
      break;
    }
    const size_t off = static_cast<size_t>(l * T * D), n = static_cast<size_t>(T * D);
    const double re = rel_error(hid.data() + off, ref.f32.data() + off, n);
    std::printf(" %.2e", re);
    EXPECT_LE(re, 1e-5) << "layer entry " << l;
  }
  std::printf("\n");
}

TEST_P(Golden, DecodeThroughCacheEqualsPrefill) {
  const std::string dp = fx_.golden_dir + "/decode_logits.npy";
  auto m = load_model(fx_.model_dir);
  const int64_t V = m->model->config().vocab_size, T = static_cast<int64_t>(ids_.size());
  const size_t k = 16;
  auto lg = prefill_then_decode(*m->model, ids_, k);  // absorbed MLA for the decode steps
  const double scale = max_abs(ref_.f32.data(), ref_.f32.size());
  const double d_all = max_abs_diff(lg.data(), ref_.f32.data(), lg.size());
  auto pre = m->model->logits(ids_);
  const double d_self = max_abs_diff(lg.data(), pre.data(), lg.size());
  std::printf("[%s] prefill 16 + %lld cached decode steps: vs HF prefill max|d| %.3e, vs own prefill %.3e\n",
              fx_.name.c_str(), static_cast<long long>(T - static_cast<int64_t>(k)), d_all, d_self);
  EXPECT_LE(d_all, 1e-4 * scale);
  EXPECT_LE(d_self, 1e-5 * scale);
  if (fs::exists(dp)) {
    NpyArray dec = read_npy(dp);
    ASSERT_EQ(dec.shape, (std::vector<int64_t>{T - static_cast<int64_t>(k), V}));
    const double d = max_abs_diff(lg.data() + k * V, dec.f32.data(), dec.f32.size());
    std::printf("[%s] cached decode rows vs HF decode_logits.npy: max|d| %.3e\n", fx_.name.c_str(), d);
    EXPECT_LE(d, 1e-4 * scale);
  }
}

TEST_P(Golden, AbsorbedEqualsNaive) {
  ModelOptions on, oa;
  on.attention = AttentionForm::Naive;
  oa.attention = AttentionForm::Absorbed;
  auto a = load_model(fx_.model_dir, on), b = load_model(fx_.model_dir, oa);
  auto la = a->model->logits(ids_), lb = b->model->logits(ids_);
  const double scale = max_abs(la.data(), la.size());
  const double d = max_abs_diff(la.data(), lb.data(), la.size());
  std::printf("[%s] absorbed vs naive MLA (whole model): max|d| %.3e\n", fx_.name.c_str(), d);
  EXPECT_LE(d, 1e-5 * scale);
}

// Models with a DSA indexer (glm_moe_dsa, deepseek_v32).
class GoldenDsa : public Golden {};

TEST_P(GoldenDsa, SparsePathIsExercised) {
  auto a = load_model(fx_.model_dir);
  const auto& cfg = a->model->config();
  ASSERT_TRUE(cfg.has_indexer());
  ASSERT_GT(static_cast<int64_t>(ids_.size()), cfg.index_topk);
  ModelOptions dense;
  dense.disable_indexer = true;
  auto b = load_model(fx_.model_dir, dense);
  auto la = a->model->logits(ids_), lb = b->model->logits(ids_);
  const size_t V = static_cast<size_t>(cfg.vocab_size), k = static_cast<size_t>(cfg.index_topk);
  const double d_dense = max_abs_diff(la.data(), lb.data(), k * V);
  const double d_sparse = max_abs_diff(la.data() + k * V, lb.data() + k * V, la.size() - k * V);
  const double d_hf = max_abs_diff(lb.data() + k * V, ref_.f32.data() + k * V, la.size() - k * V);
  std::printf("[%s] DSA vs dense attention: rows < index_topk max|d| %.3e, later rows %.3e (dense vs HF %.3e)\n",
              fx_.name.c_str(), d_dense, d_sparse, d_hf);
  EXPECT_EQ(d_dense, 0.0);
  EXPECT_GT(d_sparse, 1e-3);
}

TEST_P(Golden, GreedyGeneration) {
  const std::string gp = fx_.golden_dir + "/greedy.json";
  ASSERT_TRUE(fs::exists(gp)) << gp;
  auto j = read_json(gp);
  std::vector<int32_t> prompt = j.at("prompt").get<std::vector<int32_t>>();
  std::vector<int32_t> want = j.at("generated").get<std::vector<int32_t>>();
  auto m = load_model(fx_.model_dir);
  GenerateOptions g;
  g.max_new_tokens = static_cast<int64_t>(want.size());
  auto got = generate(*m->model, prompt, g);
  EXPECT_EQ(got, want);
}

// bf16-activation mode (docs/model.md §bf16). On these tiny random models bf16 rounding flips router / DSA top-k
// decisions (HF's own bf16 run agrees with its fp32 argmax on only 88-96 % of the rows, meta.json "bf16"), so the
// criterion is checked with the discrete decisions of our fp32 run forced into the bf16 run; the free-running
// bf16 figures (vs HF fp32 and vs HF bf16) are printed for information. The 99 % criterion is applied to rows whose
// fp32 top-1 is not a near tie (margin >= 1 % of max|logit|).
// top1_out: agreement over all rows; top1_clear_out: over the rows whose HF fp32 top1-top2 margin is at least
// 1 % of max|logit| (closer calls are within bf16 rounding of the logits themselves).
void bf16_report(const Fixture& fx, const std::vector<int32_t>& ids, const NpyArray& ref, bool forced, double* top1_out,
                 double* top1_clear_out) {
  ForwardDecisions dec;
  ModelOptions ob;
  ob.bf16_activations = true;
  if (forced) {
    ModelOptions of;
    of.record_decisions = &dec;
    auto f = load_model(fx.model_dir, of);
    KvCache c(f->model->config());
    f->model->forward(ids, c, nullptr);
    ob.force_decisions = &dec;
  }
  auto m = load_model(fx.model_dir, ob);
  const auto& cfg = m->model->config();
  const int64_t V = cfg.vocab_size, T = static_cast<int64_t>(ids.size()), L = cfg.num_hidden_layers;
  const int64_t D = cfg.hidden_size;
  std::vector<float> hid;
  std::vector<float> lg(static_cast<size_t>(T * V));
  KvCache cache(cfg);
  m->model->forward(ids, cache, lg.data(), true, &hid);
  int agree = 0, agree_hf_bf16 = 0, clear = 0, agree_clear = 0;
  const double min_margin = 0.01 * max_abs(ref.f32.data(), ref.f32.size());
  NpyArray hb;
  const bool have_hb = !forced && fs::exists(fx.golden_dir + "/logits_bf16.npy");
  if (have_hb) hb = read_npy(fx.golden_dir + "/logits_bf16.npy");
  for (int64_t t = 0; t < T; ++t) {
    const int32_t a = argmax(lg.data() + t * V, V);
    const int32_t r = argmax(ref.f32.data() + t * V, V);
    agree += a == r;
    double second = -1e30;
    for (int64_t v = 0; v < V; ++v)
      if (v != r) second = std::max(second, static_cast<double>(ref.f32[t * V + v]));
    if (ref.f32[t * V + r] - second >= min_margin) {
      ++clear;
      agree_clear += a == r;
    }
    if (a != r)
      std::printf("[%s]   row %lld: top-1 %d vs HF fp32 %d; HF fp32 logits %.4f vs %.4f, ours %.4f vs %.4f\n",
                  fx.name.c_str(), static_cast<long long>(t), a, r, ref.f32[t * V + r], ref.f32[t * V + a],
                  lg[t * V + r], lg[t * V + a]);
    if (have_hb) agree_hf_bf16 += a == argmax(hb.f32.data() + t * V, V);
  }
  *top1_out = static_cast<double>(agree) / static_cast<double>(T);
  *top1_clear_out = clear ? static_cast<double>(agree_clear) / clear : 1.0;
  std::printf("[%s] bf16 activations%s: top-1 agreement with HF fp32 %d/%lld", fx.name.c_str(),
              forced ? " (fp32 decisions forced)" : " (free-running)", agree, static_cast<long long>(T));
  if (have_hb) std::printf(", with HF bf16 %d/%lld", agree_hf_bf16, static_cast<long long>(T));
  std::printf("; rows with HF margin >= %.3f: %d/%d", min_margin, agree_clear, clear);
  std::printf("; logits rel err %.3e\n", rel_error(lg.data(), ref.f32.data(), lg.size()));
  if (fs::exists(fx.golden_dir + "/hidden.npy")) {
    NpyArray hr = read_npy(fx.golden_dir + "/hidden.npy");
    std::printf("[%s]   per-layer hidden rel err vs HF fp32:", fx.name.c_str());
    for (int64_t l = 0; l <= L; ++l) {
      const size_t off = static_cast<size_t>(l * T * D), n = static_cast<size_t>(T * D);
      std::printf(" %.2e", rel_error(hid.data() + off, hr.f32.data() + off, n));
    }
    std::printf("\n");
  }
}

TEST_P(Golden, Bf16ActivationsTop1) {
  double free_top1 = 0, free_clear = 0, forced_top1 = 0, forced_clear = 0;
  bf16_report(fx_, ids_, ref_, false, &free_top1, &free_clear);
  bf16_report(fx_, ids_, ref_, true, &forced_top1, &forced_clear);
  EXPECT_GE(forced_clear, 0.99);
  EXPECT_GE(forced_top1, 0.95);
  EXPECT_GE(free_top1, 0.8);
}

// Models with a short-prompt fixture (context <= index_topk).
class GoldenShort : public Golden {};

TEST_P(GoldenShort, ShortPromptIsDense) {
  const std::string tp = fx_.golden_dir + "/tokens_short.json", lp = fx_.golden_dir + "/logits_short.npy";
  ASSERT_TRUE(fs::exists(tp) && fs::exists(lp)) << tp;
  auto ids = read_tokens(tp);
  NpyArray ref = read_npy(lp);
  ModelOptions dense;
  dense.disable_indexer = true;
  auto a = load_model(fx_.model_dir), b = load_model(fx_.model_dir, dense);
  ASSERT_LE(static_cast<int64_t>(ids.size()), a->model->config().index_topk);
  auto la = a->model->logits(ids), lb = b->model->logits(ids);
  const double scale = max_abs(ref.f32.data(), ref.f32.size());
  const double d = max_abs_diff(la.data(), ref.f32.data(), la.size());
  std::printf("[%s] short prompt (%zu <= index_topk): vs HF max|d| %.3e, DSA vs indexer disabled %.3e\n",
              fx_.name.c_str(), ids.size(), d, max_abs_diff(la.data(), lb.data(), la.size()));
  EXPECT_LE(d, 1e-4 * scale);
  EXPECT_EQ(max_abs_diff(la.data(), lb.data(), la.size()), 0.0);
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Models, Golden,
                         ::testing::Values("glm5-tiny", "v32-tiny", "v3-tiny", "glm5-tiny-mxfp4", "v3-tiny-fp8",
                                           "glm5-tiny-b"),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Models, GoldenDsa,
                         ::testing::Values("glm5-tiny", "v32-tiny", "glm5-tiny-mxfp4", "glm5-tiny-b"), param_name);
INSTANTIATE_TEST_SUITE_P(Models, GoldenShort, ::testing::Values("glm5-tiny", "v32-tiny"), param_name);

}  // namespace
}  // namespace latent::testing
