// Host-memory helpers for the typed activation tensors of backend/backend.h, shared by the host backends (ref,
// cpu): their arithmetic runs on contiguous fp32 rows, so each op takes fp32 views of its inputs (the tensor itself
// when it is F32 and contiguous, else a converted copy) and stores its fp32 results into the output's dtype
// (bf16: round to nearest even). The linear ops' epilogue (bias, SwiGLU, gate, residual) is applied here, in the
// order backend.h defines, so that a fused call equals the unfused op sequence bit for bit.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "backend/backend.h"

namespace latent::host {

// v rounded to the dtype (BF16: nearest even; F32: v).
float round_to(DType t, float v);
// Element (r, c) of a host tensor as fp32, and a store with rounding.
float get(const Tensor& t, int64_t r, int64_t c);
void set(const Tensor& t, int64_t r, int64_t c, float v);

// A contiguous fp32 copy of t's rows (or t's own memory when it is F32 and contiguous: no copy).
const float* f32_in(const Tensor& t, std::vector<float>& buf);
// Where an op writes its fp32 result for t: t's own memory when F32 and contiguous (store_out is then a no-op),
// else `buf` (optionally filled with t's current values: in-place ops).
float* f32_out(const Tensor& t, std::vector<float>& buf, bool load = false);
// Stores a contiguous fp32 result v [t.rows, t.cols] into t, rounding to its dtype (no-op when v is t's memory).
void store_out(const Tensor& t, const float* v);

// silu_mul over n values (out = SiLU(g) · u with the backend's own arithmetic and bf16 points).
using SiluMulFn = std::function<void(const float* g, const float* u, int64_t n, float* out, bool bf16)>;

// The epilogue of a linear op over fp32 accumulators acc [M, N] (the product of the main weight) and, with ep.glu,
// gacc [M, N] (the product of the gate weight): writes y (backend.h "Epilogue").
void finish_linear(const float* acc, const float* gacc, const Tensor& y, const Epilogue& ep, const SiluMulFn& silu);
// The same for rows r0 .. r0 + n of a grouped op: yr = those rows of y, the epilogue's gate and residual sliced to
// them.
void finish_linear_rows(const float* acc, const float* gacc, const Tensor& yr, const Epilogue& ep, int64_t r0,
                        const SiluMulFn& silu);

}  // namespace latent::host
