// Tensor and expert parallelism on the CPU (ranks = threads, the in-process communicator): for every tiny model,
// TP 2 / 4, EP 2 / 4 and TP + EP give the one-rank logits (fp32, relative error <= 1e-5, same argmax per row) for
// a prefill then absorbed decode steps, over a batched multi-sequence step on the paged cache, and for greedy
// generation; invalid layouts are refused with errors naming the field or the tensor.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "../common/run_command.h"
#include "core/error.h"
#include "model/generate.h"
#include "model/parallel_model.h"
#include "model_test_util.h"

namespace latent::testing {
namespace {

std::string model_dir(const std::string& name) { return std::string(LATENT_SOURCE_DIR) + "/tests/models/" + name; }

struct Layout {
  const char* name;
  ParallelConfig pc;
};
const Layout kLayouts[] = {
    {"tp2", {2, true, false}}, {"tp4", {4, true, false}},   {"ep2", {2, false, true}},
    {"ep4", {4, false, true}}, {"tp2_ep", {2, true, true}}, {"tp4_ep", {4, true, true}},
};

// The expected refusal of a layout on a model (empty: it must run), as a substring of the error.
std::string expected_error(const std::string& model, const std::string& layout) {
  static const std::map<std::pair<std::string, std::string>, std::string> kErr = {
      {{"glm5-tiny-b", "tp4"}, "num_attention_heads 6 is not divisible by --tensor-parallel-size 4"},
      {{"glm5-tiny-b", "tp4_ep"}, "num_attention_heads 6 is not divisible by --tensor-parallel-size 4"},
      {{"glm5-tiny-b", "ep4"}, "n_routed_experts 6 is not divisible by --expert-parallel-size 4"},
      {{"glm5-tiny-mxfp4", "tp2"},
       "experts.0.down_proj.weight' (mxfp4 [64, 32]): the shard columns [0, 16) cut a "
       "32-element MXFP4 scale block"},
      {{"glm5-tiny-mxfp4", "tp4"},
       "experts.0.down_proj.weight' (mxfp4 [64, 32]): the shard columns [0, 8) cut a "
       "32-element MXFP4 scale block"},
      {{"v3-tiny-fp8", "tp2"},
       "self_attn.q_b_proj.weight' (fp8_e4m3_block128 [192, 48]): the shard rows [0, 96) cut "
       "a 128x128 scale block"},
      {{"v3-tiny-fp8", "tp4"},
       "self_attn.q_b_proj.weight' (fp8_e4m3_block128 [192, 48]): the shard rows [0, 48) cut "
       "a 128x128 scale block"},
      {{"v3-tiny-fp8", "tp2_ep"}, "self_attn.q_b_proj.weight' (fp8_e4m3_block128"},
      {{"v3-tiny-fp8", "tp4_ep"}, "self_attn.q_b_proj.weight' (fp8_e4m3_block128"},
  };
  auto it = kErr.find({model, layout});
  return it == kErr.end() ? std::string() : it->second;
}

const char* const kModels[] = {"glm5-tiny", "glm5-tiny-b", "glm5-tiny-mxfp4", "v3-tiny", "v3-tiny-fp8", "v32-tiny"};

struct Case {
  std::string model;
  Layout layout;
};
std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  std::string m = i.param.model;
  for (char& c : m)
    if (c == '-') c = '_';
  return m + "_" + i.param.layout.name;
}
// valid: the layouts a model runs under; else those it must refuse.
std::vector<Case> cases(bool valid) {
  std::vector<Case> v;
  for (const char* m : kModels)
    for (const Layout& l : kLayouts)
      if (expected_error(m, l.name).empty() == valid) v.push_back({m, l});
  return v;
}

// Relative error <= 1e-5 and the same argmax in every row of [rows, V].
void expect_same_logits(const std::vector<float>& got, const std::vector<float>& ref, int64_t V,
                        const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double rel = rel_error(got.data(), ref.data(), got.size());
  EXPECT_LE(rel, 1e-5) << what;
  for (size_t r = 0; r * V < ref.size(); ++r)
    EXPECT_EQ(argmax(got.data() + r * V, V), argmax(ref.data() + r * V, V)) << what << " row " << r;
}

std::vector<int32_t> tokens(int64_t n, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
  return t;
}

class ParallelRefused : public ::testing::TestWithParam<Case> {};

TEST_P(ParallelRefused, ClearError) {
  const Case& c = GetParam();
  ModelFiles f = open_model_files(model_dir(c.model));
  const std::string err = expected_error(c.model, c.layout.name);
  try {
    ParallelModel pm(*f.cfg, *f.plan, "cpu", 4, c.layout.pc);
    FAIL() << "expected the error: " << err;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(err), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ParallelRefused, ::testing::ValuesIn(cases(false)), case_name);

class Parallel : public ::testing::TestWithParam<Case> {};

TEST_P(Parallel, LogitsEqualOneRank) {
  const Case& c = GetParam();
  ModelFiles f = open_model_files(model_dir(c.model));
  const ModelConfig& cfg = *f.cfg;
  auto be = make_backend("cpu", 1);
  Model one(cfg, *f.plan, *be);
  ParallelModel pm(cfg, *f.plan, "cpu", 4, c.layout.pc);
  ASSERT_EQ(pm.ranks(), c.layout.pc.ranks);
  const int64_t V = cfg.vocab_size;
  // 20 tokens: beyond index_topk (8 or 12) on the DSA models, so the sparse selection runs; 14 prefilled (naive
  // attention), then 6 absorbed decode steps.
  const std::vector<int32_t> ids = tokens(20, V, 7);
  const std::vector<float> ref = prefill_then_decode(one, ids, 14);
  std::vector<float> got(ref.size());
  ParallelKvCache cache(cfg, pm.ranks());
  pm.forward(std::span<const int32_t>(ids.data(), 14), cache, got.data(), true);
  for (size_t t = 14; t < ids.size(); ++t)
    pm.forward(std::span<const int32_t>(ids.data() + t, 1), cache, got.data() + t * V, true);
  expect_same_logits(got, ref, V, c.model + " " + c.layout.name);

  // The hidden states (rank 0) match too.
  std::vector<float> h1, hp;
  {
    KvCache k1(cfg);
    ParallelKvCache kp(cfg, pm.ranks());
    std::vector<float> l1(static_cast<size_t>(5 * V)), lp(l1.size());
    one.forward(std::span<const int32_t>(ids.data(), 5), k1, l1.data(), true, &h1);
    pm.forward(std::span<const int32_t>(ids.data(), 5), kp, lp.data(), true, &hp);
  }
  ASSERT_EQ(h1.size(), hp.size());
  EXPECT_LE(rel_error(hp.data(), h1.data(), h1.size()), 1e-5);

  // Greedy generation is identical.
  GenerateOptions g;
  g.max_new_tokens = 8;
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 6);
  EXPECT_EQ(generate(pm, prompt, g), generate(one, prompt, g));
}

// Three sequences in one step on the paged cache (prefill chunks of different lengths, shared block table
// layout), then two decode steps of all three: equal to one rank over the same blocks.
TEST_P(Parallel, BatchedPagedStepEqualsOneRank) {
  const Case& c = GetParam();
  ModelFiles f = open_model_files(model_dir(c.model));
  const ModelConfig& cfg = *f.cfg;
  const int64_t V = cfg.vocab_size, bt = 4, nb = 32;
  auto be = make_backend("cpu", 1);
  Model one(cfg, *f.plan, *be);
  ParallelModel pm(cfg, *f.plan, "cpu", 4, c.layout.pc);
  PagedKvCache cache1(cfg, *be, nb, bt, one.cache_dtype());
  auto owned = pm.make_caches(nb, bt);
  std::vector<PagedKvCache*> caches;
  for (auto& p : owned) caches.push_back(p.get());

  const std::vector<int64_t> lens = {3, 17, 9};
  std::vector<std::vector<int32_t>> blocks(3);
  int32_t next = 0;
  for (int s = 0; s < 3; ++s)
    for (int j = 0; j < 8; ++j) blocks[static_cast<size_t>(s)].push_back(next++ % nb);
  // Interleave block ids so the sequences' pages are not contiguous.
  std::swap(blocks[0][1], blocks[2][0]);
  std::vector<int64_t> ctx(3, 0);
  for (int stepi = 0; stepi < 3; ++stepi) {
    std::vector<int32_t> toks;
    std::vector<StepSequence> seqs;
    for (int s = 0; s < 3; ++s) {
      const int64_t n = stepi == 0 ? lens[static_cast<size_t>(s)] : 1;
      const auto t = tokens(n, V, static_cast<uint32_t>(100 * stepi + s));
      toks.insert(toks.end(), t.begin(), t.end());
      StepSequence q;
      q.start = ctx[static_cast<size_t>(s)];
      q.n_tokens = n;
      q.blocks = blocks[static_cast<size_t>(s)];
      q.logits = stepi == 0 && s == 1 ? LogitRows::All : LogitRows::Last;
      q.decode = stepi > 0;
      seqs.push_back(q);
      ctx[static_cast<size_t>(s)] += n;
    }
    const int64_t rows = stepi == 0 ? 1 + lens[1] + 1 : 3;
    std::vector<float> ref(static_cast<size_t>(rows * V)), got(ref.size());
    const Step st{toks, seqs};
    one.step(st, cache1, ref.data());
    pm.step(st, caches, got.data());
    expect_same_logits(got, ref, V, c.model + " " + c.layout.name + " step " + std::to_string(stepi));
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, Parallel, ::testing::ValuesIn(cases(true)), case_name);

// The in-process sums run in rank order whatever the thread timing: two runs are bit-identical.
TEST(ParallelDeterminism, RepeatedRunsAreBitIdentical) {
  ModelFiles f = open_model_files(model_dir("v32-tiny"));
  const std::vector<int32_t> ids = tokens(20, f.cfg->vocab_size, 3);
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    ParallelModel pm(*f.cfg, *f.plan, "cpu", 4, {4, true, true});
    const std::vector<float> lg = pm.logits(ids);
    if (run == 0)
      first = lg;
    else
      ASSERT_EQ(std::memcmp(lg.data(), first.data(), lg.size() * sizeof(float)), 0) << "run " << run;
  }
}

// bf16 activations: the ranks round their partial sums to bf16 before the all-reduce, so the result is not the
// one-rank rounding sequence; it stays well within the bf16 noise of the model (a quarter of one rank's
// bf16-vs-fp32 error) and agrees on the top-1 token.
TEST(ParallelBf16, CloseToOneRank) {
  ModelFiles f = open_model_files(model_dir("glm5-tiny"));
  ModelOptions mo;
  mo.bf16_activations = true;
  auto be = make_backend("cpu", 1);
  Model one(*f.cfg, *f.plan, *be, mo);
  ParallelModel pm(*f.cfg, *f.plan, "cpu", 2, {2, true, true}, mo);
  const int64_t V = f.cfg->vocab_size;
  const std::vector<int32_t> ids = tokens(24, V, 11);
  const std::vector<float> ref = one.logits(ids), got = pm.logits(ids);
  int agree = 0;
  for (size_t r = 0; r < ids.size(); ++r) agree += argmax(got.data() + r * V, V) == argmax(ref.data() + r * V, V);
  const double rel = rel_error(got.data(), ref.data(), ref.size());
  // The scale of bf16 noise on this model: one rank's bf16 logits against its fp32 logits.
  Model one32(*f.cfg, *f.plan, *be);
  const std::vector<float> ref32 = one32.logits(ids);
  const double noise = rel_error(ref.data(), ref32.data(), ref.size());
  std::printf("[bf16 tp2+ep vs one rank] rel %.3g (one rank bf16 vs fp32: %.3g), top-1 %d/%zu\n", rel, noise, agree,
              ids.size());
  EXPECT_LE(rel, 0.25 * noise);
  EXPECT_GE(agree, static_cast<int>(ids.size()) - 2);
}

TEST(ParallelErrors, InvalidConfigs) {
  EXPECT_THROW(parallel_config(0, false), Error);
  EXPECT_THROW(parallel_config(1, true), Error);  // --expert-parallel needs ranks
  EXPECT_THROW(parallel_config(2, false, 2), Error);
  const ParallelConfig a = parallel_config(4, true);
  EXPECT_TRUE(a.tensor && a.expert && a.ranks == 4);
  const ParallelConfig b = parallel_config(1, false, 2);
  EXPECT_TRUE(!b.tensor && b.expert && b.ranks == 2);
  const ParallelConfig one = parallel_config(1, false);
  EXPECT_FALSE(one.active());
}

TEST(ParallelErrors, NonDivisibleSizesNameTheField) {
  ModelFiles f = open_model_files(model_dir("v3-tiny"));
  // 3 ranks: 4 heads, 8 experts.
  try {
    ParallelModel pm(*f.cfg, *f.plan, "cpu", 3, {3, true, false});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads 4 is not divisible by --tensor-parallel-size 3"),
              std::string::npos)
        << e.what();
  }
  try {
    ParallelModel pm(*f.cfg, *f.plan, "cpu", 3, {3, false, true});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_routed_experts 8 is not divisible by --expert-parallel-size 3"),
              std::string::npos)
        << e.what();
  }
  // A Model rank without a communicator.
  auto be = make_backend("cpu", 1);
  EXPECT_THROW(Model(*f.cfg, *f.plan, *be, {}, RankContext{{2, true, false}, 0, nullptr}), Error);
}

TEST(ParallelErrors, BadStepLeavesEveryRankUsable) {
  ModelFiles f = open_model_files(model_dir("glm5-tiny"));
  ParallelModel pm(*f.cfg, *f.plan, "cpu", 2, {2, true, true});
  ParallelKvCache cache(*f.cfg, 2);
  const int32_t bad[2] = {1, 100000};
  std::vector<float> lg(static_cast<size_t>(2 * f.cfg->vocab_size));
  EXPECT_THROW(pm.forward(bad, cache, lg.data(), true), Error);
  const int32_t good[2] = {1, 2};
  pm.forward(good, cache, lg.data(), true);
  auto be = make_backend("cpu", 1);
  Model one(*f.cfg, *f.plan, *be);
  const std::vector<float> ref = one.logits(good);
  EXPECT_LE(rel_error(lg.data(), ref.data(), ref.size()), 1e-5);
}

// Row and column slices of quantized weights keep whole scale blocks, and their dequantized rows equal the
// corresponding part of the full weight's rows.
TEST(Shard, SlicesDequantizeToTheFullWeightsParts) {
  for (const char* name : {"v3-tiny-fp8", "glm5-tiny-mxfp4"}) {
    ModelFiles f = open_model_files(model_dir(name));
    const ModelWeights w = resolve_weights(*f.cfg, *f.plan);
    const QuantWeight& q =
        std::string(name) == "v3-tiny-fp8" ? w.layers[1].moe.experts[0].gate : w.layers[1].moe.experts[0].down;
    ASSERT_TRUE(is_quantized(q.format)) << name;
    std::vector<float> full(static_cast<size_t>(q.cols)), part(static_cast<size_t>(q.cols));
    // Whole-weight slices (the only block-respecting ones at these sizes) and a plain-float column slice.
    ShardStorage st;
    const QuantWeight c = slice_cols(q, 0, q.cols, "w", &st);
    const QuantWeight r = slice_rows(q, 0, q.rows, "w");
    for (int64_t i = 0; i < q.rows; ++i) {
      dequant_row_ref(q, i, full.data());
      dequant_row_ref(c, i, part.data());
      EXPECT_EQ(full, part);
      dequant_row_ref(r, i, part.data());
      EXPECT_EQ(full, part);
    }
  }
  ModelFiles f = open_model_files(model_dir("glm5-tiny"));
  const ModelWeights w = resolve_weights(*f.cfg, *f.plan);
  const QuantWeight& o = w.layers[0].attn.o;  // bf16 [64, 4*dv]
  ShardStorage st;
  const QuantWeight c = slice_cols(o, 8, 40, "o", &st);
  const QuantWeight r = slice_rows(o, 16, 48, "o");
  std::vector<float> full(static_cast<size_t>(o.cols)), part(static_cast<size_t>(32));
  for (int64_t i = 0; i < o.rows; ++i) {
    dequant_row_ref(o, i, full.data());
    dequant_row_ref(c, i, part.data());
    for (int j = 0; j < 32; ++j) EXPECT_EQ(part[j], full[8 + j]);
  }
  std::vector<float> row(static_cast<size_t>(o.cols));
  dequant_row_ref(r, 0, row.data());
  dequant_row_ref(o, 16, full.data());
  EXPECT_EQ(row, full);
  EXPECT_EQ(st.bytes, o.rows * 32 * 2);
}

// The CLI: ranks as threads on the CPU. `latent run --tensor-parallel-size 2` prints the one-rank greedy ids;
// `latent plan --tensor-parallel-size 2 --expert-parallel` shows each tensor's placement; a refused layout exits
// non-zero with the error on stderr.
std::string latent_bin() {
  const char* b = std::getenv("LATENT_BIN");
  return b ? b : "";
}
std::string capture(const std::string& cmd, int* rc) { return latent::test::run_command(cmd, rc); }

TEST(ParallelCli, RunTensorParallelEqualsOneRank) {
  const std::string bin = latent_bin();
  ASSERT_FALSE(bin.empty()) << "LATENT_BIN not set (ctest sets it)";
  for (const char* flags :
       {"--tensor-parallel-size 2", "--tensor-parallel-size 4 --expert-parallel", "--expert-parallel-size 2"}) {
    const std::string base = bin + " run --model " + model_dir("glm5-tiny") +
                             " --threads 2 --prompt-tokens \"5 17 3 99 42\" --max-tokens 8 2>&1";
    int rc1 = -1, rc2 = -1;
    const std::string one = capture(base, &rc1);
    const std::string par = capture(base + " " + flags, &rc2);
    ASSERT_EQ(rc1, 0) << one;
    ASSERT_EQ(rc2, 0) << par;
    EXPECT_EQ(par, one) << flags;
    EXPECT_GE(one.size(), 16u);  // 8 ids
  }
  int rc = 0;
  const std::string err = capture(
      bin + " run --model " + model_dir("glm5-tiny-b") + " --prompt-tokens \"1 2\" --tensor-parallel-size 4 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("num_attention_heads 6 is not divisible by --tensor-parallel-size 4"), std::string::npos) << err;
}

TEST(ParallelCli, PlanShowsTheSharding) {
  const std::string bin = latent_bin();
  ASSERT_FALSE(bin.empty()) << "LATENT_BIN not set (ctest sets it)";
  int rc = -1;
  const std::string out = capture(
      bin + " plan --model " + model_dir("glm5-tiny") + " --tensor-parallel-size 2 --expert-parallel 2>&1", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("sharding: tensor parallel 2 + expert parallel"), std::string::npos) << out;
  EXPECT_NE(out.find("model.layers.0.self_attn.q_b_proj.weight"), std::string::npos);
  EXPECT_NE(out.find("rows of heads 0..2 of 4"), std::string::npos) << out;
  EXPECT_NE(out.find("columns of heads 0..2 of 4"), std::string::npos);
  EXPECT_NE(out.find("expert 7 of 8 (rank 1)"), std::string::npos);
  EXPECT_NE(out.find("vocab rows 0..128 of 256"), std::string::npos);
  const std::string js =
      capture(bin + " plan --model " + model_dir("v3-tiny-fp8") + " --json --expert-parallel-size 2 2>&1", &rc);
  ASSERT_EQ(rc, 0) << js;
  EXPECT_NE(js.find("\"sharding\""), std::string::npos);
  EXPECT_NE(js.find("expert parallel 2 (attention replicated)"), std::string::npos) << js;
  const std::string bad =
      capture(bin + " plan --model " + model_dir("v3-tiny-fp8") + " --tensor-parallel-size 2 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(bad.find("cut a 128x128 scale block"), std::string::npos) << bad;
}

}  // namespace
}  // namespace latent::testing
