// config.json parsing for DeepseekV3 / DeepseekV32 / GlmMoeDsa (docs/model.md §config, §yarn, §IndexShare).
//
// Defaults are the transformers config-class defaults. Provenance:
//   CONFIRMED against transformers 5.17.0 (DeepseekV3Config(), DeepseekV32Config(), GlmMoeDsaConfig() instantiated
//     on the team's H200 machine, and the configs of tests/data/configs loaded there): every numeric default in
//     kDefaults below; bos 0 / eos 1 / pad None; max_position_embeddings 4096 (V3) / 163840 (V3.2) / 202752 (GLM);
//     V3.2 n_group 8 / topk_group 4 (its docstring says 1; the field default is 8); rope_theta default 10000 for all
//     three (RotaryEmbeddingConfigMixin.default_theta: a GLM config without any rope_theta gets 1e4, not GLM-5's
//     1e6); mlp_layer_types = min(first_k_dense_replace, L) dense then sparse; GLM indexer_types all "full" by
//     default and full at 0,1,2,6,...,74 for index_topk_freq 4 / index_skip_topk_offset 3; the yarn numbers
//     (fp32 inv_freq bit-exact, softmax scale, attention factor; see test MatchesTransformers517Numbers).
//   Read from the transformers sources, not exercised on the device: BC key num_experts -> n_routed_experts
//     (V3.2, GLM), attribute_map num_local_experts, index_topk_pattern, index_topk_freq clamped to >= 1, yarn
//     `beta_fast or 32` / `beta_slow or 1`, truncate default true, a top-level original_max_position_embeddings
//     taking precedence, rope_scaling taking precedence over rope_parameters (we refuse when both disagree).
//   ASSUMED (no config-class field; HF ignores them): scoring_func "sigmoid", topk_method "noaux_tc",
//     moe_layer_freq 1, num_nextn_predict_layers 0; indexer_rope_interleave is hard-coded per model in modeling.
#include "format/hf_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numbers>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "core/log.h"

namespace latent {

using nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::DeepseekV3: return "DeepseekV3ForCausalLM";
    case Arch::DeepseekV32: return "DeepseekV32ForCausalLM";
    case Arch::GlmMoeDsa: return "GlmMoeDsaForCausalLM";
  }
  return "?";
}

const char* arch_model_type(Arch a) {
  switch (a) {
    case Arch::DeepseekV3: return "deepseek_v3";
    case Arch::DeepseekV32: return "deepseek_v32";
    case Arch::GlmMoeDsa: return "glm_moe_dsa";
  }
  return "?";
}

namespace {

constexpr const char* kSupported = "GlmMoeDsaForCausalLM, DeepseekV3ForCausalLM, DeepseekV32ForCausalLM";
constexpr Arch kArchs[] = {Arch::GlmMoeDsa, Arch::DeepseekV3, Arch::DeepseekV32};

struct Defaults {
  int64_t vocab_size, hidden_size, intermediate_size, moe_intermediate_size, num_hidden_layers, num_attention_heads,
      num_key_value_heads, n_shared_experts, n_routed_experts;
  double routed_scaling_factor;
  int64_t kv_lora_rank, q_lora_rank, qk_rope_head_dim, v_head_dim, qk_nope_head_dim, n_group, topk_group,
      num_experts_per_tok, first_k_dense_replace;
  int64_t max_position_embeddings;
  double rms_norm_eps;
  int64_t index_n_heads, index_head_dim, index_topk;  // 0 for V3 (no indexer)
};

// clang-format off
constexpr Defaults kDefaultsV3  = {129280, 7168, 18432, 2048, 61, 128, 128, 1, 256, 2.5, 512, 1536, 64, 128, 128, 8, 4, 8, 3,
                                   4096, 1e-6, 0, 0, 0};
constexpr Defaults kDefaultsV32 = {129280, 7168, 18432, 2048, 61, 128, 128, 1, 256, 2.5, 512, 1536, 64, 128, 128, 8, 4, 8, 3,
                                   163840, 1e-6, 64, 128, 2048};
constexpr Defaults kDefaultsGlm = {154880, 6144, 12288, 2048, 78, 64, 64, 1, 256, 2.5, 512, 2048, 64, 256, 192, 1, 1, 8, 3,
                                   202752, 1e-5, 32, 128, 2048};
// clang-format on
constexpr double kDefaultRopeTheta = 10000.0;  // RotaryEmbeddingConfigMixin.default_theta (all three)

const Defaults& defaults_for(Arch a) {
  switch (a) {
    case Arch::DeepseekV3: return kDefaultsV3;
    case Arch::DeepseekV32: return kDefaultsV32;
    case Arch::GlmMoeDsa: return kDefaultsGlm;
  }
  return kDefaultsV3;
}

// A JSON value for a one-line message (long values are cut).
std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Typed access to the keys of one JSON object; every failure names file and field (prefix + key).
class Fields {
 public:
  Fields(const json& obj, const std::string& file, std::string prefix = "")
      : obj_(obj), file_(file), prefix_(std::move(prefix)) {}

  const std::string& file() const { return file_; }
  std::string name(const char* k) const { return prefix_ + k; }
  bool present(const char* k) const { return obj_.contains(k); }  // even if null
  bool has(const char* k) const { return obj_.contains(k) && !obj_.at(k).is_null(); }
  bool is_null(const char* k) const { return obj_.contains(k) && obj_.at(k).is_null(); }
  const json& at(const char* k) const { return obj_.at(k); }

  [[noreturn]] void bad(const char* k, const std::string& what) const {
    fail("{}: field '{}' {} (got {})", file_, name(k), what, show(obj_.at(k)));
  }

  static bool to_int(const json& v, int64_t* out) {
    if (v.is_number_integer() && !v.is_number_unsigned()) {
      *out = v.get<int64_t>();
      return true;
    }
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
      *out = static_cast<int64_t>(u);
      return true;
    }
    if (v.is_number_float()) {  // 4096.0 is accepted, 4096.5 is not
      double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) return false;
      *out = static_cast<int64_t>(d);
      return true;
    }
    return false;
  }

  int64_t int_value(const char* k) const {
    int64_t v = 0;
    if (!to_int(obj_.at(k), &v)) bad(k, "must be an integer");
    return v;
  }
  // Absent -> def; null -> nullopt; integer -> value; anything else -> error.
  std::optional<int64_t> dim(const char* k, int64_t def) const {
    if (!present(k)) return def;
    if (is_null(k)) return std::nullopt;
    return int_value(k);
  }
  // Absent or null -> def.
  int64_t int_or(const char* k, int64_t def) const { return has(k) ? int_value(k) : def; }
  double num_or(const char* k, double def) const {
    if (!has(k)) return def;
    const json& v = obj_.at(k);
    if (!v.is_number()) bad(k, "must be a number");
    double d = v.get<double>();
    if (!std::isfinite(d)) bad(k, "must be finite");
    return d;
  }
  bool bool_or(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!obj_.at(k).is_boolean()) bad(k, "must be true or false");
    return obj_.at(k).get<bool>();
  }
  std::string str_or(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    if (!obj_.at(k).is_string()) bad(k, "must be a string");
    return obj_.at(k).get<std::string>();
  }
  // Token ids: integer or list of integers; absent -> def; null -> none (HF None).
  std::vector<int64_t> ids_or(const char* k, std::vector<int64_t> def) const {
    if (!present(k)) return def;
    if (is_null(k)) return {};
    const json& v = obj_.at(k);
    std::vector<int64_t> out;
    int64_t x = 0;
    if (to_int(v, &x)) {
      out.push_back(x);
    } else if (v.is_array()) {
      for (const json& e : v) {
        if (!to_int(e, &x)) bad(k, "must be an integer or a list of integers");
        out.push_back(x);
      }
    } else {
      bad(k, "must be an integer or a list of integers");
    }
    for (int64_t id : out)
      if (id < 0) bad(k, "must hold non-negative token ids");
    return out;
  }

 private:
  const json& obj_;
  const std::string& file_;
  std::string prefix_;
};

void warn(ModelConfig& c, const std::string& file, const std::string& msg) {
  std::string line = file + ": " + msg;
  log::warn("{}", line);
  c.warnings.push_back(std::move(line));
}

std::optional<Arch> arch_from_name(const std::string& s) {
  for (Arch a : kArchs)
    if (s == arch_name(a)) return a;
  return std::nullopt;
}
std::optional<Arch> arch_from_model_type(const std::string& s) {
  for (Arch a : kArchs)
    if (s == arch_model_type(a)) return a;
  return std::nullopt;
}

Arch resolve_arch(const Fields& f, ModelConfig& c) {
  const std::string& file = f.file();
  std::string arch0;
  if (f.has("architectures")) {
    const json& a = f.at("architectures");
    if (!a.is_array()) f.bad("architectures", "must be a list of strings");
    for (const json& e : a)
      if (!e.is_string()) f.bad("architectures", "must be a list of strings");
    if (!a.empty()) arch0 = a[0].get<std::string>();
  }
  std::string model_type = f.str_or("model_type", "");
  std::optional<Arch> by_name = arch0.empty() ? std::nullopt : arch_from_name(arch0);
  std::optional<Arch> by_type = model_type.empty() ? std::nullopt : arch_from_model_type(model_type);
  if (!by_name && !by_type) {
    std::string what = !arch0.empty()        ? arch0
                       : !model_type.empty() ? model_type
                                             : "(none: no architectures, no model_type)";
    fail("{}: unsupported architecture '{}' (supported: {})", file, what, kSupported);
  }
  if (by_name && !model_type.empty() && by_type != by_name)
    fail("{}: field 'model_type' '{}' does not match architectures[0] '{}' (expected model_type '{}')", file,
         model_type, arch0, arch_model_type(*by_name));
  if (!by_name && !arch0.empty())
    warn(c, file,
         fmt::format("architectures[0] '{}' is not one of ({}); using model_type '{}' -> {}", arch0, kSupported,
                     model_type, arch_name(*by_type)));
  return by_name ? *by_name : *by_type;
}

// ---- RoPE ----

bool rope_equal(const RopeConfig& a, const RopeConfig& b) {
  return std::tie(a.type, a.theta, a.factor, a.original_max_position_embeddings, a.beta_fast, a.beta_slow, a.mscale,
                  a.mscale_all_dim, a.attention_factor,
                  a.truncate) == std::tie(b.type, b.theta, b.factor, b.original_max_position_embeddings, b.beta_fast,
                                          b.beta_slow, b.mscale, b.mscale_all_dim, b.attention_factor, b.truncate);
}

// Resolves one rope dict (`where` = "rope_parameters" or "rope_scaling") with the top-level fallbacks of HF's
// convert_rope_params_to_dict / standardize_rope_params.
RopeConfig resolve_rope(const json& obj, const char* where, const Fields& top, int64_t max_pos, ModelConfig& c) {
  const std::string& file = top.file();
  Fields r(obj, file, std::string(where) + ".");
  RopeConfig rope;
  // rope_type, legacy key "type".
  if (r.has("rope_type"))
    rope.type = r.str_or("rope_type", "default");
  else
    rope.type = r.str_or("type", "default");
  const char* type_key = r.has("rope_type") ? "rope_type" : "type";
  if (rope.type != "default" && rope.type != "yarn")
    fail("{}: field '{}.{}' '{}' is not supported (supported: default, yarn)", file, where, type_key, rope.type);

  // rope_theta: dict first, then top-level rope_theta, then default_theta.
  if (r.has("rope_theta")) {
    rope.theta = r.num_or("rope_theta", kDefaultRopeTheta);
    if (top.has("rope_theta") && top.num_or("rope_theta", 0) != rope.theta)
      warn(c, file,
           fmt::format("top-level rope_theta {} ignored: {}.rope_theta {} takes precedence (as in HF)",
                       top.num_or("rope_theta", 0), where, rope.theta));
  } else {
    rope.theta = top.num_or("rope_theta", kDefaultRopeTheta);
  }
  if (!(rope.theta > 1.0)) fail("{}: field 'rope_theta' must be > 1 (got {})", file, rope.theta);

  for (const Fields* src : std::initializer_list<const Fields*>{&r, &top}) {
    if (src->has("partial_rotary_factor") && src->num_or("partial_rotary_factor", 1.0) != 1.0)
      src->bad("partial_rotary_factor", "is not supported (MLA rotates all qk_rope_head_dim dims; only 1.0)");
  }

  if (rope.type == "default") return rope;  // HF ignores factor/mscale/... for the default type

  // yarn
  if (!r.present("factor")) fail("{}: field '{}.factor' missing (required for rope_type 'yarn')", file, where);
  if (r.is_null("factor")) r.bad("factor", "must be a number (required for rope_type 'yarn')");
  rope.factor = r.num_or("factor", 1.0);
  if (!(rope.factor > 0)) r.bad("factor", "must be > 0");
  if (rope.factor < 1.0)
    warn(c, file, fmt::format("{}.factor {} < 1 (HF only warns; yarn then interpolates upwards)", where, rope.factor));

  // original_max_position_embeddings: a top-level key wins (HF standardize_rope_params, the Phi3 exception).
  std::optional<int64_t> omp_dict, omp_top;
  if (r.has("original_max_position_embeddings")) omp_dict = r.int_value("original_max_position_embeddings");
  if (top.has("original_max_position_embeddings")) omp_top = top.int_value("original_max_position_embeddings");
  if (omp_dict && omp_top && *omp_dict != *omp_top)
    fail(
        "{}: fields '{}.original_max_position_embeddings' ({}) and top-level 'original_max_position_embeddings' "
        "({}) disagree",
        file, where, *omp_dict, *omp_top);
  rope.original_max_position_embeddings = omp_top ? *omp_top : omp_dict ? *omp_dict : max_pos;
  if (rope.original_max_position_embeddings <= 0)
    fail("{}: field '{}.original_max_position_embeddings' must be positive (got {})", file, where,
         rope.original_max_position_embeddings);

  // HF: `get("beta_fast") or 32`, `get("beta_slow") or 1` (0 and null also take the default).
  rope.beta_fast = r.num_or("beta_fast", 0.0);
  if (rope.beta_fast == 0.0) rope.beta_fast = 32.0;
  rope.beta_slow = r.num_or("beta_slow", 0.0);
  if (rope.beta_slow == 0.0) rope.beta_slow = 1.0;
  if (!(rope.beta_fast > 0)) r.bad("beta_fast", "must be > 0");
  if (!(rope.beta_slow > 0)) r.bad("beta_slow", "must be > 0");
  if (rope.beta_fast < rope.beta_slow)
    warn(c, file, fmt::format("{}.beta_fast {} < beta_slow {} (HF only warns)", where, rope.beta_fast, rope.beta_slow));
  rope.mscale = r.num_or("mscale", 0.0);
  rope.mscale_all_dim = r.num_or("mscale_all_dim", 0.0);
  if (r.has("attention_factor")) {
    rope.attention_factor = r.num_or("attention_factor", 1.0);
    if (*rope.attention_factor < 0) r.bad("attention_factor", "must be >= 0");
  }
  rope.truncate = r.bool_or("truncate", true);
  double implicit = static_cast<double>(max_pos) / static_cast<double>(rope.original_max_position_embeddings);
  if (implicit != 1.0 && implicit != rope.factor)
    warn(c, file,
         fmt::format("{}.factor {} differs from max_position_embeddings / original_max_position_embeddings "
                     "= {} (HF uses factor, so does latent)",
                     where, rope.factor, implicit));
  return rope;
}

RopeConfig parse_rope(const Fields& top, int64_t max_pos, ModelConfig& c) {
  const std::string& file = top.file();
  auto dict = [&](const char* k) -> const json* {
    if (!top.has(k)) return nullptr;
    const json& v = top.at(k);
    if (!v.is_object()) top.bad(k, "must be an object");
    return v.empty() ? nullptr : &v;  // HF: `rope_scaling or rope_parameters`: an empty dict counts as absent
  };
  const json* params = dict("rope_parameters");
  const json* scaling = dict("rope_scaling");
  if (params && scaling) {
    RopeConfig a = resolve_rope(*params, "rope_parameters", top, max_pos, c);
    RopeConfig b = resolve_rope(*scaling, "rope_scaling", top, max_pos, c);
    if (!rope_equal(a, b))
      fail("{}: fields 'rope_parameters' and 'rope_scaling' both given and disagree ({} vs {}); remove one", file,
           show(*params), show(*scaling));
    return a;
  }
  if (params) return resolve_rope(*params, "rope_parameters", top, max_pos, c);
  if (scaling) return resolve_rope(*scaling, "rope_scaling", top, max_pos, c);
  RopeConfig rope;
  rope.theta = top.num_or("rope_theta", kDefaultRopeTheta);
  if (!(rope.theta > 1.0)) fail("{}: field 'rope_theta' must be > 1 (got {})", file, rope.theta);
  if (top.has("partial_rotary_factor") && top.num_or("partial_rotary_factor", 1.0) != 1.0)
    top.bad("partial_rotary_factor", "is not supported (MLA rotates all qk_rope_head_dim dims; only 1.0)");
  return rope;
}

// ---- per-layer types ----

std::vector<std::string> string_list(const Fields& f, const char* k) {
  const json& v = f.at(k);
  if (!v.is_array()) f.bad(k, "must be a list of strings");
  std::vector<std::string> out;
  for (const json& e : v) {
    if (!e.is_string()) f.bad(k, "must be a list of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

void resolve_mlp_layers(const Fields& f, ModelConfig& c) {
  const std::string& file = f.file();
  const int64_t L = c.num_hidden_layers;
  // HF V3: i >= first_k_dense_replace. HF V3.2/GLM: mlp_layer_types, derived from min(k, L) when absent.
  std::vector<bool> by_k(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) by_k[static_cast<size_t>(i)] = i >= c.first_k_dense_replace;
  if (!f.has("mlp_layer_types")) {
    c.layer_is_moe = by_k;
  } else {
    std::vector<std::string> types = string_list(f, "mlp_layer_types");
    if (static_cast<int64_t>(types.size()) != L)
      fail("{}: field 'mlp_layer_types' has {} entries, num_hidden_layers is {}", file, types.size(), L);
    c.layer_is_moe.assign(static_cast<size_t>(L), false);
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] != "dense" && types[i] != "sparse")
        fail("{}: field 'mlp_layer_types[{}]' is '{}' (expected \"dense\" or \"sparse\")", file, i, types[i]);
      c.layer_is_moe[i] = types[i] == "sparse";
    }
    if (c.arch == Arch::DeepseekV3 && c.layer_is_moe != by_k)
      fail(
          "{}: field 'mlp_layer_types' disagrees with first_k_dense_replace {} (HF DeepseekV3 ignores "
          "mlp_layer_types and uses first_k_dense_replace; fix the config)",
          file, c.first_k_dense_replace);
  }
  if (c.moe_layer_freq != 1)
    warn(c, file,
         fmt::format("moe_layer_freq {} ignored: transformers ignores it (vLLM would make layer i MoE "
                     "only if i % freq == 0); latent follows transformers",
                     c.moe_layer_freq));
}

void resolve_indexer_layers(const Fields& f, ModelConfig& c) {
  const std::string& file = f.file();
  const size_t L = static_cast<size_t>(c.num_hidden_layers);
  if (c.arch == Arch::DeepseekV3) {
    c.layer_has_indexer.assign(L, false);
    return;
  }
  if (c.arch == Arch::DeepseekV32) {
    c.layer_has_indexer.assign(L, true);
    return;
  }
  // GLM IndexShare (docs/model.md §IndexShare): indexer_types, else index_topk_pattern, else the freq/offset schedule.
  std::vector<std::string> types;
  const char* source = "indexer_types";
  if (f.has("indexer_types")) {
    types = string_list(f, "indexer_types");
  } else if (f.has("index_topk_pattern")) {
    source = "index_topk_pattern";
    const json& p = f.at("index_topk_pattern");
    if (p.is_string()) {
      std::string s = p.get<std::string>();
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == 'F')
          types.emplace_back("full");
        else if (s[i] == 'S')
          types.emplace_back("shared");
        else
          fail("{}: field 'index_topk_pattern' has '{}' at position {} (expected only 'F' or 'S')", file, s[i], i);
      }
    } else {
      types = string_list(f, "index_topk_pattern");
    }
  } else {
    int64_t freq = std::max<int64_t>(f.int_or("index_topk_freq", 1), 1);
    int64_t offset = f.int_or("index_skip_topk_offset", 2);
    if (f.is_null("index_topk_freq")) f.bad("index_topk_freq", "must be an integer");
    if (f.is_null("index_skip_topk_offset")) f.bad("index_skip_topk_offset", "must be an integer");
    for (size_t i = 0; i < L; ++i) {
      int64_t x = std::max<int64_t>(static_cast<int64_t>(i) - offset + 1, 0);
      types.emplace_back(x % freq == 0 ? "full" : "shared");
    }
    source = "index_topk_freq/index_skip_topk_offset";
  }
  if (types.size() != L) fail("{}: field '{}' has {} entries, num_hidden_layers is {}", file, source, types.size(), L);
  c.layer_has_indexer.assign(L, false);
  for (size_t i = 0; i < L; ++i) {
    if (types[i] != "full" && types[i] != "shared")
      fail("{}: field '{}[{}]' is '{}' (expected \"full\" or \"shared\")", file, source, i, types[i]);
    c.layer_has_indexer[i] = types[i] == "full";
  }
  if (L > 0 && !c.layer_has_indexer[0])
    fail("{}: field '{}' makes layer 0 \"shared\": layer 0 must run its own indexer (\"full\")", file, source);
}

// ---- validation ----

constexpr int64_t kMaxDim = int64_t{1} << 31;  // keeps products of dims and allocations sane on hostile input
constexpr int64_t kMaxLayers = 100000;

int64_t required_dim(const Fields& f, const char* k, const std::optional<int64_t>& v) {
  if (!v) fail("{}: field '{}' is null (a positive integer is required)", f.file(), k);
  if (*v <= 0) fail("{}: field '{}' must be a positive integer (got {})", f.file(), k, *v);
  if (*v > kMaxDim) fail("{}: field '{}' is implausibly large (got {}, limit {})", f.file(), k, *v, kMaxDim);
  return *v;
}

}  // namespace

double ModelConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  // HF: if rope_type != "default" and mscale_all_dim: scale *= yarn_get_mscale(factor, mscale_all_dim)^2.
  if (rope.type != "default" && rope.mscale_all_dim != 0.0) {
    double m = yarn_get_mscale(rope.factor, rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

namespace {
int64_t rope_dim_checked(const ModelConfig& c) {
  if (c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 != 0)
    fail("rope: qk_rope_head_dim must be positive and even (got {})", c.qk_rope_head_dim);
  return c.qk_rope_head_dim;
}
int64_t original_max_pos(const ModelConfig& c) {
  return c.rope.original_max_position_embeddings > 0 ? c.rope.original_max_position_embeddings
                                                     : c.max_position_embeddings;
}
}  // namespace

YarnRange rope_yarn_range(const ModelConfig& c) {
  if (c.rope.type != "yarn") fail("rope: rope_yarn_range needs rope type 'yarn' (got '{}')", c.rope.type);
  const double dim = static_cast<double>(rope_dim_checked(c));
  const double l0 = static_cast<double>(original_max_pos(c));
  auto corr = [&](double rot) {
    return dim * std::log(l0 / (rot * 2.0 * std::numbers::pi)) / (2.0 * std::log(c.rope.theta));
  };
  double lo = corr(c.rope.beta_fast), hi = corr(c.rope.beta_slow);
  if (c.rope.truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  return {std::max(lo, 0.0), std::min(hi, dim - 1.0)};
}

std::vector<double> rope_inv_freq(const ModelConfig& c) {
  const int64_t dim = rope_dim_checked(c);
  const int64_t half = dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[static_cast<size_t>(i)] = std::pow(c.rope.theta, -static_cast<double>(2 * i) / static_cast<double>(dim));
  if (c.rope.type != "yarn") return inv;
  YarnRange r = rope_yarn_range(c);
  double lo = r.lo, hi = r.hi;
  if (lo == hi) hi += 0.001;  // HF: prevent singularity
  for (int64_t i = 0; i < half; ++i) {
    double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
    double b = inv[static_cast<size_t>(i)];
    inv[static_cast<size_t>(i)] = b * (1.0 - ramp) + b / c.rope.factor * ramp;
  }
  return inv;
}

std::vector<float> rope_inv_freq_f32(const ModelConfig& c) {
  const int64_t dim = rope_dim_checked(c);
  const int64_t half = dim / 2;
  const float base = static_cast<float>(c.rope.theta);
  std::vector<float> inv(static_cast<size_t>(half));
  // HF: pos_freqs = base ** (arange(0, dim, 2).float() / dim); inv_freq_extrapolation = 1.0 / pos_freqs
  std::vector<float> pos(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    pos[static_cast<size_t>(i)] = std::pow(base, e);
    inv[static_cast<size_t>(i)] = 1.0f / pos[static_cast<size_t>(i)];
  }
  if (c.rope.type != "yarn") return inv;
  YarnRange r = rope_yarn_range(c);
  double lo = r.lo, hi = r.hi;
  if (lo == hi) hi += 0.001;
  const float factor = static_cast<float>(c.rope.factor);
  const float denom = static_cast<float>(hi - lo);  // python scalar (max - min), applied to an fp32 tensor
  for (int64_t i = 0; i < half; ++i) {
    float extrap = inv[static_cast<size_t>(i)];
    float interp = 1.0f / (factor * pos[static_cast<size_t>(i)]);
    float ramp = (static_cast<float>(i) - static_cast<float>(lo)) / denom;
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    float extrap_factor = 1.0f - ramp;
    inv[static_cast<size_t>(i)] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
  }
  return inv;
}

double rope_attention_factor(const ModelConfig& c) {
  if (c.rope.type != "yarn") return 1.0;
  if (c.rope.attention_factor) return *c.rope.attention_factor;
  const double f = c.rope.factor;
  if (c.rope.mscale != 0.0 && c.rope.mscale_all_dim != 0.0)
    return yarn_get_mscale(f, c.rope.mscale) / yarn_get_mscale(f, c.rope.mscale_all_dim);
  return yarn_get_mscale(f, 1.0);
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& file) {
  json root;
  try {
    root = json::parse(json_text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::parse_error& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at line L, column C: ..."
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    std::replace(what.begin(), what.end(), '\n', ' ');
    fail("{}: invalid JSON (byte {}): {}", file, e.byte, what);
  }
  if (!root.is_object()) fail("{}: top level must be a JSON object (got {})", file, root.type_name());

  ModelConfig c;
  Fields f(root, file);
  c.arch = resolve_arch(f, c);
  c.model_type = arch_model_type(c.arch);
  const Defaults& d = defaults_for(c.arch);
  const bool dsa = c.arch != Arch::DeepseekV3;

  // ---- dimensions ----
  c.vocab_size = required_dim(f, "vocab_size", f.dim("vocab_size", d.vocab_size));
  c.hidden_size = required_dim(f, "hidden_size", f.dim("hidden_size", d.hidden_size));
  c.num_hidden_layers = required_dim(f, "num_hidden_layers", f.dim("num_hidden_layers", d.num_hidden_layers));
  if (c.num_hidden_layers > kMaxLayers)
    fail("{}: field 'num_hidden_layers' is implausibly large (got {}, limit {})", file, c.num_hidden_layers,
         kMaxLayers);
  c.num_attention_heads = required_dim(f, "num_attention_heads", f.dim("num_attention_heads", d.num_attention_heads));
  c.kv_lora_rank = required_dim(f, "kv_lora_rank", f.dim("kv_lora_rank", d.kv_lora_rank));
  c.qk_rope_head_dim = required_dim(f, "qk_rope_head_dim", f.dim("qk_rope_head_dim", d.qk_rope_head_dim));
  c.qk_nope_head_dim = required_dim(f, "qk_nope_head_dim", f.dim("qk_nope_head_dim", d.qk_nope_head_dim));
  c.v_head_dim = required_dim(f, "v_head_dim", f.dim("v_head_dim", d.v_head_dim));
  {
    std::optional<int64_t> q = f.dim("q_lora_rank", d.q_lora_rank);
    if (!q || *q == 0)
      fail(
          "{}: q_lora_rank missing (field 'q_lora_rank' is {}): latent requires the q LoRA path of these "
          "architectures",
          file, q ? std::to_string(*q) : std::string("null"));
    c.q_lora_rank = required_dim(f, "q_lora_rank", q);
  }
  if (c.qk_rope_head_dim % 2 != 0)
    fail("{}: field 'qk_rope_head_dim' must be even (RoPE rotates pairs; got {})", file, c.qk_rope_head_dim);
  {
    // HF V3: num_key_value_heads None -> num_attention_heads. Unused by the MLA math.
    std::optional<int64_t> kv = f.dim("num_key_value_heads", d.num_key_value_heads);
    c.num_key_value_heads = kv ? *kv : c.num_attention_heads;
    if (c.num_key_value_heads <= 0)
      fail("{}: field 'num_key_value_heads' must be a positive integer (got {})", file, c.num_key_value_heads);
  }
  if (f.has("qk_head_dim") && f.int_value("qk_head_dim") != c.qk_head_dim())
    warn(c, file,
         fmt::format("qk_head_dim {} ignored: HF recomputes it as qk_nope_head_dim + qk_rope_head_dim = {}",
                     f.int_value("qk_head_dim"), c.qk_head_dim()));

  // ---- MLP / MoE ----
  c.first_k_dense_replace = f.int_or("first_k_dense_replace", d.first_k_dense_replace);
  if (f.is_null("first_k_dense_replace")) f.bad("first_k_dense_replace", "must be an integer");
  if (c.first_k_dense_replace < 0) f.bad("first_k_dense_replace", "must be >= 0");
  if (c.first_k_dense_replace > c.num_hidden_layers)
    fail("{}: field 'first_k_dense_replace' {} exceeds num_hidden_layers {}", file, c.first_k_dense_replace,
         c.num_hidden_layers);
  c.moe_layer_freq = f.int_or("moe_layer_freq", 1);
  if (c.moe_layer_freq < 1) f.bad("moe_layer_freq", "must be >= 1");
  resolve_mlp_layers(f, c);
  const bool any_moe = std::find(c.layer_is_moe.begin(), c.layer_is_moe.end(), true) != c.layer_is_moe.end();
  const bool any_dense = std::find(c.layer_is_moe.begin(), c.layer_is_moe.end(), false) != c.layer_is_moe.end();

  std::optional<int64_t> inter = f.dim("intermediate_size", d.intermediate_size);
  if (any_dense)
    c.intermediate_size = required_dim(f, "intermediate_size", inter);
  else
    c.intermediate_size = inter.value_or(0);

  std::optional<int64_t> experts = f.dim("n_routed_experts", d.n_routed_experts);
  if (f.has("num_local_experts")) {  // attribute_map alias
    int64_t alias = f.int_value("num_local_experts");
    if (f.has("n_routed_experts") && alias != f.int_value("n_routed_experts"))
      fail("{}: fields 'num_local_experts' ({}) and 'n_routed_experts' ({}) disagree", file, alias,
           f.int_value("n_routed_experts"));
    experts = alias;
  }
  if (dsa && f.has("num_experts")) experts = f.int_value("num_experts");  // HF BC re-route (V3.2, GLM)
  std::optional<int64_t> moe_inter = f.dim("moe_intermediate_size", d.moe_intermediate_size);
  std::optional<int64_t> topk = f.dim("num_experts_per_tok", d.num_experts_per_tok);
  std::optional<int64_t> n_group = f.dim("n_group", d.n_group);
  std::optional<int64_t> topk_group = f.dim("topk_group", d.topk_group);
  std::optional<int64_t> shared = f.dim("n_shared_experts", d.n_shared_experts);
  c.routed_scaling_factor = f.num_or("routed_scaling_factor", d.routed_scaling_factor);
  c.norm_topk_prob = f.bool_or("norm_topk_prob", true);
  c.scoring_func = f.str_or("scoring_func", "sigmoid");
  c.topk_method = f.str_or("topk_method", "noaux_tc");
  if (any_moe) {
    c.n_routed_experts = required_dim(f, "n_routed_experts", experts);
    c.moe_intermediate_size = required_dim(f, "moe_intermediate_size", moe_inter);
    c.num_experts_per_tok = required_dim(f, "num_experts_per_tok", topk);
    c.n_group = required_dim(f, "n_group", n_group);
    c.topk_group = required_dim(f, "topk_group", topk_group);
    if (!shared) fail("{}: field 'n_shared_experts' is null (an integer >= 0 is required)", file);
    c.n_shared_experts = *shared;
    if (c.n_shared_experts < 0) f.bad("n_shared_experts", "must be >= 0");
    if (c.n_routed_experts % c.n_group != 0)
      fail("{}: field 'n_routed_experts' {} is not divisible by n_group {}", file, c.n_routed_experts, c.n_group);
    const int64_t per_group = c.n_routed_experts / c.n_group;
    if (per_group < 2)
      fail("{}: field 'n_group' {} leaves {} expert(s) per group; the group score sums the top 2 of each group", file,
           c.n_group, per_group);
    if (c.topk_group > c.n_group) fail("{}: field 'topk_group' {} exceeds n_group {}", file, c.topk_group, c.n_group);
    if (c.num_experts_per_tok > c.n_routed_experts)
      fail("{}: field 'num_experts_per_tok' {} exceeds n_routed_experts {}", file, c.num_experts_per_tok,
           c.n_routed_experts);
    if (c.num_experts_per_tok > c.topk_group * per_group)
      fail(
          "{}: field 'num_experts_per_tok' {} exceeds the {} experts of the kept groups (topk_group {} x {} per "
          "group)",
          file, c.num_experts_per_tok, c.topk_group * per_group, c.topk_group, per_group);
    if (!(c.routed_scaling_factor > 0))
      fail("{}: field 'routed_scaling_factor' must be > 0 (got {})", file, c.routed_scaling_factor);
    // HF ignores scoring_func / topk_method and always routes with sigmoid + e_score_correction_bias (noaux_tc).
    // A checkpoint trained with softmax scoring or greedy top-k would load without complaint there and produce
    // wrong routing weights; refusing is the faithful choice.
    if (c.scoring_func != "sigmoid")
      fail(
          "{}: field 'scoring_func' '{}' is not supported (only \"sigmoid\": these architectures route with "
          "sigmoid scores; transformers ignores the field, which would silently mis-route this checkpoint)",
          file, c.scoring_func);
    if (c.topk_method != "noaux_tc")
      fail(
          "{}: field 'topk_method' '{}' is not supported (only \"noaux_tc\": bias-corrected group-limited top-k, "
          "the only routing transformers implements for these architectures)",
          file, c.topk_method);
  } else {
    c.n_routed_experts = experts.value_or(0);
    c.moe_intermediate_size = moe_inter.value_or(0);
    c.num_experts_per_tok = topk.value_or(0);
    c.n_group = n_group.value_or(1);
    c.topk_group = topk_group.value_or(1);
    c.n_shared_experts = shared.value_or(0);
  }

  c.hidden_act = f.str_or("hidden_act", "silu");
  if (c.hidden_act == "swish") c.hidden_act = "silu";  // HF ACT2FN: swish == silu
  if (c.hidden_act != "silu")
    fail("{}: field 'hidden_act' '{}' is not supported (only \"silu\": the MLPs are SwiGLU)", file, c.hidden_act);

  // ---- norms, positions, rope ----
  c.rms_norm_eps = f.num_or("rms_norm_eps", d.rms_norm_eps);
  if (!(c.rms_norm_eps > 0)) fail("{}: field 'rms_norm_eps' must be > 0 (got {})", file, c.rms_norm_eps);
  c.max_position_embeddings =
      required_dim(f, "max_position_embeddings", f.dim("max_position_embeddings", d.max_position_embeddings));
  c.rope = parse_rope(f, c.max_position_embeddings, c);

  // Main-MLA RoPE pairing: V3 honours rope_interleave (default true); V3.2/GLM hard-code interleaved.
  if (c.arch == Arch::DeepseekV3) {
    c.rope_interleave = f.bool_or("rope_interleave", true);
  } else {
    c.rope_interleave = true;
    if (!f.bool_or("rope_interleave", true))
      warn(c, file, "rope_interleave false ignored: transformers hard-codes interleaved RoPE for this architecture");
  }
  // Indexer RoPE pairing, hard-coded by HF: V3.2 half-split, GLM interleaved. The key is informational only.
  c.indexer_rope_interleave = c.arch == Arch::GlmMoeDsa;
  if (dsa && f.has("indexer_rope_interleave") &&
      f.bool_or("indexer_rope_interleave", false) != c.indexer_rope_interleave)
    warn(c, file,
         fmt::format("indexer_rope_interleave {} ignored: transformers hard-codes {} for {}",
                     !c.indexer_rope_interleave, c.indexer_rope_interleave, arch_name(c.arch)));

  c.attention_bias = f.bool_or("attention_bias", false);
  c.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
  c.num_nextn_predict_layers = f.int_or("num_nextn_predict_layers", 0);
  if (c.num_nextn_predict_layers < 0) f.bad("num_nextn_predict_layers", "must be >= 0");

  // ---- DSA indexer ----
  if (dsa) {
    c.index_n_heads = required_dim(f, "index_n_heads", f.dim("index_n_heads", d.index_n_heads));
    c.index_head_dim = required_dim(f, "index_head_dim", f.dim("index_head_dim", d.index_head_dim));
    c.index_topk = f.dim("index_topk", d.index_topk).value_or(0);
    if (f.is_null("index_topk")) fail("{}: field 'index_topk' is null (an integer >= 1 is required)", file);
    if (c.index_topk < 1) fail("{}: field 'index_topk' must be >= 1 (got {})", file, c.index_topk);
    if (c.index_head_dim < c.qk_rope_head_dim)
      fail(
          "{}: field 'index_head_dim' {} is smaller than qk_rope_head_dim {} (the indexer rotates its first "
          "qk_rope_head_dim dims)",
          file, c.index_head_dim, c.qk_rope_head_dim);
  }
  resolve_indexer_layers(f, c);

  // ---- tokens, dtype, quantization ----
  c.bos_token_ids = f.ids_or("bos_token_id", {0});
  c.eos_token_ids = f.ids_or("eos_token_id", {1});
  if (f.has("pad_token_id")) {
    c.pad_token_id = f.int_value("pad_token_id");
    if (c.pad_token_id < 0) f.bad("pad_token_id", "must be a non-negative token id");
  }
  {
    std::vector<int64_t> all = c.bos_token_ids;
    all.insert(all.end(), c.eos_token_ids.begin(), c.eos_token_ids.end());
    if (c.pad_token_id >= 0) all.push_back(c.pad_token_id);
    for (int64_t id : all)
      if (id >= c.vocab_size)
        warn(c, file,
             fmt::format("special token id {} (bos/eos/pad) is outside the vocabulary (vocab_size {})", id,
                         c.vocab_size));
  }
  c.torch_dtype = f.has("dtype") ? f.str_or("dtype", "") : f.str_or("torch_dtype", "");
  if (f.has("quantization_config")) {
    if (!f.at("quantization_config").is_object()) f.bad("quantization_config", "must be an object");
    c.quantization_config = f.at("quantization_config");
  }
  c.raw = std::move(root);
  return c;
}

ModelConfig load_model_config(const std::string& dir) {
  std::string path = dir;
  if (!path.empty() && path.back() != '/') path += '/';
  path += "config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open config.json (missing file or unreadable model directory)", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("{}: read error", path);
  return parse_model_config(ss.str(), path);
}

}  // namespace latent
