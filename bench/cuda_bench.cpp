// CUDA backend kernel timings (GPU machine): device copy bandwidth (the ceiling), decode GEMV / skinny GEMM GB/s
// per weight format and shape, the tiled prefill matmul's TFLOP/s, the bf16-mode prefill matmul (cuBLASLt) against
// it (`cuda_bench prefill` alone) and the paged absorbed attention at decode.
// Weights are rotated over enough copies (≥ 512 MB) that no timing runs out of the 60 MB L2. Figures are bytes that
// must move (weights + scales; activations are negligible at these M) over the median-free mean time of `iters`
// back-to-back launches measured with a host clock after a sync.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include "backend/backend.h"

#include "bench_decode.h"
#include "counting_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/model.h"
#include "model/weights.h"
#include "quant/float_formats.h"
#include "runtime/sampler.h"

namespace latent {
namespace {

uint64_t g_state = 0x9E3779B97F4A7C15ull;
uint64_t next_u64() {
  g_state ^= g_state << 13;
  g_state ^= g_state >> 7;
  g_state ^= g_state << 17;
  return g_state;
}
float next_normalish() { return static_cast<float>(static_cast<int64_t>(next_u64() % 2001) - 1000) / 700.0f; }

struct HostWeight {
  std::vector<uint8_t> data, scale;
  QuantWeight q;
  size_t bytes() const { return data.size() + scale.size(); }
};

HostWeight make(WeightFormat f, int64_t rows, int64_t cols) {
  HostWeight h;
  h.q.format = f;
  h.q.rows = rows;
  h.q.cols = cols;
  h.data.resize(static_cast<size_t>(rows * h.q.row_bytes()));
  switch (f) {
    case WeightFormat::BF16:
      for (size_t i = 0; i < h.data.size() / 2; ++i) {
        const uint16_t b = f32_to_bf16(next_normalish());
        std::memcpy(h.data.data() + 2 * i, &b, 2);
      }
      break;
    case WeightFormat::FP8_E4M3_BLOCK:
      for (uint8_t& c : h.data) {
        c = static_cast<uint8_t>(next_u64());
        if ((c & 0x7F) == 0x7F) c = 0x3F;
      }
      h.scale.resize(static_cast<size_t>((rows + 127) / 128 * h.q.scale_cols()) * 4);
      for (size_t i = 0; i < h.scale.size() / 4; ++i) {
        const float s = 1.0f / 256.0f;
        std::memcpy(h.scale.data() + 4 * i, &s, 4);
      }
      break;
    case WeightFormat::MXFP4:
      for (uint8_t& c : h.data) c = static_cast<uint8_t>(next_u64());
      h.scale.resize(static_cast<size_t>(rows * h.q.scale_cols()));
      for (uint8_t& c : h.scale) c = static_cast<uint8_t>(120 + next_u64() % 10);
      break;
    default:
      for (uint8_t& c : h.data) c = static_cast<uint8_t>(next_u64());
      break;
  }
  h.q.data = h.data.data();
  h.q.scale = h.scale.empty() ? nullptr : h.scale.data();
  return h;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Host fp32 values [rows, cols] uploaded as a backend tensor of dtype dt (bf16: rounded); free with be.dealloc(t.data).
Tensor upload_act(Backend& be, const std::vector<float>& v, int64_t rows, int64_t cols, DType dt) {
  Tensor t(be.alloc(static_cast<size_t>(rows * cols) * Tensor::size_of(dt), "bench activations"), dt, rows, cols);
  if (dt == DType::BF16) {
    std::vector<uint16_t> b(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(v[i]);
    be.upload(t.data, b.data(), b.size() * 2);
  } else {
    be.upload(t.data, v.data(), static_cast<size_t>(rows * cols) * 4);
  }
  return t;
}

// Copies of one weight spanning at least 512 MiB, so that the calls of a timing loop each read a copy no longer in
// L2.
std::vector<QuantWeight> weight_copies(Backend& be, const HostWeight& h) {
  const size_t copies = std::max<size_t>(2, (size_t{512} << 20) / h.bytes() + 1);
  std::vector<QuantWeight> ws;
  for (size_t i = 0; i < copies; ++i) ws.push_back(be.prepare_weight(h.q));
  return ws;
}

// The operands of a linear timing: weight_copies of h, a random x of max_m rows and its y, both of dtype act.
struct LinearOperands {
  std::vector<QuantWeight> ws;
  Tensor x, y;
};
LinearOperands linear_operands(Backend& be, const HostWeight& h, int64_t max_m, DType act = DType::BF16) {
  const int64_t rows = h.q.rows, cols = h.q.cols;
  LinearOperands o{weight_copies(be, h), {}, {}};
  std::vector<float> x(static_cast<size_t>(max_m * cols));
  for (float& v : x) v = next_normalish();
  o.x = upload_act(be, x, max_m, cols, act);
  o.y = Tensor(be.alloc(static_cast<size_t>(max_m * rows) * Tensor::size_of(act), "y"), act, max_m, rows);
  return o;
}

void bench_matmul(Backend& be, const char* label, WeightFormat f, int64_t rows, int64_t cols, DType act) {
  const HostWeight h = make(f, rows, cols);
  const LinearOperands op = linear_operands(be, h, 512, act);
  const std::vector<QuantWeight>& ws = op.ws;
  const size_t copies = ws.size();
  const Tensor &xd = op.x, &yd = op.y;
  for (int64_t M : {int64_t{1}, int64_t{4}, int64_t{8}, int64_t{16}, int64_t{512}}) {
    const int iters = M >= 512 ? 6 : 60;
    for (int i = 0; i < 3; ++i) be.matmul(ws[static_cast<size_t>(i) % copies], xd.with_rows(M), yd.with_rows(M));
    be.sync();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) be.matmul(ws[static_cast<size_t>(i) % copies], xd.with_rows(M), yd.with_rows(M));
    be.sync();
    const double t = seconds_since(t0) / iters;
    const double gbs = static_cast<double>(h.bytes()) / t / 1e9;
    const double tflops = 2.0 * static_cast<double>(M * rows * cols) / t / 1e12;
    std::printf(
        "%-28s %-8s x %-4s %6lld x %-6lld %6.1f MB  M=%-4lld %9.2f us  %7.0f GB/s (%4.1f%% of 4310)  %7.2f TFLOP/s\n",
        label, std::string(weight_format_name(f)).c_str(), std::string(dtype_name(act)).c_str(),
        static_cast<long long>(rows), static_cast<long long>(cols), h.bytes() / 1e6, static_cast<long long>(M), t * 1e6,
        gbs, 100.0 * gbs / 4310.0, tflops);
  }
  be.dealloc(xd.data);
  be.dealloc(yd.data);
}

// The BF16 / FP8 tensor-core skinny kernels and the tiled kernel (cuda_skinny_tc.cu), each forced, against the
// kernels they replace (GEMV / CUDA-core skinny kernels up to 16 rows, cuBLASLt for BF16 and the wmma tensor-core
// kernel for FP8 above), bf16 x, per M: µs, weight GB/s and % of 4.31 TB/s for each path (TFLOP/s for the tiled
// kernel; for FP8 also its mma.sync form, the wgmma one being the default on sm_90), and which the default dispatch
// takes.
const char* g_skinny_only = nullptr;  // cuda_bench skinny [substring]: only the matrices whose label has it

void bench_skinny(Backend& be, const char* label, WeightFormat f, int64_t rows, int64_t cols,
                  const std::vector<int64_t>& ms) {
  if (g_skinny_only && !std::strstr(label, g_skinny_only)) return;
  const HostWeight h = make(f, rows, cols);
  const LinearOperands op = linear_operands(be, h, *std::max_element(ms.begin(), ms.end()));
  const std::vector<QuantWeight>& ws = op.ws;
  const size_t copies = ws.size();
  const Tensor &xd = op.x, &yd = op.y;
  auto time = [&](int64_t M) {
    const int iters = M >= 256 ? 10 : 50;
    for (int i = 0; i < 3; ++i) be.matmul(ws[static_cast<size_t>(i) % copies], xd.with_rows(M), yd.with_rows(M));
    be.sync();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) be.matmul(ws[static_cast<size_t>(i) % copies], xd.with_rows(M), yd.with_rows(M));
    be.sync();
    return seconds_since(t0) / iters;
  };
  for (int64_t M : ms) {
    cuda_set_tile_rows(be, 1, 0, 1, 0);  // the skinny kernels forced
    cuda_set_stc_rows(be, 1, 1 << 20, 1, 1 << 20, true);
    const int64_t n0 = cuda_stc_matmuls(be);
    const double ts = time(M);
    const bool took = cuda_stc_matmuls(be) > n0;
    cuda_set_stc_rows(be, 1, 0, 1, 0, true);  // the tiled kernel forced
    cuda_set_tile_rows(be, 1, int64_t{1} << 40, 1, int64_t{1} << 40);
    const int64_t t0 = cuda_tile_matmuls(be);
    const double tt = time(M);
    const bool took_tile = cuda_tile_matmuls(be) > t0;
    const bool fp8 = f != WeightFormat::BF16;
    cuda_set_tile_wgmma(be, false);  // FP8: the tiled kernel's mma.sync form
    const double tm = fp8 ? time(M) : 0.0;
    cuda_set_tile_wgmma(be, true);
    cuda_set_tile_rows(be, 1, 0, 1, 0);  // neither: the paths they replace
    const double to = time(M);
    cuda_reset_stc_rows(be);  // the defaults (cuda_backend.h)
    const int64_t n1 = cuda_stc_matmuls(be), t1 = cuda_tile_matmuls(be);
    time(M);
    const char* dflt = cuda_stc_matmuls(be) > n1 ? "stc" : cuda_tile_matmuls(be) > t1 ? "tile" : "before";
    auto gbs = [&](double t) { return static_cast<double>(h.bytes()) / t / 1e9; };
    const double flop = 2.0 * static_cast<double>(M) * static_cast<double>(rows) * static_cast<double>(cols);
    std::printf(
        "skinny %-22s %-18s %6lld x %-6lld M=%-4lld  stc %8.2f us %6.0f GB/s (%5.1f%%)%s  tile %8.2f us %6.0f GB/s "
        "(%5.1f%%) %6.1f TFLOP/s%s  mma.sync %8.2f us %6.1f TFLOP/s  before %8.2f us %6.0f GB/s (%5.1f%%)  "
        "default: %s\n",
        label, std::string(weight_format_name(f)).c_str(), static_cast<long long>(rows), static_cast<long long>(cols),
        static_cast<long long>(M), ts * 1e6, gbs(ts), 100.0 * gbs(ts) / 4310.0, took ? "" : " (not taken)", tt * 1e6,
        gbs(tt), 100.0 * gbs(tt) / 4310.0, flop / tt / 1e12, took_tile ? "" : " (not taken)", tm * 1e6,
        tm > 0 ? flop / tm / 1e12 : 0.0, to * 1e6, gbs(to), 100.0 * gbs(to) / 4310.0, dflt);
  }
  be.dealloc(xd.data);
  be.dealloc(yd.data);
}

// Prefill matmul of the bf16 activation mode (Backend::matmul_bf16: cuBLASLt with bf16 operands for BF16 weights
// and MXFP4 weights dequantized whole to bf16 first; FP8 weights take the exact kernels) against the exact fp32 path
// (matmul: the skinny kernel ≤ 16 rows, the 64×64 tiled kernel above), TFLOP/s against the H200's dense bf16 peak: 990
// (datasheet) and 790 (cuBLAS 8192³ measured here, docs/cuda.md). Weights rotate over copies ≥ 512 MB (no L2 reuse
// between calls); x is bf16 values.
void bench_prefill(Backend& be, const char* label, WeightFormat f, int64_t rows, int64_t cols) {
  const HostWeight h = make(f, rows, cols);
  const std::vector<QuantWeight> ws = weight_copies(be, h);
  const size_t copies = ws.size();
  const int64_t max_m = 2048;
  std::vector<float> x(static_cast<size_t>(max_m * cols));
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(next_normalish()));
  const Tensor xf = upload_act(be, x, max_m, cols, DType::F32), xb = upload_act(be, x, max_m, cols, DType::BF16);
  const Tensor yd(be.alloc(static_cast<size_t>(max_m * rows) * 4, "y"), DType::F32, max_m, rows);
  std::vector<const QuantWeight*> wp{&ws[0]};
  be.reserve_matmul(wp.data(), wp.size(), max_m, DType::BF16);
  for (int64_t M : {int64_t{17}, int64_t{32}, int64_t{64}, int64_t{512}, int64_t{2048}}) {
    double t[2] = {0.0, 0.0};
    for (int path = 0; path < 2; ++path) {
      auto run = [&](size_t i) { be.matmul(ws[i % copies], (path == 0 ? xf : xb).with_rows(M), yd.with_rows(M)); };
      const int iters = path == 0 ? (M >= 512 ? 2 : 10) : (M >= 512 ? 20 : 60);
      for (size_t i = 0; i < 2; ++i) run(i);
      be.sync();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run(static_cast<size_t>(i));
      be.sync();
      t[path] = seconds_since(t0) / iters;
    }
    const double flop = 2.0 * static_cast<double>(M) * static_cast<double>(rows) * static_cast<double>(cols);
    const double tf = flop / t[1] / 1e12;
    std::printf(
        "prefill %-20s %-8s %5lld x %-5lld M=%-5lld exact %9.1f us %6.1f TFLOP/s | bf16 mode %8.1f us "
        "%6.1f TFLOP/s = %4.1f%% of 990, %4.1f%% of 790 (%5.1fx)\n",
        label, std::string(weight_format_name(f)).c_str(), static_cast<long long>(rows), static_cast<long long>(cols),
        static_cast<long long>(M), t[0] * 1e6, flop / t[0] / 1e12, t[1] * 1e6, tf, 100.0 * tf / 990.0,
        100.0 * tf / 790.0, t[0] / t[1]);
  }
  be.dealloc(xf.data);
  be.dealloc(xb.data);
  be.dealloc(yd.data);
}

// Declared FP8 activations (--activations declared) on block-FP8 weights, bf16 mode: matmul_act_fp8 on the FP8 x FP8
// cuBLASLt GEMM (quantize x to codes + 1 x 128 scales, the block-scaled GEMM, the epilogue) against the default
// composition (cuda_set_fp8_gemm_rows 0: quantize to q · s in fp32, then the exact fp32 kernels) and against the
// exact route of the bf16 mode (matmul: raw e4m3 codes into bf16 tensor cores, no activation rounding). Per M: µs,
// weight GB/s (% of 4.31 TB/s) and TFLOP/s against the dense peaks of the H200's datasheet: FP8 1,979, bf16 990.
void bench_act_fp8(Backend& be, const char* label, int64_t rows, int64_t cols, const std::vector<int64_t>& ms) {
  const HostWeight h = make(WeightFormat::FP8_E4M3_BLOCK, rows, cols);
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  const LinearOperands op = linear_operands(be, h, max_m);
  const std::vector<QuantWeight>& ws = op.ws;
  const size_t copies = ws.size();
  const Tensor &xb = op.x, &yd = op.y;
  ActFp8 a;
  a.scratch = static_cast<float*>(be.alloc(static_cast<size_t>(max_m * cols) * 4, "act scratch"));
  a.scratch_floats = max_m * cols;
  for (int64_t M : ms) {
    double t[3] = {0.0, 0.0, 0.0};
    int64_t took = 0;
    for (int path = 0; path < 3; ++path) {
      cuda_set_fp8_gemm_rows(be, path == 0 ? 1 : 0);
      auto run = [&](size_t i) {
        if (path == 2)
          be.matmul(ws[i % copies], xb.with_rows(M), yd.with_rows(M));
        else
          be.matmul_act_fp8(ws[i % copies], xb.with_rows(M), a, yd.with_rows(M));
      };
      const double flop = 2.0 * static_cast<double>(M * rows * cols);
      const int iters = std::clamp(static_cast<int>(2e12 / std::max(flop, 1e9)), path == 1 ? 2 : 5, 200);
      for (size_t i = 0; i < 2; ++i) run(i);
      be.sync();
      const int64_t n0 = cuda_fp8_gemm_calls(be);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run(static_cast<size_t>(i));
      be.sync();
      t[path] = seconds_since(t0) / iters;
      if (path == 0) took = cuda_fp8_gemm_calls(be) - n0;
    }
    cuda_set_fp8_gemm_rows(be, 1);
    const double flop = 2.0 * static_cast<double>(M * rows * cols), gb = static_cast<double>(h.bytes()) / 1e9;
    std::printf(
        "act-fp8 %-22s %5lld x %-5lld M=%-5lld fp8xfp8 %9.1f us %7.0f GB/s (%4.1f%%) %7.1f TFLOP/s = %4.1f%% of 1979%s"
        " | composition %9.1f us (%5.1fx) | exact bf16 mode %9.1f us %6.1f TFLOP/s (%4.1fx)\n",
        label, static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(M), t[0] * 1e6,
        gb / t[0], 100.0 * gb / t[0] / 4310.0, flop / t[0] / 1e12, 100.0 * flop / t[0] / 1e12 / 1979.0,
        took > 0 ? "" : " (NOT TAKEN)", t[1] * 1e6, t[1] / t[0], t[2] * 1e6, flop / t[2] / 1e12, t[2] / t[0]);
  }
  be.dealloc(a.scratch);
  be.dealloc(xb.data);
  be.dealloc(yd.data);
}

// One MoE layer's routed experts at prefill: `tokens` tokens × top_k over E experts, spread evenly (tokens·top_k/E
// rows each), fp32 tiled kernel (grouped_matmul) vs the bf16 mode's tensor-core kernel (grouped_matmul_bf16).
void bench_grouped_prefill(Backend& be, WeightFormat f, int64_t E, int64_t tokens, int64_t top_k, int64_t rows,
                           int64_t cols) {
  const HostWeight h = make(f, rows, cols);
  std::vector<QuantWeight> ws;
  for (int64_t e = 0; e < E; ++e) ws.push_back(be.prepare_weight(h.q));
  std::vector<const QuantWeight*> wp(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) wp[static_cast<size_t>(e)] = &ws[static_cast<size_t>(e)];
  const int64_t n = tokens * top_k;
  std::vector<int64_t> off(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) off[static_cast<size_t>(e + 1)] = n * (e + 1) / E;
  auto* offd = static_cast<int64_t*>(be.alloc(off.size() * 8, "offsets"));
  be.upload(offd, off.data(), off.size() * 8);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(next_normalish()));
  const Tensor xf = upload_act(be, x, n, cols, DType::F32), xb = upload_act(be, x, n, cols, DType::BF16);
  const Tensor yd(be.alloc(static_cast<size_t>(n * rows) * 4, "y"), DType::F32, n, rows);
  // Paths: 0 fp32 x (the exact tiled kernel), 1 bf16 x with the grouped tiled tensor-core kernel off (the wmma
  // kernel), 2 bf16 x as dispatched by default (BF16 / FP8: the tiled kernel).
  double t[3] = {0.0, 0.0, 0.0};
  for (int path = 0; path < 3; ++path) {
    if (path == 1) cuda_set_tile_rows(be, 1, 0, 1, 0, false);
    auto run = [&] { be.grouped_matmul(wp.data(), E, offd, path == 0 ? xf : xb, yd); };
    run();
    be.sync();
    const int iters = path == 0 ? 2 : 10;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) run();
    be.sync();
    t[path] = seconds_since(t0) / iters;
    if (path == 1) cuda_reset_stc_rows(be);
  }
  const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(rows) * static_cast<double>(cols);
  std::printf(
      "grouped prefill %s %lld experts, %lld tokens x top-%lld (%lld rows each), [%lld x %lld]: fp32 tiled "
      "%.1f us %.1f TFLOP/s | bf16 wmma %.1f us %.1f TFLOP/s | bf16 default %.1f us %.1f TFLOP/s (%.1fx wmma)\n",
      std::string(weight_format_name(f)).c_str(), static_cast<long long>(E), static_cast<long long>(tokens),
      static_cast<long long>(top_k), static_cast<long long>(n / E), static_cast<long long>(rows),
      static_cast<long long>(cols), t[0] * 1e6, flop / t[0] / 1e12, t[1] * 1e6, flop / t[1] / 1e12, t[2] * 1e6,
      flop / t[2] / 1e12, t[1] / t[2]);
  be.dealloc(offd);
  be.dealloc(xf.data);
  be.dealloc(xb.data);
  be.dealloc(yd.data);
}

void run_prefill_benches(Backend& be) {
  cuda_set_tc_dispatch(be, true);  // the bf16 mode's tensor-core kernel for FP8 (the default)
  bench_prefill(be, "bf16 7168x2048", WeightFormat::BF16, 7168, 2048);
  bench_prefill(be, "bf16 2048x7168", WeightFormat::BF16, 2048, 7168);
  bench_prefill(be, "fp8 block 7168x2048", WeightFormat::FP8_E4M3_BLOCK, 7168, 2048);
  bench_prefill(be, "mxfp4 expert GLM-5", WeightFormat::MXFP4, 2048, 6144);
  bench_prefill(be, "mxfp4 expert down", WeightFormat::MXFP4, 6144, 2048);
  bench_grouped_prefill(be, WeightFormat::MXFP4, 256, 2048, 8, 2048, 6144);           // GLM-5 gate/up, 2048-token chunk
  bench_grouped_prefill(be, WeightFormat::FP8_E4M3_BLOCK, 256, 2048, 8, 2048, 7168);  // DeepSeek-V3 gate/up
  bench_grouped_prefill(be, WeightFormat::FP8_E4M3_BLOCK, 256, 2048, 8, 7168, 2048);  // DeepSeek-V3 down
  bench_grouped_prefill(be, WeightFormat::BF16, 64, 2048, 8, 2048, 7168);             // bf16 experts
}

// The device's copy bandwidth (bytes read + written per second) over 2 GiB, the best of `iters` copies: the ceiling
// the memory floors of this run are also given against (the figures of other GPUs stay comparable by it).
double device_copy_bytes_per_s(Backend& be, int iters = 10) {
  const size_t bytes = size_t{2} << 30;
  void* a = be.alloc(bytes, "copy src");
  void* b = be.alloc(bytes, "copy dst");
  std::vector<uint8_t> junk(1 << 20, 0x5A);
  for (size_t o = 0; o < bytes; o += junk.size()) be.upload(static_cast<char*>(a) + o, junk.data(), junk.size());
  be.copy(b, a, bytes);
  be.sync();
  double best = 1e300;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    be.copy(b, a, bytes);
    be.sync();
    best = std::min(best, seconds_since(t0));
  }
  be.dealloc(a);
  be.dealloc(b);
  return 2.0 * static_cast<double>(bytes) / best;
}

void bench_copy(Backend& be) {
  const double bps = device_copy_bytes_per_s(be);
  std::printf("device copy 2 GiB: %.3f ms, %.0f GB/s (read + write, best of 10)\n", 2.0 * (size_t{2} << 30) / bps * 1e3,
              bps / 1e9);
}

// The device offsets of E / active expert sets: set k gives experts k·active .. (k+1)·active − 1 tpe tokens each (the
// grouped benches rotate through them, so that the selected weights come from HBM, not the L2).
std::vector<int64_t*> rotating_offsets(Backend& be, int64_t E, int64_t active, int64_t tpe) {
  std::vector<int64_t*> offs;
  for (int64_t k = 0; k < E / active; ++k) {
    std::vector<int64_t> off(static_cast<size_t>(E + 1), 0);
    for (int64_t e = 0; e < E; ++e)
      off[static_cast<size_t>(e + 1)] = off[static_cast<size_t>(e)] + (e / active == k ? tpe : 0);
    auto* d = static_cast<int64_t*>(be.alloc(off.size() * 8, "offsets"));
    be.upload(d, off.data(), off.size() * 8);
    offs.push_back(d);
  }
  return offs;
}

// One MoE layer's SwiGLU experts as the model calls them (gate and up [rows, cols] each, MXFP4, bf16 x): `active`
// experts with `tpe` tokens each, a different set every call.
void bench_grouped_glu(Backend& be, int64_t E, int64_t active, int64_t rows, int64_t cols, int64_t tpe) {
  const HostWeight h = make(WeightFormat::MXFP4, rows, cols);
  std::vector<QuantWeight> up, gate;
  for (int64_t e = 0; e < E; ++e) {
    up.push_back(be.prepare_weight(h.q));
    gate.push_back(be.prepare_weight(h.q));
  }
  std::vector<const QuantWeight*> up_p, gate_p;
  for (int64_t e = 0; e < E; ++e) {
    up_p.push_back(&up[static_cast<size_t>(e)]);
    gate_p.push_back(&gate[static_cast<size_t>(e)]);
  }
  const std::vector<int64_t*> offs = rotating_offsets(be, E, active, tpe);
  const int sets = static_cast<int>(offs.size());
  const int64_t n = active * tpe;
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& v : x) v = next_normalish();
  const Tensor xd = upload_act(be, x, n, cols, DType::BF16);
  const Tensor yd(be.alloc(static_cast<size_t>(n * rows) * 2, "y"), DType::BF16, n, rows);
  Epilogue ep;
  ep.glu = gate_p.data();
  for (int i = 0; i < 3; ++i) be.grouped_matmul(up_p.data(), E, offs[static_cast<size_t>(i % sets)], xd, yd, ep);
  be.sync();
  const int iters = 64;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) be.grouped_matmul(up_p.data(), E, offs[static_cast<size_t>(i % sets)], xd, yd, ep);
  be.sync();
  const double t = seconds_since(t0) / iters, bytes = 2.0 * static_cast<double>(active) * h.bytes();
  std::printf(
      "grouped SwiGLU mxfp4 x bf16 %lld experts, %lld active x %lld token(s), 2 x [%lld x %lld]: %.2f us, "
      "%.0f GB/s (%.1f%%)\n",
      static_cast<long long>(E), static_cast<long long>(active), static_cast<long long>(tpe),
      static_cast<long long>(rows), static_cast<long long>(cols), t * 1e6, bytes / t / 1e9,
      100.0 * bytes / t / 1e9 / 4310.0);
  for (void* p : offs) be.dealloc(p);
  be.dealloc(xd.data);
  be.dealloc(yd.data);
}

// One MoE layer's routed experts at decode: E experts of [rows, cols], `active` of them with `tpe` tokens each
// (a different set every call, so that the selected weights come from HBM). bf16 activations: the MXFP4
// tensor-core skinny kernels (the default) and, for comparison, the exact kernels (tensor-core dispatch off).
void bench_grouped(Backend& be, WeightFormat f, int64_t E, int64_t active, int64_t rows, int64_t cols, DType act,
                   int64_t tpe = 1) {
  const HostWeight h = make(f, rows, cols);
  std::vector<QuantWeight> ws;
  for (int64_t e = 0; e < E; ++e) ws.push_back(be.prepare_weight(h.q));
  std::vector<const QuantWeight*> wp(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) wp[static_cast<size_t>(e)] = &ws[static_cast<size_t>(e)];
  const std::vector<int64_t*> offs = rotating_offsets(be, E, active, tpe);
  const int sets = static_cast<int>(offs.size());
  const int64_t n = active * tpe;
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& v : x) v = next_normalish();
  const Tensor xd = upload_act(be, x, n, cols, act);
  const Tensor yd(be.alloc(static_cast<size_t>(n * rows) * Tensor::size_of(act), "y"), act, n, rows);
  const double bytes = static_cast<double>(active) * static_cast<double>(h.bytes());
  for (bool tc : {false, true}) {
    if (tc && act != DType::BF16) continue;
    cuda_set_tc_dispatch(be, act == DType::BF16 && tc);
    for (int i = 0; i < 3; ++i) be.grouped_matmul(wp.data(), E, offs[static_cast<size_t>(i % sets)], xd, yd);
    be.sync();
    const int iters = 64;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) be.grouped_matmul(wp.data(), E, offs[static_cast<size_t>(i % sets)], xd, yd);
    be.sync();
    const double t = seconds_since(t0) / iters;
    std::printf(
        "grouped_matmul %s x %s %lld experts, %lld active x %lld token(s), [%lld x %lld], %s: %.2f us, %.0f GB/s "
        "(%.1f%%)\n",
        std::string(weight_format_name(f)).c_str(), std::string(dtype_name(act)).c_str(), static_cast<long long>(E),
        static_cast<long long>(active), static_cast<long long>(tpe), static_cast<long long>(rows),
        static_cast<long long>(cols),
        act != DType::BF16 ? "exact"
        : tc               ? "tensor-core"
                           : "exact (tc off)",
        t * 1e6, bytes / t / 1e9, 100.0 * bytes / t / 1e9 / 4310.0);
  }
  for (void* p : offs) be.dealloc(p);
  be.dealloc(xd.data);
  be.dealloc(yd.data);
  cuda_set_tc_dispatch(be, true);
}

// MLA decode attention over a paged bf16 pool, GLM-5 shape (H 64, dn 192, dr 64, dv 256, dc 512): the decode block
// (Backend::mla_decode_attention: absorption GEMMs, tensor-core attention with split keys, combine, output
// absorption) and, with `generic`, the generic absorbed kernel. Bytes: the keys read (batch · ctx · 576 · 2) plus
// kv_b (W_UK and W_UV, read once per step by the block); % of 4.31 TB/s.
void bench_paged_attention(Backend& be, int64_t batch, int64_t ctx, bool generic) {
  const int64_t H = 64, dn = 192, dr = 64, dv = 256, dc = 512, bt = 64;
  const int64_t blocks_per_seq = (ctx + bt - 1) / bt, nb = blocks_per_seq * batch;
  KvPool pool;
  pool.dtype = DType::BF16;
  pool.num_blocks = nb;
  pool.block_tokens = bt;
  pool.width = dc + dr;
  const size_t pool_bytes = static_cast<size_t>(pool.rows() * pool.width) * 2;
  pool.data = be.alloc(pool_bytes, "pool");
  std::vector<uint16_t> pv(static_cast<size_t>(pool.rows() * pool.width));
  for (uint16_t& v : pv) v = f32_to_bf16(next_normalish());
  be.upload(pool.data, pv.data(), pool_bytes);
  const HostWeight kvb = make(WeightFormat::BF16, H * (dn + dv), dc);
  const QuantWeight kvbd = be.prepare_weight(kvb.q);
  std::vector<int32_t> qb(static_cast<size_t>(batch + 1)), cl(static_cast<size_t>(batch), static_cast<int32_t>(ctx)),
      table(static_cast<size_t>(batch * blocks_per_seq));
  for (int64_t s = 0; s <= batch; ++s) qb[static_cast<size_t>(s)] = static_cast<int32_t>(s);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  std::vector<int64_t> pos(static_cast<size_t>(batch), ctx - 1);
  std::vector<float> q(static_cast<size_t>(batch * H * (dn + dr)));
  for (float& v : q) v = bf16_to_f32(f32_to_bf16(next_normalish()));
  std::vector<void*> owned;
  auto up = [&](const auto& v) {
    void* p = be.alloc(v.size() * sizeof(v[0]), "bench input");
    be.upload(p, v.data(), v.size() * sizeof(v[0]));
    owned.push_back(p);
    return p;
  };
  StepSeqs seqs{batch,
                static_cast<int32_t*>(up(qb)),
                static_cast<int32_t*>(up(cl)),
                static_cast<int32_t*>(up(table)),
                blocks_per_seq,
                ctx};
  const MlaDims d{H, dn, dr, dv, dc};
  MlaLayer L;
  L.d = d;
  L.kv_b = &kvbd;
  L.softmax_scale = 0.07f;
  const Tensor qd = upload_act(be, q, batch, H * (dn + dr), DType::BF16);
  const int64_t* posd = static_cast<int64_t*>(up(pos));
  const Tensor od(be.alloc(static_cast<size_t>(batch * H * dv) * 2, "o"), DType::BF16, batch, H * dv);
  const double kv_bytes = static_cast<double>(batch * ctx * (dc + dr) * 2);
  const double w_bytes = static_cast<double>(H * (dn + dv) * dc * 2);
  auto time = [&](auto&& op) {
    op();
    be.sync();
    const int iters = 10;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) op();
    be.sync();
    return seconds_since(t0) / iters;
  };
  const double tb = time([&] { be.mla_decode_attention(L, qd, pool, seqs, posd, KeySelection{}, od); });
  std::printf(
      "mla_decode_attention block, bf16, GLM-5 shape, batch %lld ctx %lld: %.1f us; %.1f MB keys + %.1f MB kv_b: "
      "%.0f GB/s, %.1f %% of 4.31 TB/s\n",
      static_cast<long long>(batch), static_cast<long long>(ctx), tb * 1e6, kv_bytes / 1e6, w_bytes / 1e6,
      (kv_bytes + w_bytes) / tb / 1e9, 100.0 * (kv_bytes + w_bytes) / tb / 4.31e12);
  if (generic) {
    const double tg =
        time([&] { be.mla_attention_absorbed_paged(d, qd, kvbd, pool, seqs, posd, KeySelection{}, 0.07f, od); });
    std::printf("  generic absorbed kernel (fp32 mode's path), same inputs: %.1f us, %.0f GB/s of cache\n", tg * 1e6,
                kv_bytes / tg / 1e9);
  }
  for (void* p : owned) be.dealloc(p);
  be.dealloc(qd.data);
  be.dealloc(od.data);
  be.dealloc(pool.data);
}

// Decode of one sequence through Model::forward (eager launches, no CUDA graphs): prefill 32 tokens, then 64
// single-token steps; tokens/s of the decode steps and the time per step.
void bench_model(const std::string& dir, const std::string& backend, bool bf16) {
  ModelFiles files = open_model_files(dir);
  std::unique_ptr<Backend> be = make_backend(backend, 0);
  ModelOptions o;
  o.bf16_activations = bf16;
  Model m(*files.cfg, *files.plan, *be, o);
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> prompt(32);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(V));
  std::vector<float> row(static_cast<size_t>(V));
  for (int rep = 0; rep < 2; ++rep) {  // the first pass warms up
    KvCache cache(m.config());
    m.forward(prompt, cache, row.data(), false);
    int32_t next = 1;
    const int steps = 64;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) {
      m.forward(std::span<const int32_t>(&next, 1), cache, row.data(), false);
      next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    }
    const double t = seconds_since(t0) / steps;
    if (rep == 1)
      std::printf("model %s on %s (%s): decode batch 1 after a 32-token prompt: %.1f tokens/s, %.3f ms per step\n",
                  dir.c_str(), backend.c_str(), bf16 ? "bf16" : "fp32", 1.0 / t, t * 1e3);
  }
}

// Bytes of a weight as uploaded (codes + scales).
double weight_bytes(const QuantWeight& w) {
  if (!w.data) return 0.0;
  double b = static_cast<double>(w.rows) * static_cast<double>(w.row_bytes());
  switch (w.format) {
    case WeightFormat::FP8_E4M3_BLOCK:
      b += static_cast<double>((w.rows + w.block_rows - 1) / w.block_rows * w.scale_cols()) * 4;
      break;
    case WeightFormat::FP8_E4M3_CHANNEL: b += static_cast<double>(w.rows) * 4; break;
    case WeightFormat::MXFP4: b += static_cast<double>(w.rows * w.scale_cols()); break;
    default: break;
  }
  return b;
}

// Weight bytes one decode step of `batch` sequences must read: every dense / attention / head weight once, and per
// MoE layer the distinct routed experts the batch touches — exactly K at batch 1 (independent of the weights), the
// expectation E·(1 − (1 − K/E)^batch) under uniform random routing above (the worst case for distinct experts).
double decode_weight_bytes(const Model& m, int64_t batch) {
  const ModelWeights& w = m.weights();
  const ModelConfig& c = m.config();
  double b = weight_bytes(w.lm_head);
  for (const LayerWeights& lw : w.layers) {
    for (const QuantWeight* q : {&lw.attn.q_a, &lw.attn.q_b, &lw.attn.kv_a, &lw.attn.kv_b, &lw.attn.o})
      b += weight_bytes(*q);
    if (lw.indexer.present) b += weight_bytes(lw.indexer.wk) + weight_bytes(lw.indexer.weights_proj);
    auto mlp = [](const MlpWeights& e) { return weight_bytes(e.gate) + weight_bytes(e.up) + weight_bytes(e.down); };
    if (lw.is_moe) {
      b += weight_bytes(lw.moe.router);
      if (lw.moe.has_shared) b += mlp(lw.moe.shared);
      const double E = static_cast<double>(c.n_routed_experts), K = static_cast<double>(c.num_experts_per_tok);
      const double touched = batch == 1 ? K : E * (1.0 - std::pow(1.0 - K / E, static_cast<double>(batch)));
      b += touched * mlp(lw.moe.experts[0]);
    } else {
      b += mlp(lw.dense);
    }
  }
  return b;
}

// Decode through the batched step (the server's path): `batch` sequences with 32-token prompts in one paged pool,
// then 64 timed decode steps after 4 warm-up steps (the first of which captures the graph). Prints step time,
// tokens/s, kernels per step and per layer (from the captured graph), the launch floor (2.6 µs per kernel in a
// graph) and the memory floor (weight bytes of the step + KV read, at 4.31 TB/s).
void bench_decode(const std::string& dir, Model& m, Backend& be, bool bf16, int64_t batch, bool graphs) {
  ModelOptions o;
  o.bf16_activations = bf16;
  o.graphs = graphs;
  m.set_options(o);
  const ModelConfig& c = m.config();
  const int64_t bt = 64, prompt = 32, steps = 64, warm = 4;
  bench::DecodeBatch db(c.vocab_size, batch, prompt, prompt + warm + steps + 1, bt);
  m.reserve(std::max<int64_t>(batch * prompt, 256), batch, db.blocks_per_seq * bt, db.blocks_per_seq);
  PagedKvCache cache(c, be, db.pool_blocks(), bt, m.cache_dtype());
  m.step(db.prefill(), cache, db.logits.data());
  auto decode = [&] { m.step(db.next(), cache, db.logits.data()); };
  for (int64_t i = 0; i < warm; ++i) decode();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) decode();
  const double t = seconds_since(t0) / static_cast<double>(steps);
  const int64_t kernels = m.graph_kernels(decode_graph_bucket(batch));
  const double L = static_cast<double>(c.num_hidden_layers);
  const double kv = static_cast<double>(batch) * static_cast<double>(prompt + warm + steps / 2) * L *
                    static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim) * (bf16 ? 2.0 : 4.0);
  const double bytes = decode_weight_bytes(m, batch) + kv, floor_s = bytes / 4.31e12;
  std::printf("decode %s %s batch %lld %s: step %.1f us, %.0f tokens/s", dir.c_str(), bf16 ? "bf16" : "fp32",
              static_cast<long long>(batch), graphs ? "graphs" : "eager ", t * 1e6, static_cast<double>(batch) / t);
  if (graphs)
    std::printf(", %lld kernels per step (%.1f per layer), launch floor %.1f us (%.0f %% of the step), replays %lld",
                static_cast<long long>(kernels), static_cast<double>(kernels) / L, kernels * 2.6,
                100.0 * kernels * 2.6e-6 / t, static_cast<long long>(m.graph_replays()));
  std::printf(", %.1f MB read per step, memory floor %.1f us = %.1f %% of the step (%s)\n", bytes / 1e6, floor_s * 1e6,
              100.0 * floor_s / t, batch == 1 ? "exact at batch 1" : "distinct experts: uniform-routing expectation");
}

// Decode at real contexts (issue: GPU decode at the roofline). `batch` sequences that already hold `ctx` tokens of
// KV (the pools filled with a constant: the values do not change what a decode step reads or computes), then
// greedy decode steps through Model::step with the rows sampled on the device (only ids back: the server's path),
// in CUDA graphs. One eager step through the counting wrapper first counts the bytes (weights actually touched:
// the routed experts of this step's routing; the KV rows each sequence reads) and FLOPs, and with `profile` times
// every op (device synchronized around each). Floors: bytes / 4.31 TB/s and FLOPs / 790 TFLOP/s (bf16 dense, as
// measured on the H200); the figure is the % of the larger.
// The profile's device timer: CUDA events recorded on the backend's stream.
class CudaEventTimer final : public bench::DeviceTimer {
 public:
  explicit CudaEventTimer(Backend& be) : st_(static_cast<cudaStream_t>(be.native_stream())) {}
  ~CudaEventTimer() override {
    for (cudaEvent_t e : ev_) cudaEventDestroy(e);
  }
  int mark() override {
    if (used_ == ev_.size()) {
      cudaEvent_t e = nullptr;
      cudaEventCreate(&e);
      ev_.push_back(e);
    }
    cudaEventRecord(ev_[used_], st_);
    return static_cast<int>(used_++);
  }
  double seconds(int a, int b) override {
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, ev_[static_cast<size_t>(a)], ev_[static_cast<size_t>(b)]);
    return ms * 1e-3;
  }
  void reset() override { used_ = 0; }

 private:
  cudaStream_t st_;
  std::vector<cudaEvent_t> ev_;
  size_t used_ = 0;
};

// One run of `run` with every op timed by CUDA events on the backend's stream (the op table keyed by shape with
// `detail`); the counters are reset first and the profile finished after. Returns the wall seconds.
double profiled_run(bench::CountingBackend& cb, bool detail, const std::function<void()>& run) {
  CudaEventTimer timer(cb.inner());
  cb.reset();
  cb.detail = detail;
  cb.timer = &timer;
  const auto tp = std::chrono::steady_clock::now();
  run();
  cb.finish_profile();
  cb.timer = nullptr;
  return seconds_since(tp);
}
// The profile's per-shape ops, slowest first.
std::vector<std::pair<std::string, bench::CountingBackend::Detail>> slowest_ops(const bench::CountingBackend& cb) {
  std::vector<std::pair<std::string, bench::CountingBackend::Detail>> d(cb.details.begin(), cb.details.end());
  std::sort(d.begin(), d.end(), [](const auto& a, const auto& b) { return a.second.time > b.second.time; });
  return d;
}

// cuda_bench ctx --profiler-step: one more graph-replayed decode step per (batch, ctx) between cudaProfilerStart and
// cudaProfilerStop, so that `ncu --profile-from-start off` reads the kernels of exactly one step.
bool g_profiler_step = false;

struct CtxResult {
  double step_s = 0, bytes = 0, flops = 0;
  int64_t kernels = 0;
};
CtxResult bench_decode_ctx(const std::string& dir, Model& m, bench::CountingBackend& cb, int64_t batch, int64_t ctx,
                           bool profile) {
  const ModelConfig& c = m.config();
  const int64_t bt = 64, steps = 16, warm = 3, V = c.vocab_size;
  const int64_t per_seq = (ctx + warm + steps + 2 + bt - 1) / bt;
  m.reserve(std::max<int64_t>(batch, 256), batch, per_seq * bt, per_seq);
  PagedKvCache cache(c, cb, batch * per_seq, bt, m.cache_dtype());
  for (int64_t l = 0; l < cache.num_layers(); ++l)
    for (const KvPool* p : {&cache.latent(l), &cache.index(l)})
      if (p->data) cb.fill(Tensor(p->data, p->dtype, p->rows(), p->width), 0.01f);
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t j = 0; j < per_seq; ++j)
      tables[static_cast<size_t>(s)].push_back(static_cast<int32_t>(s * per_seq + j));
  std::vector<StepSequence> seqs(static_cast<size_t>(batch));
  std::vector<int32_t> tokens(static_cast<size_t>(batch)), ids(static_cast<size_t>(batch));
  std::vector<SampleRowParams> rows(static_cast<size_t>(batch));
  for (SampleRowParams& r : rows) r.temperature = 0.0f;  // greedy
  SampleBatch sb;
  sb.rows = rows.data();
  sb.n_rows = batch;
  int64_t pos = ctx;
  for (int64_t s = 0; s < batch; ++s) tokens[static_cast<size_t>(s)] = static_cast<int32_t>((s * 7919 + 13) % V);
  auto step = [&] {
    for (int64_t s = 0; s < batch; ++s) {
      StepSequence& q = seqs[static_cast<size_t>(s)];
      q.start = pos;
      q.n_tokens = 1;
      q.blocks = tables[static_cast<size_t>(s)];
      q.logits = LogitRows::Last;
      q.decode = true;
    }
    m.step(Step{tokens, seqs}, cache, nullptr, nullptr, &sb, ids.data());
    tokens = ids;
    ++pos;
  };
  CtxResult r;
  // The counted (and, with profile, timed: CUDA events around every op) eager step, after one eager warm-up step
  // (the first launch of a kernel loads its module).
  cb.set_profile(true);
  step();
  const double t_prof = profiled_run(cb, profile, step);
  r.bytes = static_cast<double>(cb.weight_bytes_read + cb.kv_bytes_read);
  r.flops = cb.flops;
  if (profile) {
    std::printf("  profile %s batch %lld ctx %lld (one eager step, %.2f ms wall; op times from CUDA events):\n",
                dir.c_str(), static_cast<long long>(batch), static_cast<long long>(ctx), t_prof * 1e3);
    bench::print_profile(cb, 1.0, t_prof, "    by op class");
    for (const auto& [k, v] : slowest_ops(cb))
      std::printf("    %-58s %4llu calls %9.1f us %8.1f GB/s (%5.1f %%) %8.2f TFLOP/s\n", k.c_str(),
                  static_cast<unsigned long long>(v.calls), v.time * 1e6, v.bytes / std::max(v.time, 1e-12) / 1e9,
                  100.0 * v.bytes / std::max(v.time, 1e-12) / 4.31e12, v.flops / std::max(v.time, 1e-12) / 1e12);
  }
  cb.set_profile(false);
  cb.detail = false;
  for (int64_t i = 0; i < warm; ++i) step();  // the first captures the graph
  cb.sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  cb.sync();
  r.step_s = seconds_since(t0) / static_cast<double>(steps);
  r.kernels = m.graph_kernels(decode_graph_bucket(batch));
  if (g_profiler_step) {  // one more graph step inside the profiler's range (ncu --profile-from-start off)
    cb.sync();
    cudaProfilerStart();
    step();
    cb.sync();
    cudaProfilerStop();
  }
  return r;
}

void bench_decode_matrix(const std::string& dir, Model& m, bench::CountingBackend& cb,
                         const std::vector<int64_t>& batches, const std::vector<int64_t>& ctxs, bool profile) {
  const double L = static_cast<double>(m.config().num_hidden_layers);
  // This device's copy probe: the floors below are at 4.31 TB/s (the H200's read probe, so that runs on other
  // machines compare), "% probe" is the memory floor at this run's probe over the step.
  const double probe = device_copy_bytes_per_s(cb.inner(), 5);
  std::printf("device copy probe of this run: %.0f GB/s (read + write); floors at 4.31 TB/s and 790 TFLOP/s\n",
              probe / 1e9);
  std::printf("%-28s %5s %6s %10s %10s %9s %8s %10s %10s %7s %8s %9s\n", "decode (bf16, graphs)", "batch", "ctx",
              "step ms", "tok/s", "MB/step", "GB/s", "mem floor", "cmp floor", "% floor", "% probe", "kern/layer");
  for (int64_t ctx : ctxs)
    for (int64_t batch : batches) {
      const CtxResult r = bench_decode_ctx(dir, m, cb, batch, ctx, profile && (batch == 1 || batch == 64));
      const double mem = r.bytes / 4.31e12, cmp = r.flops / 790e12, fl = std::max(mem, cmp);
      const double at_probe = std::max(r.bytes / probe, cmp);
      std::printf("%-28s %5lld %6lld %10.3f %10.0f %9.1f %8.0f %8.1f us %8.1f us %6.1f%% %7.1f%% %9.1f\n", dir.c_str(),
                  static_cast<long long>(batch), static_cast<long long>(ctx), r.step_s * 1e3,
                  static_cast<double>(batch) / r.step_s, r.bytes / 1e6, r.bytes / r.step_s / 1e9, mem * 1e6, cmp * 1e6,
                  100.0 * fl / r.step_s, 100.0 * at_probe / r.step_s, static_cast<double>(r.kernels) / L);
      std::fflush(stdout);
    }
}

// The A/B switches of the model benches: --no-stc turns the BF16 / FP8 skinny and tiled tensor-core kernels off
// (the paths they replace); --no-tile the tiled kernel only (the skinny kernels then take FP8 up to 2,048 rows and
// grouped prefill the wmma kernel, as before it).
void bench_no_stc(Backend& be) {
  cuda_set_stc_rows(be, 1, 0, 1, 0, false);
  cuda_set_tile_rows(be, 1, 0, 1, 0, false);
}
void bench_no_tile(Backend& be) {
  cuda_set_stc_rows(be, 1, 16, 1, 2048, true);
  cuda_set_tile_rows(be, 1, 0, 1, 0, false);
}

// End-to-end prefill of one prompt through Model::step (bf16 activations, eager): `tokens` random ids in chunks of
// `chunk` (each chunk attends to the cached earlier ones), timed from the first chunk to the last's logits. FLOPs
// counted from the config's shapes: 2 x the weights one token multiplies (MLA, dense MLP or shared + top-k routed
// experts, router) per token, plus the naive-form attention (qk and pv over the causal prefix, every head).
void bench_prefill_model(Model& m, bench::CountingBackend& be, const std::vector<int64_t>& sizes, int64_t chunk,
                         bool profile) {
  const ModelConfig& c = m.config();
  const double w_tok = static_cast<double>(decode_weight_bytes(m, 1));  // bytes a decode token reads, ~ its weights
  for (int64_t n : sizes) {
    const int64_t bt = 64, blocks = (n + bt - 1) / bt + 1, ch = std::min(chunk, n);
    m.reserve(ch, 1, blocks * bt, blocks);
    PagedKvCache cache(c, be, blocks, bt, m.cache_dtype(), m.mtp_layers());
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    for (int64_t j = 0; j < blocks; ++j) table[static_cast<size_t>(j)] = static_cast<int32_t>(j);
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));
    std::vector<int32_t> tokens;
    auto run = [&] {
      for (int64_t p = 0; p < n; p += ch) {
        const int64_t len = std::min(ch, n - p);
        tokens.resize(static_cast<size_t>(len));
        for (int64_t j = 0; j < len; ++j)
          tokens[static_cast<size_t>(j)] = static_cast<int32_t>(((p + j) * 7919 + 13) % c.vocab_size);
        std::vector<StepSequence> seqs(1);
        seqs[0].start = p;
        seqs[0].n_tokens = len;
        seqs[0].blocks = table;
        seqs[0].logits = LogitRows::Last;
        m.step(Step{tokens, seqs}, cache, p + len == n ? logits.data() : nullptr);
      }
      be.sync();
    };
    run();  // warm-up (scratch growth, cuBLASLt heuristics)
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double s = seconds_since(t0);
    const double H = static_cast<double>(c.num_attention_heads),
                 dqk = static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim),
                 dv = static_cast<double>(c.v_head_dim), N = static_cast<double>(n);
    // Keys a query attends to: every earlier one, or (DSA) at most index_topk; the indexer scores every earlier key
    // on its layers (those FLOPs counted in `flop`, not in the attention share).
    double keys = 0, causal = N * (N + 1) / 2.0;
    for (int64_t p = 0; p < n; ++p)
      keys += static_cast<double>(c.has_indexer() ? std::min<int64_t>(p + 1, c.index_topk) : p + 1);
    double idx = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      if (n > c.index_topk && layer_has_own_indexer(c, l))
        idx += 2.0 * causal * static_cast<double>(c.index_n_heads * c.index_head_dim);
    const double attn = 2.0 * H * (dqk + dv) * keys * static_cast<double>(c.num_hidden_layers);
    // Weights one prompt token multiplies (the naive form: kv_b expands every key once): MLA, the dense MLP or the
    // shared + top-k experts and the router per layer; the lm_head once per chunk, not counted.
    double params = 0;
    const double D = static_cast<double>(c.hidden_size), dq = static_cast<double>(c.q_lora_rank),
                 dc = static_cast<double>(c.kv_lora_rank), dr = static_cast<double>(c.qk_rope_head_dim),
                 dn = static_cast<double>(c.qk_nope_head_dim);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      params += D * dq + dq * H * dqk + D * (dc + dr) + dc * H * (dn + dv) + H * dv * D;
      const bool moe = l < static_cast<int64_t>(c.layer_is_moe.size()) && c.layer_is_moe[static_cast<size_t>(l)];
      params += moe ? 3.0 * D * static_cast<double>(c.moe_intermediate_size) *
                              static_cast<double>(c.num_experts_per_tok + c.n_shared_experts) +
                          D * static_cast<double>(c.n_routed_experts)
                    : 3.0 * D * static_cast<double>(c.intermediate_size);
    }
    const double flop = 2.0 * params * N + attn + idx;
    std::printf(
        "prefill-model %6lld tokens (chunks of %lld): %9.1f ms  %9.1f tok/s  %7.1f TFLOP/s (%.1f%% of 790; "
        "%.2f GFLOP/token of weights, attention %.1f%% and DSA indexer %.1f%% of the FLOPs; %.2f GB read per decode "
        "token)\n",
        static_cast<long long>(n), static_cast<long long>(ch), s * 1e3, N / s, flop / s / 1e12,
        100.0 * flop / s / 790e12, 2.0 * params / 1e9, 100.0 * attn / flop, 100.0 * idx / flop, w_tok / 1e9);
    std::fflush(stdout);
    if (profile) {  // a third run, every op timed by CUDA events (the device synchronized around each)
      be.set_profile(true);
      const double t_prof = profiled_run(be, true, run);
      std::printf("  profile prefill %lld tokens (%.1f ms wall with a sync around every op):\n",
                  static_cast<long long>(n), t_prof * 1e3);
      bench::print_profile(be, 1.0, t_prof, "    by op class");
      const auto d = slowest_ops(be);
      for (size_t i = 0; i < d.size() && i < 16; ++i)
        std::printf("    %-58s %5llu calls %10.1f us %8.2f TFLOP/s\n", d[i].first.c_str(),
                    static_cast<unsigned long long>(d[i].second.calls), d[i].second.time * 1e6,
                    d[i].second.flops / std::max(d[i].second.time, 1e-12) / 1e12);
      be.set_profile(false);
      be.detail = false;
    }
  }
}

// Speculative decoding: the cost of a verify step (every sequence's last token and k drafts, k + 1 rows of logits
// sampled on the device, in a CUDA graph) against a plain decode step (one token per sequence) at the same
// context, and of the draft step after it (the MTP layer: one slot per sequence from the verify's last row, k greedy
// drafts; only when the checkpoint has an MTP layer), bf16 activations. The sequences hold `ctx` tokens of KV (the
// pools filled with a constant, as bench_decode_ctx); every step runs at the same positions (the cost does not
// depend on what was accepted). Goal (issue 25): verify / decode <= 1.15 at batch 1 on the GLM-5 shape.
struct VerifyResult {
  double decode_s = 0, verify_s = 0, draft_s = 0;
  double draft_per_pass_s = 0;  // the draft step with a graph per pass (ModelOptions::draft_step_graph off; k >= 2)
  int64_t verify_replays = 0, steps = 0;
  int64_t draft_passes = 0, draft_replays = 0;  // the timed draft steps' passes, and those replayed from a graph
  int64_t draft_downloads = 0;                  // downloads of draft ids in the timed draft steps (one graph each)
};
VerifyResult bench_verify_one(Model& m, Backend& be, int64_t batch, int64_t ctx, int64_t k) {
  const ModelConfig& c = m.config();
  const int64_t bt = 64, steps = 16, warm = 3, V = c.vocab_size, T = k + 1;
  const bool mtp = m.mtp_layers() > 0;
  const int64_t per_seq = (ctx + T + k + 2 + bt - 1) / bt;
  m.reserve(std::max<int64_t>(batch * T + batch, 256), batch, per_seq * bt, per_seq);
  PagedKvCache cache(c, be, batch * per_seq, bt, m.cache_dtype(), m.mtp_layers());
  for (int64_t l = 0; l < cache.num_layers(); ++l)
    for (const KvPool* p : {&cache.latent(l), &cache.index(l)})
      if (p->data) be.fill(Tensor(p->data, p->dtype, p->rows(), p->width), 0.01f);
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t j = 0; j < per_seq; ++j)
      tables[static_cast<size_t>(s)].push_back(static_cast<int32_t>(s * per_seq + j));
  std::vector<StepSequence> seqs(static_cast<size_t>(batch));
  std::vector<int32_t> tokens, ids(static_cast<size_t>(batch * T)), drafts(static_cast<size_t>(batch * k));
  std::vector<SampleRowParams> rows(static_cast<size_t>(batch * T));
  for (SampleRowParams& r : rows) r.temperature = 0.0f;  // greedy
  auto step = [&](int64_t n) {
    tokens.assign(static_cast<size_t>(batch * n), 0);
    for (int64_t s = 0; s < batch; ++s) {
      StepSequence& q = seqs[static_cast<size_t>(s)];
      q.start = ctx;
      q.n_tokens = n;
      q.blocks = tables[static_cast<size_t>(s)];
      q.logits = n == 1 ? LogitRows::Last : LogitRows::All;
      q.decode = true;
      for (int64_t j = 0; j < n; ++j)
        tokens[static_cast<size_t>(s * n + j)] = static_cast<int32_t>((s * 7919 + j * 131 + 13) % V);
    }
    SampleBatch sb;
    sb.rows = rows.data();
    sb.n_rows = batch * n;
    m.step(Step{tokens, seqs}, cache, nullptr, nullptr, &sb, ids.data());
  };
  std::vector<MtpSequence> ms(static_cast<size_t>(batch));
  auto draft = [&] {
    for (int64_t s = 0; s < batch; ++s) {
      MtpSequence& q = ms[static_cast<size_t>(s)];
      q.start = ctx + 1;
      q.n_slots = 1;
      q.tokens = std::span<const int32_t>(ids.data() + s * T, 1);  // the token sampled from the first row
      q.hidden_row = s * T;
      q.blocks = tables[static_cast<size_t>(s)];
      q.n_draft = static_cast<int32_t>(k);
      q.decode = true;
    }
    m.mtp_draft(ms, cache, drafts.data());
  };
  VerifyResult r;
  r.steps = steps;
  for (int64_t i = 0; i < warm; ++i) step(1);  // the first captures the decode graph
  be.sync();
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) step(1);
  be.sync();
  r.decode_s = seconds_since(t0) / static_cast<double>(steps);
  for (int64_t i = 0; i < warm; ++i) {  // the first captures the verify graph
    step(T);
    if (mtp) draft();
  }
  be.sync();
  const int64_t rep0 = m.graph_replays(), dpass0 = m.draft_passes(), drep0 = m.draft_passes_replayed();
  const int64_t dl0 = m.draft_id_downloads();
  double tv = 0, td = 0;
  for (int64_t i = 0; i < steps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    step(T);  // (the ids download waits for the step)
    const auto b = std::chrono::steady_clock::now();
    if (mtp) draft();
    tv += std::chrono::duration<double>(b - a).count();
    td += seconds_since(b);
  }
  r.verify_replays = m.graph_replays() - rep0;
  r.draft_passes = m.draft_passes() - dpass0;
  r.draft_replays = m.draft_passes_replayed() - drep0;
  r.draft_downloads = m.draft_id_downloads() - dl0;
  r.verify_s = tv / static_cast<double>(steps);
  r.draft_s = td / static_cast<double>(steps);
  if (mtp && k >= 2 && m.options().draft_step_graph) {  // the same draft steps with a graph per pass
    ModelOptions o = m.options();
    o.draft_step_graph = false;
    m.set_options(o);  // (drops every graph: the warm-up captures them again)
    for (int64_t i = 0; i < warm; ++i) {
      step(T);
      draft();
    }
    double tp = 0;
    for (int64_t i = 0; i < steps; ++i) {
      step(T);
      const auto b = std::chrono::steady_clock::now();
      draft();
      tp += seconds_since(b);
    }
    r.draft_per_pass_s = tp / static_cast<double>(steps);
    o.draft_step_graph = true;
    m.set_options(o);
  }
  return r;
}

void bench_verify(const std::string& dir, Backend& be, const std::vector<int64_t>& batches,
                  const std::vector<int64_t>& ctxs, const std::vector<int64_t>& ks) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig probe = load_model_config(dir);
  PlanOptions po;
  po.mtp_layers = probe.num_nextn_predict_layers > 0 ? 1 : 0;
  ModelFiles files = open_model_files(dir, po);
  files.cfg->max_position_embeddings = std::max<int64_t>(files.cfg->max_position_embeddings, 65536 + 64);
  ModelOptions o;
  o.bf16_activations = true;
  o.mtp_layers = po.mtp_layers;
  Model m(*files.cfg, *files.plan, be, o);
  std::printf("verify %s: loaded in %.1f s%s\n", dir.c_str(), seconds_since(t0),
              po.mtp_layers ? " (with its MTP layer: the draft step is timed too)"
                            : " (no MTP layer: tools/make_bench_model.py --mtp adds one; the draft step is not timed)");
  std::printf("%-28s %5s %6s %3s %10s %10s %8s %10s %12s %14s %8s\n", "verify (bf16, graphs)", "batch", "ctx", "k",
              "decode ms", "verify ms", "ratio", "draft ms", "per-pass ms", "verify+draft", "graphed");
  for (int64_t ctx : ctxs)
    for (int64_t k : ks)
      for (int64_t batch : batches) {
        const VerifyResult r = bench_verify_one(m, be, batch, ctx, k);
        const char* draft_graphed = r.draft_passes == 0                     ? "-"
                                    : r.draft_replays < r.draft_passes      ? "NO"
                                    : k >= 2 && r.draft_downloads > r.steps ? "1/p"  // graphed, not as one graph
                                                                            : "yes";
        char per_pass[32] = "-";
        if (r.draft_per_pass_s > 0) std::snprintf(per_pass, sizeof(per_pass), "%.3f", r.draft_per_pass_s * 1e3);
        std::printf("%-28s %5lld %6lld %3lld %10.3f %10.3f %7.3fx %10.3f %12s %13.3fx %4s/%-3s\n", dir.c_str(),
                    static_cast<long long>(batch), static_cast<long long>(ctx), static_cast<long long>(k),
                    r.decode_s * 1e3, r.verify_s * 1e3, r.verify_s / r.decode_s, r.draft_s * 1e3, per_pass,
                    (r.verify_s + r.draft_s) / r.decode_s, r.verify_replays >= r.steps ? "yes" : "NO", draft_graphed);
        std::fflush(stdout);
      }
  std::printf(
      "ratio: a verify step of k + 1 tokens per sequence over a decode step (goal <= 1.15x at k = 1, batch 1, "
      "GLM-5 shape); draft ms: the MTP draft step after it, its k passes as one CUDA graph with one download of "
      "the ids (k >= 2); per-pass ms: the same with a graph per pass; verify+draft: verify and draft ms over decode; "
      "graphed: every timed verify step / every pass of the timed draft steps replayed a CUDA graph (- : no MTP "
      "layer; 1/p: graphed, but a graph per pass)\n");
}

// Sampling: Backend::sample_rows on the device against the host path (download [rows, V] fp32 logits, then the
// host Sampler per row), per step, for greedy / temperature 1 / top_k 50 + top_p 0.9 rows.
SamplingParams sample_mode(int mode) {
  SamplingParams p;
  p.seed = 1;
  if (mode == 0) p.temperature = 0.0f;
  if (mode == 2) {
    p.top_k = 50;
    p.top_p = 0.9f;
  }
  return p;
}
const char* sample_mode_name(int mode) {
  return mode == 0 ? "greedy" : mode == 1 ? "temperature 1" : "top_k 50 + top_p 0.9";
}

void bench_sample_op(Backend& be, int64_t V, int64_t rows, int mode) {
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(rows * V));
  for (float& v : x) v = nd(g);
  float* xd = static_cast<float*>(be.alloc(x.size() * 4, "bench logits"));
  be.upload(xd, x.data(), x.size() * 4);
  std::vector<Sampler> samplers;
  std::vector<SampleRowParams> ps(static_cast<size_t>(rows));
  std::vector<SampleEdit> edits;
  for (int64_t r = 0; r < rows; ++r) {
    samplers.emplace_back(sample_mode(mode), static_cast<uint64_t>(r));
    samplers.back().device_row({}, {}, V, ps[static_cast<size_t>(r)], edits);
  }
  auto* pd = static_cast<SampleRowParams*>(be.alloc(ps.size() * sizeof(SampleRowParams), "bench params"));
  be.upload(pd, ps.data(), ps.size() * sizeof(SampleRowParams));
  auto* idd = static_cast<int32_t*>(be.alloc(static_cast<size_t>(rows) * 4, "bench ids"));
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  const int iters = 30;
  auto device = [&] {  // (temperature 1 / greedy rows: the in-place final scores equal the input)
    be.sample_rows(xd, rows, V, pd, nullptr, nullptr, nullptr, idd);
    be.download(ids.data(), idd, ids.size() * 4);
  };
  device();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) device();
  const double td = seconds_since(t0) / iters;
  std::vector<float> host(x.size());
  auto hostpath = [&] {
    be.download(host.data(), xd, host.size() * 4);
    for (int64_t r = 0; r < rows; ++r)
      ids[static_cast<size_t>(r)] = samplers[static_cast<size_t>(r)]
                                        .sample(std::span<float>(host.data() + r * V, static_cast<size_t>(V)), {}, {})
                                        .token;
  };
  hostpath();
  const int hiters = rows * V > 4'000'000 ? 3 : 10;
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < hiters; ++i) hostpath();
  const double th = seconds_since(t0) / hiters;
  std::printf(
      "sample_rows V %lld rows %lld %-22s: device %.1f us (op + ids back), host path %.1f us (%.1f MB down + "
      "Sampler), %.1fx\n",
      static_cast<long long>(V), static_cast<long long>(rows), sample_mode_name(mode), td * 1e6, th * 1e6,
      static_cast<double>(x.size()) * 4 / 1e6, th / td);
  be.dealloc(xd);
  be.dealloc(pd);
  be.dealloc(idd);
}

// Decode steps of the model in graphs (bf16) with the rows sampled on the host (logits downloaded, host Sampler) or
// on the device (only the ids back).
void bench_sample_decode(const std::string& dir, Model& m, Backend& be, int64_t batch, int mode) {
  ModelOptions o;
  o.bf16_activations = true;
  o.graphs = true;
  m.set_options(o);
  const ModelConfig& c = m.config();
  const int64_t V = c.vocab_size, bt = 64, prompt = 32, steps = 48, warm = 4;
  double t[2] = {0, 0};
  for (int dev = 0; dev < 2; ++dev) {
    bench::DecodeBatch db(V, batch, prompt, prompt + warm + steps + 1, bt);
    m.reserve(std::max<int64_t>(batch * prompt, 256), batch, db.blocks_per_seq * bt, db.blocks_per_seq);
    PagedKvCache cache(c, be, db.pool_blocks(), bt, m.cache_dtype());
    m.step(db.prefill(), cache, db.logits.data());
    std::vector<Sampler> samplers;
    for (int64_t r = 0; r < batch; ++r) samplers.emplace_back(sample_mode(mode), static_cast<uint64_t>(r));
    std::vector<int32_t> next(static_cast<size_t>(batch));
    for (int64_t s = 0; s < batch; ++s) {
      const float* row = db.logits.data() + s * V;
      next[static_cast<size_t>(s)] = static_cast<int32_t>(std::max_element(row, row + V) - row);
    }
    std::vector<SampleRowParams> ps(static_cast<size_t>(batch));
    std::vector<SampleEdit> edits;
    auto decode = [&] {
      for (int64_t s = 0; s < batch; ++s) {
        db.tokens[static_cast<size_t>(s)] = next[static_cast<size_t>(s)];
        db.seqs[s].start += db.seqs[s].n_tokens;
        db.seqs[s].n_tokens = 1;
        db.seqs[s].decode = true;
      }
      db.tokens.resize(static_cast<size_t>(batch));
      const Step st{db.tokens, db.seqs};
      if (dev) {
        edits.clear();
        for (int64_t s = 0; s < batch; ++s) samplers[s].device_row({}, {}, V, ps[static_cast<size_t>(s)], edits);
        SampleBatch sb{ps.data(), batch, edits.data(), static_cast<int64_t>(edits.size()), nullptr, 0, nullptr};
        m.step(st, cache, nullptr, nullptr, &sb, next.data());
        for (auto& smp : samplers) smp.advance();
      } else {
        m.step(st, cache, db.logits.data());
        for (int64_t s = 0; s < batch; ++s)
          next[static_cast<size_t>(s)] =
              samplers[s].sample(std::span<float>(db.logits.data() + s * V, static_cast<size_t>(V)), {}, {}).token;
      }
    };
    for (int64_t i = 0; i < warm; ++i) decode();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) decode();
    t[dev] = seconds_since(t0) / static_cast<double>(steps);
  }
  std::printf(
      "decode %s bf16 graphs batch %lld, %s: step %.1f us with host sampling, %.1f us with device sampling "
      "(%.1f us saved)\n",
      dir.c_str(), static_cast<long long>(batch), sample_mode_name(mode), t[0] * 1e6, t[1] * 1e6, (t[0] - t[1]) * 1e6);
}

// "1,8,32" -> {1, 8, 32} (the --batch / --ctx / --k lists).
std::vector<int64_t> int_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoll(p));
    while (*p && *p != ',') ++p;
    if (*p) ++p;
  }
  return v;
}

}  // namespace
}  // namespace latent

int main(int argc, char** argv) {
  using namespace latent;
  std::unique_ptr<Backend> be = make_backend("cuda", 1);
  if (argc > 2 && std::string(argv[1]) == "model") {  // cuda_bench model <dir>: decode tokens/s, cuda and cpu
    for (const char* b : {"cuda", "cpu"})
      for (bool bf16 : {false, true}) bench_model(argv[2], b, bf16);
    return 0;
  }
  // cuda_bench ctx <dir> [--profile] [--batch 1,8,32,64,128] [--ctx 1024,8192,32768] [--no-stc] [--no-tile]: decode
  // at real contexts in graphs (bf16), with the floors and kernels per layer; --profile adds a timed per-op breakdown
  // at batch 1 and 64; --no-stc turns the BF16 / FP8 tensor-core skinny and tiled kernels off (the paths they
  // replace), --no-tile the tiled kernel only (the skinny kernels then take FP8 up to 2,048 rows, as before it);
  // --mla-split-keys N the fewest keys per split of the MLA decode attention (default: 32 at one (token, head
  // tile) item, else 128); --glu-fused-rows N the most (token, expert) pairs whose MXFP4 gate and up run in one pass;
  // --profiler-step one more step in the CUDA profiler's range (for ncu); --default-blocks runs the decode blocks
  // (mla_qkv) as the base class composes them instead of the backend's fused kernels (their A/B);
  // --no-mx-tile-major loads the MXFP4 codes row after row instead of tile-major (the A/B of that layout);
  // --no-wgmma runs the tiled kernel's FP8 calls on mma.sync instead of wgmma (the A/B of that form).
  if (argc > 2 && std::string(argv[1]) == "ctx") {
    std::vector<int64_t> batches{1, 8, 32, 64, 128}, ctxs{1024, 8192, 32768};
    bool profile = false, default_blocks = false;
    for (int i = 3; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--profile") profile = true;
      if (a == "--default-blocks") default_blocks = true;
      if (a == "--no-mx-tile-major") cuda_set_mx_tile_major(*be, false);
      if (a == "--profiler-step") g_profiler_step = true;
      if (a == "--no-stc") bench_no_stc(*be);
      if (a == "--no-tile") bench_no_tile(*be);
      if (a == "--no-wgmma") cuda_set_tile_wgmma(*be, false);
      if (a == "--mla-split-keys" && i + 1 < argc) cuda_set_mla_split_keys(*be, std::stoi(argv[++i]));
      if (a == "--glu-fused-rows" && i + 1 < argc) cuda_set_glu_fused_rows(*be, std::stoll(argv[++i]));
      if (a == "--batch" && i + 1 < argc) batches = int_list(argv[++i]);
      if (a == "--ctx" && i + 1 < argc) ctxs = int_list(argv[++i]);
    }
    const auto t0 = std::chrono::steady_clock::now();
    ModelFiles files = open_model_files(argv[2]);
    files.cfg->max_position_embeddings = std::max<int64_t>(files.cfg->max_position_embeddings, 65536 + 64);
    bench::CountingBackend cb(*be, false);
    cb.set_default_blocks(default_blocks);
    ModelOptions o;
    o.bf16_activations = true;
    Model m(*files.cfg, *files.plan, cb, o);
    std::printf("ctx %s: loaded in %.1f s (%.2f GB of weights on the GPU)\n", argv[2], seconds_since(t0),
                decode_weight_bytes(m, m.config().n_routed_experts > 0 ? 1 << 20 : 1) / 1e9);
    bench_decode_matrix(argv[2], m, cb, batches, ctxs, profile);
    return 0;
  }
  // cuda_bench prefill-model <dir> [--tokens 512,2048,4096] [--chunk 2048] [--no-tile] [--no-wgmma] [--no-flash]
  // [--no-tc-indexer] [--profile]: end-to-end prefill of one prompt through Model::step (bf16), tok/s and TFLOP/s;
  // --no-tile and --no-wgmma as for ctx, --no-flash the tensor-core prefill attention off (the CUDA-core
  // kernel), --no-tc-indexer the DSA indexer's scores on CUDA cores; --profile adds one more run per size with every
  // op timed (by op class: GEMMs, attention, indexer + top-k, ...; the slowest ops).
  if (argc > 2 && std::string(argv[1]) == "prefill-model") {
    std::vector<int64_t> sizes{512, 2048, 4096};
    int64_t chunk = 2048;
    bool profile = false;
    for (int i = 3; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--profile")
        profile = true;
      else if (a == "--tokens" && i + 1 < argc)
        sizes = int_list(argv[++i]);
      else if (a == "--chunk" && i + 1 < argc)
        chunk = int_list(argv[++i]).at(0);
      else if (a == "--no-tile")
        bench_no_tile(*be);
      else if (a == "--no-wgmma")
        cuda_set_tile_wgmma(*be, false);
      else if (a == "--no-flash")
        cuda_set_flash_prefill(*be, false);
      else if (a == "--no-tc-indexer")
        cuda_set_tc_indexer(*be, false);
      else {
        std::fprintf(stderr, "cuda_bench prefill-model: unknown argument '%s'\n", a.c_str());
        return 2;
      }
    }
    if (chunk < 1) {
      std::fprintf(stderr, "cuda_bench prefill-model: --chunk must be >= 1\n");
      return 2;
    }
    const auto t0 = std::chrono::steady_clock::now();
    ModelFiles files = open_model_files(argv[2]);
    int64_t longest = 0;
    for (int64_t n : sizes) longest = std::max(longest, n);
    files.cfg->max_position_embeddings = std::max<int64_t>(files.cfg->max_position_embeddings, longest + 64);
    bench::CountingBackend cb(*be, false);
    ModelOptions o;
    o.bf16_activations = true;
    Model m(*files.cfg, *files.plan, cb, o);
    std::printf("prefill-model %s: loaded in %.1f s\n", argv[2], seconds_since(t0));
    bench_prefill_model(m, cb, sizes, chunk, profile);
    return 0;
  }
  // cuda_bench verify <dir> [--batch 1,64] [--ctx 1024] [--k 1] [--no-stc]: speculative decoding's verify step (k + 1
  // tokens per sequence) against a decode step, and the MTP draft step when the checkpoint has one (bf16, graphs).
  if (argc > 2 && std::string(argv[1]) == "verify") {
    std::vector<int64_t> batches{1, 64}, ctxs{1024}, ks{1};
    for (int i = 3; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--batch" && i + 1 < argc)
        batches = int_list(argv[++i]);
      else if (a == "--ctx" && i + 1 < argc)
        ctxs = int_list(argv[++i]);
      else if (a == "--k" && i + 1 < argc)
        ks = int_list(argv[++i]);
      else if (a == "--no-stc")
        bench_no_stc(*be);
      else if (a == "--no-tile")
        bench_no_tile(*be);
      else {
        std::fprintf(stderr, "cuda_bench verify: unknown argument '%s'\n", a.c_str());
        return 2;
      }
    }
    for (int64_t k : ks)
      if (k < 1) {
        std::fprintf(stderr, "cuda_bench verify: --k must be >= 1\n");
        return 2;
      }
    bench_verify(argv[2], *be, batches, ctxs, ks);
    return 0;
  }
  // cuda_bench decode <dir> [batch ...]: the batched decode step, graphs and eager, both activation modes.
  if (argc > 2 && std::string(argv[1]) == "decode") {
    std::vector<int64_t> batches;
    for (int i = 3; i < argc; ++i) batches.push_back(std::atoll(argv[i]));
    if (batches.empty()) batches = {1, 8, 32};
    const auto t0 = std::chrono::steady_clock::now();
    ModelFiles files = open_model_files(argv[2]);
    Model m(*files.cfg, *files.plan, *be, ModelOptions{});
    std::printf("decode %s: loaded in %.1f s (%.2f GB of weights on the GPU)\n", argv[2], seconds_since(t0),
                decode_weight_bytes(m, m.config().n_routed_experts > 0 ? 1 << 20 : 1) / 1e9);
    for (bool bf16 : {true, false})
      for (int64_t b : batches)
        for (bool g : {true, false}) bench_decode(argv[2], m, *be, bf16, b, g);
    return 0;
  }
  // cuda_bench sample [dir]: sampling on the device vs on the host (the op at the GLM-5 vocabulary, and the
  // decode step of the model in `dir` at batch 1 and 32).
  if (argc > 1 && std::string(argv[1]) == "sample") {
    for (int64_t rows : {1, 32, 64})
      for (int mode = 0; mode < 3; ++mode) bench_sample_op(*be, 154880, rows, mode);
    if (argc > 2) {
      ModelFiles files = open_model_files(argv[2]);
      Model m(*files.cfg, *files.plan, *be, ModelOptions{});
      for (int64_t rows : {1, 32}) bench_sample_op(*be, m.config().vocab_size, rows, 2);
      for (int64_t b : {1, 32})
        for (int mode = 0; mode < 3; ++mode) bench_sample_decode(argv[2], m, *be, b, mode);
    }
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "prefill") {  // only the prefill matmul timings (bf16 path vs exact)
    run_prefill_benches(*be);
    return 0;
  }
  // cuda_bench act-fp8 [M,M,...]: declared FP8 activations on DeepSeek-V3's block-FP8 dense shapes (bench_act_fp8).
  if (argc > 1 && std::string(argv[1]) == "act-fp8") {
    const std::vector<int64_t> ms = argc > 2 ? int_list(argv[2]) : std::vector<int64_t>{1, 16, 64, 512, 2048, 4096};
    bench_act_fp8(*be, "q_a (DeepSeek-V3)", 1536, 7168, ms);
    bench_act_fp8(*be, "q_b", 24576, 1536, ms);
    bench_act_fp8(*be, "kv_a", 576, 7168, ms);
    bench_act_fp8(*be, "o_proj", 7168, 16384, ms);
    bench_act_fp8(*be, "dense gate / up", 18432, 7168, ms);
    bench_act_fp8(*be, "dense down", 7168, 18432, ms);
    bench_act_fp8(*be, "shared expert down", 7168, 2048, ms);
    return 0;
  }
  // cuda_bench grouped [--no-mx-tile-major]: only the MoE decode timings (the flag: MXFP4 codes row after row).
  if (argc > 1 && std::string(argv[1]) == "grouped") {
    if (argc > 2 && std::string(argv[2]) == "--no-mx-tile-major") cuda_set_mx_tile_major(*be, false);
    for (DType act : {DType::F32, DType::BF16}) {
      bench_grouped(*be, WeightFormat::MXFP4, 256, 8, 4096, 6144, act);
      bench_grouped(*be, WeightFormat::MXFP4, 256, 8, 6144, 2048, act);
    }
    bench_grouped(*be, WeightFormat::MXFP4, 256, 128, 4096, 6144, DType::BF16, 4);
    bench_grouped(*be, WeightFormat::MXFP4, 256, 128, 6144, 2048, DType::BF16, 4);
    // One layer's SwiGLU experts as the model calls them: gate and up in one pass (the default up to 32 pairs), and
    // at 128 pairs both routes (64 / 128 experts: every set of active ones still several times the L2; the backend
    // keeps what it uploads).
    bench_grouped_glu(*be, 64, 8, 2048, 6144, 1);
    bench_grouped_glu(*be, 128, 64, 2048, 6144, 2);
    cuda_set_glu_fused_rows(*be, 1024);
    bench_grouped_glu(*be, 128, 64, 2048, 6144, 2);
    cuda_set_glu_fused_rows(*be, 32);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "matmul") {  // only the decode GEMV timings, bf16 activations
    bench_matmul(*be, "bf16 o_proj GLM-5", WeightFormat::BF16, 6144, 16384, DType::BF16);
    bench_matmul(*be, "bf16 q_b GLM-5", WeightFormat::BF16, 16384, 2048, DType::BF16);
    bench_matmul(*be, "bf16 kv_a GLM-5", WeightFormat::BF16, 576, 6144, DType::BF16);
    bench_matmul(*be, "bf16 router GLM-5", WeightFormat::BF16, 256, 6144, DType::BF16);
    bench_matmul(*be, "bf16 indexer wk GLM-5", WeightFormat::BF16, 128, 6144, DType::BF16);
    bench_matmul(*be, "bf16 indexer heads GLM-5", WeightFormat::BF16, 32, 6144, DType::BF16);
    return 0;
  }
  // cuda_bench skinny: the BF16 / FP8 tensor-core skinny kernels against the paths they replace, per M, on the
  // decode matmuls of the GLM-5 and DeepSeek-V3 shapes; then the grouped experts (bf16 and block-FP8).
  if (argc > 1 && std::string(argv[1]) == "skinny") {
    if (argc > 2) g_skinny_only = argv[2];
    const std::vector<int64_t> ms{1, 2, 4, 8, 16, 32, 64, 128, 256};
    bench_skinny(*be, "o_proj GLM-5", WeightFormat::BF16, 6144, 16384, ms);
    bench_skinny(*be, "q_b GLM-5", WeightFormat::BF16, 16384, 2048, ms);
    bench_skinny(*be, "kv_a GLM-5", WeightFormat::BF16, 576, 6144, ms);
    bench_skinny(*be, "dense up GLM-5", WeightFormat::BF16, 12288, 6144, ms);
    bench_skinny(*be, "router GLM-5", WeightFormat::BF16, 256, 6144, {1, 2, 8, 32});
    bench_skinny(*be, "q_b DeepSeek-V3", WeightFormat::FP8_E4M3_BLOCK, 24576, 1536, ms);
    bench_skinny(*be, "o_proj DeepSeek-V3", WeightFormat::FP8_E4M3_BLOCK, 7168, 16384, ms);
    bench_skinny(*be, "kv_a DeepSeek-V3", WeightFormat::FP8_E4M3_BLOCK, 576, 7168, ms);
    bench_skinny(*be, "dense up DeepSeek-V3", WeightFormat::FP8_E4M3_BLOCK, 18432, 7168, {1, 8, 64, 512});
    bench_skinny(*be, "7168 x 2048", WeightFormat::FP8_E4M3_BLOCK, 7168, 2048, {16, 64, 512, 1024, 2048, 4096});
    bench_skinny(*be, "q_b DeepSeek-V3 prefill", WeightFormat::FP8_E4M3_BLOCK, 24576, 1536, {2048, 4096});
    bench_skinny(*be, "o_proj GLM-5 prefill", WeightFormat::BF16, 6144, 16384, {512, 2048});
    if (g_skinny_only && std::string(g_skinny_only) != "grouped") return 0;  // "grouped": only the grouped ones
    bench_grouped(*be, WeightFormat::FP8_E4M3_BLOCK, 256, 8, 4096, 7168, DType::BF16);
    bench_grouped(*be, WeightFormat::FP8_E4M3_BLOCK, 256, 8, 7168, 2048, DType::BF16);
    bench_grouped(*be, WeightFormat::FP8_E4M3_BLOCK, 256, 128, 4096, 7168, DType::BF16, 4);
    bench_grouped(*be, WeightFormat::FP8_E4M3_BLOCK, 256, 128, 7168, 2048, DType::BF16, 4);
    bench_grouped(*be, WeightFormat::BF16, 64, 8, 4096, 7168, DType::BF16);
    bench_grouped(*be, WeightFormat::BF16, 64, 32, 4096, 7168, DType::BF16, 16);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "attention") {  // only the attention timings
    for (const auto& [batch, ctx] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 1024}, {1, 8192}, {8, 1024}, {64, 1024}, {64, 8192}, {128, 1024}})
      bench_paged_attention(*be, batch, ctx, batch == 1);
    return 0;
  }
  bench_copy(*be);
  // Decode GEMV / skinny GEMM per weight format, fp32 activations (the exactness mode) and bf16 (the default).
  for (DType act : {DType::F32, DType::BF16}) {
    bench_matmul(*be, "bf16 30 MB", WeightFormat::BF16, 4096, 3840, act);
    bench_matmul(*be, "bf16 o_proj GLM-5", WeightFormat::BF16, 6144, 16384, act);
    bench_matmul(*be, "bf16 kv_a GLM-5", WeightFormat::BF16, 576, 6144, act);
    bench_matmul(*be, "mxfp4 30 MB", WeightFormat::MXFP4, 8192, 7168, act);
    bench_matmul(*be, "mxfp4 expert GLM-5", WeightFormat::MXFP4, 2048, 6144, act);
    bench_matmul(*be, "fp8 block 30 MB", WeightFormat::FP8_E4M3_BLOCK, 7168, 4096, act);
  }
  run_prefill_benches(*be);
  for (DType act : {DType::F32, DType::BF16}) {
    bench_grouped(*be, WeightFormat::MXFP4, 256, 8, 4096, 6144, act);
    bench_grouped(*be, WeightFormat::MXFP4, 256, 8, 6144, 2048, act);
  }
  // Batch 64 of a top-8 model: 512 (token, expert) pairs, here 128 experts x 4 tokens.
  bench_grouped(*be, WeightFormat::MXFP4, 256, 128, 4096, 6144, DType::BF16, 4);
  bench_grouped(*be, WeightFormat::MXFP4, 256, 128, 6144, 2048, DType::BF16, 4);
  bench_paged_attention(*be, 1, 64, true);
  bench_paged_attention(*be, 1, 4096, true);
  bench_paged_attention(*be, 32, 4096, true);
  return 0;
}
