// The default implementations of the declared-FP8-activation ops (backend/backend.h ActFp8;
// docs/quantization.md §declared-activations): act_quant_fp8 as the scalar host loop (the reference semantics of
// that op; a device backend overrides it), the linear ops composed of act_quant_fp8 and the plain linear ops.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "kernels/ref/host_tensor.h"
#include "quant/fp8.h"

namespace latent {

void Backend::act_quant_fp8(const Tensor& x, int64_t group, bool pow2_scale, const Tensor& xq) {
  const int64_t K = x.cols;
  std::vector<float> row(static_cast<size_t>(K));
  std::vector<uint8_t> codes(static_cast<size_t>(K));
  for (int64_t m = 0; m < x.rows; ++m) {
    for (int64_t k = 0; k < K; ++k) row[k] = host::get(x, m, k);
    float* out = reinterpret_cast<float*>(xq.row_ptr(m));
    for (int64_t k0 = 0; k0 < K; k0 += group) {
      const int64_t n = std::min(group, K - k0);
      const float s = quantize_act_fp8_group(row.data() + k0, n, pow2_scale, codes.data() + k0);
      for (int64_t k = k0; k < k0 + n; ++k) out[k] = e4m3fn_to_f32(codes[k]) * s;
    }
  }
}

void Backend::matmul_act_fp8(const QuantWeight& w, const Tensor& x, const ActFp8& a, const Tensor& y,
                             const Epilogue& ep) {
  const Tensor xq(a.scratch, DType::F32, x.rows, x.cols);
  act_quant_fp8(x, w.block_cols, a.pow2_scale, xq);
  matmul(w, xq, y, ep);
}

void Backend::grouped_matmul_act_fp8(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets,
                                     const Tensor& x, const ActFp8& a, const Tensor& y, const Epilogue& ep) {
  // The group size from the first weight present (a group with no rows may have none).
  int64_t group = 0;
  for (int64_t g = 0; g < n_groups && !group; ++g)
    if (w[g]) group = w[g]->block_cols;
  if (!group) return;
  const Tensor xq(a.scratch, DType::F32, x.rows, x.cols);
  act_quant_fp8(x, group, a.pow2_scale, xq);
  grouped_matmul(w, n_groups, offsets, xq, y, ep);
}

}  // namespace latent
