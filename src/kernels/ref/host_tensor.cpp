#include "kernels/ref/host_tensor.h"

#include <cstring>

#include "quant/float_formats.h"

namespace latent::host {

float round_to(DType t, float v) { return t == DType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : v; }

float get(const Tensor& t, int64_t r, int64_t c) {
  if (t.dtype == DType::BF16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(t.row_ptr(r))[c]);
  return reinterpret_cast<const float*>(t.row_ptr(r))[c];
}

void set(const Tensor& t, int64_t r, int64_t c, float v) {
  if (t.dtype == DType::BF16)
    reinterpret_cast<uint16_t*>(t.row_ptr(r))[c] = f32_to_bf16(v);
  else
    reinterpret_cast<float*>(t.row_ptr(r))[c] = v;
}

namespace {
void load_rows(const Tensor& t, float* dst) {
  for (int64_t r = 0; r < t.rows; ++r) {
    float* d = dst + r * t.cols;
    if (t.dtype == DType::BF16) {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(t.row_ptr(r));
      for (int64_t c = 0; c < t.cols; ++c) d[c] = bf16_to_f32(s[c]);
    } else {
      std::memcpy(d, t.row_ptr(r), sizeof(float) * static_cast<size_t>(t.cols));
    }
  }
}
}  // namespace

const float* f32_in(const Tensor& t, std::vector<float>& buf) {
  if (t.dtype == DType::F32 && t.contiguous()) return static_cast<const float*>(t.data);
  if (buf.size() < static_cast<size_t>(t.numel())) buf.resize(static_cast<size_t>(t.numel()));
  load_rows(t, buf.data());
  return buf.data();
}

float* f32_out(const Tensor& t, std::vector<float>& buf, bool load) {
  if (t.dtype == DType::F32 && t.contiguous()) return static_cast<float*>(t.data);
  if (buf.size() < static_cast<size_t>(t.numel())) buf.resize(static_cast<size_t>(t.numel()));
  if (load) load_rows(t, buf.data());
  return buf.data();
}

void store_out(const Tensor& t, const float* v) {
  if (v == t.data) return;
  for (int64_t r = 0; r < t.rows; ++r) {
    const float* s = v + r * t.cols;
    if (t.dtype == DType::BF16) {
      uint16_t* d = reinterpret_cast<uint16_t*>(t.row_ptr(r));
      for (int64_t c = 0; c < t.cols; ++c) d[c] = f32_to_bf16(s[c]);
    } else {
      std::memmove(t.row_ptr(r), s, sizeof(float) * static_cast<size_t>(t.cols));
    }
  }
}

void finish_linear_rows(const float* acc, const float* gacc, const Tensor& yr, const Epilogue& ep, int64_t r0,
                        const SiluMulFn& silu) {
  Epilogue e = ep;
  Tensor gate_r, res_r;
  if (ep.gate) {
    gate_r = ep.gate->row_slice(r0, yr.rows);
    e.gate = &gate_r;
  }
  if (ep.residual) {
    res_r = ep.residual->row_slice(r0, yr.rows);
    e.residual = &res_r;
  }
  finish_linear(acc, gacc, yr, e, silu);
}

void finish_linear(const float* acc, const float* gacc, const Tensor& y, const Epilogue& ep, const SiluMulFn& silu) {
  const int64_t M = y.rows, N = y.cols;
  const DType t = y.dtype;
  const bool b16 = t == DType::BF16;
  thread_local std::vector<float> v, g;
  v.resize(static_cast<size_t>(N));
  g.resize(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m) {
    const float* a = acc + m * N;
    for (int64_t j = 0; j < N; ++j) v[j] = round_to(t, ep.bias ? a[j] + ep.bias[j] : a[j]);
    if (ep.glu && gacc) {
      const float* ga = gacc + m * N;
      for (int64_t j = 0; j < N; ++j) g[j] = round_to(t, ga[j]);
      silu(g.data(), v.data(), N, v.data(), b16);
    }
    if (ep.gate) {
      for (int64_t j = 0; j < N; ++j) g[j] = get(*ep.gate, m, j);
      silu(g.data(), v.data(), N, v.data(), b16);
    }
    if (ep.residual)
      for (int64_t j = 0; j < N; ++j) v[j] = round_to(t, get(*ep.residual, m, j) + v[j]);
    if (b16) {
      uint16_t* d = reinterpret_cast<uint16_t*>(y.row_ptr(m));
      for (int64_t j = 0; j < N; ++j) d[j] = f32_to_bf16(v[j]);
    } else {
      std::memcpy(y.row_ptr(m), v.data(), sizeof(float) * static_cast<size_t>(N));
    }
  }
}

}  // namespace latent::host
