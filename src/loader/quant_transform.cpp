#include "loader/quant_transform.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "loader/quant_config.h"
#include "quant/float_formats.h"
#include "quant/fp8.h"
#include "quant/mxfp4.h"

namespace latent {

WeightFormat parse_quantize_format(const std::string& name) {
  if (name == "mxfp4") return WeightFormat::MXFP4;
  if (name == "fp8_e4m3_tensor") return WeightFormat::FP8_E4M3_TENSOR;
  if (name == "fp8_e4m3_block128") return WeightFormat::FP8_E4M3_BLOCK;
  if (name == "bf16") return WeightFormat::BF16;
  fail("--quantize: unknown format '{}' (supported: mxfp4, fp8_e4m3_tensor, fp8_e4m3_block128, bf16)", name);
}

QuantizeRule QuantizeRule::parse(const std::string& text) {
  auto eq = text.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    fail("--quantize '{}': expected PATTERN=FORMAT, e.g. '*.kv_b_proj=mxfp4'", text);
  QuantizeRule r;
  r.pattern = text.substr(0, eq);
  r.format = parse_quantize_format(text.substr(eq + 1));
  return r;
}

double rel_frobenius_error(const float* ref, const float* approx, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(ref[i]) - static_cast<double>(approx[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

namespace {

// Owned storage of one transformed weight.
struct Transformed {
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales_u8;
  std::vector<float> scales_f32;
};

// W [rows, cols] fp32 -> target format; returns the QuantWeight view into `t`.
QuantWeight quantize_into(const std::vector<float>& w, int64_t rows, int64_t cols, WeightFormat target, Transformed& t,
                          const std::string& name) {
  QuantWeight q;
  q.format = target;
  q.rows = rows;
  q.cols = cols;
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  switch (target) {
    case WeightFormat::BF16: {
      t.codes.resize(n * 2);
      auto* p = reinterpret_cast<uint16_t*>(t.codes.data());
      for (size_t i = 0; i < n; ++i) p[i] = f32_to_bf16(w[i]);
      break;
    }
    case WeightFormat::MXFP4: {
      if (cols % 32 != 0)
        fail("--quantize: '{}' has {} input features, not a multiple of 32: cannot use mxfp4", name, cols);
      t.codes.resize(n / 2);
      t.scales_u8.resize(n / 32);
      for (int64_t r = 0; r < rows; ++r)
        quantize_row_mxfp4(w.data() + r * cols, cols, t.codes.data() + r * (cols / 2),
                           t.scales_u8.data() + r * (cols / 32), Mxfp4ScaleRule::OcpFloor);
      q.scale = t.scales_u8.data();
      break;
    }
    case WeightFormat::FP8_E4M3_TENSOR:
      t.codes.resize(n);
      t.scales_f32.resize(1);
      quantize_fp8_tensor(w.data(), rows, cols, t.codes.data(), t.scales_f32.data());
      q.scale = t.scales_f32.data();
      break;
    case WeightFormat::FP8_E4M3_BLOCK:
      t.codes.resize(n);
      t.scales_f32.resize(static_cast<size_t>(((rows + 127) / 128) * ((cols + 127) / 128)));
      quantize_fp8_block(w.data(), rows, cols, 128, 128, t.codes.data(), t.scales_f32.data());
      q.block_rows = q.block_cols = 128;
      q.scale = t.scales_f32.data();
      break;
    default: fail("--quantize: target format {} is not supported", weight_format_name(target));
  }
  q.data = t.codes.data();
  return q;
}

std::vector<float> dequantize_all(const QuantWeight& q) {
  std::vector<float> w(static_cast<size_t>(q.rows) * static_cast<size_t>(q.cols));
  for (int64_t r = 0; r < q.rows; ++r) dequant_row_ref(q, r, w.data() + r * q.cols);
  return w;
}

}  // namespace

void apply_quantize_rules(std::vector<PlanEntry>& entries, const PlanOptions& opt,
                          std::vector<std::shared_ptr<void>>& owned) {
  if (opt.quantize.empty()) return;
  std::vector<int> hits(opt.quantize.size(), 0);
  std::vector<std::string> offenders;
  for (PlanEntry& e : entries) {
    if (!e.is_linear || e.skipped) continue;
    int rule = -1;
    for (size_t i = 0; i < opt.quantize.size(); ++i)
      if (glob_match(opt.quantize[i].pattern, e.module) || glob_match(opt.quantize[i].pattern, e.name))
        rule = static_cast<int>(i);
    if (rule < 0) continue;
    ++hits[static_cast<size_t>(rule)];
    const QuantizeRule& r = opt.quantize[static_cast<size_t>(rule)];
    if (r.format == e.stored) continue;  // already in that format: nothing to do
    const std::vector<float> w = dequantize_all(e.weight);
    auto t = std::make_shared<Transformed>();
    QuantWeight q = quantize_into(w, e.weight.rows, e.weight.cols, r.format, *t, e.name);
    const std::vector<float> back = dequantize_all(q);
    e.rel_error = rel_frobenius_error(w.data(), back.data(), w.size());
    e.transform = fmt::format("{}->{} (--quantize {}={})", weight_format_name(e.stored), weight_format_name(r.format),
                              r.pattern, weight_format_name(r.format));
    e.compute = r.format;
    e.weight = q;
    e.bytes = t->codes.size() + t->scales_u8.size() + 4 * t->scales_f32.size();
    e.scheme += e.scheme.empty() ? "" : "; ";
    e.scheme += "transformed at load";
    owned.push_back(t);
    if (!(e.rel_error <= opt.max_quant_error))
      offenders.push_back(fmt::format("{} rel_error {:.4f}", e.name, e.rel_error));
  }
  for (size_t i = 0; i < hits.size(); ++i)
    if (hits[i] == 0)
      fail("--quantize '{}': the pattern matches no Linear weight of this model", opt.quantize[i].pattern);
  if (!offenders.empty() && !opt.allow_lossy) {
    std::string list;
    for (size_t i = 0; i < offenders.size(); ++i) list += (i ? ", " : "") + offenders[i];
    fail("refusing lossy transform: {} tensor(s) exceed --max-quant-error {}: {} (pass --allow-lossy to accept)",
         offenders.size(), opt.max_quant_error, list);
  }
}

}  // namespace latent
