#include "quant/quantize.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/float_formats.h"
#include "quant/fp8.h"

namespace latent {

QuantWeight QuantizedMatrix::view() const {
  QuantWeight w;
  w.format = format;
  w.rows = rows;
  w.cols = cols;
  w.data = data.data();
  w.scale = format == WeightFormat::MXFP4 ? static_cast<const void*>(scale_e8m0.data())
            : scale_f32.empty()           ? nullptr
                                          : static_cast<const void*>(scale_f32.data());
  w.fnuz = fnuz;
  w.block_rows = block_rows;
  w.block_cols = block_cols;
  return w;
}

QuantizedMatrix quantize_matrix(const float* w, int64_t rows, int64_t cols, WeightFormat f,
                                const QuantizeOptions& opt) {
  if (rows < 0 || cols < 0) fail("quantize_matrix: bad shape [{}, {}]", rows, cols);
  if (f == WeightFormat::MXFP4 && cols % kMxBlock != 0)
    fail("quantize_matrix: mxfp4 needs cols % 32 == 0, got shape [{}, {}]", rows, cols);
  if (f == WeightFormat::FP8_E4M3_BLOCK && (opt.block_rows <= 0 || opt.block_cols <= 0))
    fail("quantize_matrix: bad fp8 block {}x{}", opt.block_rows, opt.block_cols);

  QuantizedMatrix q;
  q.format = f;
  q.rows = rows;
  q.cols = cols;
  q.block_rows = opt.block_rows;
  q.block_cols = opt.block_cols;
  q.fnuz = opt.fnuz && (f == WeightFormat::FP8_E4M3_BLOCK || f == WeightFormat::FP8_E4M3_TENSOR ||
                        f == WeightFormat::FP8_E4M3_CHANNEL);
  const int64_t n = rows * cols;
  q.data.resize(size_t(rows * q.view().row_bytes()));
  uint8_t* d = q.data.data();
  switch (f) {
    case WeightFormat::F32:
      if (n) std::memcpy(d, w, size_t(n) * 4);
      break;
    case WeightFormat::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(w[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      break;
    case WeightFormat::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(w[i], Overflow::Saturate);
        std::memcpy(d + 2 * i, &h, 2);
      }
      break;
    case WeightFormat::FP8_E4M3_BLOCK:
      q.scale_f32.resize(
          size_t(((rows + opt.block_rows - 1) / opt.block_rows) * ((cols + opt.block_cols - 1) / opt.block_cols)));
      quantize_fp8_block(w, rows, cols, opt.block_rows, opt.block_cols, d, q.scale_f32.data());
      break;
    case WeightFormat::FP8_E4M3_TENSOR:
      q.scale_f32.resize(1);
      quantize_fp8_tensor(w, rows, cols, d, q.scale_f32.data());
      break;
    case WeightFormat::FP8_E4M3_CHANNEL:
      q.scale_f32.resize(size_t(rows));
      quantize_fp8_channel(w, rows, cols, d, q.scale_f32.data());
      break;
    case WeightFormat::MXFP4:
      q.scale_e8m0.resize(size_t(rows * (cols / kMxBlock)));
      for (int64_t r = 0; r < rows; ++r)
        quantize_row_mxfp4(w + r * cols, cols, d + r * (cols / 2), q.scale_e8m0.data() + r * (cols / kMxBlock),
                           opt.mxfp4_rule);
      break;
  }
  if (q.fnuz) {
    e4m3fn_codes_to_fnuz(d, n);
    for (float& s : q.scale_f32) s *= 2.0f;
  }
  return q;
}

namespace {
std::vector<float> dequant_all(const QuantWeight& w) {
  std::vector<float> out(size_t(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) dequant_row_ref(w, r, out.data() + r * w.cols);
  return out;
}
}  // namespace

QuantizedMatrix quantize_matrix(const QuantWeight& src, WeightFormat f, const QuantizeOptions& opt) {
  const std::vector<float> w = dequant_all(src);
  return quantize_matrix(w.data(), src.rows, src.cols, f, opt);
}

double rel_error(const float* ref, const QuantWeight& q) {
  std::vector<float> row(size_t(q.cols));
  double num = 0.0, den = 0.0;
  for (int64_t r = 0; r < q.rows; ++r) {
    dequant_row_ref(q, r, row.data());
    const float* a = ref + r * q.cols;
    for (int64_t c = 0; c < q.cols; ++c) {
      const double e = double(a[c]) - double(row[size_t(c)]);
      num += e * e;
      den += double(a[c]) * double(a[c]);
    }
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

double rel_error(const QuantWeight& ref, const QuantWeight& q) {
  if (ref.rows != q.rows || ref.cols != q.cols)
    fail("rel_error: shape mismatch [{}, {}] vs [{}, {}]", ref.rows, ref.cols, q.rows, q.cols);
  const std::vector<float> a = dequant_all(ref);
  return rel_error(a.data(), q);
}

double quant_rel_error(const float* w, int64_t rows, int64_t cols, WeightFormat f, const QuantizeOptions& opt) {
  const QuantizedMatrix q = quantize_matrix(w, rows, cols, f, opt);
  return rel_error(w, q.view());
}

}  // namespace latent
