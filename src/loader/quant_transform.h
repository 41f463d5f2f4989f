// User-requested, opt-in weight transforms (--quantize PATTERN=FORMAT). Nothing is transformed without a rule.
// Every transformed tensor's relative Frobenius error ||W - Q(W)|| / ||W|| is measured here, at load, and a
// guard refuses transforms above PlanOptions::max_quant_error unless allow_lossy (docs/quantization.md §transforms).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "loader/precision_plan.h"

namespace latent {

// Parses a --quantize FORMAT name: mxfp4, fp8_e4m3_tensor, fp8_e4m3_block128, bf16. Throws Error otherwise.
WeightFormat parse_quantize_format(const std::string& name);

// Applies opt.quantize to the Linear entries (last matching rule wins). Patterns match the module name
// ("model.layers.0.self_attn.kv_b_proj") or the tensor name. A rule that matches no Linear weight is an error.
// Transformed storage is appended to `owned`. Throws Error listing every offending tensor and its error when the
// guard refuses.
void apply_quantize_rules(std::vector<PlanEntry>& entries, const PlanOptions& opt,
                          std::vector<std::shared_ptr<void>>& owned);

// Relative Frobenius error between two equal-size fp32 arrays (0 when both are zero).
double rel_frobenius_error(const float* ref, const float* approx, size_t n);

}  // namespace latent
