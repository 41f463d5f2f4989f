#include "loader/quant_config.h"

#include <regex>

#include "core/error.h"

namespace latent {

bool glob_match(std::string_view p, std::string_view t) {
  size_t pi = 0, ti = 0, star_p = std::string_view::npos, star_t = 0;
  while (ti < t.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star_p = pi++;
      star_t = ti;
      continue;
    }
    if (pi < p.size() && p[pi] == '[') {
      size_t close = p.find(']', pi + 1);
      if (close != std::string_view::npos) {
        bool neg = pi + 1 < close && (p[pi + 1] == '!' || p[pi + 1] == '^');
        bool hit = false;
        for (size_t k = pi + 1 + (neg ? 1 : 0); k < close; ++k) {
          if (k + 2 < close && p[k + 1] == '-') {
            hit |= t[ti] >= p[k] && t[ti] <= p[k + 2];
            k += 2;
          } else {
            hit |= t[ti] == p[k];
          }
        }
        if (hit != neg) {
          pi = close + 1;
          ++ti;
          continue;
        }
      }
    } else if (pi < p.size() && (p[pi] == '?' || p[pi] == t[ti])) {
      ++pi;
      ++ti;
      continue;
    }
    if (star_p == std::string_view::npos) return false;
    pi = star_p + 1;
    ti = ++star_t;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

namespace {

std::vector<std::string> string_list(const nlohmann::json& qc, const char* key, const std::string& where) {
  std::vector<std::string> out;
  if (!qc.contains(key) || qc[key].is_null()) return out;
  if (!qc[key].is_array()) fail("{}: quantization_config.{} must be a list of strings", where, key);
  for (const auto& v : qc[key]) {
    if (!v.is_string()) fail("{}: quantization_config.{} must be a list of strings", where, key);
    out.push_back(v.get<std::string>());
  }
  return out;
}

bool boundary_prefix(const std::string& prefix, const std::string& module) {
  return module == prefix || (module.size() > prefix.size() && module.compare(0, prefix.size(), prefix) == 0 &&
                              module[prefix.size()] == '.');
}

}  // namespace

QuantConfig QuantConfig::parse(const nlohmann::json& qc, const std::string& where) {
  QuantConfig c;
  if (qc.is_null()) return c;
  if (!qc.is_object()) fail("{}: quantization_config must be an object", where);
  c.present = true;
  if (!qc.contains("quant_method") || !qc["quant_method"].is_string())
    fail("{}: quantization_config.quant_method missing or not a string", where);
  c.method = qc["quant_method"].get<std::string>();
  if (c.method == "fp8") {
    if (qc.contains("weight_block_size") && !qc["weight_block_size"].is_null()) {
      const auto& b = qc["weight_block_size"];
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
          b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0)
        fail("{}: quantization_config.weight_block_size must be [rows, cols] of positive integers", where);
      c.block_rows = b[0].get<int64_t>();
      c.block_cols = b[1].get<int64_t>();
    }
    const std::string act = qc.contains("activation_scheme") && qc["activation_scheme"].is_string()
                                ? qc["activation_scheme"].get<std::string>()
                                : std::string("dynamic");
    const std::string sfmt =
        qc.contains("scale_fmt") && qc["scale_fmt"].is_string() ? qc["scale_fmt"].get<std::string>() : "";
    c.act_fp8_dynamic = act == "dynamic";
    c.act_pow2 = sfmt == "ue8m0";
    c.act_declared = c.act_fp8_dynamic
                         ? fmt::format("fp8 dynamic 1x{}{}", c.block_cols, c.act_pow2 ? ", ue8m0 scales" : "")
                         : "fp8 " + act;
    c.act_declared_by = "quantization_config.activation_scheme";
    c.activation_scheme = "checkpoint declares " + c.act_declared + " activations (per token, " +
                          std::to_string(c.block_cols) + "-channel groups)";
    c.exclude = string_list(qc, "ignored_layers", where);
    for (auto& s : string_list(qc, "modules_to_not_convert", where)) c.exclude.push_back(s);
  } else if (c.method == "quark") {
    c.exclude = string_list(qc, "exclude", where);
    const auto gq = qc.value("global_quant_config", nlohmann::json::object());
    const auto it = gq.is_object() ? gq.find("input_tensors") : gq.end();
    if (gq.is_object() && it != gq.end() && it->is_object()) {
      c.act_declared = it->value("dtype", std::string("?")) + (it->value("is_dynamic", true) ? " dynamic" : " static");
      c.act_declared_by = "quantization_config.global_quant_config.input_tensors";
      c.activation_scheme = "checkpoint declares " + c.act_declared + " activations (W4A4)";
    } else {
      c.activation_scheme = "weight-only (no input quantization declared)";
    }
  } else if (c.method == "mxfp4") {
    c.exclude = string_list(qc, "modules_to_not_convert", where);
  } else if (c.method == "compressed-tensors") {
    c.exclude = string_list(qc, "ignore", where);
  } else {
    fail(
        "{}: quantization_config.quant_method '{}' is not supported (supported: fp8, quark, mxfp4, "
        "compressed-tensors)",
        where, c.method);
  }
  return c;
}

bool QuantConfig::matches(const std::string& pattern, const std::string& module) const {
  if (pattern.rfind("re:", 0) == 0) {
    try {
      std::regex re(pattern.substr(3), std::regex::ECMAScript);
      return std::regex_search(module, re, std::regex_constants::match_continuous);
    } catch (const std::regex_error&) {
      fail("quantization_config: invalid regular expression '{}'", pattern);
    }
  }
  if (pattern == module) return true;
  if (method == "mxfp4" || method == "fp8")  // globs / module prefixes (vLLM & SGLang semantics)
    return glob_match(pattern, module) || glob_match(pattern + ".*", module) || boundary_prefix(pattern, module);
  return false;
}

std::optional<bool> QuantConfig::expects_quantized(const std::string& module) const {
  if (!present) return std::nullopt;
  if (method == "fp8" && exclude.empty()) return std::nullopt;  // DeepSeek ships no ignore list
  for (const auto& p : exclude)
    if (matches(p, module)) return false;
  return true;
}

}  // namespace latent
