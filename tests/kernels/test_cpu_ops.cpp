// The CPU backend against the ref backend: the shared op case list (tests/ops/op_cases.cpp: every op and decode
// block, every weight format, odd sizes, F32 and BF16 activations) for every ISA level this machine runs (scalar,
// avx2, avx512), one gtest per case: OpHarness/CpuOps.MatchesRef/<case>, every level in it. Then the CPU-only checks:
// ISA selection and the LATENT_CPU_ISA override, batch invariance of matmul / grouped matmul, and the epilogue
// contract (fused = unfused bit for bit). The per-case errors are printed at the end ("[op harness] ...").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "../ops/op_harness.h"
#include "backend/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/weight_arena.h"
#include "quant/float_formats.h"

namespace latent {
namespace {

using ops::Fmt;
using ops::HostWeight;
using ops::Rng;

std::string isa_label(CpuIsa i) { return std::string("cpu-") + cpu_isa_name(i); }

// The backends under test, one per level (thread counts unlike the ref's: results must not depend on them).
Backend& cpu_backend(CpuIsa isa) {
  static std::map<CpuIsa, std::unique_ptr<Backend>> m;
  auto& b = m[isa];
  if (!b) b = make_cpu_backend(isa == CpuIsa::Scalar ? 3 : 2, isa);
  return *b;
}

// ---------------------------------------------------------------------------------------------------------------
// The shared case list
// ---------------------------------------------------------------------------------------------------------------
// One gtest per case: OpHarness/CpuOps.MatchesRef/<case>, run on every ISA level this machine has (the ref
// backend's outputs computed once per check, then compared with each level's; the messages name the level).
class CpuOps : public ::testing::TestWithParam<ops::CaseIndex> {};

TEST_P(CpuOps, MatchesRef) {
  std::vector<ops::Tested> levels;
  for (CpuIsa isa : cpu_isas_available()) levels.push_back({&cpu_backend(isa), isa_label(isa)});
  ops::run_op_case(ops::op_cases()[GetParam().i], levels);
}

INSTANTIATE_TEST_SUITE_P(OpHarness, CpuOps, ::testing::ValuesIn(ops::all_case_indices()), ops::case_test_name);

TEST(CpuOpHarness, CaseNamesAreUnique) {
  std::set<std::string> seen;
  for (const ops::OpCase& c : ops::op_cases()) EXPECT_TRUE(seen.insert(ops::gtest_name(c.name)).second) << c.name;
  EXPECT_GT(seen.size(), 100u);
}

// The harness itself: NaN on one side only never passes; NaNs at the same places do; a wrong value fails.
TEST(CpuOpHarness, NormalizedError) {
  const float nan = std::nanf("");
  const std::vector<float> b = {1.0f, -2.0f, nan, 4.0f};
  EXPECT_EQ(ops::norm_err(b.data(), b.data(), b.size()), 0.0);
  std::vector<float> a = b;
  a[0] = nan;
  EXPECT_TRUE(std::isinf(ops::norm_err(a.data(), b.data(), b.size())));
  a = b;
  a[2] = 3.0f;
  EXPECT_TRUE(std::isinf(ops::norm_err(a.data(), b.data(), b.size())));
  a = b;
  a[3] = 4.0f + 1e-3f;
  EXPECT_NEAR(ops::norm_err(a.data(), b.data(), b.size()), (static_cast<double>(a[3]) - 4.0) / std::sqrt(21.0), 1e-12);
  const std::vector<float> inf = {std::numeric_limits<float>::infinity()}, ninf = {-inf[0]};
  EXPECT_EQ(ops::norm_err(inf.data(), inf.data(), 1), 0.0);
  EXPECT_TRUE(std::isinf(ops::norm_err(inf.data(), ninf.data(), 1)));
}

// ---------------------------------------------------------------------------------------------------------------
// ISA levels
// ---------------------------------------------------------------------------------------------------------------
TEST(CpuIsaLevels, Available) {
  const auto v = cpu_isas_available();
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v.front(), CpuIsa::Scalar);
  std::string s;
  for (CpuIsa i : v) s += std::string(cpu_isa_name(i)) + " ";
  std::printf("[op harness] CPU ISA levels tested: %s\n", s.c_str());
  for (CpuIsa i : v) EXPECT_STREQ(cpu_backend(i).name(), "cpu");
}

TEST(CpuIsaLevels, EnvironmentOverride) {
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

TEST(CpuIsaLevels, RegistryName) {
  auto b = make_backend("cpu", 1);
  ASSERT_TRUE(b);
  EXPECT_STREQ(b->name(), "cpu");
}

// ---------------------------------------------------------------------------------------------------------------
// Batch invariance (the engine's promise that a sequence's logits do not depend on what else is in the step): row
// m of a matmul computed in a batch of M rows, at any position in the batch, equals the same row computed alone
// (M = 1) bit for bit, for every weight format and ISA, F32 and BF16 activations, whatever the number of threads.
// ---------------------------------------------------------------------------------------------------------------
bool same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

// Host tensor storage of `rows` rows of `cols` values of dtype t (the CPU backends' memory is host memory).
struct HostRows {
  std::vector<uint8_t> b;
  DType t;
  int64_t cols;
  HostRows(DType t, int64_t rows, int64_t cols)
      : b(static_cast<size_t>(rows * cols) * Tensor::size_of(t), 0xFF), t(t), cols(cols) {}
  Tensor rows(int64_t r0, int64_t n) {
    return Tensor(b.data() + static_cast<size_t>(r0 * cols) * Tensor::size_of(t), t, n, cols);
  }
  const uint8_t* row(int64_t r) const { return b.data() + static_cast<size_t>(r * cols) * Tensor::size_of(t); }
  size_t row_bytes() const { return static_cast<size_t>(cols) * Tensor::size_of(t); }
};
HostRows host_values(const std::vector<float>& v, DType t, int64_t rows, int64_t cols) {
  HostRows h(t, rows, cols);
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::BF16) {
      const uint16_t x = f32_to_bf16(v[i]);
      std::memcpy(h.b.data() + 2 * i, &x, 2);
    } else {
      std::memcpy(h.b.data() + 4 * i, &v[i], 4);
    }
  }
  return h;
}

// prepare_weight with the SIMD kernels (AVX-512, AVX2) copies every weight (make_weight misaligns by one byte; the
// copy of another backend is aligned) into 64-byte aligned memory: the same bytes, the scales untouched, the same
// matmul bits; a weight already in its own arena stays; off, or with the scalar kernels, or past the budget, the
// weight stays where it is.
TEST(CpuBackend, RealignsMisalignedWeightsForAvx512) {
  Rng rng(33);
  for (CpuIsa isa : {CpuIsa::Avx512, CpuIsa::Avx2}) {
    const bool simd = cpu_isa_supported(isa) || cpu_isa_supported(CpuIsa::Avx2);  // (else the best one runs)
    const char* name = isa == CpuIsa::Avx512 ? "avx512" : "avx2";
    for (Fmt f : ops::kAllFmts) {
      const int64_t rows = 37, cols = f == Fmt::Mxfp4 ? 1088 : 1031;
      const HostWeight w = ops::make_weight(f, rows, cols, rng);
      ASSERT_NE(reinterpret_cast<uintptr_t>(w.q.data) & 63, 0u) << ops::fmt_name(f);
      const size_t bytes = static_cast<size_t>(rows * w.q.row_bytes());
      const std::unique_ptr<Backend> on = make_cpu_backend(2, isa, true);
      const QuantWeight q = on->prepare_weight(w.q);
      if (simd) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(q.data) & 63, 0u) << name << " " << ops::fmt_name(f);
        EXPECT_NE(q.data, w.q.data) << name << " " << ops::fmt_name(f);
        EXPECT_EQ(0, std::memcmp(q.data, w.q.data, bytes)) << name << " " << ops::fmt_name(f);
        EXPECT_EQ(q.scale, w.q.scale) << name << " " << ops::fmt_name(f);
        for (int64_t M : {1, 5}) {
          HostRows x = host_values(rng.normals(M * cols), DType::F32, M, cols), a(DType::F32, M, rows),
                   b(DType::F32, M, rows);
          on->matmul(w.q, x.rows(0, M), a.rows(0, M));
          on->matmul(q, x.rows(0, M), b.rows(0, M));
          EXPECT_TRUE(same_bits(a.row(0), b.row(0), a.row_bytes() * static_cast<size_t>(M)))
              << name << " " << ops::fmt_name(f) << " M " << M;
        }
        // The backend's own copy is not copied again; an aligned weight elsewhere (another backend's copy) is.
        EXPECT_EQ(on->prepare_weight(q).data, q.data) << name << " " << ops::fmt_name(f);
        const std::unique_ptr<Backend> other = make_cpu_backend(2, isa, true);
        const QuantWeight q2 = other->prepare_weight(q);
        EXPECT_NE(q2.data, q.data) << name << " " << ops::fmt_name(f);
        EXPECT_EQ(0, std::memcmp(q2.data, w.q.data, bytes)) << name << " " << ops::fmt_name(f);
        // The budget: a second weight that would pass it stays mapped, a smaller one that fits is still copied.
        const std::unique_ptr<Backend> tight =
            make_cpu_backend(2, isa, true, static_cast<int64_t>(bytes) + w.q.row_bytes());
        EXPECT_NE(tight->prepare_weight(w.q).data, w.q.data) << name << " " << ops::fmt_name(f);
        EXPECT_EQ(tight->prepare_weight(w.q).data, w.q.data) << name << " " << ops::fmt_name(f) << " (past budget)";
        QuantWeight small = w.q;
        small.rows = 1;
        EXPECT_NE(tight->prepare_weight(small).data, w.q.data) << name << " " << ops::fmt_name(f);
        EXPECT_EQ(make_cpu_backend(2, isa, true, 0)->prepare_weight(w.q).data, w.q.data) << name << " (budget 0)";
      } else {
        EXPECT_EQ(q.data, w.q.data) << name << " " << ops::fmt_name(f) << " (not here: the scalar kernels)";
      }
      EXPECT_EQ(make_cpu_backend(2, isa, false)->prepare_weight(w.q).data, w.q.data) << name << " " << ops::fmt_name(f);
    }
  }
  const HostWeight w = ops::make_weight(Fmt::BF16, 5, 64, rng);
  EXPECT_EQ(make_cpu_backend(2, CpuIsa::Scalar, true)->prepare_weight(w.q).data, w.q.data) << "scalar";
}

// The arena the realigned copies live in: every block 64-byte aligned, disjoint from the others and kept where it is
// while later ones are carved (small ones share a chunk; one larger than a chunk gets its own).
TEST(CpuBackend, WeightArenaBlocksAlignedAndDisjoint) {
  cpu::WeightArena arena;
  std::vector<std::pair<uint8_t*, size_t>> blocks;
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{4096} + 5, size_t{3} << 20, size_t{300} << 20, size_t{100},
                       size_t{200} << 20, size_t{64}}) {
    uint8_t* p = arena.alloc(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) & 63, 0u) << bytes;
    std::memset(p, static_cast<int>(blocks.size() + 1), bytes);
    blocks.emplace_back(p, bytes);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto [p, n] = blocks[i];
    EXPECT_EQ(p[0], static_cast<uint8_t>(i + 1)) << i;
    EXPECT_EQ(p[n - 1], static_cast<uint8_t>(i + 1)) << i;
    for (size_t j = 0; j < blocks.size(); ++j)
      if (j != i) {
        EXPECT_TRUE(p + n <= blocks[j].first || blocks[j].first + blocks[j].second <= p) << i << " " << j;
      }
  }
}

TEST(CpuBatchInvariance, Matmul) {
  Rng rng(21);
  constexpr int64_t kMaxM = 130;
  for (Fmt f : ops::kAllFmts) {
    const bool nan = ops::fp8_fmt(f) || f == Fmt::Mxfp4;
    // (20: the AVX-512 bf16 GEMV's natural-order tail alone; 33, 1031: whole groups and a tail)
    for (int64_t cols : f == Fmt::Mxfp4 ? std::vector<int64_t>{96, 1088} : std::vector<int64_t>{20, 33, 1031}) {
      const int64_t rows = 37;
      const HostWeight w = ops::make_weight(f, rows, cols, rng, nan);
      for (DType xt : {DType::F32, DType::BF16})
        for (DType yt : {DType::F32, DType::BF16}) {
          if (xt == DType::F32 && yt == DType::BF16) continue;
          HostRows x = host_values(rng.normals(kMaxM * cols), xt, kMaxM, cols);
          for (CpuIsa isa : cpu_isas_available()) {
            const std::unique_ptr<Backend> one = make_cpu_backend(1, isa), three = make_cpu_backend(3, isa);
            HostRows alone(yt, kMaxM, rows);
            for (int64_t m = 0; m < kMaxM; ++m) one->matmul(w.q, x.rows(m, 1), alone.rows(m, 1));
            const std::string what = std::string(ops::fmt_name(f)) + " " + cpu_isa_name(isa) + " cols " +
                                     std::to_string(cols) + " x " + ops::dtype_label(xt) + " y " + ops::dtype_label(yt);
            for (int64_t M : {1, 2, 3, 4, 5, 7, 16, 17, 64, 130}) {
              for (int64_t at : {int64_t{0}, (kMaxM - M) / 2 + 1}) {  // the batch at the start / in the middle
                if (at + M > kMaxM || (at > 0 && M == kMaxM)) continue;
                for (Backend* be : {one.get(), three.get()}) {
                  HostRows y(yt, M, rows);
                  be->matmul(w.q, x.rows(at, M), y.rows(0, M));
                  for (int64_t m = 0; m < M; ++m)
                    EXPECT_TRUE(same_bits(y.row(m), alone.row(at + m), y.row_bytes()))
                        << what << " M " << M << " row " << m << " at " << at << " threads " << be->num_threads();
                }
              }
            }
          }
        }
    }
  }
}

TEST(CpuBatchInvariance, GroupedMatmul) {  // a token's expert output does not depend on the group's other rows
  Rng rng(22);
  const int64_t rows = 37, cols = 1088;
  const Fmt fmts[] = {Fmt::Mxfp4, Fmt::BF16, Fmt::Fp8Block, Fmt::Mxfp4, Fmt::F32};
  const int64_t G = 5;
  std::vector<HostWeight> ws;
  for (int64_t g = 0; g < G; ++g) ws.push_back(ops::make_weight(fmts[g], rows, cols, rng));
  std::vector<const QuantWeight*> wp(G);
  for (int64_t g = 0; g < G; ++g) wp[static_cast<size_t>(g)] = &ws[static_cast<size_t>(g)].q;
  for (const std::vector<int64_t>& counts :
       {std::vector<int64_t>{1, 1, 1, 1, 1}, {3, 0, 7, 16, 1}, {64, 2, 0, 5, 66}}) {
    std::vector<int64_t> off(G + 1, 0);
    for (int64_t g = 0; g < G; ++g) off[g + 1] = off[g] + counts[static_cast<size_t>(g)];
    const int64_t n = off[G];
    for (DType t : {DType::F32, DType::BF16}) {
      HostRows x = host_values(rng.normals(n * cols), t, n, cols);
      for (CpuIsa isa : cpu_isas_available()) {
        const std::unique_ptr<Backend> one = make_cpu_backend(1, isa), three = make_cpu_backend(3, isa);
        HostRows alone(t, n, rows);
        for (int64_t g = 0; g < G; ++g)
          for (int64_t i = off[g]; i < off[g + 1]; ++i)
            one->matmul(*wp[static_cast<size_t>(g)], x.rows(i, 1), alone.rows(i, 1));
        for (Backend* be : {one.get(), three.get()}) {
          HostRows y(t, n, rows);
          be->grouped_matmul(wp.data(), G, off.data(), x.rows(0, n), y.rows(0, n));
          for (int64_t i = 0; i < n; ++i)
            EXPECT_TRUE(same_bits(y.row(i), alone.row(i), y.row_bytes()))
                << cpu_isa_name(isa) << " " << ops::dtype_label(t) << " token " << i << " of " << n << " threads "
                << be->num_threads();
        }
      }
    }
  }
}

// Elementwise ops and norms over many rows do not depend on the thread count (nor, with it, on where the work is
// split): silu_mul, add, rms_norm, scale over 70001 values / 171 rows, 1 vs 3 threads, bit for bit.
TEST(CpuBatchInvariance, ElementwiseThreads) {
  Rng rng(23);
  const int64_t R = 7, C = 10001, D = 409, M = 171;
  std::vector<float> g = rng.normals(R * C, 4.0f);
  const std::vector<float> u = rng.normals(R * C), x = rng.normals(M * D, 3.0f), w = rng.normals(D);
  for (DType t : {DType::F32, DType::BF16})
    for (CpuIsa isa : cpu_isas_available()) {
      std::vector<std::vector<uint8_t>> outs[2];
      int k = 0;
      for (int threads : {1, 3}) {
        const std::unique_ptr<Backend> be = make_cpu_backend(threads, isa);
        HostRows gt = host_values(g, t, R, C), ut = host_values(u, t, R, C), o(t, R, C);
        be->silu_mul(gt.rows(0, R), ut.rows(0, R), o.rows(0, R));
        be->add(ut.rows(0, R), gt.rows(0, R));
        HostRows xt = host_values(x, t, M, D), y(t, M, D);
        be->rms_norm(xt.rows(0, M), w.data(), 1e-6f, y.rows(0, M));
        be->scale(gt.rows(0, R), 0.37f);
        outs[k++] = {o.b, ut.b, y.b, gt.b};
      }
      const char* names[] = {"silu_mul", "add", "rms_norm", "scale"};
      for (size_t i = 0; i < 4; ++i)
        EXPECT_TRUE(outs[0][i] == outs[1][i])
            << names[i] << " " << cpu_isa_name(isa) << " " << ops::dtype_label(t) << ": 1 and 3 threads differ";
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The epilogue contract (backend.h): fused = unfused bit for bit, on every level and on the ref backend.
// ---------------------------------------------------------------------------------------------------------------
TEST(CpuEpilogue, FusedEqualsUnfused) {
  for (CpuIsa isa : cpu_isas_available()) ops::expect_fused_equals_unfused(cpu_backend(isa), isa_label(isa));
  const std::unique_ptr<Backend> r = make_ref_backend(2);
  ops::expect_fused_equals_unfused(*r, "ref");
}

// The decode-block contract (backend.h): each block equals its default composition bit for bit.
TEST(CpuBlocks, EqualDefaults) {
  for (CpuIsa isa : cpu_isas_available()) ops::expect_blocks_equal_defaults(cpu_backend(isa), isa_label(isa));
}

// Decode attention at real context lengths: contexts past one chunk of keys (the CPU kernel splits a token's keys
// into chunks that run on different threads and are combined), fp32 and bf16 pools, DSA selections of more than a
// chunk, against the ref; and bitwise batch invariance: every sequence alone (one call of its own) and with one
// thread equals the whole batch on two threads.
TEST(CpuOps, MlaAttentionAbsorbedPagedLongContext) {
  Rng rng(23);
  const int64_t H = 4, dn = 16, dr = 16, dv = 24, dc = 64, dqk = dn + dr, width = dc + dr + 3, bt = 64;
  MlaDims d{H, dn, dr, dv, dc};
  const std::vector<int32_t> ctx = {1, 100, 513, 1300, 4100, 777};
  const int64_t n_seqs = static_cast<int64_t>(ctx.size()), max_blocks = (4100 + bt - 1) / bt;
  const int64_t n_blocks = n_seqs * max_blocks;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int64_t i = 0; i < n_blocks; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::shuffle(table.begin(), table.end(), rng.g);
  std::vector<int32_t> q_begin(static_cast<size_t>(n_seqs + 1));
  for (int64_t s = 0; s <= n_seqs; ++s) q_begin[static_cast<size_t>(s)] = static_cast<int32_t>(s);
  std::vector<int64_t> pos(static_cast<size_t>(n_seqs));
  for (int64_t s = 0; s < n_seqs; ++s) pos[static_cast<size_t>(s)] = ctx[static_cast<size_t>(s)] - 1;
  std::vector<float> pool_f(static_cast<size_t>(n_blocks * bt * width));
  for (float& v : pool_f) v = rng.normal(0.7f);
  std::vector<uint16_t> pool_b(pool_f.size());
  for (size_t i = 0; i < pool_f.size(); ++i) pool_b[i] = f32_to_bf16(pool_f[i]);
  // Selections: up to 1,500 keys per token anywhere in its causal range (duplicates and -1 ignored).
  const int64_t stride = 1500;
  std::vector<int32_t> sel(static_cast<size_t>(n_seqs * stride)), count(static_cast<size_t>(n_seqs));
  for (int64_t s = 0; s < n_seqs; ++s) {
    count[static_cast<size_t>(s)] = static_cast<int32_t>(rng.integer(1, stride));
    for (int64_t j = 0; j < stride; ++j)
      sel[static_cast<size_t>(s * stride + j)] = static_cast<int32_t>(rng.integer(-1, ctx[static_cast<size_t>(s)] - 1));
  }
  const std::unique_ptr<Backend> ref = make_ref_backend(2);
  for (Fmt f : {Fmt::BF16, Fmt::Fp8Block}) {
    const HostWeight kvb = ops::make_weight(f, H * (dn + dv), dc, rng);
    for (bool bf16 : {false, true}) {
      const DType dt = bf16 ? DType::BF16 : DType::F32;
      for (bool use_sel : {false, true}) {
        KvPool pool;
        pool.dtype = dt;
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
        seqs.max_ctx = 4100;
        std::vector<float> qv(static_cast<size_t>(n_seqs * H * dqk));
        for (float& v : qv) v = rng.normal();
        if (bf16) qv = ops::bf16_values(qv);
        // Host backends: tensors over host vectors (q as bf16 bits or fp32).
        std::vector<uint16_t> qb(qv.size());
        for (size_t i = 0; i < qv.size(); ++i) qb[i] = f32_to_bf16(qv[i]);
        const Tensor q(bf16 ? static_cast<void*>(qb.data()) : static_cast<void*>(qv.data()), dt, n_seqs, H * dqk);
        const KeySelection ks = use_sel ? KeySelection{sel.data(), count.data(), stride} : KeySelection{};
        const float scale = 2.0f / std::sqrt(static_cast<float>(dqk));  // peaked: the chunks' maxima differ
        auto out = [&](std::vector<float>& f32, std::vector<uint16_t>& b16) {
          f32.assign(static_cast<size_t>(n_seqs * H * dv), -3.0f);
          b16.assign(f32.size(), 0xC040);
          return Tensor(bf16 ? static_cast<void*>(b16.data()) : static_cast<void*>(f32.data()), dt, n_seqs, H * dv);
        };
        auto values = [&](const std::vector<float>& f32, const std::vector<uint16_t>& b16) {
          std::vector<float> v(f32.size());
          for (size_t i = 0; i < v.size(); ++i) v[i] = bf16 ? bf16_to_f32(b16[i]) : f32[i];
          return v;
        };
        std::vector<float> rf;
        std::vector<uint16_t> rb;
        const Tensor orf = out(rf, rb);
        ref->mla_attention_absorbed_paged(d, q, kvb.q, pool, seqs, pos.data(), ks, scale, orf);
        const std::vector<float> want = values(rf, rb);
        for (CpuIsa isa : cpu_isas_available()) {
          std::vector<float> cf;
          std::vector<uint16_t> cb;
          const Tensor o = out(cf, cb);
          cpu_backend(isa).mla_attention_absorbed_paged(d, q, kvb.q, pool, seqs, pos.data(), ks, scale, o);
          const std::vector<float> got = values(cf, cb);
          const double e = ops::norm_err(got.data(), want.data(), want.size());
          ops::record_summary(std::string("mla_absorbed_paged_long/") + ops::fmt_name(f) + "/" + ops::dtype_label(dt) +
                                  (use_sel ? "/sel" : ""),
                              isa_label(isa), e, ops::tol_for(dt));
          EXPECT_LE(e, ops::tol_for(dt)) << ops::fmt_name(f) << " " << cpu_isa_name(isa) << " sel " << use_sel;
          // Each sequence alone, on one thread: bit-identical rows.
          std::unique_ptr<Backend> one = make_cpu_backend(1, isa);
          for (int64_t s = 0; s < n_seqs; ++s) {
            StepSeqs alone = seqs;
            alone.n_seqs = 1;
            alone.q_begin = q_begin.data() + s;
            alone.ctx_len = ctx.data() + s;
            alone.block_table = table.data() + s * max_blocks;
            std::vector<float> af;
            std::vector<uint16_t> ab;
            const Tensor oa = out(af, ab);
            one->mla_attention_absorbed_paged(d, q, kvb.q, pool, alone, pos.data(), ks, scale, oa);
            const std::vector<float> ga = values(af, ab);
            EXPECT_EQ(std::memcmp(ga.data() + s * H * dv, got.data() + s * H * dv, sizeof(float) * H * dv), 0)
                << ops::fmt_name(f) << " " << cpu_isa_name(isa) << " bf16 " << bf16 << " sel " << use_sel
                << ": sequence " << s << " (context " << ctx[static_cast<size_t>(s)] << ") alone differs";
          }
        }
      }
    }
  }
}

// The decode attention's small GEMMs (dot_rows, axpy_rows) of every ISA level against the scalar kernels on random
// inputs, and their prefetch cursor: the same bits with and without one, and a SIMD kernel walks it to its end
// when it has enough steps (the scalar kernels ignore it).
TEST(CpuKernels, SmallGemmsAndPrefetchCursor) {
  Rng rng(31);
  const int64_t na = 13, n1 = 70, n2 = 19, nb = 37, lda = n1 + n2 + 5, n = 83, ldc = n + 3;
  std::vector<float> a(static_cast<size_t>(na * lda)), keys(static_cast<size_t>(nb * (n1 + n2 + 1)));
  for (float& v : a) v = rng.normal();
  for (float& v : keys) v = rng.normal();
  std::vector<uint16_t> keys_b(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) keys_b[i] = f32_to_bf16(keys[i]);
  std::vector<const float*> b1(nb), b2(nb);
  std::vector<const uint16_t*> h1(nb), h2(nb);
  for (int64_t j = 0; j < nb; ++j) {
    b1[static_cast<size_t>(j)] = keys.data() + j * (n1 + n2 + 1);
    b2[static_cast<size_t>(j)] = b1[static_cast<size_t>(j)] + n1;
    h1[static_cast<size_t>(j)] = keys_b.data() + j * (n1 + n2 + 1);
    h2[static_cast<size_t>(j)] = h1[static_cast<size_t>(j)] + n1;
  }
  // The rows the cursor walks (any readable memory): 9 rows of 300 bytes.
  std::vector<uint8_t> other(9 * 300 + 64);
  std::vector<const void*> rows(9);
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = other.data() + 3 + r * 300;
  std::vector<const cpu::Kernels*> levels = {&cpu::kernels_scalar()};
  if (cpu_isa_supported(CpuIsa::Avx2)) levels.push_back(cpu::kernels_avx2());
  if (cpu_isa_supported(CpuIsa::Avx512)) levels.push_back(cpu::kernels_avx512());
  const cpu::Kernels& sc = cpu::kernels_scalar();
  std::vector<float> want_s(static_cast<size_t>(na * nb)), want_sb(want_s.size());
  sc.dot_rows_f32(a.data(), lda, na, b1.data(), b2.data(), n1, n2, nb, want_s.data(), nb, nullptr);
  sc.dot_rows_bf16(a.data(), lda, na, h1.data(), h2.data(), n1, n2, nb, want_sb.data(), nb, nullptr);
  std::vector<float> c0(static_cast<size_t>(na * ldc));
  for (float& v : c0) v = rng.normal();
  std::vector<float> want_c = c0, want_cb = c0;
  sc.axpy_rows_f32(a.data(), lda, na, b1.data(), nb, n, want_c.data(), ldc, true, nullptr);
  sc.axpy_rows_bf16(a.data(), lda, na, h1.data(), nb, n, want_cb.data(), ldc, true, nullptr);
  for (const cpu::Kernels* k : levels) {
    SCOPED_TRACE(k->name);
    const bool simd = k != &sc;
    for (bool bf : {false, true}) {
      std::vector<float> s0(want_s.size()), s1(want_s.size());
      cpu::PrefetchCursor pf{rows.data(), static_cast<int64_t>(rows.size()), 300, 0, 0};
      if (bf) {
        k->dot_rows_bf16(a.data(), lda, na, h1.data(), h2.data(), n1, n2, nb, s0.data(), nb, nullptr);
        k->dot_rows_bf16(a.data(), lda, na, h1.data(), h2.data(), n1, n2, nb, s1.data(), nb, &pf);
      } else {
        k->dot_rows_f32(a.data(), lda, na, b1.data(), b2.data(), n1, n2, nb, s0.data(), nb, nullptr);
        k->dot_rows_f32(a.data(), lda, na, b1.data(), b2.data(), n1, n2, nb, s1.data(), nb, &pf);
      }
      EXPECT_EQ(std::memcmp(s0.data(), s1.data(), sizeof(float) * s0.size()), 0) << "dot_rows bf16 " << bf;
      if (simd) {
        EXPECT_EQ(pf.row, static_cast<int64_t>(rows.size())) << "dot_rows bf16 " << bf;
      }
      const std::vector<float>& ws = bf ? want_sb : want_s;
      EXPECT_LE(ops::norm_err(s0.data(), ws.data(), ws.size()), 1e-5) << "dot_rows bf16 " << bf;

      std::vector<float> d0 = c0, d1 = c0;
      pf = cpu::PrefetchCursor{rows.data(), static_cast<int64_t>(rows.size()), 300, 0, 0};
      if (bf) {
        k->axpy_rows_bf16(a.data(), lda, na, h1.data(), nb, n, d0.data(), ldc, true, nullptr);
        k->axpy_rows_bf16(a.data(), lda, na, h1.data(), nb, n, d1.data(), ldc, true, &pf);
      } else {
        k->axpy_rows_f32(a.data(), lda, na, b1.data(), nb, n, d0.data(), ldc, true, nullptr);
        k->axpy_rows_f32(a.data(), lda, na, b1.data(), nb, n, d1.data(), ldc, true, &pf);
      }
      EXPECT_EQ(std::memcmp(d0.data(), d1.data(), sizeof(float) * d0.size()), 0) << "axpy_rows bf16 " << bf;
      if (simd) {
        EXPECT_EQ(pf.row, static_cast<int64_t>(rows.size())) << "axpy_rows bf16 " << bf;
      }
      const std::vector<float>& wc = bf ? want_cb : want_c;
      EXPECT_LE(ops::norm_err(d0.data(), wc.data(), wc.size()), 1e-5) << "axpy_rows bf16 " << bf;
    }
  }
}

// The decode attention's transposed-query scores (dot_rows_t: heads in the vector lanes) of every ISA level against
// the scalar dot_rows on the same queries: head counts below, at and past whole vectors and register tiles (1, 5,
// 13, 16, 50: a partly filled last vector, several vector groups), key counts that leave a tail after the key
// tiles (1, 7, 37, 64), a second part (k_pe) or none, fp32 and bf16 keys, and lanes of qt past na holding garbage
// (dropped, never mixed into a row). Each row's bits must not depend on the tile its head falls in: the same head
// alone (na = 1, at its own lane 0) gives the same bits.
TEST(CpuKernels, TransposedScoresMatchScalar) {
  Rng rng(37);
  std::vector<const cpu::Kernels*> levels = {&cpu::kernels_scalar()};
  if (cpu_isa_supported(CpuIsa::Avx2)) levels.push_back(cpu::kernels_avx2());
  if (cpu_isa_supported(CpuIsa::Avx512)) levels.push_back(cpu::kernels_avx512());
  const cpu::Kernels& sc = cpu::kernels_scalar();
  for (int64_t na : {1, 5, 13, 16, 50})
    for (int64_t nb : {1, 7, 37, 64})
      for (int64_t n2 : {0, 19}) {
        const int64_t n1 = 70, nx = n1 + n2, ldt = (na + 15) / 16 * 16 + 16;  // room for a shifted head
        std::vector<float> a(static_cast<size_t>(na * nx)), keys(static_cast<size_t>(nb * (nx + 1)));
        for (float& v : a) v = rng.normal();
        for (float& v : keys) v = rng.normal();
        std::vector<float> qt(static_cast<size_t>(nx * ldt + 16));
        for (float& v : qt) v = rng.normal() * 1e30f;  // lanes past na: garbage that must not leak
        for (int64_t x = 0; x < nx; ++x)
          for (int64_t i = 0; i < na; ++i) qt[static_cast<size_t>(x * ldt + i)] = a[static_cast<size_t>(i * nx + x)];
        std::vector<uint16_t> keys_b(keys.size());
        for (size_t i = 0; i < keys.size(); ++i) keys_b[i] = f32_to_bf16(keys[i]);
        std::vector<const float*> b1(nb), b2(nb);
        std::vector<const uint16_t*> h1(nb), h2(nb);
        for (int64_t j = 0; j < nb; ++j) {
          // Odd element offsets: bf16 rows 2-byte aligned only, as in a pool row.
          b1[static_cast<size_t>(j)] = keys.data() + j * (nx + 1) + 1;
          b2[static_cast<size_t>(j)] = b1[static_cast<size_t>(j)] + n1;
          h1[static_cast<size_t>(j)] = keys_b.data() + j * (nx + 1) + 1;
          h2[static_cast<size_t>(j)] = h1[static_cast<size_t>(j)] + n1;
        }
        for (bool bf : {false, true}) {
          std::vector<float> want(static_cast<size_t>(na * nb));
          if (bf)
            sc.dot_rows_bf16(a.data(), nx, na, h1.data(), h2.data(), n1, n2, nb, want.data(), nb, nullptr);
          else
            sc.dot_rows_f32(a.data(), nx, na, b1.data(), b2.data(), n1, n2, nb, want.data(), nb, nullptr);
          for (const cpu::Kernels* k : levels) {
            SCOPED_TRACE(std::string(k->name) + " na " + std::to_string(na) + " nb " + std::to_string(nb) + " n2 " +
                         std::to_string(n2) + " bf16 " + std::to_string(bf));
            auto run = [&](const float* q, int64_t rows, float* s) {
              if (bf)
                k->dot_rows_t_bf16(q, ldt, rows, h1.data(), h2.data(), n1, n2, nb, s, nb, nullptr);
              else
                k->dot_rows_t_f32(q, ldt, rows, b1.data(), b2.data(), n1, n2, nb, s, nb, nullptr);
            };
            std::vector<float> got(want.size(), -7.0f);
            run(qt.data(), na, got.data());
            EXPECT_LE(ops::norm_err(got.data(), want.data(), want.size()), 1e-5);
            // The last head alone, read from its own lane (an item whose heads start mid-vector).
            std::vector<float> alone(static_cast<size_t>(nb));
            run(qt.data() + (na - 1), 1, alone.data());
            EXPECT_EQ(std::memcmp(alone.data(), got.data() + (na - 1) * nb, sizeof(float) * static_cast<size_t>(nb)),
                      0);
          }
        }
      }
}

}  // namespace
}  // namespace latent
