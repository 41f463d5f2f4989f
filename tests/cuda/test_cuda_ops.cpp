// The CUDA backend against the ref backend: the shared op case list (tests/ops/op_cases.cpp, the same cases and
// names as the CPU harness tests/kernels/test_cpu_ops.cpp) on make_backend("cuda"), one gtest per case:
// OpHarness/CudaOps.MatchesRef/<case>. Then the CUDA-only checks: memory ops and out-of-memory errors, which
// kernels the bf16 activation mode dispatches to (cuBLASLt, the own tensor-core kernel: the counters of
// kernels/cuda/cuda_backend.h), the epilogue contract (fused = unfused bit for bit), ops recorded in a graph and
// replayed, and device sampling (= the host reference bit for bit, the distribution of many draws).
// Needs a GPU: built when CUDA is, not registered with ctest; scripts/gpu_test runs it on the GPU machine and prints
// the "[op harness]" summary lines.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "../ops/op_harness.h"
#include "../runtime/truncated_softmax.h"
#include "backend/backend.h"
#include "backend/sample_reference.h"
#include "core/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_mla_decode.h"
#include "kernels/cuda/cuda_ops.h"
#include "quant/float_formats.h"

namespace latent {
namespace {

using ops::Arena;
using ops::Fmt;
using ops::HostWeight;
using ops::Rng;

Backend& ref() {
  static std::unique_ptr<Backend> r = make_ref_backend(2);
  return *r;
}
Backend& gpu() {
  static std::unique_ptr<Backend> g = make_backend("cuda", 1);
  return *g;
}

// Bitwise-equal floats (NaN equal to NaN).
bool same(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------------------------
// The shared case list
// ---------------------------------------------------------------------------------------------------------------
// One gtest per case: OpHarness/CudaOps.MatchesRef/<case>.
class CudaOps : public ::testing::TestWithParam<ops::CaseIndex> {};

TEST_P(CudaOps, MatchesRef) { ops::run_op_case(ops::op_cases()[GetParam().i], {{&gpu(), "cuda"}}); }

INSTANTIATE_TEST_SUITE_P(OpHarness, CudaOps, ::testing::ValuesIn(ops::all_case_indices()), ops::case_test_name);

// ---------------------------------------------------------------------------------------------------------------
// Memory and registry
// ---------------------------------------------------------------------------------------------------------------
TEST(CudaBackend, Registry) {
  EXPECT_STREQ(gpu().name(), "cuda");
  EXPECT_EQ(gpu().device(), Device::Cuda);
  const auto names = backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "cuda"), names.end());
  EXPECT_TRUE(gpu().graphs_supported());
  EXPECT_FALSE(gpu().device_lost());
  EXPECT_EQ(cuda_lt_matmuls(ref()), -1);
  EXPECT_EQ(cuda_tc_matmuls(ref()), -1);
}

TEST(CudaBackend, MemoryOps) {
  Rng rng(100);
  const std::vector<float> a = rng.normals(1000);
  Arena dv(gpu());
  float* d1 = dv.up(a);
  float* d2 = dv.out<float>(1000);
  gpu().copy(d2, d1, 1000 * sizeof(float));
  gpu().sync();
  EXPECT_TRUE(same(dv.down(d2, 1000), a));
  const auto [free_b, total_b] = gpu().memory_info();
  EXPECT_GT(total_b, 0u);
  EXPECT_LE(free_b, total_b);
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
  EXPECT_TRUE(same(dv.down(d3, 1000), a));
  EXPECT_FALSE(gpu().device_lost());
}

// ---------------------------------------------------------------------------------------------------------------
// Declared FP8 activations: matmul_act_fp8 with bf16 x and y and 128 x 128 block-FP8 weights (K % 16 == 0) runs the
// FP8 x FP8 cuBLASLt GEMM (the counter proves it), within the bf16 tolerance of the ref's definition; the fp32
// mode, bf16 x into F32 y, e4m3fnuz codes, other block shapes, K % 16 != 0 and the switch set to 0 keep the
// default composition.
// ---------------------------------------------------------------------------------------------------------------
double run_act_fp8(const HostWeight& w, const std::vector<float>& x, int64_t M, DType xt, DType yt, bool& took) {
  const int64_t N = w.q.rows, K = w.q.cols;
  std::vector<float> want, got;
  for (Backend* be : {&ref(), &gpu()}) {
    Arena A(*be);
    const QuantWeight wd = A.weight(w);
    const Tensor xd = A.up(x, xt, M, K), y = A.tensor(yt, M, N);
    ActFp8 a;
    a.scratch = A.out<float>(static_cast<size_t>(M * K));
    a.scratch_floats = M * K;
    const int64_t n0 = cuda_fp8_gemm_calls(gpu());
    be->matmul_act_fp8(wd, xd, a, y);
    (be == &ref() ? want : got) = A.down(y);
    took = cuda_fp8_gemm_calls(gpu()) > n0;
  }
  return ops::norm_err(got.data(), want.data(), want.size());
}

TEST(CudaDispatch, MatmulActFp8) {
  Rng rng(29);
  ASSERT_GE(cuda_fp8_gemm_calls(gpu()), 0);
  EXPECT_EQ(cuda_fp8_gemm_calls(ref()), -1);
  struct Case {
    Fmt f;
    int64_t N, K, M;
    DType xt, yt;
    bool want;
  };
  const Case cases[] = {
      {Fmt::Fp8Block, 512, 1024, 1, DType::BF16, DType::BF16, true},
      {Fmt::Fp8Block, 512, 1024, 64, DType::BF16, DType::BF16, true},
      {Fmt::Fp8Block, 384, 640, 300, DType::BF16, DType::BF16, true},  // 5 column blocks: padded scale rows
      {Fmt::Fp8Block, 160, 400, 17, DType::BF16, DType::BF16, true},   // partial row and column blocks
      {Fmt::Fp8Block, 512, 1024, 64, DType::F32, DType::F32, false},   // the fp32 mode
      {Fmt::Fp8Block, 512, 1024, 64, DType::BF16, DType::F32, false},  // bf16 x into F32 y
      {Fmt::Fp8BlockFnuz, 512, 1024, 64, DType::BF16, DType::BF16, false},
      {Fmt::Fp8BlockOdd, 512, 1024, 64, DType::BF16, DType::BF16, false},
      {Fmt::Fp8Block, 512, 1031, 64, DType::BF16, DType::BF16, false},  // K % 16 != 0
  };
  for (const Case& c : cases) {
    const HostWeight w = ops::make_weight(c.f, c.N, c.K, rng);
    const std::vector<float> x = rng.normals(c.M * c.K);
    const std::string what = std::string(ops::fmt_name(c.f)) + " N " + std::to_string(c.N) + " K " +
                             std::to_string(c.K) + " M " + std::to_string(c.M) + (c.xt == DType::F32 ? " f32" : "") +
                             (c.yt == DType::F32 ? " >f32" : "");
    bool took = false;
    const double e = run_act_fp8(w, x, c.M, c.xt, c.yt, took);
    EXPECT_EQ(took, c.want) << what;
    const double tol = c.yt == DType::BF16 ? ops::kTolBf16 : ops::kTolF32;
    if (c.want) ops::record_summary("cuda-only/matmul_act_fp8/fp8_gemm", "cuda", e, tol);
    EXPECT_LE(e, tol) << what;
  }
  // The tiny models' shapes (N and K below or across one 128 block, K down to 16): the GEMM, within the tolerance.
  const int64_t small[][2] = {{48, 64},   {192, 48},  {160, 64}, {64, 160}, {64, 96},  {32, 64},  {128, 128},
                              {256, 128}, {128, 256}, {48, 256}, {256, 48}, {128, 64}, {64, 128}, {144, 144},
                              {48, 400},  {64, 32},   {96, 32},  {64, 16},  {160, 32}, {32, 32},  {48, 32}};
  for (const auto& sh : small) {
    const HostWeight w = ops::make_weight(Fmt::Fp8Block, sh[0], sh[1], rng);
    bool took = false;
    const double e = run_act_fp8(w, rng.normals(20 * sh[1]), 20, DType::BF16, DType::BF16, took);
    const std::string what = "N " + std::to_string(sh[0]) + " K " + std::to_string(sh[1]) + " M 20";
    EXPECT_TRUE(took) << what;
    EXPECT_LE(e, ops::kTolBf16) << what;
    ops::record_summary("cuda-only/matmul_act_fp8/fp8_gemm", "cuda", e, ops::kTolBf16);
  }
  // Off: the default composition, the same answer within the tolerance.
  cuda_set_fp8_gemm_rows(gpu(), 0);
  const HostWeight w = ops::make_weight(Fmt::Fp8Block, 512, 1024, rng);
  bool took = true;
  const double e = run_act_fp8(w, rng.normals(64 * 1024), 64, DType::BF16, DType::BF16, took);
  cuda_set_fp8_gemm_rows(gpu(), 1);
  EXPECT_FALSE(took);
  EXPECT_LE(e, ops::kTolBf16);
}

// ---------------------------------------------------------------------------------------------------------------
// Dispatch of the bf16 activation mode (BF16 x): cuBLASLt for weights whose values are exactly bf16 (BF16, MXFP4)
// from cuda_lt_min_rows() rows, the own tensor-core kernel for FP8 weights whose scale blocks are multiples of
// 16 x 32 (block 128, tensor, channel; not the 32 x 40 blocks); F32 / F16 weights, M <= 16 and F32 x take the
// exact kernels. The counters prove which path ran; the results are held to the harness tolerances (BF16 y 1e-2,
// F32 y 1e-5: the products are exact, only the fp32 accumulation order differs).
// ---------------------------------------------------------------------------------------------------------------
// The tensor-core dispatch on for one test (the default; a test may turn it off), then as before.
struct TcOn {
  bool was = cuda_tc_dispatch(gpu());
  TcOn() { cuda_set_tc_dispatch(gpu(), true); }
  ~TcOn() { cuda_set_tc_dispatch(gpu(), was); }
};

// y = x·Wᵀ on the GPU and on the ref; returns the normalized error; `lt` / `tc`: whether the counters moved.
double run_matmul(const HostWeight& w, const std::vector<float>& x, int64_t M, DType xt, DType yt, bool& lt, bool& tc) {
  const int64_t N = w.q.rows, K = w.q.cols;
  std::vector<float> want, got;
  {
    Arena A(ref());
    const Tensor y = A.tensor(yt, M, N);
    A.be.matmul(w.q, A.up(x, xt, M, K), y);
    want = A.down(y);
  }
  Arena A(gpu());
  const QuantWeight wd = A.weight(w);
  const Tensor xd = A.up(x, xt, M, K), y = A.tensor(yt, M, N);
  const int64_t lt0 = cuda_lt_matmuls(gpu()), tc0 = cuda_tc_matmuls(gpu());
  gpu().matmul(wd, xd, y);
  got = A.down(y);
  lt = cuda_lt_matmuls(gpu()) > lt0;
  tc = cuda_tc_matmuls(gpu()) > tc0;
  return ops::norm_err(got.data(), want.data(), want.size());
}

TEST(CudaDispatch, MatmulBf16) {
  Rng rng(21);
  ASSERT_GE(cuda_lt_matmuls(gpu()), 0);
  const TcOn tc_on;
  struct Shape {
    int64_t rows, cols;
    std::vector<int64_t> ms;
  };
  for (Fmt f : ops::kAllFmts) {
    const bool lt = f == Fmt::BF16 || f == Fmt::Mxfp4;
    const bool tc = f == Fmt::Fp8Block || f == Fmt::Fp8BlockFnuz || f == Fmt::Fp8Tensor || f == Fmt::Fp8Channel;
    const bool mx = f == Fmt::Mxfp4;
    const Shape shapes[] = {{37, mx ? 160 : 33, {16, 17, 33, 64, 100, 257}},
                            {301, mx ? 1088 : 1031, {17, 100, 257}},
                            {129, mx ? 4128 : 4099, {33, 64}},
                            {64, mx ? 512 : 520, {64}}};  // K % 8 == 0: a BF16 weight used in place
    for (const Shape& sh : shapes) {
      const HostWeight w = ops::make_weight(f, sh.rows, sh.cols, rng);
      for (int64_t M : sh.ms) {
        const std::vector<float> x = rng.normals(M * sh.cols);
        const std::string what = std::string(ops::fmt_name(f)) + " rows " + std::to_string(sh.rows) + " cols " +
                                 std::to_string(sh.cols) + " M " + std::to_string(M);
        bool took_lt = false, took_tc = false;
        const double e = run_matmul(w, x, M, DType::BF16, DType::BF16, took_lt, took_tc);
        const bool want_lt = lt && M >= cuda_lt_min_rows(), want_tc = tc && M >= cuda_lt_min_rows();
        EXPECT_EQ(took_lt, want_lt) << what;
        EXPECT_EQ(took_tc, want_tc) << what;
        const std::string path = want_lt ? "cublaslt" : want_tc ? "tensor-core" : "exact";
        ops::record_summary("cuda-only/matmul_bf16/" + std::string(ops::fmt_name(f)) + "/" + path, "cuda", e,
                            ops::kTolBf16);
        EXPECT_LE(e, ops::kTolBf16) << what;
        // BF16 x into F32 y (the router logits of a bf16 run): fp32 accuracy whichever kernel runs.
        const double e32 = run_matmul(w, x, M, DType::BF16, DType::F32, took_lt, took_tc);
        ops::record_summary("cuda-only/matmul_bf16>f32/" + std::string(ops::fmt_name(f)), "cuda", e32, ops::kTolF32);
        EXPECT_LE(e32, ops::kTolF32) << what << " (F32 y)";
        // The fp32 mode's matmul never takes the bf16 paths.
        if (M == 17 || M == 64) {
          const double ef = run_matmul(w, x, M, DType::F32, DType::F32, took_lt, took_tc);
          EXPECT_FALSE(took_lt) << what << " (F32 x)";
          EXPECT_FALSE(took_tc) << what << " (F32 x)";
          EXPECT_LE(ef, ops::kTolF32) << what << " (F32 x)";
        }
      }
    }
  }
  // Off: FP8 takes the exact kernels.
  {
    cuda_set_tc_dispatch(gpu(), false);
    const HostWeight w = ops::make_weight(Fmt::Fp8Block, 300, 520, rng);
    bool took_lt = false, took_tc = false;
    const double e = run_matmul(w, rng.normals(64 * 520), 64, DType::BF16, DType::BF16, took_lt, took_tc);
    EXPECT_FALSE(took_tc);
    EXPECT_LE(e, ops::kTolBf16);
    cuda_set_tc_dispatch(gpu(), true);
  }
  // A bigger prefill shape through every scratch size change (x and weight scratch grow, then are reused).
  for (Fmt f : {Fmt::BF16, Fmt::Fp8Block, Fmt::Mxfp4}) {
    const int64_t rows = 1000, cols = f == Fmt::Mxfp4 ? 2048 : 2056, M = 300;
    const HostWeight w = ops::make_weight(f, rows, cols, rng);
    const std::vector<float> x = rng.normals(M * cols);
    for (int rep = 0; rep < 2; ++rep) {
      bool took_lt = false, took_tc = false;
      const double e = run_matmul(w, x, M, DType::BF16, DType::F32, took_lt, took_tc);
      ops::record_summary(std::string("cuda-only/matmul_bf16>f32/prefill_300x1000/") + ops::fmt_name(f), "cuda", e,
                          ops::kTolF32);
      EXPECT_LE(e, ops::kTolF32) << ops::fmt_name(f) << " rep " << rep;
    }
  }
}

// The ref backend's grouped matmul of x (bf16 activations, [off.back(), cols]) into a y of dtype yt.
std::vector<float> ref_grouped(const std::vector<HostWeight>& ws, const std::vector<int64_t>& off,
                               const std::vector<float>& x, int64_t rows, int64_t cols, DType yt) {
  Arena A(ref());
  std::vector<const QuantWeight*> wp;
  for (const HostWeight& w : ws) wp.push_back(&w.q);
  const int64_t n = off.back();
  const Tensor y = A.tensor(yt, n, rows);
  A.be.grouped_matmul(wp.data(), static_cast<int64_t>(ws.size()), off.data(), A.up(x, DType::BF16, n, cols), y);
  return A.down(y);
}

// The bf16 mode's grouped matmul: groups of more than 16 rows on the tensor-core kernel when every weight's values
// or codes are bf16 values (a table with an F32 or odd-block FP8 weight keeps the fp32 kernels for all).
TEST(CudaDispatch, GroupedMatmulBf16TensorCores) {
  Rng rng(22);
  const TcOn tc_on;
  struct Case {
    std::vector<Fmt> fmts;
    bool tc;
  };
  const Case cases[] = {
      {{Fmt::Mxfp4, Fmt::Mxfp4, Fmt::Mxfp4, Fmt::Mxfp4, Fmt::Mxfp4, Fmt::Mxfp4}, true},
      {{Fmt::Fp8Block, Fmt::Fp8Block, Fmt::Fp8BlockFnuz, Fmt::Fp8Block, Fmt::Fp8Block, Fmt::Fp8Block}, true},
      {{Fmt::BF16, Fmt::Fp8Channel, Fmt::Fp8Tensor, Fmt::Mxfp4, Fmt::BF16, Fmt::Fp8Block}, true},
      {{Fmt::BF16, Fmt::F32, Fmt::Mxfp4, Fmt::BF16, Fmt::Mxfp4, Fmt::BF16}, false},
      {{Fmt::Fp8BlockOdd, Fmt::Fp8Block, Fmt::BF16, Fmt::BF16, Fmt::BF16, Fmt::BF16}, false}};
  const int64_t counts[] = {
      3, 0, 17, 65, 1, 1030};  // each kernel class, an empty group, tile edges; > 1024 rows: the tensor-core path
  for (const Case& c : cases) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 160}, {200, 1024 + 32}, {129, 4096}}) {
      const int64_t G = static_cast<int64_t>(c.fmts.size());
      std::vector<HostWeight> ws;
      for (Fmt f : c.fmts) ws.push_back(ops::make_weight(f, rows, cols, rng));
      std::vector<int64_t> off(static_cast<size_t>(G + 1), 0);
      for (int64_t g = 0; g < G; ++g) off[static_cast<size_t>(g + 1)] = off[static_cast<size_t>(g)] + counts[g];
      const int64_t n = off.back();
      const std::vector<float> x = rng.normals(n * cols);
      for (DType yt : {DType::BF16, DType::F32}) {
        const std::vector<float> want = ref_grouped(ws, off, x, rows, cols, yt);
        std::vector<float> got;
        Arena A(gpu());
        std::vector<QuantWeight> wd;
        for (const HostWeight& w : ws) wd.push_back(A.weight(w));
        std::vector<const QuantWeight*> wp;
        for (const QuantWeight& w : wd) wp.push_back(&w);
        const Tensor xd = A.up(x, DType::BF16, n, cols), y = A.tensor(yt, n, rows);
        const int64_t* od = A.up(off);
        const int64_t tc0 = cuda_tc_matmuls(gpu()), ti0 = cuda_tile_matmuls(gpu());
        gpu().grouped_matmul(wp.data(), G, od, xd, y);
        got = A.down(y);
        const std::string what = std::string(ops::fmt_name(c.fmts[0])) + " rows " + std::to_string(rows) + " cols " +
                                 std::to_string(cols) + " y " + ops::dtype_label(yt);
        // An all-MXFP4 table with K % 128 == 0 takes the tiled kernel (decoded in shared memory) instead.
        bool all_mx = cols % 128 == 0;
        for (Fmt f : c.fmts) all_mx = all_mx && f == Fmt::Mxfp4;
        if (yt == DType::BF16) {
          EXPECT_EQ(cuda_tc_matmuls(gpu()) > tc0, c.tc && !all_mx) << what;
          EXPECT_EQ(cuda_tile_matmuls(gpu()) > ti0, all_mx) << what;
        }
        const double tol = ops::tol_for(yt), e = ops::norm_err(got.data(), want.data(), want.size());
        ops::record_summary(
            std::string("cuda-only/grouped_matmul_bf16/") + (c.tc ? "tensor-core/" : "exact/") + ops::dtype_label(yt),
            "cuda", e, tol);
        EXPECT_LE(e, tol) << what;
        // Rows of every group, checked one by one (a group written to another's rows would hide in the norm).
        for (int64_t g = 0; g < G; ++g) {
          const int64_t a = off[static_cast<size_t>(g)] * rows, b = off[static_cast<size_t>(g + 1)] * rows;
          if (b == a) continue;
          EXPECT_LE(ops::norm_err(got.data() + a, want.data() + a, static_cast<size_t>(b - a)), tol)
              << what << " group " << g;
        }
      }
    }
  }
}

// The MXFP4 skinny tensor-core kernels (bf16 x, M <= 16 / decode expert groups, cols % 128 == 0): taken exactly
// then (the counter), held to the harness tolerances against the ref, per weight row — rows whose scales are tiny
// (2^-107) or above 2^1 (the second multiply) are compared on their own, so that a wrong or flushed scale cannot
// hide under the other rows' magnitude.
TEST(CudaDispatch, Mxfp4SkinnyTensorCores) {
  Rng rng(23);
  const TcOn tc_on;
  auto col_err = [](const std::vector<float>& got, const std::vector<float>& want, int64_t M, int64_t N, int64_t r) {
    std::vector<float> a, b;
    for (int64_t m = 0; m < M; ++m) {
      a.push_back(got[static_cast<size_t>(m * N + r)]);
      b.push_back(want[static_cast<size_t>(m * N + r)]);
    }
    return ops::norm_err(a.data(), b.data(), a.size());
  };
  // Scale bytes: random in [118, 130] with rows 0-2 special (tiny, above 128, alternating 128 / 129), or (`low`:
  // the usual case of real checkpoints) all at most 128 but in rows 16-31, so that the kernel's path without the
  // second multiply runs for whole chunks and the other path for another row tile of the same call.
  struct MxShape {
    int64_t rows, cols;
    bool low;
  };
  for (const MxShape& sh :
       {MxShape{16, 128, false}, MxShape{37, 1152, false}, MxShape{300, 6144, false}, MxShape{300, 6144, true}}) {
    const int64_t rows = sh.rows, cols = sh.cols;
    HostWeight w = ops::make_weight(Fmt::Mxfp4, rows, cols, rng);
    const int64_t sc = cols / 32;
    if (sh.low) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < sc; ++b)
          w.scale[static_cast<size_t>(1 + r * sc + b)] =
              static_cast<uint8_t>(r >= 16 && r < 32 ? 129 + (r + b) % 3 : 100 + (r * 7 + b) % 29);
    } else {
      for (int64_t b = 0; b < sc; ++b) {
        w.scale[static_cast<size_t>(1 + 0 * sc + b)] = 20;   // 2^-107
        w.scale[static_cast<size_t>(1 + 1 * sc + b)] = 140;  // 2^13: scale bytes above 128
        w.scale[static_cast<size_t>(1 + 2 * sc + b)] = static_cast<uint8_t>(b % 2 ? 129 : 128);
      }
    }
    for (int64_t M : {1, 5, 8, 9, 16}) {
      const std::vector<float> x = rng.normals(M * cols);
      for (DType yt : {DType::BF16, DType::F32}) {
        std::vector<float> want;
        {
          Arena A(ref());
          const Tensor y = A.tensor(yt, M, rows);
          A.be.matmul(w.q, A.up(x, DType::BF16, M, cols), y);
          want = A.down(y);
        }
        Arena A(gpu());
        const QuantWeight wd = A.weight(w);
        const Tensor xd = A.up(x, DType::BF16, M, cols), y = A.tensor(yt, M, rows);
        const int64_t n0 = cuda_mx_tc_matmuls(gpu());
        gpu().matmul(wd, xd, y);
        const std::vector<float> got = A.down(y);
        const std::string what = "rows " + std::to_string(rows) + " cols " + std::to_string(cols) + " M " +
                                 std::to_string(M) + " y " + ops::dtype_label(yt) + (sh.low ? " low scales" : "");
        EXPECT_EQ(cuda_mx_tc_matmuls(gpu()), n0 + 1) << what;
        const double tol = ops::tol_for(yt), e = ops::norm_err(got.data(), want.data(), want.size());
        ops::record_summary(std::string("cuda-only/matmul_mxfp4_tc/") + ops::dtype_label(yt), "cuda", e, tol);
        EXPECT_LE(e, tol) << what;
        for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{2}, rows - 1})
          EXPECT_LE(col_err(got, want, M, rows, r), tol) << what << " weight row " << r;
        // Off (and fp32 x): the exact kernels, the counter stays.
        cuda_set_tc_dispatch(gpu(), false);
        gpu().matmul(wd, xd, y);
        EXPECT_LE(ops::norm_err(A.down(y).data(), want.data(), want.size()), tol) << what << " (exact kernels)";
        cuda_set_tc_dispatch(gpu(), true);
        EXPECT_EQ(cuda_mx_tc_matmuls(gpu()), n0 + 1) << what;
      }
    }
    Arena A(gpu());
    const QuantWeight wd = A.weight(w);
    const Tensor xf = A.up(rng.normals(4 * cols), DType::F32, 4, cols), yf = A.tensor(DType::F32, 4, rows);
    const int64_t n0 = cuda_mx_tc_matmuls(gpu());
    gpu().matmul(wd, xf, yf);
    EXPECT_EQ(cuda_mx_tc_matmuls(gpu()), n0) << "fp32 x took the bf16 tensor-core kernel";
  }
  // Grouped (decode experts): every group MXFP4 takes it; one BF16 weight in the table keeps the exact kernels;
  // (variant 2) every scale byte at most 128 but one expert's; 256, 1,152 and 6,144 columns (2, 9 and 48 chunks of
  // 128), the groups of 9 tokens in two passes.
  for (int64_t cols : {int64_t{256}, int64_t{1152}, int64_t{6144}})
    for (int variant = 0; variant < 3; ++variant) {
      const bool mixed = variant == 1;
      const int64_t G = 6, rows = 40;
      const std::string what = "variant " + std::to_string(variant) + " cols " + std::to_string(cols);
      std::vector<HostWeight> ws;
      for (int64_t g = 0; g < G; ++g) {
        ws.push_back(ops::make_weight(mixed && g == 3 ? Fmt::BF16 : Fmt::Mxfp4, rows, cols, rng));
        if (variant == 2)
          for (size_t i = 1; i < ws.back().scale.size(); ++i)
            ws.back().scale[i] = static_cast<uint8_t>(g == 4 ? 129 + i % 3 : 100 + i % 29);
      }
      const std::vector<int64_t> off = {0, 1, 1, 4, 13, 30, 31};
      const std::vector<float> x = rng.normals(off.back() * cols);
      const std::vector<float> want = ref_grouped(ws, off, x, rows, cols, DType::BF16);
      Arena A(gpu());
      std::vector<QuantWeight> wd;
      for (const HostWeight& w : ws) wd.push_back(A.weight(w));
      std::vector<const QuantWeight*> wp;
      for (const QuantWeight& w : wd) wp.push_back(&w);
      const Tensor xd = A.up(x, DType::BF16, off.back(), cols), y = A.tensor(DType::BF16, off.back(), rows);
      const int64_t n0 = cuda_mx_tc_matmuls(gpu());
      gpu().grouped_matmul(wp.data(), G, A.up(off), xd, y);
      EXPECT_EQ(cuda_mx_tc_matmuls(gpu()), n0 + (mixed ? 0 : 1)) << what;
      EXPECT_LE(ops::norm_err(A.down(y).data(), want.data(), want.size()), ops::kTolBf16) << what;
      // Each weight row on its own too (a wrong part or a lost one cannot hide under the other rows).
      {
        const std::vector<float> got = A.down(y);
        for (int64_t r : {int64_t{0}, int64_t{17}, rows - 1})
          EXPECT_LE(col_err(got, want, off.back(), rows, r), ops::kTolBf16) << what << " weight row " << r;
      }
      // SwiGLU (the gate table = the up table reversed): one tensor-core call counted when every weight is MXFP4,
      // equal bit for bit to the gate rows and up with the gate epilogue (FusedEpilogueEqualsUnfused checks that the
      // unfused ops compose to it).
      std::vector<const QuantWeight*> gp(wp.rbegin(), wp.rend());
      Epilogue e;
      e.glu = gp.data();
      const Tensor yg = A.tensor(DType::BF16, off.back(), rows), g = A.tensor(DType::BF16, off.back(), rows),
                   yu = A.tensor(DType::BF16, off.back(), rows);
      const int64_t n1 = cuda_mx_tc_matmuls(gpu());
      gpu().grouped_matmul(wp.data(), G, A.up(off), xd, yg, e);
      EXPECT_EQ(cuda_mx_tc_matmuls(gpu()), n1 + (mixed ? 0 : 1)) << what << " SwiGLU";
      gpu().grouped_matmul(gp.data(), G, A.up(off), xd, g);
      Epilogue eu;
      eu.gate = &g;
      gpu().grouped_matmul(wp.data(), G, A.up(off), xd, yu, eu);
      const std::vector<float> a = A.down(yg), b = A.down(yu);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what << " SwiGLU fused != unfused";
      // The backend's own unfused route (cuda_set_glu_fused_rows below this call's 31 pairs) gives the same bits.
      cuda_set_glu_fused_rows(gpu(), 0);
      gpu().grouped_matmul(wp.data(), G, A.up(off), xd, yg, e);
      cuda_set_glu_fused_rows(gpu(), 32);
      const std::vector<float> c = A.down(yg);
      EXPECT_EQ(0, std::memcmp(c.data(), a.data(), c.size() * sizeof(float))) << what << " SwiGLU unfused route";
    }
}

// The BF16 / FP8 tensor-core skinny kernels (bf16 x, weights with K % 128 == 0: BF16, FP8 block 128 / tensor /
// channel; not fnuz, not 32 x 40 blocks): taken exactly where the default dispatch says (cuda_backend.h: BF16 1 ..
// 16, FP8 1 .. 32 and the tiled kernel from 33, not one token over long rows, not under 9 tokens below 1,024 rows; the
// counter), held to the harness tolerances against the ref, each weight row on its own (a misplaced tile or scale
// cannot hide under the others' magnitude); a token's result is the same bits whatever the number of tokens of the call
// (NT and the passes do not change its arithmetic); grouped decode calls take them when every weight qualifies.
TEST(CudaDispatch, Bf16Fp8SkinnyTensorCores) {
  Rng rng(24);
  const TcOn tc_on;
  auto col_err = [](const std::vector<float>& got, const std::vector<float>& want, int64_t M, int64_t N, int64_t r) {
    std::vector<float> a, b;
    for (int64_t m = 0; m < M; ++m) {
      a.push_back(got[static_cast<size_t>(m * N + r)]);
      b.push_back(want[static_cast<size_t>(m * N + r)]);
    }
    return ops::norm_err(a.data(), b.data(), a.size());
  };
  for (Fmt f : {Fmt::BF16, Fmt::Fp8Block, Fmt::Fp8Tensor, Fmt::Fp8Channel, Fmt::Fp8BlockFnuz, Fmt::Fp8BlockOdd}) {
    const bool eligible = f != Fmt::Fp8BlockFnuz && f != Fmt::Fp8BlockOdd;
    const int64_t hi = f == Fmt::BF16 ? 16 : 32, long_row = f == Fmt::BF16 ? 4096 : 8192;
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{16, 128}, {37, 1152}, {300, 6144}, {1037, 384}, {1024, 8320}}) {
      const HostWeight w = ops::make_weight(f, rows, cols, rng);
      const int64_t mmax = rows * cols > 1'000'000 ? 17 : 129;
      const std::vector<float> x = rng.normals(mmax * cols);
      std::vector<float> first;  // row 0 of x's result at the first M that takes the kernels
      for (int64_t M : {1, 2, 5, 8, 9, 16, 17, 33, 64, 65, 128, 129}) {
        if (M > mmax || (cols > 6144 && M != 1 && M != 2 && M != 9)) continue;
        const std::vector<float> xm(x.begin(), x.begin() + M * cols);
        for (DType yt : {DType::BF16, DType::F32}) {
          std::vector<float> want;
          {
            Arena A(ref());
            const Tensor y = A.tensor(yt, M, rows);
            A.be.matmul(w.q, A.up(xm, DType::BF16, M, cols), y);
            want = A.down(y);
          }
          Arena A(gpu());
          const QuantWeight wd = A.weight(w);
          const Tensor xd = A.up(xm, DType::BF16, M, cols), y = A.tensor(yt, M, rows);
          const int64_t n0 = cuda_stc_matmuls(gpu()), t0 = cuda_tile_matmuls(gpu());
          gpu().matmul(wd, xd, y);
          const std::vector<float> got = A.down(y);
          const std::string what = std::string(ops::fmt_name(f)) + " rows " + std::to_string(rows) + " cols " +
                                   std::to_string(cols) + " M " + std::to_string(M) + " y " + ops::dtype_label(yt);
          const bool want_stc = eligible && M <= hi && (rows >= 1024 || M >= 9) && (M > 1 || cols <= long_row);
          EXPECT_EQ(cuda_stc_matmuls(gpu()), n0 + (want_stc ? 1 : 0)) << what;
          const bool want_tile = eligible && f != Fmt::BF16 && M >= 33;  // the tiled kernel above (FP8 only)
          EXPECT_EQ(cuda_tile_matmuls(gpu()), t0 + (want_tile ? 1 : 0)) << what;
          const double tol = ops::tol_for(yt), e = ops::norm_err(got.data(), want.data(), want.size());
          if (want_stc)
            ops::record_summary(std::string("cuda-only/matmul_stc/") + ops::fmt_name(f) + "/" + ops::dtype_label(yt),
                                "cuda", e, tol);
          EXPECT_LE(e, tol) << what;
          for (int64_t r : {int64_t{0}, int64_t{7}, int64_t{8}, int64_t{15}, rows - 1})
            if (r < rows) {
              EXPECT_LE(col_err(got, want, M, rows, r), tol) << what << " weight row " << r;
            }
          if (want_stc && yt == DType::F32) {
            const std::vector<float> row0(got.begin(), got.begin() + rows);
            if (first.empty())
              first = row0;
            else
              EXPECT_TRUE(same(first, row0)) << what << ": token 0 changed with the number of tokens";
          }
        }
      }
    }
  }
  // fp32 x never takes them; grouped decode calls do when every weight qualifies (one MXFP4 or F32 weight in the
  // table keeps the others' kernels).
  {
    const HostWeight w = ops::make_weight(Fmt::BF16, 40, 256, rng);
    Arena A(gpu());
    const QuantWeight wd = A.weight(w);
    const Tensor xf = A.up(rng.normals(4 * 256), DType::F32, 4, 256), yf = A.tensor(DType::F32, 4, 40);
    const int64_t n0 = cuda_stc_matmuls(gpu());
    gpu().matmul(wd, xf, yf);
    EXPECT_EQ(cuda_stc_matmuls(gpu()), n0) << "fp32 x took the bf16 tensor-core kernel";
  }
  for (Fmt other : {Fmt::BF16, Fmt::Fp8Channel, Fmt::Mxfp4, Fmt::F32}) {
    const int64_t G = 6, rows = 40, cols = 256;
    const bool stc = other != Fmt::Mxfp4 && other != Fmt::F32;
    std::vector<HostWeight> ws;
    for (int64_t g = 0; g < G; ++g) ws.push_back(ops::make_weight(g == 3 ? other : Fmt::Fp8Block, rows, cols, rng));
    const std::vector<int64_t> off = {0, 1, 1, 4, 13, 30, 31};
    const std::vector<float> x = rng.normals(off.back() * cols);
    const std::vector<float> want = ref_grouped(ws, off, x, rows, cols, DType::BF16);
    Arena A(gpu());
    std::vector<QuantWeight> wd;
    for (const HostWeight& w : ws) wd.push_back(A.weight(w));
    std::vector<const QuantWeight*> wp;
    for (const QuantWeight& w : wd) wp.push_back(&w);
    const Tensor xd = A.up(x, DType::BF16, off.back(), cols), y = A.tensor(DType::BF16, off.back(), rows);
    const int64_t n0 = cuda_stc_matmuls(gpu());
    gpu().grouped_matmul(wp.data(), G, A.up(off), xd, y);
    EXPECT_EQ(cuda_stc_matmuls(gpu()), n0 + (stc ? 1 : 0)) << ops::fmt_name(other);
    const double e = ops::norm_err(A.down(y).data(), want.data(), want.size());
    if (stc) ops::record_summary("cuda-only/grouped_stc/bf16", "cuda", e, ops::kTolBf16);
    EXPECT_LE(e, ops::kTolBf16) << ops::fmt_name(other);
  }
}

// The tiled tensor-core kernel (128 weight rows x 64 tokens per block, K split over parts with a workspace when the
// blocks would not fill the GPU), forced on for BF16 and FP8 (block / tensor / channel): every weight row and token
// against the ref at odd sizes (rows and tokens past a tile, a single 128-column block, splits of 1 to many parts),
// bf16 and fp32 y, with the bias + residual epilogue and SwiGLU (the gate weight through the same kernel); a call
// is deterministic (the same bits twice); NaN codes of an FP8 weight reach exactly their rows. FP8 in both forms:
// wgmma (the default on sm_90) and mma.sync (cuda_set_tile_wgmma off).
TEST(CudaDispatch, TiledTensorCoreMatmul) {
  Rng rng(26);
  const TcOn tc_on;
  struct Restore {
    ~Restore() {
      cuda_reset_stc_rows(gpu());
      cuda_set_tile_wgmma(gpu(), true);
    }
  } restore;
  cuda_set_stc_rows(gpu(), 1, 0, 1, 0, true);
  cuda_set_tile_rows(gpu(), 1, int64_t{1} << 40, 1, int64_t{1} << 40);
  for (const auto& [f, wgmma] : {std::pair{Fmt::BF16, false},
                                 {Fmt::Fp8Block, true},
                                 {Fmt::Fp8Tensor, true},
                                 {Fmt::Fp8Channel, true},
                                 {Fmt::Fp8Block, false},
                                 {Fmt::Fp8Channel, false}}) {
    cuda_set_tile_wgmma(gpu(), wgmma);
    if (wgmma) {
      ASSERT_TRUE(cuda::wg_tile_ok()) << "the GPU machines are sm_90: the wgmma form must be the one tested";
    }
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{37, 1152}, {300, 6144}, {1037, 384}, {130, 128}, {2048, 1024}}) {
      const HostWeight w = ops::make_weight(f, rows, cols, rng), wg = ops::make_weight(f, rows, cols, rng);
      const std::vector<float> bias = rng.normals(rows);
      for (int64_t M : {1, 17, 64, 65, 200, 256, 300}) {
        if (M >= 256 && rows * cols > 1'000'000) continue;  // (256: the wgmma form's last size; 300: mma.sync)
        const std::vector<float> x = rng.normals(M * cols), res = rng.normals(M * rows);
        for (DType yt : {DType::BF16, DType::F32}) {
          std::vector<float> want, want_glu;
          {
            Arena A(ref());
            const Tensor r = A.up(res, yt, M, rows), y = A.tensor(yt, M, rows), yg = A.tensor(yt, M, rows);
            Epilogue e;
            e.bias = A.up(bias);
            e.residual = &r;
            A.be.matmul(w.q, A.up(x, DType::BF16, M, cols), y, e);
            want = A.down(y);
            Epilogue glu;
            const QuantWeight* gq[1] = {&wg.q};
            glu.glu = gq;
            A.be.matmul(w.q, A.up(x, DType::BF16, M, cols), yg, glu);
            want_glu = A.down(yg);
          }
          Arena A(gpu());
          const QuantWeight wd = A.weight(w), wgd = A.weight(wg);
          const QuantWeight* gq[1] = {&wgd};
          const std::string what = std::string(ops::fmt_name(f)) + (wgmma && M <= 256 ? " wgmma" : "") + " rows " +
                                   std::to_string(rows) + " cols " + std::to_string(cols) + " M " + std::to_string(M) +
                                   " y " + ops::dtype_label(yt) + " K parts " +
                                   std::to_string(cuda::tile_splits(cuda::make_wdesc(wd), M));
          const Tensor xd = A.up(x, DType::BF16, M, cols), r = A.up(res, yt, M, rows), y = A.tensor(yt, M, rows),
                       y2 = A.tensor(yt, M, rows), yg = A.tensor(yt, M, rows);
          Epilogue e;
          e.bias = A.up(bias);
          e.residual = &r;
          const int64_t t0 = cuda_tile_matmuls(gpu());
          gpu().matmul(wd, xd, y, e);
          EXPECT_EQ(cuda_tile_matmuls(gpu()), t0 + 1) << what;
          gpu().matmul(wd, xd, y2, e);
          Epilogue glu;
          glu.glu = gq;
          gpu().matmul(wd, xd, yg, glu);
          const std::vector<float> got = A.down(y), got2 = A.down(y2), got_glu = A.down(yg);
          EXPECT_TRUE(same(got, got2)) << what << ": two calls differ";
          const double tol = ops::tol_for(yt), err = ops::norm_err(got.data(), want.data(), want.size());
          ops::record_summary(std::string("cuda-only/matmul_tile/") + ops::fmt_name(f) +
                                  (wgmma && M <= 256 ? "-wgmma/" : "/") + ops::dtype_label(yt),
                              "cuda", err, tol);
          EXPECT_LE(err, tol) << what;
          EXPECT_LE(ops::norm_err(got_glu.data(), want_glu.data(), want_glu.size()), tol) << what << " SwiGLU";
          // Row by row from 17 tokens (a row of fewer fp32 values is one cancellation away from its own tolerance).
          for (int64_t rr = 0; M >= 17 && rr < rows; rr += std::max<int64_t>(1, rows / 40)) {
            std::vector<float> a, b;
            for (int64_t m = 0; m < M; ++m) {
              a.push_back(got[static_cast<size_t>(m * rows + rr)]);
              b.push_back(want[static_cast<size_t>(m * rows + rr)]);
            }
            EXPECT_LE(ops::norm_err(a.data(), b.data(), a.size()), tol) << what << " weight row " << rr;
          }
        }
      }
    }
  }
  // Grouped at prefill sizes (more rows than the decode kernels take): groups of more than 16 tokens on the tiled
  // kernel, the others on the skinny ones, a table mixing BF16 and FP8, one of MXFP4 weights (decoded in shared
  // memory) and one of FP8 block weights (wgmma, and mma.sync in variant 6), plain and SwiGLU, every group's rows
  // checked.
  for (int variant = 0; variant < 7; ++variant) {
    const bool glu = variant & 1, mx = variant == 2 || variant == 3, fp8 = variant >= 4;
    cuda_set_tile_wgmma(gpu(), variant != 6);
    const int64_t G = 7, rows = 200, cols = 640;
    const Fmt mixed[G] = {Fmt::Fp8Block,  Fmt::BF16, Fmt::Fp8Channel, Fmt::Fp8Block,
                          Fmt::Fp8Tensor, Fmt::BF16, Fmt::Fp8Block};
    Fmt fmts[G];
    for (int64_t g = 0; g < G; ++g) fmts[g] = mx ? Fmt::Mxfp4 : fp8 ? Fmt::Fp8Block : mixed[g];
    // (FP8: at most 1,024 pairs, the wgmma form's grouped calls)
    const int64_t counts[G] = {fp8 ? 300 : 700, 0, 1, 17, 5, 64, fp8 ? 200 : 400};
    std::vector<HostWeight> ws, gs;
    for (Fmt f : fmts) {
      ws.push_back(ops::make_weight(f, rows, cols, rng));
      gs.push_back(ops::make_weight(f, rows, cols, rng));
    }
    std::vector<int64_t> off(G + 1, 0);
    for (int64_t g = 0; g < G; ++g) off[static_cast<size_t>(g + 1)] = off[static_cast<size_t>(g)] + counts[g];
    const int64_t n = off.back();
    const std::vector<float> x = rng.normals(n * cols);
    std::vector<float> want;
    {
      Arena A(ref());
      std::vector<const QuantWeight*> wp, gp;
      for (int64_t g = 0; g < G; ++g) {
        wp.push_back(&ws[static_cast<size_t>(g)].q);
        gp.push_back(&gs[static_cast<size_t>(g)].q);
      }
      const Tensor y = A.tensor(DType::BF16, n, rows);
      Epilogue e;
      if (glu) e.glu = gp.data();
      A.be.grouped_matmul(wp.data(), G, off.data(), A.up(x, DType::BF16, n, cols), y, e);
      want = A.down(y);
    }
    Arena A(gpu());
    std::vector<QuantWeight> wd, gd;
    for (int64_t g = 0; g < G; ++g) {
      wd.push_back(A.weight(ws[static_cast<size_t>(g)]));
      gd.push_back(A.weight(gs[static_cast<size_t>(g)]));
    }
    const std::vector<const QuantWeight*> wp = ops::ptrs(wd), gp = ops::ptrs(gd);
    const Tensor y = A.tensor(DType::BF16, n, rows);
    Epilogue e;
    if (glu) e.glu = gp.data();
    const int64_t t0 = cuda_tile_matmuls(gpu());
    gpu().grouped_matmul(wp.data(), G, A.up(off), A.up(x, DType::BF16, n, cols), y, e);
    const std::string what = "grouped prefill variant " + std::to_string(variant);
    EXPECT_EQ(cuda_tile_matmuls(gpu()), t0 + 1) << what;
    const std::vector<float> got = A.down(y);
    const double err = ops::norm_err(got.data(), want.data(), want.size());
    ops::record_summary(std::string("cuda-only/grouped_tile/") +
                            (mx             ? "mxfp4/"
                             : !fp8         ? "bf16+fp8/"
                             : variant != 6 ? "fp8-wgmma/"
                                            : "fp8/") +
                            (glu ? "swiglu" : "plain"),
                        "cuda", err, ops::kTolBf16);
    EXPECT_LE(err, ops::kTolBf16) << what;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t a = off[static_cast<size_t>(g)] * rows, b = off[static_cast<size_t>(g + 1)] * rows;
      if (b > a) {
        EXPECT_LE(ops::norm_err(got.data() + a, want.data() + a, static_cast<size_t>(b - a)), ops::kTolBf16)
            << what << " group " << g;
      }
    }
  }
  // NaN codes (0x7F / 0xFF) in two FP8 rows: those rows' outputs are NaN, every other row finite — at one token
  // (the CUDA-core kernel), 9 (the skinny tensor-core kernel, its per-block NaN vote) and 40 (this kernel); the
  // upload's scan marks the weight (fp8_nan_free false), and a weight without NaN codes true.
  {
    HostWeight w = ops::make_weight(Fmt::Fp8Block, 256, 1024, rng);
    {
      Arena A(gpu());
      EXPECT_TRUE(A.weight(w).fp8_nan_free);
    }
    w.data[1 + 77 * 1024 + 300] = 0x7F;  // q.data = data + 1
    w.data[1 + 200 * 1024 + 5] = 0xFF;
    for (int64_t M : {1, 9, 40, 41}) {
      cuda_set_tile_wgmma(gpu(), M == 40);  // 40: wgmma, 41: mma.sync
      const std::vector<float> x = rng.normals(M * 1024);
      Arena A(gpu());
      const QuantWeight wd = A.weight(w);
      EXPECT_FALSE(wd.fp8_nan_free);
      const Tensor y = A.tensor(DType::F32, M, 256);
      gpu().matmul(wd, A.up(x, DType::BF16, M, 1024), y);
      const std::vector<float> got = A.down(y);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t r = 0; r < 256; ++r) {
          const float v = got[static_cast<size_t>(m * 256 + r)];
          EXPECT_EQ(std::isnan(v), r == 77 || r == 200) << "M " << M << " token " << m << " row " << r;
        }
    }
  }
}

// The prefill (naive-form) MLA attention on tensor cores: taken for bf16 calls at DeepSeek-V3's and GLM-5's head
// sizes (the counter), equal to the ref's bf16 attention within the bf16 tolerance over every output row (a query
// that sees no key gives 0; a cached prefix before the chunk; queries past a 64-row block), and to the CUDA-core
// kernel it replaces — without and with a DSA selection (random per-row key sets of varying counts, some entries
// out of range or past the row's causal limit, duplicates, one row with an empty selection, whole 64-key tiles
// no query of a block selects).
TEST(CudaDispatch, FlashPrefillAttention) {
  Rng rng(27);
  const TcOn tc_on;
  struct Dims {
    int64_t H, dn, dr, dv, S, past;
  };
  for (const Dims& k : {Dims{4, 128, 64, 128, 130, 70}, Dims{2, 192, 64, 256, 100, 200}, Dims{3, 64, 64, 64, 65, 0}}) {
    const int64_t T = k.past + k.S, dqk = k.dn + k.dr;
    const MlaDims d{k.H, k.dn, k.dr, k.dv, 512};
    const std::vector<float> q = rng.normals(k.S * k.H * dqk), kvb = rng.normals(T * k.H * (k.dn + k.dv)),
                             kpe = rng.normals(T * k.dr);
    std::vector<int64_t> pos(static_cast<size_t>(k.S));
    for (int64_t s = 0; s < k.S; ++s) pos[static_cast<size_t>(s)] = k.past + s;
    pos[3] = -1;
    const float scale = 1.5f / std::sqrt(static_cast<float>(dqk));
    // A DSA selection: row s picks cnt[s] of `stride` entries among keys [-2, T + 5) minus keys 64..127 (a tile
    // no query selects); row 5 none.
    const int64_t stride = 48;
    std::vector<int32_t> sel(static_cast<size_t>(k.S * stride), -7), cnt(static_cast<size_t>(k.S));
    for (int64_t s = 0; s < k.S; ++s) {
      cnt[static_cast<size_t>(s)] = s == 5 ? 0 : static_cast<int32_t>(rng.integer(1, stride));
      for (int64_t j = 0; j < cnt[static_cast<size_t>(s)]; ++j) {
        int64_t t = rng.integer(-2, T + 4);
        if (t >= 64 && t < 128) t -= 64;
        sel[static_cast<size_t>(s * stride + j)] = static_cast<int32_t>(t);
      }
    }
    for (const bool dsa : {false, true}) {
      auto run = [&](Backend& be, bool flash) {
        Arena A(be);
        if (&be == &gpu()) cuda_set_flash_prefill(gpu(), flash);
        const Tensor qt = A.up(q, DType::BF16, k.S, k.H * dqk), kt = A.up(kvb, DType::BF16, T, k.H * (k.dn + k.dv)),
                     pt = A.up(kpe, DType::BF16, T, k.dr), o = A.tensor(DType::BF16, k.S, k.H * k.dv);
        const KeySelection ks = dsa ? KeySelection{A.up(sel), A.up(cnt), stride} : KeySelection{};
        A.be.mla_attention_naive(d, qt, kt, pt, T, A.up(pos), ks, scale, o);
        std::vector<float> r = A.down(o);
        cuda_set_flash_prefill(gpu(), true);
        return r;
      };
      const std::string what = "dqk " + std::to_string(dqk) + " dv " + std::to_string(k.dv) + (dsa ? " dsa" : "");
      const std::vector<float> want = run(ref(), true);
      const int64_t n0 = cuda_flash_prefill_calls(gpu());
      const std::vector<float> got = run(gpu(), true);
      EXPECT_EQ(cuda_flash_prefill_calls(gpu()), n0 + 1) << what;
      const std::vector<float> old = run(gpu(), false);
      EXPECT_EQ(cuda_flash_prefill_calls(gpu()), n0 + 1) << what << ": counted with the kernel off";
      const double e = ops::norm_err(got.data(), want.data(), want.size());
      ops::record_summary("cuda-only/mla_attention_naive_flash/" + what, "cuda", e, ops::kTolBf16);
      EXPECT_LE(e, ops::kTolBf16) << what;
      EXPECT_LE(ops::norm_err(got.data(), old.data(), old.size()), ops::kTolBf16) << what << " vs the CUDA-core kernel";
      for (int64_t s = 0; s < k.S; ++s) {
        const size_t a = static_cast<size_t>(s * k.H * k.dv), n = static_cast<size_t>(k.H * k.dv);
        if (s == 3 || (dsa && s == 5)) {
          for (size_t i = 0; i < n; ++i) EXPECT_EQ(got[a + i], 0.0f) << what << ": a query without keys";
          continue;
        }
        EXPECT_LE(ops::norm_err(got.data() + a, want.data() + a, n), ops::kTolBf16) << what << " query " << s;
      }
    }
  }
}

// The DSA indexer's scores on tensor cores (bf16 queries and key pool, head_dim 128, 32 / 64 index heads): taken
// (the counter), and equal to the CUDA-core kernel and to the ref backend up to the order of fp32 sums — every row
// of a step with a 40-row prompt chunk past several 512-key slices, a decode row of another sequence and a 3-key
// sequence (one block walks rows of several sequences), −inf exactly at the keys a row cannot see.
TEST(CudaDispatch, TensorCoreIndexer) {
  Rng rng(28);
  const TcOn tc_on;
  for (const int64_t nI : {32, 64}) {
    const int64_t dI = 128, bt = 64;
    const std::vector<std::pair<int64_t, int64_t>> seqs{{40, 1300}, {1, 700}, {3, 3}};  // (rows, context after)
    int64_t max_blocks = 0, N = 0, T = 0;
    for (const auto& [n, c] : seqs) {
      max_blocks = std::max(max_blocks, (c + bt - 1) / bt);
      N += n;
      T = std::max(T, c);
    }
    T += 70;  // a graph step scores the reserved context
    const int64_t n_seqs = static_cast<int64_t>(seqs.size()), blocks = n_seqs * max_blocks;
    std::vector<int32_t> perm(static_cast<size_t>(blocks)), q_begin{0}, ctx, table;
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng.g);
    std::vector<int64_t> pos;
    for (int64_t s = 0; s < n_seqs; ++s) {
      const auto [n, c] = seqs[static_cast<size_t>(s)];
      for (int64_t j = 0; j < max_blocks; ++j) table.push_back(perm[static_cast<size_t>(s * max_blocks + j)]);
      for (int64_t i = 0; i < n; ++i) pos.push_back(c - n + i);
      q_begin.push_back(static_cast<int32_t>(q_begin.back() + n));
      ctx.push_back(static_cast<int32_t>(c));
    }
    const std::vector<float> pool = rng.normals(blocks * bt * dI), q = rng.normals(N * nI * dI),
                             w = rng.normals(N * nI);
    auto run = [&](Backend& be, bool tc) {
      Arena A(be);
      if (&be == &gpu()) cuda_set_tc_indexer(gpu(), tc);
      const KvPool kp = A.pool(pool, DType::BF16, blocks, bt, dI);
      const StepSeqs ss{n_seqs, A.up(q_begin), A.up(ctx), A.up(table), max_blocks, T - 70};
      float* sc = A.out<float>(static_cast<size_t>(N * T));
      A.be.indexer_scores_paged(A.up(q, DType::BF16, N, nI * dI), A.up(w, DType::F32, N, nI), kp, ss, 0, nI,
                                1.0f / std::sqrt(static_cast<float>(dI)), A.up(pos), T, sc);
      std::vector<float> r(static_cast<size_t>(N * T));
      be.download(r.data(), sc, r.size() * sizeof(float));
      cuda_set_tc_indexer(gpu(), true);
      return r;
    };
    const int64_t n0 = cuda_tc_indexer_calls(gpu());
    const std::vector<float> got = run(gpu(), true);
    EXPECT_EQ(cuda_tc_indexer_calls(gpu()), n0 + 1) << "nI " << nI;
    const std::vector<float> old = run(gpu(), false), want = run(ref(), true);
    EXPECT_EQ(cuda_tc_indexer_calls(gpu()), n0 + 1) << "nI " << nI << ": counted with the kernel off";
    double worst = 0.0;
    for (const auto* other : {&old, &want})
      for (int64_t r = 0; r < N; ++r) {
        double mx = 0.0;
        for (int64_t t = 0; t < T; ++t) {
          const float b = (*other)[static_cast<size_t>(r * T + t)];
          if (std::isfinite(b)) mx = std::max(mx, static_cast<double>(std::fabs(b)));
        }
        for (int64_t t = 0; t < T; ++t) {
          const float a = got[static_cast<size_t>(r * T + t)], b = (*other)[static_cast<size_t>(r * T + t)];
          const bool visible = t <= pos[static_cast<size_t>(r)];
          ASSERT_EQ(std::isinf(b) && b < 0, !visible) << "nI " << nI << " row " << r << " key " << t;
          if (!visible) {
            ASSERT_TRUE(std::isinf(a) && a < 0) << "nI " << nI << " row " << r << " key " << t << ": " << a;
            continue;
          }
          const double e = std::fabs(static_cast<double>(a) - b) / std::max(mx, 1e-30);
          worst = std::max(worst, e);
          ASSERT_LE(e, 1e-5) << "nI " << nI << " row " << r << " key " << t << ": " << a << " vs " << b;
        }
      }
    std::printf("[cuda dispatch] tensor-core indexer nI %lld: max |d| / row max %.2e (vs CUDA-core kernel and ref)\n",
                static_cast<long long>(nI), worst);
  }
}

// The MLA decode block's absorptions take the tensor cores for FP8 kv_b whose 128 x 128 scale blocks fit the heads
// (DeepSeek-V3's dims, per-tensor FP8) as for bf16, and the CUDA-core kernels otherwise; the harness cases
// mla_decode_attention/deepseek/* and head_block/* hold both paths to the ref.
TEST(CudaDispatch, MlaAbsorptionOnTensorCoresForFp8KvB) {
  Rng rng(25);
  struct Want {
    Fmt f;
    MlaDims d;
    bool tc;
  };
  const Want cases[] = {{Fmt::BF16, MlaDims{4, 128, 64, 128, 512}, true},
                        {Fmt::Fp8Block, MlaDims{4, 128, 64, 128, 512}, true},
                        {Fmt::Fp8Block, MlaDims{3, 64, 32, 64, 256}, true},
                        {Fmt::Fp8Tensor, MlaDims{3, 64, 32, 64, 256}, true},
                        {Fmt::Fp8Channel, MlaDims{4, 128, 64, 128, 512}, false},
                        {Fmt::Fp8BlockFnuz, MlaDims{4, 128, 64, 128, 512}, false},
                        {Fmt::Fp8Block, MlaDims{3, 16, 8, 16, 64}, false},       // dn + dv = 32: blocks span heads
                        {Fmt::Fp8Block, MlaDims{64, 192, 64, 256, 512}, false},  // dn 192 > a 128-row block
                        {Fmt::Mxfp4, MlaDims{4, 128, 64, 128, 512}, false}};
  for (const Want& w : cases) {
    const HostWeight h = ops::make_weight(w.f, w.d.n_heads * (w.d.nope + w.d.v), w.d.latent, rng);
    Arena A(gpu());
    const QuantWeight q = A.weight(h);
    EXPECT_EQ(cuda::absorb_tc_ok(w.d, cuda::make_wdesc(q)), w.tc)
        << ops::fmt_name(w.f) << " dn " << w.d.nope << " dv " << w.d.v << " dc " << w.d.latent;
  }
}

// The epilogue contract of backend.h on the device: fused = unfused op sequence bit for bit.
TEST(CudaBackend, FusedEpilogueEqualsUnfused) { ops::expect_fused_equals_unfused(gpu(), "cuda"); }
TEST(CudaBackend, DecodeBlocksEqualDefaults) { ops::expect_blocks_equal_defaults(gpu(), "cuda"); }

// ---------------------------------------------------------------------------------------------------------------
// Graphs: typed ops recorded once and replayed on new inputs uploaded into the same buffers equal eager runs bit
// for bit (a fused SwiGLU matmul, a residual matmul, add_rms_norm, RoPE on a column view, in both dtypes).
// ---------------------------------------------------------------------------------------------------------------
TEST(CudaGraphs, TypedOpsReplayEqualsEager) {
  Rng rng(30);
  for (DType t : {DType::F32, DType::BF16}) {
    const int64_t M = 3, D = 64, I = 96, H = 2, dr = 16, hs = 24;
    const HostWeight wu = ops::make_weight(Fmt::Mxfp4, I, D, rng), wg = ops::make_weight(Fmt::Mxfp4, I, D, rng),
                     wd = ops::make_weight(Fmt::BF16, D, I, rng);
    const std::vector<float> norm_w = rng.normals(D);
    std::vector<float> inv(dr / 2);
    for (int64_t i = 0; i < dr / 2; ++i)
      inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / dr);
    Arena A(gpu());
    const QuantWeight u = A.weight(wu), g = A.weight(wg), d = A.weight(wd);
    const QuantWeight* gp[1] = {&g};
    const Tensor x = A.tensor(t, M, D), h = A.tensor(t, M, D), mid = A.tensor(t, M, I), y = A.tensor(t, M, D),
                 q = A.tensor(t, M, H * hs);
    int64_t* pos = A.out<int64_t>(M);
    const float* nw = A.up(norm_w);
    RopeParams rp;
    rp.inv_freq = A.up(inv);
    rp.dim = dr;
    auto step = [&] {
      Epilogue glu;
      glu.glu = gp;
      gpu().matmul(u, x, mid, glu);
      Epilogue res;
      res.residual = &h;
      gpu().matmul(d, mid, h, res);
      gpu().add_rms_norm(h, x, nw, 1e-6f, y);
      gpu().rope(q.col_slice(hs - dr, (H - 1) * hs + dr), H, hs, pos, rp);
    };
    auto load = [&](uint64_t seed) {
      Rng r(seed);
      const std::vector<float> hx = r.normals(M * D), hh = r.normals(M * D), hq = r.normals(M * H * hs);
      std::vector<int64_t> hp(M);
      for (int64_t& p : hp) p = r.integer(0, 4000);
      A.set(x, hx);
      A.set(h, hh);
      A.set(q, hq);
      gpu().upload(pos, hp.data(), hp.size() * sizeof(int64_t));
    };
    auto outputs = [&] {
      std::vector<float> o = A.down(y), oh = A.down(h), oq = A.down(q);
      o.insert(o.end(), oh.begin(), oh.end());
      o.insert(o.end(), oq.begin(), oq.end());
      return o;
    };
    load(1);
    step();  // eager first: every one-time setup happens outside the recording
    gpu().sync();
    load(1);
    gpu().graph_begin();
    step();
    const int id = gpu().graph_end();
    EXPECT_GT(gpu().graph_kernels(id), 0);
    for (uint64_t s = 2; s < 5; ++s) {
      load(s);
      gpu().graph_replay(id);
      const std::vector<float> replayed = outputs();
      load(s);
      step();
      const std::vector<float> eager = outputs();
      ASSERT_EQ(replayed.size(), eager.size());
      EXPECT_EQ(0, std::memcmp(replayed.data(), eager.data(), eager.size() * sizeof(float)))
          << ops::dtype_label(t) << " replay " << s;
    }
    gpu().graph_release(id);
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
      case 1:
        p.temperature = 0.0f;
        p.repetition_penalty = 1.4f;
        p.frequency_penalty = 0.5f;
        edits(60, true, true, true);
        break;
      case 2: break;
      case 3: p.temperature = 0.7f; break;
      case 4: p.top_k = 50; break;
      case 5:
        p.top_k = 1;
        p.temperature = 2.0f;
        break;
      case 6: p.top_p = 0.9f; break;
      case 7:
        p.top_p = 0.5f;
        p.temperature = 0.6f;
        break;
      case 8: p.min_p = 0.05f; break;
      case 9: p.min_p = 1.0f; break;
      case 10:
        p.top_k = 400;
        p.top_p = 0.95f;
        p.min_p = 0.01f;
        p.temperature = 1.2f;
        break;
      case 11:
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.4f;
        p.frequency_penalty = -0.2f;
        edits(200, false, true, true);
        break;
      case 12:
        edits(30, true, false, false);
        mask(3);
        p.top_p = 0.8f;
        break;
      case 13:
        mask(3);
        p.top_k = static_cast<int32_t>(V);
        p.min_p = 0.001f;
        break;
      case 14: mask(static_cast<int>(V) + 1); break;  // one allowed id (2)
      default: mask(0); break;                        // nothing allowed: the first non-banned id
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
        ops::Arena dv(gpu());
        float* xd = dv.up(c.logits);
        int32_t* idd = dv.out<int32_t>(static_cast<size_t>(rows));
        gpu().sample_rows(xd, rows, V, dv.up(c.rows), c.edits.empty() ? nullptr : dv.up(c.edits),
                          c.allow.empty() ? nullptr : dv.up(c.allow), dv.up(c.banned), idd);
        const std::vector<int32_t> id = dv.down(idd, ir.size());
        int diff = 0;
        for (int64_t r = 0; r < rows; ++r) {
          diff += id[r] != ir[r];
          EXPECT_EQ(id[r], ir[r]) << "V " << V << " row " << r << " (mix " << r % 16 << ")";
        }
        EXPECT_TRUE(same(dv.down(xd, xr.size()), xr)) << "final scores, V " << V << " rows " << rows;
        ops::record_summary("cuda-only/sample_rows/V" + std::to_string(V) + " (rows whose id differs)", "cuda", diff,
                            0.0);
        total += rows;
      }
    }
  }
  std::printf("[op harness] cuda-only sample_rows: %lld rows, device ids = reference ids\n",
              static_cast<long long>(total));
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
      ops::Arena dv(gpu());
      int32_t* idd = dv.out<int32_t>(static_cast<size_t>(rows));
      gpu().sample_rows(dv.up(x), rows, V, dv.up(ps), nullptr, nullptr, nullptr, idd);
      for (int32_t id : dv.down(idd, static_cast<size_t>(rows))) {
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
  ops::Arena dv(gpu());
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
    EXPECT_EQ(dv.down(idd, ir.size()), ir) << "replay " << step;
  }
  gpu().graph_release(g);
}

}  // namespace
}  // namespace latent
