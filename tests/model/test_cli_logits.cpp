// End-to-end `latent logits` on a synthetic model: the .npy it writes equals the in-process logits, with and
// without --decode-from, and --hidden has shape [L+1, T, D]. Skipped unless LATENT_BIN names the binary (ctest
// sets it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/npy.h"
#include "model/generate.h"
#include "model_test_util.h"
#include "synthetic_model.h"

namespace latent::testing {
namespace {

namespace fs = std::filesystem;

std::string latent_bin() {
  const char* b = std::getenv("LATENT_BIN");
  return b && fs::exists(b) ? b : "";
}

TEST(CliLogits, PrefillDecodeAndHidden) {
  const std::string bin = latent_bin();
  ASSERT_FALSE(bin.empty()) << "LATENT_BIN not set (ctest sets it)";
  SyntheticSpec s;
  s.arch = "glm";
  s.index_topk = 5;
  const std::string dir = write_synthetic_model(s);
  const std::vector<int32_t> ids = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26};
  auto m = load_model(dir);
  auto want = m->model->logits(ids);
  const std::string out = dir + "/a.npy", out2 = dir + "/b.npy", hid = dir + "/h.npy";
  const std::string toks = "3 14 15 92 65 35 89 79 32 38 46 26";
  std::string cmd =
      bin + " logits --model " + dir + " --tokens \"" + toks + "\" --out " + out + " --hidden " + hid + " --threads 2";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  cmd = bin + " logits --model " + dir + " --tokens \"" + toks + "\" --decode-from 4 --out " + out2;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  NpyArray a = read_npy(out), b = read_npy(out2), h = read_npy(hid);
  ASSERT_EQ(a.shape, (std::vector<int64_t>{12, 96}));
  ASSERT_EQ(b.shape, (std::vector<int64_t>{12, 96}));
  ASSERT_EQ(h.shape, (std::vector<int64_t>{5, 12, 64}));
  const double scale = max_abs(want.data(), want.size());
  EXPECT_LE(max_abs_diff(a.f32.data(), want.data(), want.size()), 1e-4 * scale);
  EXPECT_LE(max_abs_diff(b.f32.data(), want.data(), want.size()), 1e-4 * scale);
  // Bad input: one clear error line, non-zero exit.
  cmd = bin + " logits --model " + dir + " --tokens \"1 2 x\" --out " + out + " 2>/dev/null";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  cmd = bin + " logits --model " + dir + " --tokens \"1 2 3\" --decode-from 9 --out " + out + " 2>/dev/null";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  fs::remove_all(dir);
}

TEST(CliRun, GreedyPrintsIds) {
  const std::string bin = latent_bin();
  ASSERT_FALSE(bin.empty()) << "LATENT_BIN not set (ctest sets it)";
  SyntheticSpec s;
  s.arch = "v3";
  const std::string dir = write_synthetic_model(s);
  const std::string out = dir + "/run.txt";
  std::string cmd = bin + " run --model " + dir + " --prompt-tokens \"1 2 3\" --max-tokens 4 > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  std::vector<int32_t> got;
  int32_t v;
  while (f >> v) got.push_back(v);
  auto m = load_model(dir);
  GenerateOptions g;
  g.max_new_tokens = 4;
  std::vector<int32_t> prompt = {1, 2, 3};
  EXPECT_EQ(got, generate(*m->model, prompt, g));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace latent::testing
