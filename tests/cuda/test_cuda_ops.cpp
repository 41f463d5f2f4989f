// Op harness of the CUDA backend: every op against the scalar ref backend on fresh random inputs (odd sizes that are
// not multiples of 32/128, M = 1 and large, every stored weight format, both activation modes). Inputs are uploaded,
// outputs poisoned (NaN bytes) before each run and downloaded after. Errors are normalized, max|gpu − ref| /
// max|ref|: fp32 mode ≤ 1e-5, bf16 mode ≤ 1e-2; a NaN or Inf on one side only never passes; index outputs (router,
// top-k, expert grouping) and exact ops (embedding, add, scatter, data movement) must be identical.
// Needs a GPU: built when CUDA is, not registered with ctest; scripts/gpu_test runs it on the GPU machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../runtime/truncated_softmax.h"
#include "backend/backend.h"
#include "backend/sample_reference.h"
#include "core/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "quant/float_formats.h"

namespace latent {
namespace {

constexpr double kTolF32 = 1e-5;
constexpr double kTolBf16 = 1e-2;

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
    std::printf("\n[cuda op harness] max normalized error |cuda-ref|/max|ref| (op / case):\n");
    for (const auto& [k, v] : summary()) std::printf("  %-52s %.3g\n", k.c_str(), v);
  }
};
const auto* const g_env = ::testing::AddGlobalTestEnvironment(new SummaryEnv);

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
  return den == 0.0 ? num : num / den;
}
double norm_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  return norm_err(a.data(), b.data(), static_cast<int64_t>(std::min(a.size(), b.size())));
}
// Bitwise-equal floats (NaN equal to NaN).
bool same(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

Backend& ref() {
  static std::unique_ptr<Backend> r = make_ref_backend(2);
  return *r;
}
Backend& gpu() {
  static std::unique_ptr<Backend> g = make_backend("cuda", 1);
  return *g;
}

// Device buffers of one test case, freed at scope end.
class Dev {
 public:
  ~Dev() {
    for (void* p : ptrs_) gpu().dealloc(p);
  }
  template <class T>
  T* up(const std::vector<T>& v) {
    T* p = raw<T>(v.size());
    gpu().upload(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  template <class T>
  T* out(size_t n) {  // poisoned: every byte 0xFF (NaN floats, -1 ints)
    T* p = raw<T>(n);
    const std::vector<uint8_t> junk(std::max<size_t>(1, n * sizeof(T)), 0xFF);
    gpu().upload(p, junk.data(), n * sizeof(T));
    return p;
  }
  template <class T>
  static std::vector<T> down(const T* p, size_t n) {
    std::vector<T> v(n);
    gpu().download(v.data(), p, n * sizeof(T));
    return v;
  }

 private:
  template <class T>
  T* raw(size_t n) {
    void* p = gpu().alloc(std::max<size_t>(1, n * sizeof(T)), "test buffer");
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  std::vector<void*> ptrs_;
};

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
std::vector<float> bf16_values(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Random weights in every stored format (host copies misaligned by one byte; the GPU gets them via prepare_weight)
// ---------------------------------------------------------------------------------------------------------------
enum class Fmt { F32, BF16, F16, Fp8Block, Fp8BlockOdd, Fp8BlockFnuz, Fp8Tensor, Fp8Channel, Mxfp4 };
constexpr Fmt kAllFmts[] = {Fmt::F32,          Fmt::BF16,         Fmt::F16,       Fmt::Fp8Block, Fmt::Fp8BlockOdd,
                            Fmt::Fp8BlockFnuz, Fmt::Fp8Tensor,    Fmt::Fp8Channel, Fmt::Mxfp4};
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
  QuantWeight q;  // host view (for ref)
  QuantWeight d;  // device copy (for the GPU)
};

uint8_t random_fp8(Rng& r, bool fnuz) {
  for (;;) {
    const uint8_t c = static_cast<uint8_t>(r.integer(0, 255));
    if (fnuz ? c != 0x80 : (c & 0x7F) != 0x7F) return c;
  }
}

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
      if (nan && rows * cols > 0)
        for (int k = 0; k < 3; ++k) {
          const int64_t i = r.integer(0, rows * cols - 1);
          t.data[static_cast<size_t>(1 + i)] = q.fnuz ? 0x80 : (r.integer(0, 1) ? 0x7F : 0xFF);
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
      if (nan && t.scale.size() > 1)
        t.scale[static_cast<size_t>(r.integer(1, static_cast<int64_t>(t.scale.size()) - 1))] = 0xFF;
      break;
    }
  }
  q.data = t.data.data() + 1;
  q.scale = t.scale.empty() ? nullptr : t.scale.data() + 1;
  t.d = gpu().prepare_weight(q);
  return t;
}

std::vector<int64_t> cols_for(Fmt f) {  // odd sizes (element-wise path) and aligned ones (16-byte vector path)
  if (f == Fmt::Mxfp4) return {32, 96, 160, 1024, 4096 + 32};
  return {1, 7, 33, 95, 161, 128, 1024, 4099, 4096 + 128};
}

std::vector<float> run_matmul(const QuantWeight& w, const std::vector<float>& x, int64_t M) {
  Dev dv;
  const float* xd = dv.up(x);
  float* yd = dv.out<float>(static_cast<size_t>(M * w.rows));
  gpu().matmul(w, xd, M, yd);
  return Dev::down(yd, static_cast<size_t>(M * w.rows));
}

// ---------------------------------------------------------------------------------------------------------------
// Memory and registry
// ---------------------------------------------------------------------------------------------------------------
TEST(CudaOps, Registry) {
  EXPECT_STREQ(gpu().name(), "cuda");
  EXPECT_EQ(gpu().device(), Device::Cuda);
  const auto names = backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "cuda"), names.end());
}

TEST(CudaOps, MemoryOps) {
  Rng rng(100);
  const std::vector<float> a = rng.normals(1000);
  Dev dv;
  float* d1 = dv.up(a);
  float* d2 = dv.out<float>(1000);
  gpu().copy(d2, d1, 1000 * sizeof(float));
  gpu().sync();
  EXPECT_TRUE(same(Dev::down(d2, 1000), a));
  // Out of memory names what did not fit.
  try {
    gpu().alloc(size_t{1} << 50, "a 1-PiB test buffer");
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("a 1-PiB test buffer"), std::string::npos) << m;
    EXPECT_NE(m.find("free"), std::string::npos) << m;
  }
  // The device still works after the failed allocation.
  float* d3 = dv.up(a);
  EXPECT_TRUE(same(Dev::down(d3, 1000), a));
}

// ---------------------------------------------------------------------------------------------------------------
// Linear
// ---------------------------------------------------------------------------------------------------------------
TEST(CudaOps, Matmul) {
  Rng rng(1);
  for (Fmt f : kAllFmts) {
    for (int64_t rows : {1, 3, 37, 129}) {
      for (int64_t cols : cols_for(f)) {
        if (cols > 4000 && rows > 37) continue;
        const TestWeight w = make_weight(f, rows, cols, rng);
        for (int64_t M : {1, 2, 5, 16, 17}) {
          const std::vector<float> x = rng.normals(M * cols);
          std::vector<float> yr(static_cast<size_t>(M * rows));
          ref().matmul(w.q, x.data(), M, yr.data());
          const double e = norm_err(run_matmul(w.d, x, M), yr);
          record(std::string("matmul/") + fmt_name(f) + (M <= 16 ? "/M<=16" : "/M>16"), e);
          EXPECT_LE(e, kTolF32) << fmt_name(f) << " rows " << rows << " cols " << cols << " M " << M;
        }
      }
    }
  }
}

TEST(CudaOps, MatmulLargeBatch) {  // prefill-sized M: several m tiles, row tiles with a ragged edge
  Rng rng(2);
  for (Fmt f : kAllFmts) {
    const int64_t rows = 301, cols = f == Fmt::Mxfp4 ? 1088 : 1031;
    const TestWeight w = make_weight(f, rows, cols, rng);
    for (int64_t M : {45, 130}) {
      const std::vector<float> x = rng.normals(M * cols);
      std::vector<float> yr(static_cast<size_t>(M * rows));
      ref().matmul(w.q, x.data(), M, yr.data());
      const double e = norm_err(run_matmul(w.d, x, M), yr);
      record(std::string("matmul_large/") + fmt_name(f), e);
      EXPECT_LE(e, kTolF32) << fmt_name(f) << " M " << M;
    }
  }
}

// The bf16 activation mode's matmul (cuBLASLt from cuda_lt_min_rows() rows): bf16 x, every weight format, odd N
// and K (K padded to a multiple of 8 in the bf16 operands), M from 17 to 257. BF16 and MXFP4 weights are exact in
// bf16, so only the fp32 summation order differs from the ref (≤ 1e-3, measured ~1e-6); FP8 weights are rounded to
// bf16 once (relative 2^-9; ≤ the bf16 tolerance 1e-2); F32/F16 weights and M ≤ 16 keep the exact kernels (1e-5).
// The cuBLASLt call counter proves which path ran.
// The tensor-core kernel's dispatch on for one test (the default; a test may turn it off), then as before.
struct TcOn {
  bool was = cuda_tc_dispatch(gpu());
  TcOn() { cuda_set_tc_dispatch(gpu(), true); }
  ~TcOn() { cuda_set_tc_dispatch(gpu(), was); }
};

TEST(CudaOps, MatmulBf16Lt) {
  Rng rng(21);
  ASSERT_GE(cuda_lt_matmuls(gpu()), 0);
  const TcOn tc_on;
  struct Shape {
    int64_t rows, cols;
    std::vector<int64_t> ms;
  };
  for (Fmt f : kAllFmts) {
    // cuBLASLt only for weights that are exactly bf16 values (BF16, MXFP4); FP8 takes the own tensor-core kernel
    // (raw e4m3 codes, scales on the fp32 partial sums) when its scale blocks are multiples of 16 × 32, else (and
    // F32 / F16 always) the exact kernels.
    const bool lt = f == Fmt::BF16 || f == Fmt::Mxfp4, exact_products = lt;
    const bool tc = f == Fmt::Fp8Block || f == Fmt::Fp8BlockFnuz || f == Fmt::Fp8Tensor || f == Fmt::Fp8Channel;
    const bool mx = f == Fmt::Mxfp4;
    const Shape shapes[] = {{37, mx ? 160 : 33, {16, 17, 33, 64, 100, 257}},
                            {301, mx ? 1088 : 1031, {17, 100, 257}},
                            {129, mx ? 4128 : 4099, {33, 64}},
                            {64, mx ? 512 : 520, {64}}};  // K % 8 == 0: a BF16 weight is used in place
    for (const Shape& sh : shapes) {
      const TestWeight w = make_weight(f, sh.rows, sh.cols, rng);
      for (int64_t M : sh.ms) {
        const std::vector<float> x = bf16_values(rng.normals(M * sh.cols));
        std::vector<float> yr(static_cast<size_t>(M * sh.rows));
        ref().matmul(w.q, x.data(), M, yr.data());
        Dev dv;
        const float* xd = dv.up(x);
        float* yd = dv.out<float>(yr.size());
        const int64_t calls0 = cuda_lt_matmuls(gpu()), tc0 = cuda_tc_matmuls(gpu());
        gpu().matmul_bf16(w.d, xd, M, yd);
        const std::vector<float> y = Dev::down(yd, yr.size());
        const bool took_lt = cuda_lt_matmuls(gpu()) > calls0, took_tc = cuda_tc_matmuls(gpu()) > tc0;
        const bool want_lt = lt && M >= cuda_lt_min_rows(), want_tc = tc && M >= cuda_lt_min_rows();
        EXPECT_EQ(took_lt, want_lt) << fmt_name(f) << " rows " << sh.rows << " cols " << sh.cols << " M " << M;
        EXPECT_EQ(took_tc, want_tc) << fmt_name(f) << " rows " << sh.rows << " cols " << sh.cols << " M " << M;
        const double e = norm_err(y, yr);
        // Exact products (bf16 x times bf16 values or e4m3 codes), fp32 tensor-core accumulation.
        const double tol = want_tc ? 1e-3 : !want_lt ? kTolF32 : exact_products ? 1e-3 : kTolBf16;
        record(std::string("matmul_bf16/") + fmt_name(f) + (want_lt ? "/cublaslt" : want_tc ? "/tensor-core" : "/exact"),
               e);
        EXPECT_LE(e, tol) << fmt_name(f) << " rows " << sh.rows << " cols " << sh.cols << " M " << M;
        // The fp32 mode's matmul never takes the bf16 path.
        if (M == 17 || M == 64) {
          const int64_t c1 = cuda_lt_matmuls(gpu());
          const double e32 = norm_err(run_matmul(w.d, x, M), yr);
          EXPECT_EQ(cuda_lt_matmuls(gpu()), c1) << fmt_name(f);
          EXPECT_LE(e32, kTolF32) << fmt_name(f) << " fp32 path, M " << M;
        }
      }
    }
  }
  // A bigger prefill shape through every scratch size change (x and weight scratch grow, then are reused).
  // Off: FP8 takes the exact kernels.
  {
    cuda_set_tc_dispatch(gpu(), false);
    const TestWeight w = make_weight(Fmt::Fp8Block, 300, 520, rng);
    const std::vector<float> x = bf16_values(rng.normals(64 * 520));
    std::vector<float> yr(static_cast<size_t>(64 * 300));
    ref().matmul(w.q, x.data(), 64, yr.data());
    Dev dv;
    float* yd = dv.out<float>(yr.size());
    const int64_t tc0 = cuda_tc_matmuls(gpu());
    gpu().matmul_bf16(w.d, dv.up(x), 64, yd);
    EXPECT_EQ(cuda_tc_matmuls(gpu()), tc0);
    EXPECT_LE(norm_err(Dev::down(yd, yr.size()), yr), kTolF32);
    cuda_set_tc_dispatch(gpu(), true);
  }
  for (Fmt f : {Fmt::BF16, Fmt::Fp8Block, Fmt::Mxfp4}) {
    const int64_t rows = 1000, cols = f == Fmt::Mxfp4 ? 2048 : 2056, M = 300;
    const TestWeight w = make_weight(f, rows, cols, rng);
    const std::vector<float> x = bf16_values(rng.normals(M * cols));
    std::vector<float> yr(static_cast<size_t>(M * rows));
    ref().matmul(w.q, x.data(), M, yr.data());
    for (int rep = 0; rep < 2; ++rep) {
      Dev dv;
      float* yd = dv.out<float>(yr.size());
      gpu().matmul_bf16(w.d, dv.up(x), M, yd);
      const double e = norm_err(Dev::down(yd, yr.size()), yr);
      record(std::string("matmul_bf16/") + fmt_name(f) + (f == Fmt::Fp8Block ? "/tensor-core" : "/cublaslt"), e);
      EXPECT_LE(e, 1e-3) << fmt_name(f) << " rep " << rep;
    }
  }
}

TEST(CudaOps, MatmulNaNCodes) {  // NaN fp8 codes and NaN e8m0 scales propagate exactly where ref puts them
  Rng rng(3);
  for (Fmt f : {Fmt::Fp8Block, Fmt::Fp8BlockFnuz, Fmt::Fp8Tensor, Fmt::Mxfp4}) {
    for (int64_t cols : {f == Fmt::Mxfp4 ? int64_t{160} : int64_t{161}, int64_t{1024}}) {
      const int64_t rows = 37;
      const TestWeight w = make_weight(f, rows, cols, rng, /*nan=*/true);
      for (int64_t M : {1, 5, 40}) {
        const std::vector<float> x = rng.normals(M * cols);
        std::vector<float> yr(static_cast<size_t>(M * rows));
        ref().matmul(w.q, x.data(), M, yr.data());
        EXPECT_LE(norm_err(run_matmul(w.d, x, M), yr), kTolF32) << fmt_name(f) << " M " << M;
      }
    }
  }
}

TEST(CudaOps, GroupedMatmul) {
  Rng rng(4);
  for (int64_t cols : {160, 1024, 4096 + 32}) {
    for (int64_t rows : {37, 129}) {
      const Fmt fmts[] = {Fmt::Mxfp4, Fmt::BF16, Fmt::Mxfp4, Fmt::Fp8Block, Fmt::F32, Fmt::Mxfp4, Fmt::BF16, Fmt::Fp8Channel};
      const int64_t counts[] = {3, 0, 1, 17, 0, 2, 40, 16};
      const int64_t G = 8;
      std::vector<TestWeight> ws;
      ws.reserve(G);
      for (int64_t g = 0; g < G; ++g) ws.push_back(make_weight(fmts[g], rows, cols, rng));
      for (int pass = 0; pass < 2; ++pass) {  // pass 1: decode shape (one row per non-empty group)
        std::vector<const QuantWeight*> wr(G, nullptr), wd(G, nullptr);
        std::vector<int64_t> off(G + 1, 0);
        for (int64_t g = 0; g < G; ++g) {
          const int64_t c = pass == 0 ? counts[g] : (counts[g] ? 1 : 0);
          if (c > 0) {
            wr[static_cast<size_t>(g)] = &ws[static_cast<size_t>(g)].q;
            wd[static_cast<size_t>(g)] = &ws[static_cast<size_t>(g)].d;
          }
          off[g + 1] = off[g] + c;
        }
        const int64_t n = off[G];
        const std::vector<float> x = rng.normals(n * cols);
        std::vector<float> yr(static_cast<size_t>(n * rows));
        ref().grouped_matmul(wr.data(), G, off.data(), x.data(), yr.data());
        Dev dv;
        const int64_t* offd = dv.up(off);
        const float* xd = dv.up(x);
        float* yd = dv.out<float>(yr.size());
        gpu().grouped_matmul(wd.data(), G, offd, xd, yd);
        const double e = norm_err(Dev::down(yd, yr.size()), yr);
        record(std::string("grouped_matmul/") + (pass ? "decode" : "mixed"), e);
        EXPECT_LE(e, kTolF32) << "rows " << rows << " cols " << cols << " pass " << pass;
      }
    }
  }
}

TEST(CudaOps, GroupedMatmulManyExperts) {  // 300 groups (more than one classification pass), few of them active
  Rng rng(20);
  const int64_t G = 300, rows = 37, cols = 160;
  std::vector<TestWeight> ws;
  ws.reserve(G);
  for (int64_t g = 0; g < G; ++g) ws.push_back(make_weight(g % 3 ? Fmt::Mxfp4 : Fmt::BF16, rows, cols, rng));
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<const QuantWeight*> wr(G, nullptr), wd(G, nullptr);
    std::vector<int64_t> off(G + 1, 0);
    for (int64_t g = 0; g < G; ++g) {
      int64_t c = 0;
      if (rng.integer(0, 9) == 0) c = pass == 0 ? 1 : pass == 1 ? rng.integer(1, 16) : rng.integer(1, 70);
      // Weights are passed for every group, as the model does; empty groups must be skipped.
      wr[static_cast<size_t>(g)] = &ws[static_cast<size_t>(g)].q;
      wd[static_cast<size_t>(g)] = &ws[static_cast<size_t>(g)].d;
      off[g + 1] = off[g] + c;
    }
    const int64_t n = off[G];
    const std::vector<float> x = rng.normals(n * cols);
    std::vector<float> yr(static_cast<size_t>(n * rows));
    ref().grouped_matmul(wr.data(), G, off.data(), x.data(), yr.data());
    Dev dv;
    float* yd = dv.out<float>(yr.size());
    gpu().grouped_matmul(wd.data(), G, dv.up(off), dv.up(x), yd);
    const double e = norm_err(Dev::down(yd, yr.size()), yr);
    record("grouped_matmul/300_groups", e);
    EXPECT_LE(e, kTolF32) << "pass " << pass;
  }
}

// The bf16 mode's grouped matmul: groups of more than 16 rows on the tensor-core kernel when every weight's
// values or codes are bf16 values (a table with an F32 weight keeps the fp32 tiled kernel for all); bf16 x.
TEST(CudaOps, GroupedMatmulBf16TensorCores) {
  Rng rng(22);
  const TcOn tc_on;
  struct Case {
    std::vector<Fmt> fmts;
    bool tc;
  };
  const Case cases[] = {{{Fmt::Mxfp4, Fmt::Mxfp4, Fmt::Mxfp4, Fmt::Mxfp4, Fmt::Mxfp4, Fmt::Mxfp4}, true},
                        {{Fmt::Fp8Block, Fmt::Fp8Block, Fmt::Fp8BlockFnuz, Fmt::Fp8Block, Fmt::Fp8Block, Fmt::Fp8Block}, true},
                        {{Fmt::BF16, Fmt::Fp8Channel, Fmt::Fp8Tensor, Fmt::Mxfp4, Fmt::BF16, Fmt::Fp8Block}, true},
                        {{Fmt::BF16, Fmt::F32, Fmt::Mxfp4, Fmt::BF16, Fmt::Mxfp4, Fmt::BF16}, false},
                        {{Fmt::Fp8BlockOdd, Fmt::Fp8Block, Fmt::BF16, Fmt::BF16, Fmt::BF16, Fmt::BF16}, false}};
  const int64_t counts[] = {3, 0, 17, 65, 1, 130};  // one group of each kernel class, an empty one, tile edges
  for (const Case& c : cases) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 160}, {200, 1024 + 32}, {129, 4096}}) {
      const int64_t G = static_cast<int64_t>(c.fmts.size());
      std::vector<TestWeight> ws;
      ws.reserve(static_cast<size_t>(G));
      for (Fmt f : c.fmts) ws.push_back(make_weight(f, rows, cols, rng));
      std::vector<const QuantWeight*> wr, wd;
      std::vector<int64_t> off(static_cast<size_t>(G + 1), 0);
      for (int64_t g = 0; g < G; ++g) {
        wr.push_back(&ws[static_cast<size_t>(g)].q);
        wd.push_back(&ws[static_cast<size_t>(g)].d);
        off[static_cast<size_t>(g + 1)] = off[static_cast<size_t>(g)] + counts[g];
      }
      const int64_t n = off.back();
      const std::vector<float> x = bf16_values(rng.normals(n * cols));
      std::vector<float> yr(static_cast<size_t>(n * rows));
      ref().grouped_matmul(wr.data(), G, off.data(), x.data(), yr.data());
      Dev dv;
      float* yd = dv.out<float>(yr.size());
      const int64_t tc0 = cuda_tc_matmuls(gpu());
      gpu().grouped_matmul_bf16(wd.data(), G, dv.up(off), dv.up(x), yd);
      const std::vector<float> y = Dev::down(yd, yr.size());
      EXPECT_EQ(cuda_tc_matmuls(gpu()) > tc0, c.tc) << fmt_name(c.fmts[0]) << " rows " << rows << " cols " << cols;
      const double e = norm_err(y, yr);
      record(std::string("grouped_matmul_bf16/") + (c.tc ? "tensor-core" : "exact"), e);
      EXPECT_LE(e, c.tc ? 1e-3 : kTolF32) << fmt_name(c.fmts[0]) << " rows " << rows << " cols " << cols;
      // Rows of every group, checked one by one (a group written to another's rows would hide in the norm).
      for (int64_t g = 0; g < G; ++g) {
        const int64_t a = off[static_cast<size_t>(g)] * rows, b = off[static_cast<size_t>(g + 1)] * rows;
        if (b == a) continue;
        const double eg = norm_err(y.data() + a, yr.data() + a, b - a);
        EXPECT_LE(eg, c.tc ? 2e-3 : 1e-4) << "group " << g << " rows " << rows;
      }
    }
  }
}

TEST(CudaOps, Embedding) {  // dequantization is exact in every format
  Rng rng(5);
  for (Fmt f : kAllFmts) {
    const int64_t V = 41, D = f == Fmt::Mxfp4 ? 96 : 131;
    const TestWeight w = make_weight(f, V, D, rng);
    for (int64_t M : {1, 2, 17}) {
      std::vector<int32_t> ids(static_cast<size_t>(M));
      for (int32_t& i : ids) i = static_cast<int32_t>(rng.integer(0, V - 1));
      std::vector<float> yr(static_cast<size_t>(M * D));
      ref().embedding(w.q, ids.data(), M, yr.data());
      Dev dv;
      const int32_t* idd = dv.up(ids);
      float* yd = dv.out<float>(yr.size());
      gpu().embedding(w.d, idd, M, yd);
      const std::vector<float> y = Dev::down(yd, yr.size());
      record(std::string("embedding/") + fmt_name(f), norm_err(y, yr));
      EXPECT_TRUE(same(y, yr)) << fmt_name(f);
    }
  }
  // Every code of the 8-bit formats decodes exactly (a 1 x 256 table holding each code once).
  for (Fmt f : {Fmt::Fp8Tensor, Fmt::Fp8BlockFnuz}) {
    TestWeight w = make_weight(f, 1, 256, rng);
    for (int c = 0; c < 256; ++c) w.data[static_cast<size_t>(1 + c)] = static_cast<uint8_t>(c);
    w.d = gpu().prepare_weight(w.q);
    std::vector<float> yr(256);
    const std::vector<int32_t> ids{0};
    ref().embedding(w.q, ids.data(), 1, yr.data());
    Dev dv;
    float* yd = dv.out<float>(256);
    gpu().embedding(w.d, dv.up(ids), 1, yd);
    EXPECT_TRUE(same(Dev::down(yd, 256), yr)) << fmt_name(f);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Norms / elementwise
// ---------------------------------------------------------------------------------------------------------------
TEST(CudaOps, RmsNormLayerNorm) {
  Rng rng(6);
  for (bool bf16 : {false, true}) {
    for (int64_t D : {1, 7, 64, 1023, 4099}) {
      for (int64_t M : {1, 2, 17}) {
        const std::vector<float> x = rng.normals(M * D, 3.0f), w = rng.normals(D), b = rng.normals(D);
        std::vector<float> yr(x.size()), lr(x.size());
        ref().rms_norm(x.data(), w.data(), M, D, 1e-6f, yr.data(), bf16);
        ref().layer_norm(x.data(), w.data(), b.data(), M, D, 1e-6f, lr.data(), bf16);
        Dev dv;
        float* xd = dv.up(x);  // in place for rms_norm
        const float* wd = dv.up(w);
        const float* bd = dv.up(b);
        const float* x2 = dv.up(x);
        float* ld = dv.out<float>(x.size());
        gpu().rms_norm(xd, wd, M, D, 1e-6f, xd, bf16);
        gpu().layer_norm(x2, wd, bd, M, D, 1e-6f, ld, bf16);
        const double e1 = norm_err(Dev::down(xd, x.size()), yr), e2 = norm_err(Dev::down(ld, x.size()), lr);
        record(std::string("rms_norm/") + (bf16 ? "bf16" : "f32"), e1);
        record(std::string("layer_norm/") + (bf16 ? "bf16" : "f32"), e2);
        EXPECT_LE(e1, bf16 ? kTolBf16 : kTolF32) << "D " << D << " M " << M;
        EXPECT_LE(e2, bf16 ? kTolBf16 : kTolF32) << "D " << D << " M " << M;
      }
    }
  }
}

TEST(CudaOps, Rope) {
  Rng rng(8);
  for (bool interleaved : {true, false}) {
    for (bool bf16 : {false, true}) {
      for (int64_t dim : {2, 6, 64}) {
        std::vector<float> inv(static_cast<size_t>(dim / 2));
        for (int64_t i = 0; i < dim / 2; ++i)
          inv[static_cast<size_t>(i)] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / dim));
        for (int64_t heads : {1, 3, 8}) {
          for (int64_t n : {1, 5, 17}) {
            const int64_t head_stride = dim + 3, token_stride = heads * head_stride + 5;
            std::vector<int64_t> pos(static_cast<size_t>(n));
            for (int64_t& q : pos) q = rng.integer(0, 70000);
            const std::vector<float> x0 = rng.normals(n * token_stride);
            std::vector<float> xr = x0;
            RopeParams p;
            p.inv_freq = inv.data();
            p.dim = dim;
            p.attention_factor = 1.137f;
            p.interleaved = interleaved;
            ref().rope(xr.data(), n, heads, token_stride, head_stride, pos.data(), p, bf16);
            Dev dv;
            float* xd = dv.up(x0);
            RopeParams pd = p;
            pd.inv_freq = dv.up(inv);
            gpu().rope(xd, n, heads, token_stride, head_stride, dv.up(pos), pd, bf16);
            const double e = norm_err(Dev::down(xd, x0.size()), xr);
            record(std::string("rope/") + (interleaved ? "interleaved/" : "half/") + (bf16 ? "bf16" : "f32"), e);
            EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32) << "dim " << dim;
          }
        }
      }
    }
  }
}

TEST(CudaOps, Elementwise) {
  Rng rng(9);
  for (bool bf16 : {false, true}) {
    for (int64_t n : {1, 7, 33, 4099, 70001}) {
      std::vector<float> g = rng.normals(n, 4.0f), u = rng.normals(n);
      if (n >= 7) {
        g[0] = -100.0f;
        g[1] = 95.0f;
        g[2] = std::numeric_limits<float>::quiet_NaN();
      }
      std::vector<float> sr(static_cast<size_t>(n)), ar = u, rr = g, br = u, scr = g;
      ref().silu_mul(g.data(), u.data(), n, sr.data(), bf16);
      ref().add(ar.data(), g.data(), n, bf16);
      ref().round_bf16(rr.data(), n);
      ref().scale(scr.data(), n, 0.37f);
      const int64_t N = n >= 7 ? 7 : 1;  // add_bias over [n / N, N]
      const std::vector<float> bias = rng.normals(N);
      ref().add_bias(br.data(), bias.data(), n / N, N, bf16);
      Dev dv;
      float* s = dv.up(g);  // out aliases gate
      gpu().silu_mul(s, dv.up(u), n, s, bf16);
      float* a = dv.up(u);
      gpu().add(a, dv.up(g), n, bf16);
      float* r = dv.up(g);
      gpu().round_bf16(r, n);
      float* sc = dv.up(g);
      gpu().scale(sc, n, 0.37f);
      float* bb = dv.up(u);
      gpu().add_bias(bb, dv.up(bias), n / N, N, bf16);
      std::vector<float> fr = g;
      ref().fill(fr.data(), n - n / 3, -2.75f);
      float* fd = dv.up(g);
      gpu().fill(fd, n - n / 3, -2.75f);
      EXPECT_TRUE(same(Dev::down(fd, g.size()), fr)) << "fill n " << n;
      const std::string tag = bf16 ? "bf16" : "f32";
      const double e = norm_err(Dev::down(s, g.size()), sr);
      record("silu_mul/" + tag, e);
      EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32) << n;
      EXPECT_TRUE(same(Dev::down(a, u.size()), ar)) << "add " << tag << " n " << n;
      EXPECT_TRUE(same(Dev::down(r, g.size()), rr)) << "round_bf16 n " << n;
      EXPECT_TRUE(same(Dev::down(sc, g.size()), scr)) << "scale n " << n;
      EXPECT_TRUE(same(Dev::down(bb, u.size()), br)) << "add_bias " << tag << " n " << n;
    }
  }
}

TEST(CudaOps, DataMovement) {
  Rng rng(15);
  const int64_t R = 23, D = 37, n = 41;
  const std::vector<float> src = rng.normals(R * D);
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (int32_t& r : rows) r = static_cast<int32_t>(rng.integer(0, R - 1));
  std::vector<float> gr(static_cast<size_t>(n * D)), cr(static_cast<size_t>(R * 11));
  ref().gather_rows(src.data(), rows.data(), n, D, gr.data());
  ref().copy_cols(src.data(), D, 5, 11, R, cr.data());
  Dev dv;
  const float* sd = dv.up(src);
  float* gd = dv.out<float>(gr.size());
  float* cd = dv.out<float>(cr.size());
  gpu().gather_rows(sd, dv.up(rows), n, D, gd);
  gpu().copy_cols(sd, D, 5, 11, R, cd);
  EXPECT_TRUE(same(Dev::down(gd, gr.size()), gr));
  EXPECT_TRUE(same(Dev::down(cd, cr.size()), cr));
}

// ---------------------------------------------------------------------------------------------------------------
// Paged latent cache
// ---------------------------------------------------------------------------------------------------------------
struct HostPool {
  std::vector<uint8_t> bytes;
  KvPool pool;
};
HostPool make_pool(DType dt, int64_t blocks, int64_t bt, int64_t width, Rng& rng) {
  HostPool h;
  h.pool.dtype = dt;
  h.pool.num_blocks = blocks;
  h.pool.block_tokens = bt;
  h.pool.width = width;
  const size_t eb = dt == DType::BF16 ? 2 : 4;
  h.bytes.resize(static_cast<size_t>(blocks * bt * width) * eb);
  const std::vector<float> v = rng.normals(blocks * bt * width);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::BF16) {
      const uint16_t b = f32_to_bf16(v[i]);
      std::memcpy(h.bytes.data() + 2 * i, &b, 2);
    } else {
      std::memcpy(h.bytes.data() + 4 * i, &v[i], 4);
    }
  }
  h.pool.data = h.bytes.data();
  return h;
}

TEST(CudaOps, KvStoreGatherCopy) {
  Rng rng(16);
  for (DType dt : {DType::F32, DType::BF16}) {
    HostPool hp = make_pool(dt, 9, 16, 45, rng);
    Dev dv;
    KvPool dp = hp.pool;
    dp.data = dv.up(hp.bytes);
    const int64_t n = 20, col0 = 7, width = 30;
    std::vector<int64_t> slots(static_cast<size_t>(n));
    std::vector<int64_t> all(static_cast<size_t>(hp.pool.rows()));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng.g);
    std::copy(all.begin(), all.begin() + n, slots.begin());
    const std::vector<float> src = rng.normals(n * width);
    ref().kv_store(hp.pool, slots.data(), n, src.data(), col0, width);
    gpu().kv_store(dp, dv.up(slots), n, dv.up(src), col0, width);
    ref().kv_copy_block(hp.pool, 3, 6, 11);
    gpu().kv_copy_block(dp, 3, 6, 11);
    EXPECT_EQ(Dev::down(static_cast<const uint8_t*>(dp.data), hp.bytes.size()), hp.bytes);
    const std::vector<int32_t> blocks{4, 0, 8, 2};
    const int64_t nt = 55;
    std::vector<float> gr(static_cast<size_t>(nt * width));
    ref().kv_gather(hp.pool, blocks.data(), nt, col0, width, gr.data());
    float* gd = dv.out<float>(gr.size());
    gpu().kv_gather(dp, dv.up(blocks), nt, col0, width, gd);
    EXPECT_TRUE(same(Dev::down(gd, gr.size()), gr));
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
};
Selection random_selection(Rng& rng, int64_t S, int64_t T, const std::vector<int64_t>& pos, int64_t stride) {
  Selection s;
  s.stride = stride;
  s.sel.resize(static_cast<size_t>(S * stride));
  s.count.resize(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    s.count[static_cast<size_t>(i)] = static_cast<int32_t>(rng.integer(0, stride));
    for (int64_t j = 0; j < stride; ++j)  // duplicates, -1 and keys beyond q_pos are allowed (ignored)
      s.sel[static_cast<size_t>(i * stride + j)] =
          static_cast<int32_t>(rng.integer(-1, std::min<int64_t>(T - 1, pos[static_cast<size_t>(i)] + 2)));
  }
  return s;
}
KeySelection host_view(const Selection& s) {
  KeySelection k;
  if (s.stride > 0) k = {s.sel.data(), s.count.data(), s.stride};
  return k;
}
KeySelection dev_view(const Selection& s, Dev& dv) {
  KeySelection k;
  if (s.stride > 0) k = {dv.up(s.sel), dv.up(s.count), s.stride};
  return k;
}

const AttnCase kAttnCases[] = {
    {1, 16, 8, 16, 32, 1, 0, false},   {3, 24, 16, 20, 96, 2, 3, false},  {8, 64, 32, 64, 256, 1, 40, false},
    {4, 32, 16, 24, 64, 5, 11, true},  {3, 24, 8, 20, 160, 17, 0, false}, {2, 16, 16, 16, 32, 17, 30, true},
    {5, 40, 8, 33, 96, 1, 200, true},  {4, 192, 64, 256, 512, 2, 700, false}, {2, 48, 16, 40, 128, 3, 1500, true},
    {2, 16, 6, 16, 40, 3, 50, true},   // rope dim not a multiple of 4: element-wise key loads
    {1, 16, 8, 16, 32, 1, 60000, false},  // more keys than the shared-memory score cache: scores recomputed
    {16, 16, 8, 16, 32, 17, 30, true},    // ≥ 256 (query, head) items: one block each instead of clusters
};

TEST(CudaOps, MlaAttentionNaive) {
  Rng rng(10);
  for (bool bf16 : {false, true}) {
    for (const AttnCase& a : kAttnCases) {
      const int64_t T = a.past + a.S, dqk = a.dn + a.dr;
      const MlaDims d{a.H, a.dn, a.dr, a.dv, a.dc};
      std::vector<float> q = rng.normals(a.S * a.H * dqk), kvb = rng.normals(T * a.H * (a.dn + a.dv)),
                         kpe = rng.normals(T * a.dr);
      if (bf16) {
        q = bf16_values(q);
        kvb = bf16_values(kvb);
        kpe = bf16_values(kpe);
      }
      std::vector<int64_t> pos(static_cast<size_t>(a.S));
      for (int64_t s = 0; s < a.S; ++s) pos[static_cast<size_t>(s)] = a.past + s;
      const Selection sel = a.use_sel ? random_selection(rng, a.S, T, pos, 7 + a.past / 10) : Selection{};
      const float scale = 1.0f / std::sqrt(static_cast<float>(dqk));
      std::vector<float> orf(static_cast<size_t>(a.S * a.H * a.dv));
      ref().mla_attention_naive(d, q.data(), kvb.data(), kpe.data(), a.S, T, pos.data(), host_view(sel), scale,
                                orf.data(), bf16);
      Dev dv;
      float* od = dv.out<float>(orf.size());
      gpu().mla_attention_naive(d, dv.up(q), dv.up(kvb), dv.up(kpe), a.S, T, dv.up(pos), dev_view(sel, dv), scale, od,
                                bf16);
      const double e = norm_err(Dev::down(od, orf.size()), orf);
      record(std::string("mla_naive/") + (bf16 ? "bf16" : "f32"), e);
      EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32) << "H " << a.H << " S " << a.S << " T " << T;
    }
  }
}

TEST(CudaOps, MlaAttentionAbsorbed) {
  Rng rng(11);
  for (Fmt f : {Fmt::F32, Fmt::BF16, Fmt::Fp8Block, Fmt::Fp8BlockOdd, Fmt::Mxfp4}) {
    for (bool bf16 : {false, true}) {
      for (const AttnCase& a : kAttnCases) {
        if (f == Fmt::Mxfp4 && a.dc % 32 != 0) continue;
        const int64_t T = a.past + a.S, dqk = a.dn + a.dr;
        const MlaDims d{a.H, a.dn, a.dr, a.dv, a.dc};
        const TestWeight kvb = make_weight(f, a.H * (a.dn + a.dv), a.dc, rng);
        std::vector<float> q = rng.normals(a.S * a.H * dqk), c = rng.normals(T * a.dc), kpe = rng.normals(T * a.dr);
        if (bf16) {
          q = bf16_values(q);
          c = bf16_values(c);
          kpe = bf16_values(kpe);
        }
        std::vector<int64_t> pos(static_cast<size_t>(a.S));
        for (int64_t s = 0; s < a.S; ++s) pos[static_cast<size_t>(s)] = a.past + s;
        const Selection sel = a.use_sel ? random_selection(rng, a.S, T, pos, 7 + a.past / 10) : Selection{};
        const float scale = 0.3f / std::sqrt(static_cast<float>(dqk));
        std::vector<float> orf(static_cast<size_t>(a.S * a.H * a.dv));
        ref().mla_attention_absorbed(d, q.data(), kvb.q, c.data(), kpe.data(), a.S, T, pos.data(), host_view(sel),
                                     scale, orf.data(), bf16);
        Dev dv;
        float* od = dv.out<float>(orf.size());
        gpu().mla_attention_absorbed(d, dv.up(q), kvb.d, dv.up(c), dv.up(kpe), a.S, T, dv.up(pos), dev_view(sel, dv),
                                     scale, od, bf16);
        const double e = norm_err(Dev::down(od, orf.size()), orf);
        record(std::string("mla_absorbed/") + fmt_name(f) + (bf16 ? "/bf16" : "/f32"), e);
        EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32) << fmt_name(f) << " H " << a.H << " S " << a.S << " T " << T;
      }
    }
  }
}

TEST(CudaOps, MlaAttentionAbsorbedPaged) {
  Rng rng(17);
  for (bool bf16 : {false, true}) {
    for (bool use_sel : {false, true}) {
      const int64_t H = 4, dn = 32, dr = 16, dv = 24, dc = 64, bt = 16, blocks = 40;
      const MlaDims d{H, dn, dr, dv, dc};
      HostPool hp = make_pool(bf16 ? DType::BF16 : DType::F32, blocks, bt, dc + dr, rng);
      const TestWeight kvb = make_weight(Fmt::BF16, H * (dn + dv), dc, rng);
      // Sequences: (new tokens, context after the step): decode, a prefill chunk with cached context, a new prompt.
      const std::vector<std::pair<int64_t, int64_t>> seq{{1, 37}, {5, 100}, {1, 1}, {9, 9}, {1, 130}};
      const int64_t S = static_cast<int64_t>(seq.size()), max_blocks = 9;
      std::vector<int32_t> q_begin(static_cast<size_t>(S + 1), 0), ctx(static_cast<size_t>(S));
      std::vector<int32_t> table(static_cast<size_t>(S * max_blocks), 0);
      std::vector<int32_t> perm(static_cast<size_t>(blocks));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng.g);
      std::vector<int64_t> pos;
      int64_t next_block = 0, max_ctx = 0;
      for (int64_t s = 0; s < S; ++s) {
        const auto [n, T] = seq[static_cast<size_t>(s)];
        q_begin[static_cast<size_t>(s + 1)] = q_begin[static_cast<size_t>(s)] + static_cast<int32_t>(n);
        ctx[static_cast<size_t>(s)] = static_cast<int32_t>(T);
        max_ctx = std::max(max_ctx, T);
        for (int64_t j = 0; j < (T + bt - 1) / bt; ++j) table[static_cast<size_t>(s * max_blocks + j)] = perm[static_cast<size_t>(next_block++)];
        for (int64_t i = 0; i < n; ++i) pos.push_back(T - n + i);
      }
      const int64_t N = q_begin.back();
      std::vector<float> q = rng.normals(N * H * (dn + dr));
      if (bf16) q = bf16_values(q);
      const Selection sel = use_sel ? random_selection(rng, N, max_ctx, pos, 23) : Selection{};
      StepSeqs hs{S, q_begin.data(), ctx.data(), table.data(), max_blocks, max_ctx};
      std::vector<float> orf(static_cast<size_t>(N * H * dv));
      ref().mla_attention_absorbed_paged(d, q.data(), kvb.q, hp.pool, hs, pos.data(), host_view(sel), 0.2f,
                                         orf.data(), bf16);
      Dev dvm;
      KvPool dp = hp.pool;
      dp.data = dvm.up(hp.bytes);
      StepSeqs ds{S, dvm.up(q_begin), dvm.up(ctx), dvm.up(table), max_blocks, max_ctx};
      float* od = dvm.out<float>(orf.size());
      gpu().mla_attention_absorbed_paged(d, dvm.up(q), kvb.d, dp, ds, dvm.up(pos), dev_view(sel, dvm), 0.2f, od, bf16);
      const double e = norm_err(Dev::down(od, orf.size()), orf);
      record(std::string("mla_absorbed_paged/") + (bf16 ? "bf16" : "f32"), e);
      EXPECT_LE(e, bf16 ? kTolBf16 : kTolF32) << "sel " << use_sel;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// DSA indexer and top-k
// ---------------------------------------------------------------------------------------------------------------
TEST(CudaOps, IndexerScores) {
  Rng rng(12);
  for (int64_t nI : {1, 8, 32}) {
    for (int64_t dI : {32, 72, 128}) {
      for (int64_t S : {1, 3, 17}) {
        const int64_t T = S + 29 + 100 * (nI == 32);
        const std::vector<float> q = rng.normals(S * nI * dI), w = rng.normals(S * nI), k = rng.normals(T * dI);
        std::vector<int64_t> pos(static_cast<size_t>(S));
        for (int64_t s = 0; s < S; ++s) pos[static_cast<size_t>(s)] = T - S + s;
        const float scale = 1.0f / std::sqrt(static_cast<float>(dI));
        std::vector<float> sr(static_cast<size_t>(S * T));
        ref().indexer_scores(q.data(), w.data(), k.data(), S, T, nI, dI, scale, pos.data(), sr.data());
        Dev dv;
        float* sd = dv.out<float>(sr.size());
        gpu().indexer_scores(dv.up(q), dv.up(w), dv.up(k), S, T, nI, dI, scale, dv.up(pos), sd);
        const double e = norm_err(Dev::down(sd, sr.size()), sr);
        record("indexer_scores", e);
        EXPECT_LE(e, kTolF32) << nI << " " << dI << " " << S;
      }
    }
  }
}

void check_topk(const std::vector<float>& scores, int64_t S, int64_t T, int64_t k, const std::vector<int64_t>& pos,
                const char* what) {
  std::vector<int32_t> selr(static_cast<size_t>(S * k), -5), cntr(static_cast<size_t>(S));
  ref().topk_select(scores.data(), S, T, k, pos.data(), selr.data(), cntr.data());
  Dev dv;
  int32_t* seld = dv.out<int32_t>(selr.size());
  int32_t* cntd = dv.out<int32_t>(cntr.size());
  gpu().topk_select(dv.up(scores), S, T, k, dv.up(pos), seld, cntd);
  const std::vector<int32_t> sel = Dev::down(seld, selr.size()), cnt = Dev::down(cntd, cntr.size());
  ASSERT_EQ(cnt, cntr) << what;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t j = 0; j < cntr[static_cast<size_t>(s)]; ++j)
      ASSERT_EQ(sel[static_cast<size_t>(s * k + j)], selr[static_cast<size_t>(s * k + j)])
          << what << " T " << T << " k " << k << " row " << s << " rank " << j;
}

TEST(CudaOps, TopkSelect) {
  Rng rng(13);
  // Distinct scores, heavy ties (scores on a coarse grid), NaN and -inf entries; rows shorter and longer than k.
  for (int64_t T : {1, 40, 2047, 2048, 2049, 3000}) {
    for (int mode = 0; mode < 3; ++mode) {
      const int64_t S = 3;
      std::vector<float> sc = rng.normals(S * T);
      if (mode == 1)
        for (float& v : sc) v = std::round(v * 2.0f);  // few distinct values: ties decided by index
      if (mode == 2)
        for (size_t i = 0; i < sc.size(); i += 7)
          sc[i] = i % 2 ? std::numeric_limits<float>::quiet_NaN() : -std::numeric_limits<float>::infinity();
      std::vector<int64_t> pos{T - 1, T / 2, T + 5};
      check_topk(sc, S, T, 2048, pos, mode == 0 ? "distinct" : mode == 1 ? "ties" : "nan/-inf");
      check_topk(sc, S, T, 9, pos, "k=9");
    }
  }
  // k beyond the shared-memory sort (global scratch path).
  std::vector<float> sc = rng.normals(2 * 6000);
  for (size_t i = 0; i < sc.size(); i += 3) sc[i] = 1.0f;
  check_topk(sc, 2, 6000, 5000, {5999, 4000}, "k=5000");
}

// ---------------------------------------------------------------------------------------------------------------
// MoE
// ---------------------------------------------------------------------------------------------------------------
TEST(CudaOps, Router) {
  Rng rng(14);
  struct Case {
    int64_t E, G, TG, K;
    bool norm;
  };
  const Case cases[] = {{16, 1, 1, 4, true}, {8, 4, 2, 2, true}, {64, 8, 4, 6, false}, {256, 8, 4, 8, true},
                        {7, 1, 1, 7, true},  {6, 3, 2, 3, false}, {256, 1, 1, 8, true}};
  for (const Case& cs : cases) {
    for (bool with_bias : {false, true}) {
      for (int64_t M : {1, 5, 70}) {
        RouterParams p;
        p.n_experts = cs.E;
        p.n_group = cs.G;
        p.topk_group = cs.TG;
        p.top_k = cs.K;
        p.norm_topk_prob = cs.norm;
        p.routed_scaling_factor = 2.5f;
        std::vector<float> logits = rng.normals(M * cs.E, 2.0f), bias = rng.normals(cs.E, 0.05f);
        if (M > 1) {
          logits[1] = logits[0];  // exact ties
          for (int64_t e = 0; e < cs.E; ++e) logits[static_cast<size_t>(cs.E + e)] = 0.5f;
        }
        std::vector<int32_t> idr(static_cast<size_t>(M * cs.K));
        std::vector<float> wr(idr.size());
        ref().router(logits.data(), with_bias ? bias.data() : nullptr, M, p, idr.data(), wr.data());
        Dev dv;
        int32_t* idd = dv.out<int32_t>(idr.size());
        float* wd = dv.out<float>(wr.size());
        gpu().router(dv.up(logits), with_bias ? dv.up(bias) : nullptr, M, p, idd, wd);
        EXPECT_EQ(Dev::down(idd, idr.size()), idr) << "E " << cs.E << " G " << cs.G << " M " << M;
        const double e = norm_err(Dev::down(wd, wr.size()), wr);
        record("router/weights", e);
        EXPECT_LE(e, kTolF32);
      }
    }
  }
}

TEST(CudaOps, MoeGroup) {
  Rng rng(18);
  for (int64_t M : {1, 7, 300}) {
    for (int64_t E : {8, 256}) {
      const int64_t K = std::min<int64_t>(E, 8);
      std::vector<int32_t> ids(static_cast<size_t>(M * K));
      for (int64_t m = 0; m < M; ++m) {  // distinct experts per token, skewed towards low ids
        std::vector<int32_t> e(static_cast<size_t>(E));
        std::iota(e.begin(), e.end(), 0);
        std::shuffle(e.begin(), e.begin() + std::min<int64_t>(E, 12), rng.g);
        for (int64_t k = 0; k < K; ++k) ids[static_cast<size_t>(m * K + k)] = e[static_cast<size_t>(k)];
      }
      const std::vector<float> w = rng.normals(M * K);
      std::vector<int64_t> offr(static_cast<size_t>(E + 1));
      std::vector<int32_t> tokr(static_cast<size_t>(M * K));
      std::vector<float> wr(static_cast<size_t>(M * K));
      ref().moe_group(ids.data(), w.data(), M, K, E, offr.data(), tokr.data(), wr.data());
      Dev dv;
      int64_t* offd = dv.out<int64_t>(offr.size());
      int32_t* tokd = dv.out<int32_t>(tokr.size());
      float* wd = dv.out<float>(wr.size());
      gpu().moe_group(dv.up(ids), dv.up(w), M, K, E, offd, tokd, wd);
      EXPECT_EQ(Dev::down(offd, offr.size()), offr);
      EXPECT_EQ(Dev::down(tokd, tokr.size()), tokr);
      EXPECT_TRUE(same(Dev::down(wd, wr.size()), wr));
    }
  }
}

TEST(CudaOps, ScatterAddWeighted) {
  Rng rng(19);
  for (bool bf16 : {false, true}) {
    for (int64_t D : {1, 7, 1030}) {
      for (int64_t n : {1, 5, 40}) {
        const int64_t rows = 6;
        const std::vector<float> x = rng.normals(n * D), w = rng.normals(n);
        std::vector<int32_t> tok(static_cast<size_t>(n));
        for (int32_t& t : tok) t = static_cast<int32_t>(rng.integer(0, rows - 1));
        std::vector<float> yr = rng.normals(rows * D);
        if (bf16) yr = bf16_values(yr);
        const std::vector<float> y0 = yr;
        ref().scatter_add_weighted(x.data(), tok.data(), w.data(), n, D, yr.data(), bf16);
        Dev dv;
        float* yd = dv.up(y0);
        gpu().scatter_add_weighted(dv.up(x), dv.up(tok), dv.up(w), n, D, yd, bf16);
        EXPECT_TRUE(same(Dev::down(yd, yr.size()), yr)) << (bf16 ? "bf16" : "f32") << " D " << D << " n " << n;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Sampling (backend/sampling.h): the device draw equals the reference's bit for bit (ids and final scores).
// ---------------------------------------------------------------------------------------------------------------
struct SampleCase {
  std::vector<float> logits;
  std::vector<SampleRowParams> rows;
  std::vector<SampleEdit> edits;
  std::vector<uint32_t> allow, banned;
};

// Rows cycle through 16 parameter mixes: greedy, temperatures, top-k / top-p / min-p alone and together, penalties
// and bias, allowed-id masks (some leaving one id or none), over logits with exact ties and -inf entries.
SampleCase sample_case(Rng& rng, int64_t rows, int64_t V, uint64_t counter0) {
  SampleCase c;
  c.logits = rng.normals(rows * V, 2.0f);
  std::vector<bool> banned(static_cast<size_t>(V), false);
  for (int64_t i = std::max<int64_t>(0, V - 37); i < V; ++i) banned[static_cast<size_t>(i)] = true;
  c.banned = sample_bitmask(banned);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    float* x = c.logits.data() + r * V;
    for (int64_t i = 0; i < V; i += 97) x[i] = 4.0f;  // ties decided by the lower id
    for (int64_t i = 5; i < V; i += 211) x[i] = ninf;
    if (r % 5 == 4 && V > 40) x[rng.integer(0, V - 40)] = 30.0f;  // one dominant id
    SampleRowParams p;
    p.rng_key = sample_stream_key(1000 + static_cast<uint64_t>(r), static_cast<uint64_t>(r % 3));
    p.rng_counter = counter0 + static_cast<uint64_t>(r);
    const int mix = static_cast<int>(r % 16);
    auto edits = [&](int n, bool bias, bool seen, bool count) {
      n = std::min<int>(n, static_cast<int>(V / 2));
      p.edit_begin = static_cast<int64_t>(c.edits.size());
      std::vector<int32_t> ids;
      while (static_cast<int>(ids.size()) < n) {
        const int32_t t = static_cast<int32_t>(rng.integer(0, V - 1));
        if (std::find(ids.begin(), ids.end(), t) == ids.end()) ids.push_back(t);
      }
      for (int32_t t : ids) {
        SampleEdit e;
        e.token = t;
        if (bias && rng.integer(0, 1)) {
          e.bias = rng.uniform(-5.0f, 5.0f);
          e.flags |= kSampleEditBias;
        }
        if (seen && rng.integer(0, 1)) e.flags |= kSampleEditSeen;
        if (count) e.count = static_cast<int32_t>(rng.integer(0, 4));
        c.edits.push_back(e);
      }
      p.n_edits = n;
    };
    auto mask = [&](int keep_mod) {  // keep_mod 0: allow nothing
      p.allow_offset = static_cast<int64_t>(c.allow.size());
      c.allow.resize(c.allow.size() + static_cast<size_t>((V + 31) / 32), 0u);
      uint32_t* w = c.allow.data() + p.allow_offset;
      for (int64_t i = 0; i < V; ++i)
        if (keep_mod > 0 && i % keep_mod == 2) w[i >> 5] |= 1u << (i & 31);
    };
    switch (mix) {
      case 0: p.temperature = 0.0f; break;
      case 1: p.temperature = 0.0f; p.repetition_penalty = 1.4f; p.frequency_penalty = 0.5f; edits(60, true, true, true); break;
      case 2: break;
      case 3: p.temperature = 0.7f; break;
      case 4: p.top_k = 50; break;
      case 5: p.top_k = 1; p.temperature = 2.0f; break;
      case 6: p.top_p = 0.9f; break;
      case 7: p.top_p = 0.5f; p.temperature = 0.6f; break;
      case 8: p.min_p = 0.05f; break;
      case 9: p.min_p = 1.0f; break;
      case 10: p.top_k = 400; p.top_p = 0.95f; p.min_p = 0.01f; p.temperature = 1.2f; break;
      case 11:
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.4f;
        p.frequency_penalty = -0.2f;
        edits(200, false, true, true);
        break;
      case 12: edits(30, true, false, false); mask(3); p.top_p = 0.8f; break;
      case 13: mask(3); p.top_k = static_cast<int32_t>(V); p.min_p = 0.001f; break;
      case 14: mask(static_cast<int>(V) + 1); break;  // one allowed id (2)
      default: mask(0); break;  // nothing allowed: the first non-banned id
    }
    c.rows.push_back(p);
  }
  return c;
}

TEST(CudaOps, SampleRowsEqualReference) {
  Rng rng(23);
  int64_t total = 0;
  for (int64_t V : {1, 64, 1237, 4032, 154880}) {
    for (int64_t rows : {1, 37}) {
      for (uint64_t counter0 : {0ull, 977ull}) {
        SampleCase c = sample_case(rng, rows, V, counter0);
        std::vector<float> xr = c.logits;
        std::vector<int32_t> ir(static_cast<size_t>(rows), -1);
        ref().sample_rows(xr.data(), rows, V, c.rows.data(), c.edits.data(), c.allow.data(), c.banned.data(),
                          ir.data());
        Dev dv;
        float* xd = dv.up(c.logits);
        int32_t* idd = dv.out<int32_t>(static_cast<size_t>(rows));
        gpu().sample_rows(xd, rows, V, dv.up(c.rows), c.edits.empty() ? nullptr : dv.up(c.edits),
                          c.allow.empty() ? nullptr : dv.up(c.allow), dv.up(c.banned), idd);
        const std::vector<int32_t> id = Dev::down(idd, ir.size());
        int diff = 0;
        for (int64_t r = 0; r < rows; ++r) {
          diff += id[r] != ir[r];
          EXPECT_EQ(id[r], ir[r]) << "V " << V << " row " << r << " (mix " << r % 16 << ")";
        }
        EXPECT_TRUE(same(Dev::down(xd, xr.size()), xr)) << "final scores, V " << V << " rows " << rows;
        record("sample_rows: rows whose id differs / V " + std::to_string(V), diff);
        total += rows;
      }
    }
  }
  std::printf("[cuda op harness] sample_rows: %lld rows, device ids = reference ids\n", static_cast<long long>(total));
}

// Many device draws (one row per draw: counter = draw index) follow the exact truncated softmax.
TEST(CudaOps, SampleRowsDistribution) {
  const std::vector<float> l = {2.0f, 1.5f, 1.4f, 0.3f, 0.0f, -0.5f, -1.0f, -3.0f, 1.45f, -7.0f, 0.9f};
  const int64_t V = static_cast<int64_t>(l.size()), rows = 8192, launches = 5;
  std::vector<SampleRowParams> mixes(5);
  mixes[1].temperature = 0.7f;
  mixes[1].top_k = 4;
  mixes[2].temperature = 1.2f;
  mixes[2].top_p = 0.8f;
  mixes[3].min_p = 0.2f;
  mixes[4].temperature = 1.5f;
  mixes[4].top_k = 6;
  mixes[4].top_p = 0.9f;
  mixes[4].min_p = 0.05f;
  for (size_t m = 0; m < mixes.size(); ++m) {
    const std::vector<double> q = truncated_softmax(l, mixes[m]);
    std::vector<int64_t> counts(static_cast<size_t>(V), 0);
    for (int64_t k = 0; k < launches; ++k) {
      std::vector<float> x;
      std::vector<SampleRowParams> ps(static_cast<size_t>(rows), mixes[m]);
      for (int64_t r = 0; r < rows; ++r) {
        x.insert(x.end(), l.begin(), l.end());
        ps[r].rng_key = sample_stream_key(5, m);
        ps[r].rng_counter = static_cast<uint64_t>(k * rows + r);
      }
      Dev dv;
      int32_t* idd = dv.out<int32_t>(static_cast<size_t>(rows));
      gpu().sample_rows(dv.up(x), rows, V, dv.up(ps), nullptr, nullptr, nullptr, idd);
      for (int32_t id : Dev::down(idd, static_cast<size_t>(rows))) {
        ASSERT_TRUE(id >= 0 && id < V);
        ++counts[static_cast<size_t>(id)];
      }
    }
    const double n = static_cast<double>(rows * launches);
    for (int64_t i = 0; i < V; ++i) {
      const double f = counts[i] / n, sd = std::sqrt(q[i] * (1 - q[i]) / n);
      if (q[i] == 0.0)
        EXPECT_EQ(counts[i], 0) << "mix " << m << " id " << i << " is truncated";
      else
        EXPECT_NEAR(f, q[i], 5 * sd + 1e-4) << "mix " << m << " id " << i;
    }
  }
}

// The op recorded in a graph reads the parameters uploaded before each replay.
TEST(CudaOps, SampleRowsInGraph) {
  Rng rng(29);
  const int64_t V = 4032, rows = 16;
  SampleCase c = sample_case(rng, rows, V, 0);
  Dev dv;
  float* xd = dv.up(c.logits);
  SampleRowParams* pd = dv.up(c.rows);
  SampleEdit* ed = c.edits.empty() ? nullptr : dv.up(c.edits);
  uint32_t* ad = c.allow.empty() ? nullptr : dv.up(c.allow);
  uint32_t* bd = dv.up(c.banned);
  int32_t* idd = dv.out<int32_t>(static_cast<size_t>(rows));
  gpu().sample_rows(xd, rows, V, pd, ed, ad, bd, idd);  // eager first
  gpu().sync();
  gpu().graph_begin();
  gpu().sample_rows(xd, rows, V, pd, ed, ad, bd, idd);
  const int g = gpu().graph_end();
  for (uint64_t step = 1; step <= 3; ++step) {
    for (auto& p : c.rows) p.rng_counter += 1000;
    gpu().upload(xd, c.logits.data(), c.logits.size() * sizeof(float));
    gpu().upload(pd, c.rows.data(), c.rows.size() * sizeof(SampleRowParams));
    gpu().graph_replay(g);
    std::vector<float> xr = c.logits;
    std::vector<int32_t> ir(static_cast<size_t>(rows));
    ref().sample_rows(xr.data(), rows, V, c.rows.data(), c.edits.data(), c.allow.data(), c.banned.data(), ir.data());
    EXPECT_EQ(Dev::down(idd, ir.size()), ir) << "replay " << step;
  }
  gpu().graph_release(g);
}

}  // namespace
}  // namespace latent
