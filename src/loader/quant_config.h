// quantization_config of config.json, read only to cross-check what the tensors say (docs/quantization.md §encodings).
// Families: fp8 (DeepSeek block FP8), quark (AMD, `exclude`), mxfp4 (gpt-oss, `modules_to_not_convert`),
// compressed-tensors (`ignore`). Unknown quant_method -> Error.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace latent {

struct QuantConfig {
  bool present = false;
  std::string method;        // "fp8", "quark", "mxfp4", "compressed-tensors", "" when absent
  int64_t block_rows = 128;  // fp8 weight_block_size
  int64_t block_cols = 128;
  std::string activation_scheme = "fp32 activations; weights dequantized in registers";
  // What the checkpoint declares for the inputs of its quantized modules: "" (nothing: weight-only), "fp8 dynamic
  // 1x128" (DeepSeek block FP8; "…, ue8m0 scales" with scale_fmt ue8m0), "fp8 static", "<dtype> dynamic" (Quark
  // input_tensors); the config field it comes from; whether it is DeepSeek's dynamic per-group FP8 (the scheme
  // --activations declared runs) and its scales are powers of two.
  std::string act_declared;
  std::string act_declared_by;
  bool act_fp8_dynamic = false;
  bool act_pow2 = false;
  std::vector<std::string> exclude;  // module patterns that stay unquantized (family semantics, see matches())

  static QuantConfig parse(const nlohmann::json& qc, const std::string& where);
  // Whether the config expects `module` (a checkpoint module name) to be quantized; nullopt when it does not say
  // (no quantization_config, or DeepSeek fp8 without an ignore list: then the dtype alone decides).
  std::optional<bool> expects_quantized(const std::string& module) const;
  // One exclude entry against a module name: exact match; "re:<regex>" anchored at the start (Python re.match);
  // for mxfp4 (gpt-oss) and modelopt: fnmatch-style globs, and a prefix match on module boundaries.
  bool matches(const std::string& pattern, const std::string& module) const;
};

// fnmatch-style glob: '*' any run (dots included), '?' one char, '[...]' classes. Used for --quantize too.
bool glob_match(std::string_view pattern, std::string_view text);

}  // namespace latent
