#include "quant/weight_format.h"

#include <cstring>

#include "quant/float_formats.h"
#include "quant/fp8.h"
#include "quant/mxfp4.h"

namespace latent {

namespace {
float load_f32(const void* base, int64_t i) {  // scale tensors of a mapped checkpoint need not be aligned
  float v;
  std::memcpy(&v, static_cast<const uint8_t*>(base) + i * 4, 4);
  return v;
}
}  // namespace

std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return "f32";
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::F16: return "f16";
    case WeightFormat::FP8_E4M3_BLOCK: return "fp8_e4m3_block128";
    case WeightFormat::FP8_E4M3_TENSOR: return "fp8_e4m3_tensor";
    case WeightFormat::FP8_E4M3_CHANNEL: return "fp8_e4m3_channel";
    case WeightFormat::MXFP4: return "mxfp4";
  }
  return "?";
}

bool is_quantized(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32:
    case WeightFormat::BF16:
    case WeightFormat::F16: return false;
    default: return true;
  }
}

std::string weight_format_label(const QuantWeight& w) {
  switch (w.format) {
    case WeightFormat::FP8_E4M3_BLOCK:
    case WeightFormat::FP8_E4M3_TENSOR:
    case WeightFormat::FP8_E4M3_CHANNEL: {
      std::string s = w.fnuz ? "fp8_e4m3fnuz_" : "fp8_e4m3_";
      if (w.format == WeightFormat::FP8_E4M3_TENSOR) return s + "tensor";
      if (w.format == WeightFormat::FP8_E4M3_CHANNEL) return s + "channel";
      s += "block" + std::to_string(w.block_rows);
      if (w.block_cols != w.block_rows) s += "x" + std::to_string(w.block_cols);
      return s;
    }
    default: return std::string(weight_format_name(w.format));
  }
}

int64_t QuantWeight::row_bytes() const {
  switch (format) {
    case WeightFormat::F32: return cols * 4;
    case WeightFormat::BF16:
    case WeightFormat::F16: return cols * 2;
    case WeightFormat::FP8_E4M3_BLOCK:
    case WeightFormat::FP8_E4M3_TENSOR:
    case WeightFormat::FP8_E4M3_CHANNEL: return cols;
    case WeightFormat::MXFP4: return cols / 2;
  }
  return 0;
}

void dequant_row_ref(const QuantWeight& w, int64_t r, float* out) {
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes();
  switch (w.format) {
    case WeightFormat::F32: std::memcpy(out, row, size_t(w.cols) * 4); return;
    case WeightFormat::BF16:
    case WeightFormat::F16:
      for (int64_t c = 0; c < w.cols; ++c) {
        uint16_t h;
        std::memcpy(&h, row + 2 * c, 2);  // checkpoint bytes need not be 2-byte aligned
        out[c] = w.format == WeightFormat::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      return;
    case WeightFormat::FP8_E4M3_BLOCK: {
      const float* t = w.fnuz ? kE4M3FnuzToF32.data() : kE4M3FnToF32.data();
      const int64_t s0 = (r / w.block_rows) * w.scale_cols();
      for (int64_t c = 0; c < w.cols; ++c) out[c] = t[row[c]] * load_f32(w.scale, s0 + c / w.block_cols);
      return;
    }
    case WeightFormat::FP8_E4M3_TENSOR: dequant_row_fp8(row, load_f32(w.scale, 0), w.cols, w.fnuz, out); return;
    case WeightFormat::FP8_E4M3_CHANNEL: dequant_row_fp8(row, load_f32(w.scale, r), w.cols, w.fnuz, out); return;
    case WeightFormat::MXFP4:
      dequant_row_mxfp4(row, static_cast<const uint8_t*>(w.scale) + r * w.scale_cols(), w.cols, out);
      return;
  }
}

}  // namespace latent
