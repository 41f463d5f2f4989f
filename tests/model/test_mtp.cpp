// Multi-token prediction (model/mtp.cpp) against the fp64 numpy reference (tools/mtp_reference.py, fixtures in
// tests/golden/*-mtp), and the verify step speculative decoding relies on: k + 1 decode tokens of one sequence in
// one step give, bit for bit, the logits of k + 1 single-token decode steps (CPU backends, fp32 and bf16).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include <unistd.h>

#include "core/error.h"
#include "core/npy.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace latent::testing {
namespace {

std::string src(const std::string& rel) { return std::string(LATENT_SOURCE_DIR) + "/" + rel; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

std::unique_ptr<LoadedModel> load_mtp(const std::string& name, const std::string& backend, bool bf16 = false) {
  auto lm = std::make_unique<LoadedModel>();
  PlanOptions po;
  po.mtp_layers = 1;
  lm->files = open_model_files(src("tests/models/" + name), po);
  lm->backend = make_backend(backend, 2);
  ModelOptions mo;
  mo.mtp_layers = 1;
  mo.bf16_activations = bf16;
  lm->model = std::make_unique<Model>(*lm->files.cfg, *lm->files.plan, *lm->backend, mo);
  return lm;
}

int32_t argmax_row(const float* r, int64_t V) { return static_cast<int32_t>(std::max_element(r, r + V) - r); }

struct MtpCase {
  std::string model, backend;
};
std::string mtp_case_name(const ::testing::TestParamInfo<MtpCase>& i) {
  std::string m = i.param.model + "_" + i.param.backend;
  for (char& c : m)
    if (c == '-') c = '_';
  return m;
}

class MtpReference : public ::testing::TestWithParam<MtpCase> {};

// The main model prefills the fixture's prompt (its hidden rows are kept), its greedy next token is the fixture's
// token T; the MTP slots 0..q (q = 0..T) give the reference's logits of slot q, and 3 recursive drafts after slot T
// give the reference's drafts and their logits.
TEST_P(MtpReference, SlotsAndDraftsMatchTheNumpyReference) {
  const MtpCase& c = GetParam();
  const std::string gold = src("tests/golden/" + c.model);
  const nlohmann::json fx = read_json(gold + "/mtp_draft.json");
  const std::vector<int32_t> toks = fx["tokens"].get<std::vector<int32_t>>();
  const std::vector<int32_t> want_drafts = fx["drafts"].get<std::vector<int32_t>>();
  const NpyArray ref = read_npy(gold + "/mtp_logits.npy");
  const NpyArray ref_d = read_npy(gold + "/mtp_draft_logits.npy");
  auto lm = load_mtp(c.model, c.backend);
  Model& m = *lm->model;
  const ModelConfig& cfg = m.config();
  const int64_t V = cfg.vocab_size, T = static_cast<int64_t>(toks.size()) - 1, bt = 8;
  ASSERT_EQ(ref.shape, (std::vector<int64_t>{T + 1, V}));
  ASSERT_EQ(m.mtp_layers(), 1);
  PagedKvCache cache(cfg, m.backend(), 8, bt, m.cache_dtype(), 1);
  std::vector<int32_t> blocks(8);
  std::iota(blocks.begin(), blocks.end(), 0);
  const double tol = 2e-4 * std::max(1.0, max_abs(ref.f32.data(), ref.f32.size()));
  for (int64_t q = 0; q <= T; ++q) {
    // The main step over the prompt (its rows stay for the draft step), then slots 0..q with one draft.
    std::vector<float> logits(static_cast<size_t>(T * V));
    StepSequence s;
    s.start = 0;
    s.n_tokens = T;
    s.blocks = blocks;
    s.logits = LogitRows::All;
    m.step(Step{std::span<const int32_t>(toks.data(), static_cast<size_t>(T)), std::span<const StepSequence>(&s, 1)},
           cache, logits.data());
    ASSERT_EQ(argmax_row(logits.data() + (T - 1) * V, V), toks[static_cast<size_t>(T)]);
    MtpSequence ms;
    ms.start = 0;
    ms.n_slots = q + 1;
    ms.tokens = std::span<const int32_t>(toks.data(), static_cast<size_t>(q + 1));
    ms.hidden_row = -1;
    ms.zero_first = true;
    ms.blocks = blocks;
    ms.n_draft = 1;
    ms.decode = q % 2 == 0;  // both attention forms
    int32_t d = -1;
    std::vector<float> dl(static_cast<size_t>(V));
    m.mtp_draft(std::span<const MtpSequence>(&ms, 1), cache, &d, nullptr, dl.data());
    EXPECT_LE(max_abs_diff(dl.data(), ref.f32.data() + q * V, static_cast<size_t>(V)), tol) << "slot " << q;
    EXPECT_EQ(d, argmax_row(dl.data(), V));
  }
  // Three drafts after slot T (slots T+1, T+2 from the layer's own output).
  MtpSequence ms;
  ms.start = 0;
  ms.n_slots = T + 1;
  ms.tokens = toks;
  ms.hidden_row = -1;
  ms.zero_first = true;
  ms.blocks = blocks;
  ms.n_draft = 3;
  std::vector<int32_t> d(3, -1);
  std::vector<float> dl(static_cast<size_t>(3 * V));
  m.mtp_draft(std::span<const MtpSequence>(&ms, 1), cache, d.data(), nullptr, dl.data());
  EXPECT_EQ(d, want_drafts);
  EXPECT_LE(max_abs_diff(dl.data(), ref_d.f32.data(), dl.size()), tol);
}

std::vector<MtpCase> mtp_cases() {
  std::vector<MtpCase> v;
  for (const char* mdl : {"glm5-tiny-mtp", "v3-tiny-mtp", "glm5-tiny-mxfp4-mtp"})
    for (const char* be : {"ref", "cpu"}) v.push_back({mdl, be});
  return v;
}
INSTANTIATE_TEST_SUITE_P(Models, MtpReference, ::testing::ValuesIn(mtp_cases()), mtp_case_name);

// A draft step equals the same slots written in pieces: slots 0..P from a prefill's rows in one pass, versus the
// slots of two chunks (the second chunk's first slot pairs with the first chunk's last row).
TEST(Mtp, ChunkedSlotsEqualOnePass) {
  auto lm = load_mtp("glm5-tiny-mtp", "cpu");
  Model& m = *lm->model;
  const ModelConfig& cfg = m.config();
  const int64_t V = cfg.vocab_size, bt = 4;
  std::mt19937 rng(7);
  std::vector<int32_t> toks(21);
  for (auto& t : toks) t = static_cast<int32_t>(rng() % V);
  std::vector<int32_t> blocks(8);
  std::iota(blocks.begin(), blocks.end(), 0);
  auto run = [&](bool chunked) {
    PagedKvCache cache(cfg, m.backend(), 8, bt, m.cache_dtype(), 1);
    std::vector<int32_t> d(2);
    std::vector<float> dl(static_cast<size_t>(2 * V));
    const int64_t P = 20, cut = chunked ? 9 : P;
    for (int64_t s0 = 0, s1 = cut; s0 < P; s0 = s1, s1 = P) {
      StepSequence s;
      s.start = s0;
      s.n_tokens = s1 - s0;
      s.blocks = blocks;
      s.logits = LogitRows::None;
      m.step(Step{std::span<const int32_t>(toks.data() + s0, static_cast<size_t>(s1 - s0)),
                  std::span<const StepSequence>(&s, 1)},
             cache, nullptr);
      MtpSequence ms;  // slots s0 + 1 .. s1 (slot 0 too on the first chunk): token at the slot, hidden of slot - 1
      ms.start = s0 == 0 ? 0 : s0 + 1;
      ms.n_slots = s0 == 0 ? s1 + 1 : s1 - s0;
      ms.tokens = std::span<const int32_t>(toks.data() + ms.start, static_cast<size_t>(ms.n_slots));
      ms.hidden_row = s0 == 0 ? -1 : 0;
      ms.zero_first = s0 == 0;
      ms.blocks = blocks;
      ms.n_draft = s1 == P ? 2 : 0;
      ms.decode = false;
      m.mtp_draft(std::span<const MtpSequence>(&ms, 1), cache, d.data(), nullptr, dl.data());
    }
    return std::make_pair(d, dl);
  };
  const auto [d1, l1] = run(false);
  const auto [d2, l2] = run(true);
  EXPECT_EQ(d1, d2);
  EXPECT_LE(max_abs_diff(l1.data(), l2.data(), l1.size()), 1e-5);
}

TEST(Mtp, CheckpointWithoutMtpLayerIsAClearError) {
  PlanOptions po;
  po.mtp_layers = 1;
  ModelFiles f = open_model_files(src("tests/models/glm5-tiny"), po);
  auto be = make_backend("ref", 1);
  ModelOptions mo;
  mo.mtp_layers = 1;
  try {
    Model m(*f.cfg, *f.plan, *be, mo);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no MTP layer (config.json num_nextn_predict_layers 0"), std::string::npos)
        << e.what();
  }
  // A plan without the MTP layer's tensors (speculation off) cannot feed an MTP model either.
  ModelFiles g = open_model_files(src("tests/models/glm5-tiny-mtp"));
  try {
    Model m(*g.cfg, *g.plan, *be, mo);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not loaded"), std::string::npos) << e.what();
  }
}

// A shared_head.head stored as a byte-identical copy of lm_head (the demo's, like DeepSeek-V3's and GLM-5's) is
// served by lm_head itself (one copy in memory and caches); a head with other bytes (v3-tiny-mtp's) stays its own.
TEST(Mtp, HeadStoredAsACopyOfLmHeadIsShared) {
  PlanOptions po;
  po.mtp_layers = 1;
  {
    ModelFiles f = open_model_files(src("models/latent-demo"), po);
    ASSERT_TRUE(f.plan->has("model.layers.4.shared_head.head.weight"));
    const ModelWeights w = resolve_weights(*f.cfg, *f.plan, 1);
    ASSERT_EQ(w.mtp.size(), 1u);
    EXPECT_FALSE(w.mtp[0].own_head);
    EXPECT_EQ(w.mtp[0].head.data, w.lm_head.data);
  }
  {
    ModelFiles f = open_model_files(src("tests/models/v3-tiny-mtp"), po);
    const int64_t L = f.cfg->num_hidden_layers;
    ASSERT_TRUE(f.plan->has(fmt::format("model.layers.{}.shared_head.head.weight", L)));
    const ModelWeights w = resolve_weights(*f.cfg, *f.plan, 1);
    ASSERT_EQ(w.mtp.size(), 1u);
    EXPECT_TRUE(w.mtp[0].own_head);
    EXPECT_NE(w.mtp[0].head.data, w.lm_head.data);
    EXPECT_EQ(w.mtp[0].head.rows, w.lm_head.rows);
  }
}

// An MTP layer announced by config.json (num_nextn_predict_layers 1) whose tensors the checkpoint lacks: the main
// model's config of glm5-tiny-mtp over the weights of glm5-tiny. missing_tensors (the check of load and `latent
// plan`) lists exactly the MTP layer's required tensors, and the load refuses it with one error naming the first
// and the count; without speculation nothing is missing.
TEST(Mtp, AnnouncedButAbsentMtpLayerIsListedAndRefused) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("latent-mtp-absent-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(src("tests/models/glm5-tiny-mtp/config.json"), dir / "config.json",
                fs::copy_options::overwrite_existing);
  fs::copy_file(src("tests/models/glm5-tiny/model.safetensors"), dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  PlanOptions po;
  po.mtp_layers = 1;
  ModelFiles f = open_model_files(dir.string(), po);
  const int64_t L = f.cfg->num_hidden_layers;
  EXPECT_TRUE(missing_tensors(*f.cfg, *f.plan, 0).empty());
  const std::vector<std::string> missing = missing_tensors(*f.cfg, *f.plan, 1);
  // Every one is a tensor of glm5-tiny-mtp's layer L, none twice, and their count is what the config implies:
  // 2 norms, 5 attention Linears + 2 norms, the indexer (3 Linears + LayerNorm weight and bias), the router, 3 per
  // routed and shared expert, and the MTP layer's enorm, hnorm, shared_head.norm and eh_proj.
  ModelFiles full = open_model_files(src("tests/models/glm5-tiny-mtp"), po);
  EXPECT_TRUE(missing_tensors(*full.cfg, *full.plan, 1).empty());
  const std::string prefix = fmt::format("model.layers.{}.", L);
  std::set<std::string> seen;
  for (const std::string& n : missing) {
    EXPECT_EQ(n.rfind(prefix, 0), 0u) << n;
    EXPECT_TRUE(full.plan->has(n)) << n;
    EXPECT_TRUE(seen.insert(n).second) << n;
  }
  const ModelConfig& c = *f.cfg;
  ASSERT_TRUE(c.has_indexer() && c.n_shared_experts > 0 && !c.attention_bias);
  EXPECT_EQ(static_cast<int64_t>(missing.size()), 2 + 7 + 5 + 1 + 3 * c.n_routed_experts + 3 + 4);
  for (const char* n : {"eh_proj.weight", "shared_head.norm.weight", "self_attn.indexer.k_norm.bias"})
    EXPECT_TRUE(seen.count(prefix + n)) << n;
  EXPECT_TRUE(seen.count(fmt::format("{}mlp.experts.{}.down_proj.weight", prefix, c.n_routed_experts - 1)));
  EXPECT_EQ(missing.front(), prefix + "input_layernorm.weight");
  auto be = make_backend("ref", 1);
  ModelOptions mo;
  mo.mtp_layers = 1;
  try {
    Model m(*f.cfg, *f.plan, *be, mo);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fmt::format("{} tensors that config.json implies are missing", missing.size())),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("the first '" + prefix + "input_layernorm.weight'"), std::string::npos) << what;
    EXPECT_NE(what.find("MTP layer"), std::string::npos) << what;
  }
  fs::remove_all(dir);
}

TEST(Mtp, MalformedDraftStepsAreRefused) {
  auto lm = load_mtp("glm5-tiny-mtp", "ref");
  Model& m = *lm->model;
  const ModelConfig& cfg = m.config();
  PagedKvCache cache(cfg, m.backend(), 2, 4, m.cache_dtype(), 1);
  PagedKvCache no_mtp(cfg, m.backend(), 2, 4, m.cache_dtype(), 0);
  std::vector<int32_t> blocks{0, 1}, toks{3, 4, 5};
  StepSequence s;
  s.n_tokens = 3;
  s.blocks = blocks;
  m.step(Step{toks, std::span<const StepSequence>(&s, 1)}, cache, nullptr);
  int32_t d[8];
  MtpSequence ms;
  ms.n_slots = 3;
  ms.tokens = toks;
  ms.hidden_row = -1;
  ms.zero_first = true;
  ms.blocks = blocks;
  ms.n_draft = 1;
  EXPECT_NO_THROW(m.mtp_draft(std::span<const MtpSequence>(&ms, 1), cache, d));
  EXPECT_THROW(m.mtp_draft(std::span<const MtpSequence>(&ms, 1), no_mtp, d), Error);
  MtpSequence bad = ms;
  bad.hidden_row = 5;  // beyond the last step's 3 rows
  EXPECT_THROW(m.mtp_draft(std::span<const MtpSequence>(&bad, 1), cache, d), Error);
  bad = ms;
  bad.n_draft = 7;  // scratch slots beyond the 8 the table holds
  EXPECT_THROW(m.mtp_draft(std::span<const MtpSequence>(&bad, 1), cache, d), Error);
  bad = ms;
  const std::vector<int32_t> oob{3, 4, static_cast<int32_t>(cfg.vocab_size)};
  bad.tokens = oob;
  EXPECT_THROW(m.mtp_draft(std::span<const MtpSequence>(&bad, 1), cache, d), Error);
}

// ---- the verify step ----
struct VerifyCase {
  std::string model, backend;
  bool bf16;
};
std::string verify_case_name(const ::testing::TestParamInfo<VerifyCase>& i) {
  std::string m = i.param.model + "_" + i.param.backend + (i.param.bf16 ? "_bf16" : "_fp32");
  for (char& c : m)
    if (c == '-') c = '_';
  return m;
}
class VerifyStep : public ::testing::TestWithParam<VerifyCase> {};

// Greedy decoding one token per step versus a verify step of k + 1 tokens (the last token and k correct drafts)
// in one batched step with another sequence beside it: every row bit for bit equal (k = 1, 2, 3; contexts below
// and above index_topk on the DSA models).
TEST_P(VerifyStep, KPlusOneDecodeRowsEqualSingleDecodes) {
  const VerifyCase& c = GetParam();
  ModelOptions mo;
  mo.bf16_activations = c.bf16;
  auto lm = load_model(src("tests/models/" + c.model), mo, 2, c.backend);
  Model& m = *lm->model;
  const ModelConfig& cfg = m.config();
  const int64_t V = cfg.vocab_size, bt = 4;
  std::mt19937 rng(99);
  for (int64_t P : {3, 11}) {
    for (int64_t k = 1; k <= 3; ++k) {
      std::vector<int32_t> toks(static_cast<size_t>(P));
      for (auto& t : toks) t = static_cast<int32_t>(rng() % V);
      std::vector<int32_t> blocks(8), blocks2(8);
      std::iota(blocks.begin(), blocks.end(), 0);
      std::iota(blocks2.begin(), blocks2.end(), 8);
      // One token per step.
      PagedKvCache a(cfg, m.backend(), 16, bt, m.cache_dtype());
      std::vector<float> row(static_cast<size_t>(V)), single;
      std::vector<int32_t> seq = toks;
      StepSequence s;
      s.blocks = blocks;
      s.start = 0;
      s.n_tokens = P;
      s.logits = LogitRows::Last;
      m.step(Step{seq, std::span<const StepSequence>(&s, 1)}, a, row.data());
      seq.push_back(argmax_row(row.data(), V));
      for (int64_t j = 0; j <= k; ++j) {
        s.start = static_cast<int64_t>(seq.size()) - 1;
        s.n_tokens = 1;
        s.decode = true;
        m.step(Step{std::span<const int32_t>(&seq.back(), 1), std::span<const StepSequence>(&s, 1)}, a, row.data());
        single.insert(single.end(), row.begin(), row.end());
        seq.push_back(argmax_row(row.data(), V));
      }
      // The same, verifying seq[P .. P+k] in one step beside another sequence's decode.
      PagedKvCache b(cfg, m.backend(), 16, bt, m.cache_dtype());
      s.start = 0;
      s.n_tokens = P;
      s.decode = false;
      s.logits = LogitRows::Last;
      m.step(Step{toks, std::span<const StepSequence>(&s, 1)}, b, row.data());
      StepSequence o = s;
      o.blocks = blocks2;
      m.step(Step{toks, std::span<const StepSequence>(&o, 1)}, b, row.data());
      std::vector<int32_t> flat{static_cast<int32_t>(5 % V)};
      flat.insert(flat.end(), seq.begin() + P, seq.begin() + P + k + 1);
      StepSequence two[2];
      two[0] = o;
      two[0].start = P;
      two[0].n_tokens = 1;
      two[0].decode = true;
      two[1] = s;
      two[1].start = P;
      two[1].n_tokens = k + 1;
      two[1].decode = true;
      two[1].logits = LogitRows::All;
      std::vector<float> out(static_cast<size_t>((k + 2) * V));
      m.step(Step{flat, std::span<const StepSequence>(two, 2)}, b, out.data());
      EXPECT_EQ(std::memcmp(out.data() + V, single.data(), single.size() * sizeof(float)), 0)
          << "P " << P << " k " << k;
    }
  }
}

std::vector<VerifyCase> verify_cases() {
  std::vector<VerifyCase> v;
  for (const char* mdl : {"glm5-tiny", "v32-tiny", "v3-tiny", "glm5-tiny-b", "glm5-tiny-mxfp4", "v3-tiny-fp8"})
    for (bool bf16 : {false, true}) v.push_back({mdl, "cpu", bf16});
  v.push_back({"glm5-tiny", "ref", false});
  return v;
}
INSTANTIATE_TEST_SUITE_P(Models, VerifyStep, ::testing::ValuesIn(verify_cases()), verify_case_name);

}  // namespace
}  // namespace latent::testing
