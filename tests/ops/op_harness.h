// The shared op harness: one list of op cases (op_cases.cpp) that every backend is held to, each case run on the
// backend under test and on the ref backend (the oracle) on identical inputs, the outputs compared. The CPU
// harness (tests/kernels/test_cpu_ops.cpp, in ctest) runs it for every ISA level, the CUDA harness
// (tests/cuda/test_cuda_ops.cpp, on the GPU machine) on the CUDA backend; a new op or weight format is added here
// once.
//
// A case draws fresh random inputs on the host (its own generator, seeded from its name, plus LATENT_OP_SEED when
// set), then calls CaseCtx::check with a body that runs the op on one backend: it uploads the inputs into that
// backend's memory (an Arena: F32 or BF16 storage, strided rows; outputs poisoned with NaN bytes first), runs the
// op and returns the outputs downloaded as fp32 (or integers). check runs the body on the ref backend and on the
// backend under test and compares each output: floats by the normalized error ‖a − b‖₂ / ‖b‖₂ (a NaN or an Inf on
// one side only never passes; NaNs at the same places do: poisoned padding that neither backend wrote), integers
// exactly. Tolerances: F32 outputs 1e-5, BF16 outputs 1e-2 (both sides round to bf16 at the op's internal points;
// an fp32 accumulation-order difference can move one rounding by an ulp), exact for data movement, dequantization
// and selection (ids, counts, offsets).
//
// At the end of the program every case run prints one line, the same case names on every backend:
//   [op harness] <case name>: <err> <backend>[, <err> <backend> ...] (tol <tol>)
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace latent::ops {

constexpr double kTolF32 = 1e-5;
constexpr double kTolBf16 = 1e-2;
constexpr double kExact = 0.0;
// The tolerance of an output of this dtype.
inline double tol_for(DType t) { return t == DType::BF16 ? kTolBf16 : kTolF32; }
inline const char* dtype_label(DType t) { return t == DType::BF16 ? "bf16" : "f32"; }

// ‖a − b‖₂ / max(‖b‖₂, floor·√n) over the n' entries finite on both sides (n = n'); +inf when a NaN or an Inf is
// on one side only (or two Infs differ). floor: the typical magnitude of an entry (a dot product's √K·rms(x)·rms(w)),
// so that an output that cancels to much less than its terms (one element of a K = 7 matmul ≈ 0.007) is judged
// against the size of its terms, as its rounding error is; 0: plain ‖a − b‖₂ / ‖b‖₂ (‖a − b‖₂ when b is all zero).
double norm_err(const float* a, const float* b, size_t n, double floor = 0.0);
// bf16 round trip (nearest even) of every value.
std::vector<float> bf16_values(std::vector<float> v);

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
// Weights in every stored format
// ---------------------------------------------------------------------------------------------------------------
enum class Fmt { F32, BF16, F16, Fp8Block, Fp8BlockOdd, Fp8BlockFnuz, Fp8Tensor, Fp8Channel, Mxfp4 };
inline constexpr Fmt kAllFmts[] = {Fmt::F32,          Fmt::BF16,      Fmt::F16,        Fmt::Fp8Block, Fmt::Fp8BlockOdd,
                                   Fmt::Fp8BlockFnuz, Fmt::Fp8Tensor, Fmt::Fp8Channel, Fmt::Mxfp4};
// "f32", "bf16", "f16", "fp8_block128", "fp8_block32x40", "fp8fnuz_block128", "fp8_tensor", "fp8_channel", "mxfp4"
const char* fmt_name(Fmt f);
// Whether the format's values are exactly bf16 values (BF16, MXFP4) or its codes are (FP8): the bf16 tensor-core
// classes of a device backend.
bool fp8_fmt(Fmt f);

// A random weight in host memory, in its stored format (data and scales misaligned by one byte on purpose).
// nan: NaN codes (FP8) / a NaN e8m0 scale (MXFP4) in a few places.
struct HostWeight {
  std::vector<uint8_t> data, scale;
  QuantWeight q;
  double rms = 0.0;  // of the finite dequantized values
  HostWeight() = default;
  HostWeight(const HostWeight&) = delete;  // q points into data / scale
  HostWeight(HostWeight&&) = default;      // vector moves keep their buffers
  HostWeight& operator=(HostWeight&&) = default;
};
HostWeight make_weight(Fmt f, int64_t rows, int64_t cols, Rng& r, bool nan = false);
// A grouped matmul's table: a pointer to each weight of ws.
inline std::vector<const QuantWeight*> ptrs(const std::vector<QuantWeight>& ws) {
  std::vector<const QuantWeight*> p;
  for (const QuantWeight& w : ws) p.push_back(&w);
  return p;
}
// Column counts a format is tested at: odd sizes (the element-wise paths) and aligned ones (vector paths).
std::vector<int64_t> cols_for(Fmt f);

// ---------------------------------------------------------------------------------------------------------------
// Backend memory of one run
// ---------------------------------------------------------------------------------------------------------------
// The outputs a body returns: floats compared by norm_err against `tol` (exact: 0 allowed), integers exactly.
struct Out {
  std::string name;
  std::vector<float> f;
  std::vector<int64_t> i;
  double tol = 0.0;
  double floor = 0.0;  // norm_err's floor
  bool ints = false;
  Out&& with_floor(double f) && {
    floor = f;
    return std::move(*this);
  }
};
using Outs = std::vector<Out>;

// Buffers in one backend's memory, freed when the arena goes. Every buffer an op writes starts poisoned (0xFF
// bytes: NaN floats of both widths, -1 integers).
class Arena {
 public:
  explicit Arena(Backend& be) : be(be) {}
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  Backend& be;

  void* bytes(size_t n);  // poisoned
  template <class T>
  T* up(const std::vector<T>& v) {
    T* p = static_cast<T*>(bytes(v.size() * sizeof(T)));
    if (!v.empty()) be.upload(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  template <class T>
  T* out(size_t n) {
    return static_cast<T*>(bytes(n * sizeof(T)));
  }
  template <class T>
  std::vector<T> down(const T* p, size_t n) {
    std::vector<T> v(n);
    if (n) be.download(v.data(), p, n * sizeof(T));
    return v;
  }
  // A tensor [rows, cols] (row stride ld >= cols, -1: cols) of dtype t holding v (rows·cols values, rounded to t),
  // the padding between rows poisoned.
  Tensor up(const std::vector<float>& v, DType t, int64_t rows, int64_t cols, int64_t ld = -1);
  // A poisoned tensor.
  Tensor tensor(DType t, int64_t rows, int64_t cols, int64_t ld = -1);
  // Uploads v (t.rows·t.cols values, rounded to t's dtype) into an existing tensor; the padding is poisoned.
  void set(const Tensor& t, const std::vector<float>& v);
  // The tensor's rows·cols values as fp32 (padding: with_padding gives the whole rows·ld storage).
  std::vector<float> down(const Tensor& t, bool with_padding = false);
  // A weight as the backend's ops see it (prepare_weight of the host view).
  QuantWeight weight(const HostWeight& w) { return be.prepare_weight(w.q); }
  // A paged pool [blocks·bt, width] of dtype t holding v (blocks·bt·width values).
  KvPool pool(const std::vector<float>& v, DType t, int64_t blocks, int64_t bt, int64_t width);

  // Outputs: a tensor (its whole storage, so padding must stay poisoned on both sides), tolerance by its dtype
  // unless given; exact; fp32 arrays; integer arrays.
  Out result(const std::string& name, const Tensor& t, double tol = -1.0);
  Out exact(const std::string& name, const Tensor& t) { return result(name, t, kExact); }
  Out result(const std::string& name, const KvPool& p, double tol = kExact);
  Out floats(const std::string& name, const float* p, size_t n, double tol);
  template <class T>
  Out ints(const std::string& name, const T* p, size_t n) {
    Out o;
    o.name = name;
    o.ints = true;
    for (T v : down(p, n)) o.i.push_back(static_cast<int64_t>(v));
    return o;
  }

 private:
  std::vector<void*> ptrs_;
};

// ---------------------------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------------------------
// A backend under test and the label the messages and the summary give it ("cpu-avx2", "cuda").
struct Tested {
  Backend* be;
  std::string label;
};

class CaseCtx {
 public:
  CaseCtx(const std::string& name, std::vector<Tested> under_test);
  Rng rng;
  // Runs `body` on the ref backend once and on each backend under test, compares every output (gtest EXPECTs
  // naming the case, `what`, the output and the backend) and records the largest error for the summary. `body`
  // must not draw from `rng` (every backend gets the same inputs: draw them before check).
  void check(const std::string& what, const std::function<Outs(Arena&)>& body);
  const std::string& name() const { return name_; }

 private:
  void compare(const std::string& what, const Outs& want, const std::function<Outs(Arena&)>& body, Backend& be,
               const std::string& label);
  std::string name_;
  std::vector<Tested> tested_;
  uint64_t seed_;
};

struct OpCase {
  std::string name;  // "op/variant/dtype", e.g. "matmul/fp8_block128/bf16"
  std::function<void(CaseCtx&)> run;
};

// The case list (op_cases.cpp): every op of backend.h and the decode blocks.
const std::vector<OpCase>& op_cases();
// Runs one case on each backend of `under_test` against the ref backend (its outputs computed once).
void run_op_case(const OpCase& c, const std::vector<Tested>& under_test);
// The case name as a gtest name (non-alphanumerics to '_').
std::string gtest_name(const std::string& s);

// The parameter of a backend's one-gtest-per-case suite (tests/kernels/test_cpu_ops.cpp, tests/cuda/test_cuda_ops.cpp):
// a case of the list, printed as its name (what ctest or a gtest listing shows after the test's); every index of
// op_cases(); the gtest name of one (INSTANTIATE_TEST_SUITE_P's name generator).
struct CaseIndex {
  size_t i;
};
void PrintTo(const CaseIndex& p, std::ostream* os);
std::vector<CaseIndex> all_case_indices();
std::string case_test_name(const ::testing::TestParamInfo<CaseIndex>& p);

// Records a line of the end-of-program summary for a check outside the case list (backend-specific tests).
void record_summary(const std::string& name, const std::string& label, double err, double tol);

// The contract of backend.h "Epilogue": a linear op with a fused epilogue (bias, SwiGLU, gate, residual, y
// aliased by the residual, grouped SwiGLU) equals the unfused op sequence (matmul, add, convert, silu_mul) in the
// same dtypes bit for bit, on `be` alone. gtest EXPECTs name the format, the dtype and the epilogue.
void expect_fused_equals_unfused(Backend& be, const std::string& label);

// The contract of backend.h's decode blocks: a backend's mla_qkv equals the default composition
// (Backend::mla_qkv: its primitives in order) bit for bit in cq, q and the pool, on `be` alone (a backend that does
// not override the block passes trivially). gtest EXPECTs name the format, dtype and shape.
void expect_blocks_equal_defaults(Backend& be, const std::string& label);

}  // namespace latent::ops
