// The ref backend's linear ops with declared FP8 activations (backend.h matmul_act_fp8): the definition, written as
// a future FP8 x FP8 tensor-core GEMM computes it (not as "dequantize, then multiply"), so that such a kernel
// matches it up to the order of its fp32 sums:
//   y[m, o] = Σ_b (s_x[m, b] · s_w[o / br, b]) · Σ_{k in group b} q_x[m, k] · q_w[o, k].
// Here every code product and each group's sum are exact in double (e4m3 products have 8 significant bits and
// span 2^-18 .. 2^17.6, so 128 of them fit in 53 bits), the scales multiply in double, the groups are summed in
// double and the result is rounded to fp32 once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/ref/ref_backend.h"
#include "quant/fp8.h"

namespace latent {

void RefBackend::matmul_act_fp8_f32(const QuantWeight& w, const float* x, int64_t M, bool pow2_scale, float* y) {
  const int64_t N = w.rows, K = w.cols, g = w.block_cols, G = (K + g - 1) / g;
  if (M <= 0 || N <= 0) return;
  // The activation codes (decoded, exact) and scales of every row.
  std::vector<float> qx(static_cast<size_t>(M * K)), sx(static_cast<size_t>(M * G));
  pool_.parallel_for(M, 1, [&](int64_t m0, int64_t m1) {
    std::vector<uint8_t> codes(static_cast<size_t>(K));
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t b = 0; b < G; ++b) {
        const int64_t k0 = b * g, n = std::min(g, K - k0);
        sx[m * G + b] = quantize_act_fp8_group(x + m * K + k0, n, pow2_scale, codes.data() + k0);
        for (int64_t k = k0; k < k0 + n; ++k) qx[m * K + k] = e4m3fn_to_f32(codes[k]);
      }
  });
  const float* table = w.fnuz ? kE4M3FnuzToF32.data() : kE4M3FnToF32.data();
  const auto* codes_w = static_cast<const uint8_t*>(w.data);
  const auto* scale_w = static_cast<const uint8_t*>(w.scale);  // a mapped checkpoint's scales need not be aligned
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, K * M));
  pool_.parallel_for(N, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> qw(static_cast<size_t>(K)), sw(static_cast<size_t>(G));
    for (int64_t o = r0; o < r1; ++o) {
      const uint8_t* cw = codes_w + o * K;
      for (int64_t k = 0; k < K; ++k) qw[k] = table[cw[k]];
      std::memcpy(sw.data(), scale_w + sizeof(float) * static_cast<size_t>((o / w.block_rows) * G),
                  sizeof(float) * static_cast<size_t>(G));
      for (int64_t m = 0; m < M; ++m) {
        const float* qxm = qx.data() + m * K;
        double acc = 0.0;
        for (int64_t b = 0; b < G; ++b) {
          const int64_t k0 = b * g, k1 = std::min(K, k0 + g);
          double dot = 0.0;
          for (int64_t k = k0; k < k1; ++k) dot += static_cast<double>(qxm[k]) * qw[k];
          acc += static_cast<double>(sx[m * G + b]) * static_cast<double>(sw[b]) * dot;
        }
        y[m * N + o] = static_cast<float>(acc);
      }
    }
  });
}

void RefBackend::matmul_act_fp8(const QuantWeight& w, const Tensor& x, const ActFp8& a, const Tensor& y,
                                const Epilogue& ep) {
  const int64_t M = x.rows, N = w.rows;
  if (M <= 0 || N <= 0) return;
  const float* xf = host::f32_in(x, tl(0));
  float* acc = tl_ptr(1, M * N);
  matmul_act_fp8_f32(w, xf, M, a.pow2_scale, acc);
  float* gacc = nullptr;
  if (ep.glu) {
    gacc = tl_ptr(2, M * N);
    matmul_act_fp8_f32(*ep.glu[0], xf, M, a.pow2_scale, gacc);
  }
  host::finish_linear(acc, gacc, y, ep, silu());
}

void RefBackend::grouped_matmul_act_fp8(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets,
                                        const Tensor& x, const ActFp8& a, const Tensor& y, const Epilogue& ep) {
  if (n_groups <= 0) return;
  const int64_t r0 = offsets[0], r1 = offsets[n_groups], N = y.cols, K = x.cols;
  if (r1 <= r0) return;
  const Tensor xr = x.row_slice(r0, r1 - r0), yr = y.row_slice(r0, r1 - r0);
  const float* xf = host::f32_in(xr, tl(0));
  float* acc = tl_ptr(1, (r1 - r0) * N);
  float* gacc = ep.glu ? tl_ptr(2, (r1 - r0) * N) : nullptr;
  for (int64_t g = 0; g < n_groups; ++g) {
    const int64_t a0 = offsets[g] - r0, rows = offsets[g + 1] - offsets[g];
    if (rows <= 0) continue;
    matmul_act_fp8_f32(*w[g], xf + a0 * K, rows, a.pow2_scale, acc + a0 * N);
    if (gacc) matmul_act_fp8_f32(*ep.glu[g], xf + a0 * K, rows, a.pow2_scale, gacc + a0 * N);
  }
  host::finish_linear_rows(acc, gacc, yr, ep, r0, silu());
}

}  // namespace latent
