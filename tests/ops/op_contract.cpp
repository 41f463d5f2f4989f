// The contract of backend.h "Epilogue", on one backend: each fused epilogue equals the unfused op sequence in the
// same dtypes bit for bit:
//   bias      matmul → F32 accumulators, add(bias rows) in F32, convert to y's dtype
//   glu       matmul(W) and matmul(Wg) in y's dtype, silu_mul(g, u)
//   gate      matmul in y's dtype, silu_mul(gate, ·)
//   residual  matmul in y's dtype, add into a copy of the residual (also with the residual being y itself)
// and their combinations, for matmul and grouped_matmul.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "op_harness.h"

namespace latent::ops {

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> rows_of(const std::vector<float>& v, int64_t M) {
  std::vector<float> r;
  for (int64_t m = 0; m < M; ++m) r.insert(r.end(), v.begin(), v.end());
  return r;
}

}  // namespace

void expect_fused_equals_unfused(Backend& be, const std::string& label) {
  Rng rng(4242);
  const std::vector<std::string> kinds = {
      "bias", "glu", "gate", "residual", "residual=y", "bias+glu+residual", "bias+gate+residual"};
  for (Fmt f : {Fmt::F32, Fmt::BF16, Fmt::Fp8Block, Fmt::Fp8Channel, Fmt::Mxfp4}) {
    const int64_t N = 37, K = f == Fmt::Mxfp4 ? 160 : 161;
    const HostWeight w = make_weight(f, N, K, rng), wg = make_weight(f, N, K, rng);
    for (DType t : {DType::F32, DType::BF16})
      for (int64_t M : {1, 5, 17, 64}) {
        const std::vector<float> x = rng.normals(M * K), bias = rng.normals(N), gate = rng.normals(M * N, 2.0f),
                                 res = rng.normals(M * N, 3.0f);
        for (const std::string& k : kinds) {
          const bool has_bias = k.find("bias") != std::string::npos, has_glu = k.find("glu") != std::string::npos,
                     has_gate = k.find("gate") != std::string::npos, has_res = k.find("residual") != std::string::npos;
          Arena A(be);
          const QuantWeight wd = A.weight(w), wgd = A.weight(wg);
          const QuantWeight* gp[1] = {&wgd};
          const Tensor xt = A.up(x, t, M, K), gt = A.up(gate, t, M, N), rt = A.up(res, t, M, N);
          const float* bd = A.up(bias);
          // Fused.
          const Tensor y = k == "residual=y" ? A.up(res, t, M, N) : A.tensor(t, M, N);
          Epilogue e;
          if (has_bias) e.bias = bd;
          if (has_glu) e.glu = gp;
          if (has_gate) e.gate = &gt;
          if (has_res) e.residual = k == "residual=y" ? &y : &rt;
          be.matmul(wd, xt, y, e);
          // Unfused.
          Tensor u = A.tensor(t, M, N);
          if (has_bias) {
            const Tensor acc = A.tensor(DType::F32, M, N);
            be.matmul(wd, xt, acc);
            be.add(acc, A.up(rows_of(bias, M), DType::F32, M, N));
            be.convert(acc, u);
          } else {
            be.matmul(wd, xt, u);
          }
          if (has_glu) {
            const Tensor g = A.tensor(t, M, N);
            be.matmul(wgd, xt, g);
            be.silu_mul(g, u, u);
          }
          if (has_gate) be.silu_mul(gt, u, u);
          if (has_res) {
            const Tensor r2 = A.up(res, t, M, N);
            be.add(r2, u);
            u = r2;
          }
          EXPECT_TRUE(same_bits(A.down(y), A.down(u))) << label << ": fused " << k << " differs from the unfused ops; "
                                                       << fmt_name(f) << " " << dtype_label(t) << " M " << M;
        }
      }
  }
  // grouped_matmul: SwiGLU per group and a residual, with an empty group and offsets not starting at 0; mixed formats
  // (K 160), and all MXFP4 with K a multiple of 128 (the CUDA tensor-core kernels: groups of ≤ 16 tokens read gate
  // and up in one pass, the group of 17 through the gate rows).
  auto grouped = [&](const std::vector<Fmt>& fmts, int64_t K) {
    const std::vector<int64_t> counts = {3, 0, 17, 1};
    const int64_t N = 37, G = 4;
    std::vector<HostWeight> ws, gs;
    for (Fmt f : fmts) {
      ws.push_back(make_weight(f, N, K, rng));
      gs.push_back(make_weight(f, N, K, rng));
    }
    std::vector<int64_t> off = {2};
    for (int64_t c : counts) off.push_back(off.back() + c);
    const int64_t R = off.back();
    const std::vector<float> x = rng.normals(R * K), res = rng.normals(R * N);
    for (DType t : {DType::F32, DType::BF16})
      for (const std::string k : {"glu", "residual", "glu+residual"}) {
        const bool has_glu = k.find("glu") != std::string::npos, has_res = k.find("residual") != std::string::npos;
        Arena A(be);
        std::vector<QuantWeight> wd, gd;
        for (int64_t g = 0; g < G; ++g) {
          wd.push_back(A.weight(ws[static_cast<size_t>(g)]));
          gd.push_back(A.weight(gs[static_cast<size_t>(g)]));
        }
        const std::vector<const QuantWeight*> wp = ptrs(wd), gp = ptrs(gd);
        const int64_t* od = A.up(off);
        const Tensor xt = A.up(x, t, R, K), rt = A.up(res, t, R, N), y = A.tensor(t, R, N), u = A.tensor(t, R, N);
        Epilogue e;
        if (has_glu) e.glu = gp.data();
        if (has_res) e.residual = &rt;
        be.grouped_matmul(wp.data(), G, od, xt, y, e);
        be.grouped_matmul(wp.data(), G, od, xt, u);
        const Tensor ur = u.row_slice(2, R - 2);
        if (has_glu) {
          const Tensor g = A.tensor(t, R, N);
          be.grouped_matmul(gp.data(), G, od, xt, g);
          be.silu_mul(g.row_slice(2, R - 2), ur, ur);
        }
        if (has_res) {
          const Tensor r2 = A.up(res, t, R, N);
          be.add(r2.row_slice(2, R - 2), ur);
          be.copy(ur.data, r2.row_ptr(2), static_cast<size_t>((R - 2) * N) * ur.elem_size());
        }
        EXPECT_TRUE(same_bits(A.down(y), A.down(u)))
            << label << ": fused grouped " << k << " differs from the unfused ops; " << dtype_label(t) << " K " << K;
      }
  };
  grouped({Fmt::Mxfp4, Fmt::BF16, Fmt::Fp8Block, Fmt::Mxfp4}, 160);
  grouped({Fmt::Mxfp4, Fmt::Mxfp4, Fmt::Mxfp4, Fmt::Mxfp4}, 256);
}

}  // namespace latent::ops
