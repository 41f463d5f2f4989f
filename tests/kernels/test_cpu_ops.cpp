// Op harness: every op of the CPU backend against the scalar ref backend on random inputs of awkward sizes
// (odd, not multiples of 32/128, batch 1 and larger), for every weight format and every ISA level this machine
// runs (scalar, avx2, avx512). Errors are normalized: max|cpu − ref| / max|ref|. fp32 paths must be within 1e-5;
// bf16-rounding variants within a few bf16 ulps (the two backends round different fp32 values to bf16 when their
// accumulation orders differ). The largest error seen per op / format / ISA is printed at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "quant/float_formats.h"
#include "quant/fp8.h"

namespace latent {
namespace {

constexpr double kTolF32 = 1e-5;
constexpr double kTolBf16 = 1.0 / 64;  // a couple of bf16 ulps (2^-8 each) at the largest magnitude

// ---------------------------------------------------------------------------------------------------------------
// Error bookkeeping
// ---------------------------------------------------------------------------------------------------------------
std::map<std::string, double>& summary() {
  static std::map<std::string, double> m;
  return m;
}
void record(const std::string& key, double e) {
  double& v = summary()[key];
  v = std::max(v, e);
}

class SummaryEnv : public ::testing::Environment {
 public:
  void TearDown() override {
    if (summary().empty()) return;
    std::printf("\n[cpu op harness] max normalized error |cpu-ref|/max|ref| (op / case / isa):\n");
    for (const auto& [k, v] : summary()) std::printf("  %-48s %.3g\n", k.c_str(), v);
  }
};
const auto* const g_env = ::testing::AddGlobalTestEnvironment(new SummaryEnv);

// max|a − b| / max|b|; NaNs must coincide (a NaN in only one of them gives +inf).
double norm_err(const float* a, const float* b, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const bool na = std::isnan(a[i]), nb = std::isnan(b[i]);
    if (na || nb) {
      if (na != nb) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  if (den == 0.0) return num;
  return num / den;
}
double norm_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  return norm_err(a.data(), b.data(), static_cast<int64_t>(std::min(a.size(), b.size())));
}

// ---------------------------------------------------------------------------------------------------------------
// Backends under test
// ---------------------------------------------------------------------------------------------------------------
struct Cpu {
  CpuIsa isa;
  std::unique_ptr<Backend> be;
};
Backend& ref_backend() {
  static std::unique_ptr<Backend> r = make_ref_backend(2);
  return *r;
}
std::vector<Cpu>& cpus() {
  static std::vector<Cpu> v = [] {
    std::vector<Cpu> out;
    for (CpuIsa i : cpu_isas_available()) out.push_back({i, make_cpu_backend(i == CpuIsa::Scalar ? 3 : 2, i)});
    return out;
  }();
  return v;
}

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  float normal(float sd = 1.0f) { return std::normal_distribution<float>(0.0f, sd)(g); }
  float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(g); }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g); }
  std::vector<float> normals(int64_t n, float sd = 1.0f) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(sd);
    return v;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Random weights in every stored format (data and scales deliberately misaligned by one byte)
// ---------------------------------------------------------------------------------------------------------------
enum class Fmt { F32, BF16, F16, Fp8Block, Fp8BlockOdd, Fp8BlockFnuz, Fp8Tensor, Fp8Channel, Mxfp4 };
constexpr Fmt kAllFmts[] = {Fmt::F32,          Fmt::BF16,      Fmt::F16,        Fmt::Fp8Block,
                            Fmt::Fp8BlockOdd,  Fmt::Fp8BlockFnuz, Fmt::Fp8Tensor, Fmt::Fp8Channel,
                            Fmt::Mxfp4};

const char* fmt_name(Fmt f) {
  switch (f) {
    case Fmt::F32: return "f32";
    case Fmt::BF16: return "bf16";
    case Fmt::F16: return "f16";
    case Fmt::Fp8Block: return "fp8_block128";
    case Fmt::Fp8BlockOdd: return "fp8_block32x40";
    case Fmt::Fp8BlockFnuz: return "fp8fnuz_block128";
    case Fmt::Fp8Tensor: return "fp8_tensor";
    case Fmt::Fp8Channel: return "fp8_channel";
    case Fmt::Mxfp4: return "mxfp4";
  }
  return "?";
}

struct TestWeight {
  std::vector<uint8_t> data, scale;
  QuantWeight q;
};

uint8_t random_fp8(Rng& r, bool fnuz) {
  for (;;) {
    const uint8_t c = static_cast<uint8_t>(r.integer(0, 255));
    if (fnuz ? c != 0x80 : (c & 0x7F) != 0x7F) return c;
  }
}

// nan: put NaN codes (fp8) / NaN scales (mxfp4) into a few rows.
TestWeight make_weight(Fmt f, int64_t rows, int64_t cols, Rng& r, bool nan = false) {
  TestWeight t;
  QuantWeight& q = t.q;
  q.rows = rows;
  q.cols = cols;
  auto put_f32 = [](std::vector<uint8_t>& buf, int64_t i, float v) { std::memcpy(buf.data() + 1 + 4 * i, &v, 4); };
  switch (f) {
    case Fmt::F32:
      q.format = WeightFormat::F32;
      t.data.resize(static_cast<size_t>(rows * cols * 4 + 1));
      for (int64_t i = 0; i < rows * cols; ++i) put_f32(t.data, i, r.normal());
      break;
    case Fmt::BF16:
    case Fmt::F16:
      q.format = f == Fmt::BF16 ? WeightFormat::BF16 : WeightFormat::F16;
      t.data.resize(static_cast<size_t>(rows * cols * 2 + 1));
      for (int64_t i = 0; i < rows * cols; ++i) {
        const float v = r.normal();
        const uint16_t h = f == Fmt::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(t.data.data() + 1 + 2 * i, &h, 2);
      }
      break;
    case Fmt::Fp8Block:
    case Fmt::Fp8BlockOdd:
    case Fmt::Fp8BlockFnuz:
    case Fmt::Fp8Tensor:
    case Fmt::Fp8Channel: {
      q.fnuz = f == Fmt::Fp8BlockFnuz;
      q.format = f == Fmt::Fp8Tensor    ? WeightFormat::FP8_E4M3_TENSOR
                 : f == Fmt::Fp8Channel ? WeightFormat::FP8_E4M3_CHANNEL
                                        : WeightFormat::FP8_E4M3_BLOCK;
      if (f == Fmt::Fp8BlockOdd) {
        q.block_rows = 32;
        q.block_cols = 40;
      }
      t.data.resize(static_cast<size_t>(rows * cols + 1));
      for (int64_t i = 0; i < rows * cols; ++i) t.data[static_cast<size_t>(1 + i)] = random_fp8(r, q.fnuz);
      if (nan && rows * cols > 0) {
        for (int k = 0; k < 3; ++k) {
          const int64_t i = r.integer(0, rows * cols - 1);
          t.data[static_cast<size_t>(1 + i)] = q.fnuz ? 0x80 : (r.integer(0, 1) ? 0x7F : 0xFF);
        }
      }
      int64_t ns = 1;
      if (q.format == WeightFormat::FP8_E4M3_CHANNEL) ns = rows;
      if (q.format == WeightFormat::FP8_E4M3_BLOCK)
        ns = ((rows + q.block_rows - 1) / q.block_rows) * ((cols + q.block_cols - 1) / q.block_cols);
      t.scale.resize(static_cast<size_t>(ns * 4 + 1));
      for (int64_t i = 0; i < ns; ++i) put_f32(t.scale, i, r.uniform(0.5f, 2.0f) / 256.0f);
      break;
    }
    case Fmt::Mxfp4: {
      q.format = WeightFormat::MXFP4;
      t.data.resize(static_cast<size_t>(rows * cols / 2 + 1));
      for (size_t i = 1; i < t.data.size(); ++i) t.data[i] = static_cast<uint8_t>(r.integer(0, 255));
      t.scale.resize(static_cast<size_t>(rows * (cols / 32) + 1));
      for (size_t i = 1; i < t.scale.size(); ++i) t.scale[i] = static_cast<uint8_t>(r.integer(118, 130));
      if (nan && t.scale.size() > 1) t.scale[static_cast<size_t>(r.integer(1, static_cast<int64_t>(t.scale.size()) - 1))] = 0xFF;
      break;
    }
  }
  q.data = t.data.data() + 1;
  q.scale = t.scale.empty() ? nullptr : t.scale.data() + 1;
  return t;
}

std::vector<int64_t> cols_for(Fmt f) {
  if (f == Fmt::Mxfp4) return {32, 96, 160, 4096 + 32};
  return {1, 7, 33, 95, 161, 4099};
}

// ---------------------------------------------------------------------------------------------------------------
// Linear
// ---------------------------------------------------------------------------------------------------------------
TEST(CpuOps, IsaLevels) {
  const auto v = cpu_isas_available();
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v.front(), CpuIsa::Scalar);
  std::string s;
  for (CpuIsa i : v) s += std::string(cpu_isa_name(i)) + " ";
  std::printf("[cpu op harness] ISA levels tested: %s\n", s.c_str());
  for (const Cpu& c : cpus()) EXPECT_STREQ(c.be->name(), "cpu");
}

TEST(CpuOps, IsaEnvironmentOverride) {
  const char* old = std::getenv("LATENT_CPU_ISA");
  const std::string saved = old ? old : "";
  setenv("LATENT_CPU_ISA", "scalar", 1);
  EXPECT_EQ(cpu_isa_default(), CpuIsa::Scalar);
  if (cpu_isa_supported(CpuIsa::Avx2)) {
    setenv("LATENT_CPU_ISA", "avx2", 1);
    EXPECT_EQ(cpu_isa_default(), CpuIsa::Avx2);
  }
  setenv("LATENT_CPU_ISA", "avx512", 1);
  EXPECT_EQ(cpu_isa_default(), cpu_isas_available().back());  // falls back to the best available
  if (old)
    setenv("LATENT_CPU_ISA", saved.c_str(), 1);
  else
    unsetenv("LATENT_CPU_ISA");
}

TEST(CpuOps, Matmul) {
  Rng rng(1);
  for (Fmt f : kAllFmts) {
    for (int64_t rows : {1, 3, 37, 129}) {
      for (int64_t cols : cols_for(f)) {
        if (cols > 4000 && rows > 37) continue;
        const TestWeight w = make_weight(f, rows, cols, rng);
        for (int64_t M : {1, 2, 5, 17}) {
          const std::vector<float> x = rng.normals(M * cols);
          std::vector<float> yr(static_cast<size_t>(M * rows));
          ref_backend().matmul(w.q, x.data(), M, yr.data());
          for (Cpu& c : cpus()) {
            std::vector<float> y(yr.size(), -1.0f);
            c.be->matmul(w.q, x.data(), M, y.data());
            const double e = norm_err(y, yr);
            record(std::string("matmul/") + fmt_name(f) + "/" + cpu_isa_name(c.isa), e);
            EXPECT_LE(e, kTolF32) << fmt_name(f) << " " << cpu_isa_name(c.isa) << " rows " << rows << " cols " << cols
                                  << " M " << M;
          }
        }
      }
    }
  }
}

TEST(CpuOps, MatmulLargeBatch) {  // prefill-sized M (several M tiles and row blocks)
  Rng rng(2);
  for (Fmt f : {Fmt::BF16, Fmt::Mxfp4, Fmt::Fp8Block, Fmt::F32}) {
    const int64_t rows = 301, cols = f == Fmt::Mxfp4 ? 1088 : 1031, M = 45;
    const TestWeight w = make_weight(f, rows, cols, rng);
    const std::vector<float> x = rng.normals(M * cols);
    std::vector<float> yr(static_cast<size_t>(M * rows));
    ref_backend().matmul(w.q, x.data(), M, yr.data());
    for (Cpu& c : cpus()) {
      std::vector<float> y(yr.size());
      c.be->matmul(w.q, x.data(), M, y.data());
      const double e = norm_err(y, yr);
      record(std::string("matmul_M45/") + fmt_name(f) + "/" + cpu_isa_name(c.isa), e);
      EXPECT_LE(e, kTolF32) << fmt_name(f) << " " << cpu_isa_name(c.isa);
    }
  }
}

TEST(CpuOps, MatmulNaNCodes) {  // NaN fp8 codes and NaN e8m0 scales propagate exactly where ref puts them
  Rng rng(3);
  for (Fmt f : {Fmt::Fp8Block, Fmt::Fp8BlockFnuz, Fmt::Fp8Tensor, Fmt::Mxfp4}) {
    const int64_t rows = 37, cols = f == Fmt::Mxfp4 ? 160 : 161;
    const TestWeight w = make_weight(f, rows, cols, rng, /*nan=*/true);
    for (int64_t M : {1, 5}) {
      const std::vector<float> x = rng.normals(M * cols);
      std::vector<float> yr(static_cast<size_t>(M * rows));
      ref_backend().matmul(w.q, x.data(), M, yr.data());
      for (Cpu& c : cpus()) {
        std::vector<float> y(yr.size());
        c.be->matmul(w.q, x.data(), M, y.data());
        EXPECT_LE(norm_err(y, yr), kTolF32) << fmt_name(f) << " " << cpu_isa_name(c.isa) << " M " << M;
      }
    }
  }
}

TEST(CpuOps, GroupedMatmul) {
  Rng rng(4);
  for (int64_t cols : {160, 4096 + 32}) {
    for (int64_t rows : {37, 129}) {
      // Formats may differ per group; some groups empty.
      const Fmt fmts[] = {Fmt::Mxfp4, Fmt::BF16, Fmt::Mxfp4, Fmt::Fp8Block, Fmt::F32, Fmt::Mxfp4, Fmt::BF16};
      const int64_t counts[] = {3, 0, 1, 17, 0, 2, 5};
      const int64_t G = 7;
      std::vector<TestWeight> ws;
      std::vector<const QuantWeight*> wp(G, nullptr);
      ws.reserve(G);
      for (int64_t g = 0; g < G; ++g) ws.push_back(make_weight(fmts[g], rows, cols, rng));
      for (int64_t g = 0; g < G; ++g)
        if (counts[g] > 0) wp[static_cast<size_t>(g)] = &ws[static_cast<size_t>(g)].q;
      std::vector<int64_t> off(G + 1, 0);
      for (int64_t g = 0; g < G; ++g) off[g + 1] = off[g] + counts[g];
      const int64_t n = off[G];
      const std::vector<float> x = rng.normals(n * cols);
      std::vector<float> yr(static_cast<size_t>(n * rows));
      ref_backend().grouped_matmul(wp.data(), G, off.data(), x.data(), yr.data());
      for (Cpu& c : cpus()) {
        std::vector<float> y(yr.size(), -7.0f);
        c.be->grouped_matmul(wp.data(), G, off.data(), x.data(), y.data());
        const double e = norm_err(y, yr);
        record(std::string("grouped_matmul/mixed/") + cpu_isa_name(c.isa), e);
        EXPECT_LE(e, kTolF32) << cpu_isa_name(c.isa) << " rows " << rows << " cols " << cols;
      }
      // Decode shape: one token, K experts of one row each.
      std::vector<int64_t> off1(G + 1, 0);
      for (int64_t g = 0; g < G; ++g) off1[g + 1] = off1[g] + (wp[static_cast<size_t>(g)] ? 1 : 0);
      const std::vector<float> x1 = rng.normals(off1[G] * cols);
      std::vector<float> y1r(static_cast<size_t>(off1[G] * rows));
      ref_backend().grouped_matmul(wp.data(), G, off1.data(), x1.data(), y1r.data());
      for (Cpu& c : cpus()) {
        std::vector<float> y(y1r.size());
        c.be->grouped_matmul(wp.data(), G, off1.data(), x1.data(), y.data());
        const double e = norm_err(y, y1r);
        record(std::string("grouped_matmul/decode/") + cpu_isa_name(c.isa), e);
        EXPECT_LE(e, kTolF32) << cpu_isa_name(c.isa);
      }
    }
  }
}

// Batch invariance (the engine's promise that a sequence's logits do not depend on what else is in the step):
// row m of a matmul computed in a batch of M rows, at any position in the batch, equals the same row computed
// alone (M = 1) bit for bit, for every weight format and ISA, with fp32 and with bf16-valued activations, and
// whatever the number of threads.
bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, sizeof(float) * static_cast<size_t>(n)) == 0;
}

TEST(CpuOps, MatmulBatchInvariance) {
  Rng rng(21);
  constexpr int64_t kMaxM = 130;
  for (Fmt f : kAllFmts) {
    const bool fp8 = f != Fmt::F32 && f != Fmt::BF16 && f != Fmt::F16 && f != Fmt::Mxfp4;
    for (int64_t cols : f == Fmt::Mxfp4 ? std::vector<int64_t>{96, 1088} : std::vector<int64_t>{33, 1031}) {
      const int64_t rows = 37;
      const TestWeight w = make_weight(f, rows, cols, rng, /*nan=*/fp8 || f == Fmt::Mxfp4);
      for (bool bf16_act : {false, true}) {
        std::vector<float> x = rng.normals(kMaxM * cols);
        if (bf16_act)
          for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
        for (CpuIsa isa : cpu_isas_available()) {
          const std::unique_ptr<Backend> one = make_cpu_backend(1, isa), three = make_cpu_backend(3, isa);
          std::vector<float> alone(static_cast<size_t>(kMaxM * rows));
          for (int64_t m = 0; m < kMaxM; ++m) one->matmul(w.q, x.data() + m * cols, 1, alone.data() + m * rows);
          const std::string what = std::string(fmt_name(f)) + " " + cpu_isa_name(isa) + " cols " +
                                   std::to_string(cols) + (bf16_act ? " bf16" : " f32");
          for (int64_t M : {1, 3, 4, 7, 16, 64, 130}) {
            for (int64_t at : {int64_t{0}, (kMaxM - M) / 2 + 1}) {  // the batch at the start / in the middle
              if (at + M > kMaxM || (at > 0 && M == kMaxM)) continue;
              for (Backend* be : {one.get(), three.get()}) {
                std::vector<float> y(static_cast<size_t>(M * rows), -1.0f);
                be->matmul(w.q, x.data() + at * cols, M, y.data());
                for (int64_t m = 0; m < M; ++m)
                  EXPECT_TRUE(same_bits(y.data() + m * rows, alone.data() + (at + m) * rows, rows))
                      << what << " M " << M << " row " << m << " at " << at << " threads " << be->num_threads();
              }
            }
          }
        }
      }
    }
  }
}

TEST(CpuOps, GroupedMatmulBatchInvariance) {  // a token's expert output does not depend on the group's other rows
  Rng rng(22);
  const int64_t rows = 37, cols = 1088;
  const Fmt fmts[] = {Fmt::Mxfp4, Fmt::BF16, Fmt::Fp8Block, Fmt::Mxfp4, Fmt::F32};
  const int64_t G = 5;
  std::vector<TestWeight> ws;
  ws.reserve(G);
  for (int64_t g = 0; g < G; ++g) ws.push_back(make_weight(fmts[g], rows, cols, rng));
  std::vector<const QuantWeight*> wp(G);
  for (int64_t g = 0; g < G; ++g) wp[static_cast<size_t>(g)] = &ws[static_cast<size_t>(g)].q;
  for (const std::vector<int64_t>& counts :
       {std::vector<int64_t>{1, 1, 1, 1, 1}, {3, 0, 7, 16, 1}, {64, 2, 0, 5, 66}}) {
    std::vector<int64_t> off(G + 1, 0);
    for (int64_t g = 0; g < G; ++g) off[g + 1] = off[g] + counts[static_cast<size_t>(g)];
    const int64_t n = off[G];
    const std::vector<float> x = rng.normals(n * cols);
    for (CpuIsa isa : cpu_isas_available()) {
      const std::unique_ptr<Backend> one = make_cpu_backend(1, isa), three = make_cpu_backend(3, isa);
      std::vector<float> alone(static_cast<size_t>(n * rows));
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = off[g]; i < off[g + 1]; ++i)
          one->matmul(*wp[static_cast<size_t>(g)], x.data() + i * cols, 1, alone.data() + i * rows);
      for (Backend* be : {one.get(), three.get()}) {
        std::vector<float> y(alone.size(), -1.0f);
        be->grouped_matmul(wp.data(), G, off.data(), x.data(), y.data());
        for (int64_t i = 0; i < n; ++i)
          EXPECT_TRUE(same_bits(y.data() + i * rows, alone.data() + i * rows, rows))
              << cpu_isa_name(isa) << " token " << i << " of " << n << " threads " << be->num_threads();
      }
    }
  }
}

TEST(CpuOps, Embedding) {  // dequantization is exact in every format
  Rng rng(5);
  for (Fmt f : kAllFmts) {
    const int64_t V = 41, D = f == Fmt::Mxfp4 ? 96 : 131;
    const TestWeight w = make_weight(f, V, D, rng);
    for (int64_t M : {1, 2, 17}) {
      std::vector<int32_t> ids(static_cast<size_t>(M));
      for (int32_t& i : ids) i = static_cast<int32_t>(rng.integer(0, V - 1));
      std::vector<float> yr(static_cast<size_t>(M * D));
      ref_backend().embedding(w.q, ids.data(), M, yr.data());
      for (Cpu& c : cpus()) {
        std::vector<float> y(yr.size());
        c.be->embedding(w.q, ids.data(), M, y.data());
        const double e = norm_err(y, yr);
        record(std::string("embedding/") + fmt_name(f) + "/" + cpu_isa_name(c.isa), e);
        EXPECT_EQ(e, 0.0) << fmt_name(f) << " " << cpu_isa_name(c.isa);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Norms / elementwise
// ---------------------------------------------------------------------------------------------------------------
TEST(CpuOps, RmsNorm) {
  Rng rng(6);
  for (bool bf16 : {false, true}) {
    for (int64_t D : {1, 7, 64, 1023, 4099}) {
      for (int64_t M : {1, 2, 5, 17}) {
        const std::vector<float> x = rng.normals(M * D, 3.0f), w = rng.normals(D);
        std::vector<float> yr(x.size());
        ref_backend().rms_norm(x.data(), w.data(), M, D, 1e-6f, yr.data(), bf16);
        for (Cpu& c : cpus()) {
          std::vector<float> y = x;  // in place (y aliases x)
          c.be->rms_norm(y.data(), w.data(), M, D, 1e-6f, y.data(), bf16);
          const double e = norm_err(y, yr);
          record(std::string("rms_norm/") + (bf16 ? "bf16/" : "f32/") + cpu_isa_name(c.isa), e);
          EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32) << cpu_isa_name(c.isa) << " D " << D << " M " << M;
        }
      }
    }
  }
}

TEST(CpuOps, LayerNorm) {
  Rng rng(7);
  for (bool bf16 : {false, true}) {
    const int64_t M = 5, D = 67;
    const std::vector<float> x = rng.normals(M * D, 2.0f), w = rng.normals(D), b = rng.normals(D);
    std::vector<float> yr(x.size());
    ref_backend().layer_norm(x.data(), w.data(), b.data(), M, D, 1e-6f, yr.data(), bf16);
    for (Cpu& c : cpus()) {
      std::vector<float> y(x.size());
      c.be->layer_norm(x.data(), w.data(), b.data(), M, D, 1e-6f, y.data(), bf16);
      const double e = norm_err(y, yr);
      record(std::string("layer_norm/") + (bf16 ? "bf16/" : "f32/") + cpu_isa_name(c.isa), e);
      EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32);
    }
  }
}

TEST(CpuOps, Rope) {
  Rng rng(8);
  for (bool interleaved : {true, false}) {
    for (bool bf16 : {false, true}) {
      for (int64_t dim : {2, 6, 16, 32, 64}) {
        std::vector<float> inv(static_cast<size_t>(dim / 2));
        for (int64_t i = 0; i < dim / 2; ++i)
          inv[static_cast<size_t>(i)] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / dim));
        RopeParams p;
        p.inv_freq = inv.data();
        p.dim = dim;
        p.attention_factor = 1.137f;
        p.interleaved = interleaved;
        for (int64_t heads : {1, 3, 8}) {
          for (int64_t n : {1, 5, 17}) {
            const int64_t head_stride = dim + 3, token_stride = heads * head_stride + 5;
            std::vector<int64_t> pos(static_cast<size_t>(n));
            for (int64_t& q : pos) q = rng.integer(0, 70000);
            const std::vector<float> x0 = rng.normals(n * token_stride);
            std::vector<float> xr = x0;
            ref_backend().rope(xr.data(), n, heads, token_stride, head_stride, pos.data(), p, bf16);
            for (Cpu& c : cpus()) {
              std::vector<float> x = x0;
              c.be->rope(x.data(), n, heads, token_stride, head_stride, pos.data(), p, bf16);
              const double e = norm_err(x, xr);
              record(std::string("rope/") + (interleaved ? "interleaved/" : "half/") + (bf16 ? "bf16/" : "f32/") +
                         cpu_isa_name(c.isa),
                     e);
              EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32) << cpu_isa_name(c.isa) << " dim " << dim;
            }
          }
        }
      }
    }
  }
}

TEST(CpuOps, Elementwise) {
  Rng rng(9);
  for (bool bf16 : {false, true}) {
    for (int64_t n : {1, 7, 33, 1000, 4099, 70001}) {
      std::vector<float> g = rng.normals(n, 4.0f), u = rng.normals(n);
      if (n >= 7) {  // both sides of the exp range
        g[0] = -100.0f;
        g[1] = 95.0f;
      }
      std::vector<float> sr(static_cast<size_t>(n)), ar = u, rr = g;
      ref_backend().silu_mul(g.data(), u.data(), n, sr.data(), bf16);
      ref_backend().add(ar.data(), g.data(), n, bf16);
      ref_backend().round_bf16(rr.data(), n);
      for (Cpu& c : cpus()) {
        const std::string tag = std::string(bf16 ? "bf16/" : "f32/") + cpu_isa_name(c.isa);
        std::vector<float> s = g;  // out aliases gate
        c.be->silu_mul(s.data(), u.data(), n, s.data(), bf16);
        double e = norm_err(s, sr);
        record("silu_mul/" + tag, e);
        EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32) << tag << " n " << n;
        std::vector<float> a = u;
        c.be->add(a.data(), g.data(), n, bf16);
        e = norm_err(a, ar);
        record("add/" + tag, e);
        EXPECT_EQ(e, 0.0) << tag;
        std::vector<float> r = g;
        c.be->round_bf16(r.data(), n);
        EXPECT_EQ(norm_err(r, rr), 0.0) << tag;
      }
    }
  }
  // NaN stays NaN through bf16 rounding.
  for (Cpu& c : cpus()) {
    std::vector<float> v(9, std::numeric_limits<float>::quiet_NaN());
    v[3] = 1.0f;
    c.be->round_bf16(v.data(), 9);
    EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[8]));
    EXPECT_EQ(v[3], 1.0f);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// MLA attention
// ---------------------------------------------------------------------------------------------------------------
struct AttnCase {
  int64_t H, dn, dr, dv, dc, S, past;
  bool use_sel;
};

struct Selection {
  std::vector<int32_t> sel, count;
  int64_t stride = 0;
  KeySelection view() const {
    KeySelection k;
    if (stride > 0) {
      k.sel = sel.data();
      k.count = count.data();
      k.stride = stride;
    }
    return k;
  }
};

Selection random_selection(Rng& rng, int64_t S, int64_t T, const std::vector<int64_t>& pos) {
  Selection s;
  s.stride = 7;
  s.sel.resize(static_cast<size_t>(S * s.stride));
  s.count.resize(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    s.count[static_cast<size_t>(i)] = static_cast<int32_t>(rng.integer(0, s.stride));
    for (int64_t j = 0; j < s.stride; ++j)  // duplicates, -1 and keys beyond q_pos are allowed (ignored)
      s.sel[static_cast<size_t>(i * s.stride + j)] =
          static_cast<int32_t>(rng.integer(-1, std::min<int64_t>(T - 1, pos[static_cast<size_t>(i)] + 2)));
  }
  return s;
}

const AttnCase kAttnCases[] = {
    {1, 16, 8, 16, 32, 1, 0, false},  {3, 24, 16, 20, 96, 2, 3, false}, {8, 64, 32, 64, 256, 1, 40, false},
    {4, 32, 16, 24, 64, 5, 11, true}, {3, 24, 8, 20, 160, 17, 0, false}, {2, 16, 16, 16, 32, 17, 30, true},
    {5, 40, 8, 33, 96, 1, 200, true},
};

TEST(CpuOps, MlaAttentionNaive) {
  Rng rng(10);
  for (bool bf16 : {false, true}) {
    for (const AttnCase& a : kAttnCases) {
      const int64_t T = a.past + a.S, dqk = a.dn + a.dr;
      MlaDims d{a.H, a.dn, a.dr, a.dv, a.dc};
      const std::vector<float> q = rng.normals(a.S * a.H * dqk), kvb = rng.normals(T * a.H * (a.dn + a.dv)),
                               kpe = rng.normals(T * a.dr);
      std::vector<int64_t> pos(static_cast<size_t>(a.S));
      for (int64_t s = 0; s < a.S; ++s) pos[static_cast<size_t>(s)] = a.past + s;
      const Selection sel = a.use_sel ? random_selection(rng, a.S, T, pos) : Selection{};
      const float scale = 1.0f / std::sqrt(static_cast<float>(dqk));
      std::vector<float> orf(static_cast<size_t>(a.S * a.H * a.dv));
      ref_backend().mla_attention_naive(d, q.data(), kvb.data(), kpe.data(), a.S, T, pos.data(), sel.view(), scale,
                                        orf.data(), bf16);
      for (Cpu& c : cpus()) {
        std::vector<float> o(orf.size(), -3.0f);
        c.be->mla_attention_naive(d, q.data(), kvb.data(), kpe.data(), a.S, T, pos.data(), sel.view(), scale,
                                  o.data(), bf16);
        const double e = norm_err(o, orf);
        record(std::string("mla_naive/") + (bf16 ? "bf16/" : "f32/") + cpu_isa_name(c.isa), e);
        EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32) << cpu_isa_name(c.isa) << " H " << a.H << " S " << a.S;
      }
    }
  }
}

// The flash-style naive attention over several query blocks and key tiles: chunk offsets (past keys), causal
// diagonals inside tiles, odd head sizes (dv not a multiple of 8), DSA selections whose union spans many tiles
// (stride 48, keys anywhere in the causal range, duplicates and -1 ignored), queries with no key at all.
TEST(CpuOps, MlaAttentionNaiveFlashTiles) {
  struct Case {
    int64_t H, dn, dr, dv, S, past, stride;
  };
  const Case cases[] = {{3, 24, 8, 20, 70, 45, 0},  {2, 64, 64, 64, 100, 0, 0}, {4, 16, 16, 33, 40, 90, 48},
                        {1, 8, 8, 7, 33, 1, 0},     {2, 40, 24, 64, 65, 31, 48}, {16, 64, 64, 64, 37, 200, 0}};
  Rng rng(21);
  for (bool bf16 : {false, true}) {
    for (const Case& a : cases) {
      const int64_t T = a.past + a.S, dqk = a.dn + a.dr;
      MlaDims d{a.H, a.dn, a.dr, a.dv, 64};
      const std::vector<float> q = rng.normals(a.S * a.H * dqk), kvb = rng.normals(T * a.H * (a.dn + a.dv)),
                               kpe = rng.normals(T * a.dr);
      std::vector<int64_t> pos(static_cast<size_t>(a.S));
      for (int64_t s = 0; s < a.S; ++s) pos[static_cast<size_t>(s)] = a.past + s;
      if (a.S > 3) pos[2] = -1;  // a query that sees no key
      Selection sel;
      if (a.stride > 0) {
        sel.stride = a.stride;
        sel.sel.resize(static_cast<size_t>(a.S * a.stride));
        sel.count.resize(static_cast<size_t>(a.S));
        for (int64_t i = 0; i < a.S; ++i) {
          sel.count[static_cast<size_t>(i)] = static_cast<int32_t>(rng.integer(i % 5 == 0 ? 0 : 1, a.stride));
          for (int64_t j = 0; j < a.stride; ++j)
            sel.sel[static_cast<size_t>(i * a.stride + j)] =
                static_cast<int32_t>(rng.integer(-1, std::max<int64_t>(0, pos[static_cast<size_t>(i)])));
        }
      }
      const float scale = 1.5f / std::sqrt(static_cast<float>(dqk));  // peaked softmax: the running max moves
      std::vector<float> orf(static_cast<size_t>(a.S * a.H * a.dv));
      ref_backend().mla_attention_naive(d, q.data(), kvb.data(), kpe.data(), a.S, T, pos.data(), sel.view(), scale,
                                        orf.data(), bf16);
      for (Cpu& c : cpus()) {
        std::vector<float> o(orf.size(), -3.0f);
        c.be->mla_attention_naive(d, q.data(), kvb.data(), kpe.data(), a.S, T, pos.data(), sel.view(), scale,
                                  o.data(), bf16);
        const double e = norm_err(o, orf);
        record(std::string("mla_naive_tiles/") + (bf16 ? "bf16/" : "f32/") + cpu_isa_name(c.isa), e);
        EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32) << cpu_isa_name(c.isa) << " H " << a.H << " S " << a.S;
        if (a.S > 3) {
          for (int64_t x = 0; x < a.H * a.dv; ++x) EXPECT_EQ(o[static_cast<size_t>(2 * a.H * a.dv + x)], 0.0f);
        }
      }
    }
  }
}

TEST(CpuOps, MlaAttentionAbsorbed) {
  Rng rng(11);
  for (Fmt f : {Fmt::F32, Fmt::BF16, Fmt::Fp8Block, Fmt::Fp8BlockOdd, Fmt::Mxfp4}) {
    for (bool bf16 : {false, true}) {
      for (const AttnCase& a : kAttnCases) {
        if (f == Fmt::Mxfp4 && a.dc % 32 != 0) continue;
        const int64_t T = a.past + a.S, dqk = a.dn + a.dr;
        MlaDims d{a.H, a.dn, a.dr, a.dv, a.dc};
        const TestWeight kvb = make_weight(f, a.H * (a.dn + a.dv), a.dc, rng);
        const std::vector<float> q = rng.normals(a.S * a.H * dqk), c = rng.normals(T * a.dc),
                                 kpe = rng.normals(T * a.dr);
        std::vector<int64_t> pos(static_cast<size_t>(a.S));
        for (int64_t s = 0; s < a.S; ++s) pos[static_cast<size_t>(s)] = a.past + s;
        const Selection sel = a.use_sel ? random_selection(rng, a.S, T, pos) : Selection{};
        const float scale = 0.3f / std::sqrt(static_cast<float>(dqk));
        std::vector<float> orf(static_cast<size_t>(a.S * a.H * a.dv));
        ref_backend().mla_attention_absorbed(d, q.data(), kvb.q, c.data(), kpe.data(), a.S, T, pos.data(),
                                             sel.view(), scale, orf.data(), bf16);
        for (Cpu& cb : cpus()) {
          std::vector<float> o(orf.size(), -3.0f);
          cb.be->mla_attention_absorbed(d, q.data(), kvb.q, c.data(), kpe.data(), a.S, T, pos.data(), sel.view(),
                                        scale, o.data(), bf16);
          const double e = norm_err(o, orf);
          record(std::string("mla_absorbed/") + fmt_name(f) + (bf16 ? "/bf16/" : "/f32/") + cpu_isa_name(cb.isa),
                 e);
          EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32)
              << fmt_name(f) << " " << cpu_isa_name(cb.isa) << " H " << a.H << " S " << a.S;
        }
      }
    }
  }
}

// The absorbed attention straight over a paged pool (no gather): sequences with their own block tables (blocks
// shuffled, 5 tokens per block, rows wider than dc + dr), decode tokens and a multi-token chunk in one run that
// starts at row 2 of q / o (rows before it untouched), fp32 and bf16 pools, with and without a DSA selection,
// blocks of 5 and of 16 tokens.
TEST(CpuOps, MlaAttentionAbsorbedPaged) {
  Rng rng(22);
  for (Fmt f : {Fmt::F32, Fmt::BF16, Fmt::Mxfp4}) {
    for (bool bf16 : {false, true}) {
      for (int64_t sel_bt = 0; sel_bt < 4; ++sel_bt) {
        const bool use_sel = sel_bt & 1;
        const int64_t bt = sel_bt & 2 ? 16 : 5;  // 16: whole key tiles inside one block (value rows read in place)
        const int64_t H = 5, dn = 24, dr = 16, dv = 20, dc = 64, dqk = dn + dr, width = dc + dr + 3;
        MlaDims d{H, dn, dr, dv, dc};
        const std::vector<int32_t> q_begin = {2, 3, 7, 8, 9}, ctx = {23, 17, 1, 40};
        const int64_t n_seqs = 4, rows = 9, max_blocks = 8, n_blocks = n_seqs * max_blocks;
        std::vector<int32_t> table(static_cast<size_t>(n_blocks));
        for (int64_t i = 0; i < n_blocks; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(i);
        std::shuffle(table.begin(), table.end(), rng.g);
        std::vector<float> pool_f = rng.normals(n_blocks * bt * width);
        std::vector<uint16_t> pool_b(pool_f.size());
        for (size_t i = 0; i < pool_f.size(); ++i) pool_b[i] = f32_to_bf16(pool_f[i]);
        KvPool pool;
        pool.dtype = bf16 ? DType::BF16 : DType::F32;
        pool.data = bf16 ? static_cast<void*>(pool_b.data()) : static_cast<void*>(pool_f.data());
        pool.num_blocks = n_blocks;
        pool.block_tokens = bt;
        pool.width = width;
        StepSeqs seqs;
        seqs.n_seqs = n_seqs;
        seqs.q_begin = q_begin.data();
        seqs.ctx_len = ctx.data();
        seqs.block_table = table.data();
        seqs.max_blocks = max_blocks;
        seqs.max_ctx = 40;
        std::vector<int64_t> pos(static_cast<size_t>(rows), 0);
        for (int64_t s = 0; s < n_seqs; ++s)
          for (int32_t r = q_begin[static_cast<size_t>(s)]; r < q_begin[static_cast<size_t>(s + 1)]; ++r)
            pos[static_cast<size_t>(r)] = ctx[static_cast<size_t>(s)] - (q_begin[static_cast<size_t>(s + 1)] - r);
        const Selection sel = use_sel ? random_selection(rng, rows, 40, pos) : Selection{};
        const TestWeight kvb = make_weight(f, H * (dn + dv), dc, rng);
        const std::vector<float> q = rng.normals(rows * H * dqk);
        const float scale = 0.5f / std::sqrt(static_cast<float>(dqk));
        std::vector<float> orf(static_cast<size_t>(rows * H * dv), -3.0f);
        ref_backend().mla_attention_absorbed_paged(d, q.data(), kvb.q, pool, seqs, pos.data(), sel.view(), scale,
                                                   orf.data(), bf16);
        for (Cpu& c : cpus()) {
          std::vector<float> o(orf.size(), -3.0f);
          c.be->mla_attention_absorbed_paged(d, q.data(), kvb.q, pool, seqs, pos.data(), sel.view(), scale,
                                             o.data(), bf16);
          const double e = norm_err(o, orf);
          record(std::string("mla_absorbed_paged/") + fmt_name(f) + (bf16 ? "/bf16/" : "/f32/") +
                     cpu_isa_name(c.isa),
                 e);
          EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32) << fmt_name(f) << " " << cpu_isa_name(c.isa) << " sel " << use_sel;
          for (int64_t x = 0; x < 2 * H * dv; ++x) EXPECT_EQ(o[static_cast<size_t>(x)], -3.0f);
        }
      }
    }
  }
}

TEST(CpuOps, IndexerScoresAndTopk) {
  Rng rng(12);
  for (int64_t nI : {1, 8}) {
    for (int64_t dI : {32, 64, 72}) {
      for (int64_t S : {1, 3, 17}) {
        const int64_t T = S + 29;
        const std::vector<float> q = rng.normals(S * nI * dI), w = rng.normals(S * nI), k = rng.normals(T * dI);
        std::vector<int64_t> pos(static_cast<size_t>(S));
        for (int64_t s = 0; s < S; ++s) pos[static_cast<size_t>(s)] = T - S + s;
        const float scale = 1.0f / std::sqrt(static_cast<float>(dI));
        std::vector<float> sr(static_cast<size_t>(S * T));
        ref_backend().indexer_scores(q.data(), w.data(), k.data(), S, T, nI, dI, scale, pos.data(), sr.data());
        const int64_t kk = 9;
        std::vector<int32_t> selr(static_cast<size_t>(S * kk)), cntr(static_cast<size_t>(S));
        ref_backend().topk_select(sr.data(), S, T, kk, pos.data(), selr.data(), cntr.data());
        for (Cpu& c : cpus()) {
          std::vector<float> sc(sr.size());
          c.be->indexer_scores(q.data(), w.data(), k.data(), S, T, nI, dI, scale, pos.data(), sc.data());
          const double e = norm_err(sc, sr);
          record(std::string("indexer_scores/") + cpu_isa_name(c.isa), e);
          EXPECT_LE(e, kTolF32) << cpu_isa_name(c.isa);
          std::vector<int32_t> sel(selr.size()), cnt(cntr.size());
          c.be->topk_select(sr.data(), S, T, kk, pos.data(), sel.data(), cnt.data());
          EXPECT_EQ(sel, selr);
          EXPECT_EQ(cnt, cntr);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// MoE
// ---------------------------------------------------------------------------------------------------------------
TEST(CpuOps, Router) {
  Rng rng(13);
  struct Case {
    int64_t E, G, TG, K;
    bool norm;
  };
  const Case cases[] = {{16, 1, 1, 4, true}, {8, 4, 2, 2, true}, {64, 8, 4, 6, false}, {256, 8, 4, 8, true},
                        {7, 1, 1, 7, true},  {6, 3, 2, 3, false}};
  for (const Case& cs : cases) {
    for (bool with_bias : {false, true}) {
      for (int64_t M : {1, 5, 17}) {
        RouterParams p;
        p.n_experts = cs.E;
        p.n_group = cs.G;
        p.topk_group = cs.TG;
        p.top_k = cs.K;
        p.norm_topk_prob = cs.norm;
        p.routed_scaling_factor = 2.5f;
        std::vector<float> logits = rng.normals(M * cs.E, 2.0f), bias = rng.normals(cs.E, 0.05f);
        if (M > 1) logits[1] = logits[0];  // exact tie
        std::vector<int32_t> idr(static_cast<size_t>(M * cs.K));
        std::vector<float> wr(idr.size());
        ref_backend().router(logits.data(), with_bias ? bias.data() : nullptr, M, p, idr.data(), wr.data());
        for (Cpu& c : cpus()) {
          std::vector<int32_t> id(idr.size(), -1);
          std::vector<float> wv(wr.size());
          c.be->router(logits.data(), with_bias ? bias.data() : nullptr, M, p, id.data(), wv.data());
          EXPECT_EQ(id, idr) << cpu_isa_name(c.isa) << " E " << cs.E;
          const double e = norm_err(wv, wr);
          record(std::string("router/") + cpu_isa_name(c.isa), e);
          EXPECT_LE(e, kTolF32);
        }
      }
    }
  }
}

TEST(CpuOps, ScatterAddWeighted) {
  Rng rng(14);
  for (bool bf16 : {false, true}) {
    for (int64_t D : {1, 7, 1030}) {
      for (int64_t n : {1, 5, 40}) {
        const int64_t rows = 6;
        const std::vector<float> x = rng.normals(n * D), w = rng.normals(n);
        std::vector<int32_t> tok(static_cast<size_t>(n));
        for (int32_t& t : tok) t = static_cast<int32_t>(rng.integer(0, rows - 1));
        std::vector<float> yr = rng.normals(rows * D);
        if (bf16) ref_backend().round_bf16(yr.data(), rows * D);
        const std::vector<float> y0 = yr;
        ref_backend().scatter_add_weighted(x.data(), tok.data(), w.data(), n, D, yr.data(), bf16);
        for (Cpu& c : cpus()) {
          std::vector<float> y = y0;
          c.be->scatter_add_weighted(x.data(), tok.data(), w.data(), n, D, y.data(), bf16);
          const double e = norm_err(y, yr);
          record(std::string("scatter_add/") + (bf16 ? "bf16/" : "f32/") + cpu_isa_name(c.isa), e);
          EXPECT_EQ(e, 0.0) << cpu_isa_name(c.isa);
        }
      }
    }
  }
}

TEST(CpuOps, RegistryName) {
  auto b = make_backend("cpu", 1);
  ASSERT_TRUE(b);
  EXPECT_STREQ(b->name(), "cpu");
}

}  // namespace
}  // namespace latent
