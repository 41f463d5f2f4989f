// Tensor / expert parallelism over NCCL on a multi-GPU machine (scripts/gpu_parallel_test runs it; built with the
// CUDA backend, not registered with ctest since CI has no GPU): the NCCL collectives against host references, and
// for every tiny model TP 2 / EP 2 / TP 2 + EP (and 4 when 4 GPUs are visible) giving one GPU's fp32 logits
// (relative error <= 1e-5, same argmax per row) over a prefill then absorbed decode steps, and the same greedy
// continuation. Fails (does not skip) with fewer than 2 GPUs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/generate.h"
#include "model/parallel_model.h"

namespace latent {
namespace {

std::string repo() {
  const char* r = std::getenv("LATENT_REPO");
  return r ? r : LATENT_SOURCE_DIR;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(CudaParallel, AtLeastTwoGpus) { ASSERT_GE(cuda_device_count(), 2) << "this program needs 2 or more GPUs"; }

// NCCL collectives through a 1-layer "model" would hide errors: check them directly on every visible GPU pair.
TEST(CudaParallel, NcclCollectivesMatchHostReferences) {
  const int W = std::min(cuda_device_count(), 4);
  ASSERT_GE(W, 2);
  ModelFiles f = open_model_files(repo() + "/tests/models/v3-tiny");
  ParallelModel pm(*f.cfg, *f.plan, "cuda", 0, {W, true, false});  // W threads bound to GPUs, NCCL comms
  const int64_t n = 1003;
  std::vector<std::vector<float>> got(static_cast<size_t>(W));
  pm.run([&](int r) {
    Backend& be = pm.backend(r);
    Communicator& c = *pm.rank(r).rank_context().comm;
    std::vector<float> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) h[i] = float(r + 1) * 0.25f + float(i % 13);
    float* d = static_cast<float*>(be.alloc(sizeof(float) * n * W, "test"));
    be.upload(d, h.data(), sizeof(float) * n);
    c.all_reduce_sum(d, n);
    std::vector<float> out(static_cast<size_t>(n * W));
    be.download(out.data(), d, sizeof(float) * n);
    // all-gather of n floats into [W, n]
    be.upload(d, h.data(), sizeof(float) * n);
    float* g = static_cast<float*>(be.alloc(sizeof(float) * n * W, "test"));
    c.all_gather(d, sizeof(float) * n, g);
    std::vector<float> ga(static_cast<size_t>(n * W));
    be.download(ga.data(), g, sizeof(float) * n * W);
    out.insert(out.end(), ga.begin(), ga.end());
    be.dealloc(d);
    be.dealloc(g);
    got[static_cast<size_t>(r)] = out;
  });
  for (int r = 0; r < W; ++r)
    for (int64_t i = 0; i < n; ++i) {
      float ref = 0;
      for (int k = 0; k < W; ++k) ref += float(k + 1) * 0.25f + float(i % 13);
      ASSERT_NEAR(got[static_cast<size_t>(r)][i], ref, 1e-4) << "all_reduce rank " << r << " i " << i;
      for (int k = 0; k < W; ++k)
        ASSERT_EQ(got[static_cast<size_t>(r)][n * W + k * n + i], float(k + 1) * 0.25f + float(i % 13));
    }
}

struct Case {
  std::string model;
  ParallelConfig pc;
};

class CudaParallelModels : public ::testing::TestWithParam<Case> {};

TEST_P(CudaParallelModels, LogitsEqualOneGpu) {
  const Case& c = GetParam();
  ASSERT_GE(cuda_device_count(), c.pc.ranks) << c.pc.describe() << " needs " << c.pc.ranks << " GPUs";
  ModelFiles f = open_model_files(repo() + "/tests/models/" + c.model);
  const ModelConfig& cfg = *f.cfg;
  const int64_t V = cfg.vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % V));
  std::vector<float> ref(ids.size() * V), got(ref.size());
  std::vector<int32_t> g1, gp;
  GenerateOptions g;
  g.max_new_tokens = 8;
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 6);
  {
    cuda_bind_device(0);
    auto be = make_backend("cuda", 1);
    Model one(cfg, *f.plan, *be);
    KvCache k(cfg);
    one.forward(std::span<const int32_t>(ids.data(), 14), k, ref.data(), true);
    for (size_t t = 14; t < ids.size(); ++t)
      one.forward(std::span<const int32_t>(ids.data() + t, 1), k, ref.data() + t * V, true);
    g1 = generate(one, prompt, g);
  }
  ParallelModel pm(cfg, *f.plan, "cuda", 0, c.pc);
  ParallelKvCache k(cfg, pm.ranks());
  pm.forward(std::span<const int32_t>(ids.data(), 14), k, got.data(), true);
  for (size_t t = 14; t < ids.size(); ++t)
    pm.forward(std::span<const int32_t>(ids.data() + t, 1), k, got.data() + t * V, true);
  gp = generate(pm, prompt, g);
  EXPECT_LE(rel_error(got, ref), 1e-5) << c.model << " " << c.pc.describe();
  for (size_t r = 0; r < ids.size(); ++r)
    EXPECT_EQ(argmax(got.data() + r * V, V), argmax(ref.data() + r * V, V)) << "row " << r;
  EXPECT_EQ(gp, g1);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  const int n = cuda_device_count();
  for (const char* m : {"glm5-tiny", "v3-tiny", "v32-tiny", "glm5-tiny-b"}) {
    v.push_back({m, {2, true, false}});
    v.push_back({m, {2, false, true}});
    v.push_back({m, {2, true, true}});
    if (n >= 4 && std::string(m) != "glm5-tiny-b") {  // glm5-tiny-b: 6 heads, 6 experts (not divisible by 4)
      v.push_back({m, {4, true, false}});
      v.push_back({m, {4, true, true}});
    }
  }
  for (const char* m : {"glm5-tiny-mxfp4", "v3-tiny-fp8"}) v.push_back({m, {2, false, true}});
  v.push_back({"glm5-tiny-mxfp4", {2, true, true}});
  return v;
}
std::string name(const ::testing::TestParamInfo<Case>& i) {
  std::string s = i.param.model + "_" + std::to_string(i.param.pc.ranks) + (i.param.pc.tensor ? "_tp" : "") +
                  (i.param.pc.expert ? "_ep" : "");
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}
INSTANTIATE_TEST_SUITE_P(TinyModels, CudaParallelModels, ::testing::ValuesIn(cases()), name);

}  // namespace
}  // namespace latent
