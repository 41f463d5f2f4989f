#include "loader/plan_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "kernels/cuda/mx_layout.h"

namespace latent {

namespace {

// Splits a name into the text with numeric path components replaced: layer -> "{L}", expert -> "*".
struct NameKey {
  std::string pattern;  // "model.layers.{L}.mlp.experts.*.up_proj.weight"
  int64_t layer = -1;
};

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

NameKey name_key(const std::string& name) {
  NameKey k;
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!all_digits(parts[i]) || parts[i].size() > 9) continue;
    if (i > 0 && parts[i - 1] == "layers" && k.layer < 0) {
      k.layer = std::stoll(parts[i]);
      parts[i] = "{L}";
    } else {
      parts[i] = "*";
    }
  }
  for (size_t i = 0; i < parts.size(); ++i) k.pattern += (i ? "." : "") + parts[i];
  return k;
}

std::string ranges(const std::set<int64_t>& v) {
  std::string out;
  auto it = v.begin();
  while (it != v.end()) {
    int64_t a = *it, b = a;
    auto nx = std::next(it);
    while (nx != v.end() && *nx == b + 1) {
      b = *nx;
      ++nx;
    }
    if (!out.empty()) out += ",";
    out += a == b ? std::to_string(a) : fmt::format("{}-{}", a, b);
    it = nx;
  }
  return out;
}

// Forward-pass order for display: embedding, per-layer modules in execution order, final norm, head.
int display_rank(const std::string& name) {
  static const char* kOrder[] = {
      "input_layernorm", "q_a_proj",       "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa",
      "kv_a_layernorm",  "kv_b_proj",      "indexer",       "o_proj",   "post_attention_layernorm",
      "mlp.gate.",       "shared_experts", "experts",       "mlp."};
  if (name.rfind("model.embed_tokens", 0) == 0) return 0;
  if (name.rfind("model.layers.", 0) == 0) {
    for (int i = 0; i < static_cast<int>(std::size(kOrder)); ++i)
      if (name.find(kOrder[i]) != std::string::npos) return 10 + i;
    return 90;
  }
  if (name.rfind("model.norm", 0) == 0) return 100;
  if (name.rfind("lm_head", 0) == 0) return 101;
  return 200;
}

int proj_rank(const std::string& p) {
  static const char* kOrder[] = {"gate", "up", "down", "q_a", "q_b", "kv_a", "kv_b", "o"};
  for (int i = 0; i < static_cast<int>(std::size(kOrder)); ++i)
    if (p == kOrder[i]) return i;
  return 100;
}

std::string stored_label(const PlanEntry& e) {
  std::string s(weight_format_name(e.stored));
  if (!e.scheme.empty()) s += " (" + e.scheme + ")";
  return s;
}

std::string compute_label(const PlanEntry& e) {
  if (e.skipped) return "-";
  if (!e.is_linear) return std::string(weight_format_name(e.compute)) + " (fp32 math)";
  if (e.compute == WeightFormat::F32) return "f32";
  return std::string(weight_format_name(e.compute)) + " -> fp32 in registers";
}

std::string transform_label(const PlanEntry& e) {
  if (e.skipped) return "skipped: " + e.skip_reason;
  return e.transform;
}

}  // namespace

uint64_t entry_bytes(const PrecisionPlan& plan, const PlanEntry& e) {
  (void)plan;
  return e.bytes;
}

std::vector<PlanGroup> group_plan(const PrecisionPlan& plan) {
  struct Acc {
    PlanGroup g;
    std::set<int64_t> layers;
    size_t order = 0;
  };
  // Pass 1: by (pattern with {L}, stored, compute, transform).
  std::map<std::string, Acc> by_key;
  size_t order = 0;
  for (const PlanEntry& e : plan.entries()) {
    NameKey k = name_key(e.name);
    PlanGroup g{k.pattern, stored_label(e), compute_label(e), transform_label(e)};
    std::string key = g.pattern + "\x1f" + g.stored + "\x1f" + g.compute + "\x1f" + g.transform;
    auto [it, fresh] = by_key.try_emplace(key);
    if (fresh) {
      it->second.g = g;
      it->second.order = order++;
    }
    Acc& a = it->second;
    a.g.tensors += 1;
    a.g.params += e.shape.numel();
    a.g.bytes += entry_bytes(plan, e);
    a.g.max_rel_error = std::max(a.g.max_rel_error, e.rel_error);
    if (k.layer >= 0) a.layers.insert(k.layer);
  }
  // Pass 2: write the layer range into the pattern; merge patterns that differ only in the projection name
  // ("gate_proj" / "up_proj" / "down_proj") when everything else matches.
  std::vector<Acc> accs;
  for (auto& [key, a] : by_key) {
    if (!a.layers.empty()) {
      std::string r = ranges(a.layers);
      auto pos = a.g.pattern.find("{L}");
      a.g.pattern.replace(pos, 3, a.layers.size() == 1 ? r : "{" + r + "}");
    }
    accs.push_back(std::move(a));
  }
  std::stable_sort(accs.begin(), accs.end(), [](const Acc& x, const Acc& y) {
    const int rx = display_rank(x.g.pattern), ry = display_rank(y.g.pattern);
    return rx != ry ? rx < ry : x.order < y.order;
  });
  std::vector<PlanGroup> out;
  std::map<std::string, size_t> merged;  // key without proj name -> index in out
  std::map<size_t, std::vector<std::string>> projs;
  for (auto& a : accs) {
    std::string pat = a.g.pattern;
    std::string proj;
    static const std::string kSuffix = "_proj.weight";
    if (pat.size() > kSuffix.size() && pat.compare(pat.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
      size_t dot = pat.rfind('.', pat.size() - kSuffix.size());
      proj = pat.substr(dot + 1, pat.size() - kSuffix.size() - dot - 1);
      pat = pat.substr(0, dot + 1) + "{}" + kSuffix;
    }
    std::string key = pat + "\x1f" + a.g.stored + "\x1f" + a.g.compute + "\x1f" + a.g.transform;
    auto it = proj.empty() ? merged.end() : merged.find(key);
    if (it == merged.end()) {
      if (!proj.empty()) {
        merged[key] = out.size();
        projs[out.size()].push_back(proj);
        a.g.pattern = pat;
      }
      out.push_back(a.g);
    } else {
      PlanGroup& g = out[it->second];
      g.tensors += a.g.tensors;
      g.params += a.g.params;
      g.bytes += a.g.bytes;
      g.max_rel_error = std::max(g.max_rel_error, a.g.max_rel_error);
      projs[it->second].push_back(proj);
    }
  }
  for (auto& [idx, names] : projs) {
    std::stable_sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
      return proj_rank(a) != proj_rank(b) ? proj_rank(a) < proj_rank(b) : a < b;
    });
    std::string joined;
    for (size_t i = 0; i < names.size(); ++i) joined += (i ? "," : "") + names[i];
    std::string& pat = out[idx].pattern;
    pat.replace(pat.find("{}"), 2, names.size() == 1 ? joined : "{" + joined + "}");
  }
  return out;
}

namespace {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

std::string human_count(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1'000) return fmt::format("{:.1f}k", n / 1e3);
  return std::to_string(n);
}

// Whether the CUDA backend stores this weight's codes pair-swizzled (kernels/cuda/mx_layout.h; the backend's
// prepare_weight swizzles every MXFP4 weight whose rows are whole 32-bit words of codes).
bool cuda_mx_swizzled(const PlanEntry& e) {
  return e.is_linear && e.compute == WeightFormat::MXFP4 && e.shape.ndim == 2 && e.shape[1] % 8 == 0;
}
// Whether it also stores the code bytes in tile-major order (the backend's own rule, mx_tile_major_ok: rows whole
// 16-row tiles, columns whole 128-column chunks).
bool cuda_mx_tile_major(const PlanEntry& e) {
  return cuda_mx_swizzled(e) && cuda::mx_tile_major_ok(e.shape[0], e.shape[1], e.shape[1] / 2);
}
const char* cuda_layout(const PlanEntry& e) {
  return cuda_mx_tile_major(e) ? "mxfp4_pair_swizzled_tile_major"
         : cuda_mx_swizzled(e) ? "mxfp4_pair_swizzled"
                               : "as_stored";
}

}  // namespace

std::string activation_label(const PlanEntry& e, const PlanActivations& run) {
  if (e.act_declared.empty()) return run.dtype + " (run default; the checkpoint declares nothing for it)";
  if (run.declared && e.weight.act_fp8)
    return e.act_declared + " (checkpoint declares it: " + e.act_declared_by + "; --activations declared)";
  std::string s = run.dtype + " (run default, above the declared " + e.act_declared + " (" + e.act_declared_by + ")";
  if (e.weight.act_fp8)
    s += "; --activations declared runs it";
  else if (!e.act_note.empty())
    s += "; " + e.act_note;
  return s + ")";
}

namespace {

// The Linear entries' activation labels grouped by name pattern (layers and experts folded, as group_plan does).
std::string format_activations(const PrecisionPlan& plan, const PlanActivations& run) {
  struct Acc {
    std::string pattern, label;
    std::set<int64_t> layers;
    size_t order = 0;
  };
  std::map<std::string, Acc> by_key;
  size_t order = 0;
  for (const PlanEntry& e : plan.entries()) {
    if (!e.is_linear || e.skipped) continue;
    const NameKey k = name_key(e.name);
    const std::string label = activation_label(e, run);
    auto [it, fresh] = by_key.try_emplace(k.pattern + "\x1f" + label);
    if (fresh) it->second = Acc{k.pattern, label, {}, order++};
    if (k.layer >= 0) it->second.layers.insert(k.layer);
  }
  std::vector<Acc> accs;
  for (auto& [key, a] : by_key) {
    if (!a.layers.empty()) {
      const std::string r = ranges(a.layers);
      a.pattern.replace(a.pattern.find("{L}"), 3, a.layers.size() == 1 ? r : "{" + r + "}");
    }
    accs.push_back(std::move(a));
  }
  std::stable_sort(accs.begin(), accs.end(), [](const Acc& x, const Acc& y) { return x.order < y.order; });
  size_t w = 0;
  for (const Acc& a : accs) w = std::max(w, a.pattern.size());
  std::string out = "\nactivations per Linear module (input of the module)\n";
  for (const Acc& a : accs) out += fmt::format("  {:<{}}  {}\n", a.pattern, w, a.label);
  return out;
}

}  // namespace

std::string format_plan_text(const PrecisionPlan& plan, const ModelConfig& cfg, const std::string& model_dir,
                             bool allow_lossy, const PlanActivations& run) {
  std::string out;
  out += fmt::format("model     {}\narch      {} ({} layers, hidden {}, {} routed experts top-{})\n", model_dir,
                     arch_name(cfg.arch), cfg.num_hidden_layers, cfg.hidden_size, cfg.n_routed_experts,
                     cfg.num_experts_per_tok);
  auto groups = group_plan(plan);
  size_t w = 8, ws = 6, wc = 7;
  for (auto& g : groups) {
    w = std::max(w, g.pattern.size());
    ws = std::max(ws, g.stored.size());
    wc = std::max(wc, g.compute.size());
  }
  out += fmt::format("\n{:<{}}  {:>8}  {:<{}}  {:<{}}  {}\n", "tensors", w, "params", "stored", ws, "compute", wc,
                     "transform");
  for (auto& g : groups) {
    std::string tr = g.transform;
    if (g.max_rel_error > 0) tr += fmt::format(" (rel_error {:.4f})", g.max_rel_error);
    out += fmt::format("{:<{}}  {:>8}  {:<{}}  {:<{}}  {}\n", g.pattern, w, human_count(g.params), g.stored, ws,
                       g.compute, wc, tr);
  }
  // Totals per stored format (loaded tensors only).
  std::map<std::string, std::pair<int64_t, uint64_t>> totals;
  int64_t skipped = 0;
  for (const PlanEntry& e : plan.entries()) {
    if (e.skipped) {
      ++skipped;
      continue;
    }
    auto& t = totals[std::string(weight_format_name(e.compute))];
    t.first += e.shape.numel();
    t.second += entry_bytes(plan, e);
  }
  out += "\ntotals (as computed)\n";
  int64_t all_p = 0;
  uint64_t all_b = 0;
  for (auto& [fmt_name, t] : totals) {
    out += fmt::format("  {:<20} {:>10} params  {:>12}\n", fmt_name, human_count(t.first), human_bytes(t.second));
    all_p += t.first;
    all_b += t.second;
  }
  out += fmt::format("  {:<20} {:>10} params  {:>12}\n", "all", human_count(all_p), human_bytes(all_b));
  if (skipped)
    out += fmt::format("  {} tensors not loaded (MTP layers / IndexShare), listed above as skipped\n", skipped);
  out += format_activations(plan, run);
  out += fmt::format("\nactivations  {}\n", plan.activation_scheme());
  int64_t swizzled = 0, tile_major = 0;
  for (const PlanEntry& e : plan.entries()) {
    swizzled += !e.skipped && cuda_mx_swizzled(e);
    tile_major += !e.skipped && cuda_mx_tile_major(e);
  }
  if (swizzled)
    out += fmt::format(
        "cuda layout  {} mxfp4 tensors: codes pair-swizzled inside each 32-bit word at load on --device cuda (a bit "
        "order for the tensor-core decode; the same codes, scales and values — docs/cuda.md){}\n",
        swizzled,
        tile_major ? fmt::format("; {} of them with their code bytes in tile-major order (16-row tiles of "
                                 "128-column chunks, for the decode kernels' reads)",
                                 tile_major)
                   : std::string());
  if (plan.lossy())
    out += fmt::format("lossy        YES: user-requested transforms above{}\n",
                       allow_lossy ? " (guard lifted by --allow-lossy)" : "");
  else
    out += "lossy        no: every tensor is computed from exactly what the checkpoint stores\n";
  for (const auto& wmsg : plan.warnings()) out += "warning      " + wmsg + "\n";
  return out;
}

nlohmann::json plan_to_json(const PrecisionPlan& plan, const PlanActivations& run) {
  nlohmann::json arr = nlohmann::json::array();
  for (const PlanEntry& e : plan.entries()) {
    nlohmann::json o;
    o["name"] = e.name;
    o["shape"] = nlohmann::json::array();
    for (int i = 0; i < e.shape.ndim; ++i) o["shape"].push_back(e.shape[i]);
    o["dtype"] = std::string(dtype_name(e.dtype));
    o["stored"] = std::string(weight_format_name(e.stored));
    o["compute"] = std::string(weight_format_name(e.compute));
    o["transform"] = e.transform;
    o["rel_error"] = e.rel_error;
    o["scheme"] = e.scheme;
    o["companions"] = e.companions;
    o["linear"] = e.is_linear;
    if (e.is_linear && !e.skipped) {
      const bool declared_runs = run.declared && e.weight.act_fp8;
      o["activations"] = {
          {"runs", declared_runs ? e.act_declared : run.dtype},
          {"source", declared_runs ? "checkpoint (--activations declared)" : "run default"},
          {"declared", e.act_declared.empty() ? nlohmann::json() : nlohmann::json(e.act_declared)},
          {"declared_by", e.act_declared_by.empty() ? nlohmann::json() : nlohmann::json(e.act_declared_by)},
          {"declared_runnable", e.weight.act_fp8},
          {"note", e.act_note.empty() ? nlohmann::json() : nlohmann::json(e.act_note)},
          {"label", activation_label(e, run)}};
    }
    o["skipped"] = e.skipped;
    if (e.skipped) o["skip_reason"] = e.skip_reason;
    o["cuda_layout"] = cuda_layout(e);
    arr.push_back(std::move(o));
  }
  return arr;
}

nlohmann::json plan_summary(const PrecisionPlan& plan) {
  nlohmann::json weights = nlohmann::json::object();
  nlohmann::json lossy = nlohmann::json::array();
  for (const PlanEntry& e : plan.entries()) {
    if (e.skipped) continue;
    std::string k(weight_format_name(e.compute));
    weights[k] = weights.value(k, int64_t{0}) + e.shape.numel();
    if (e.transform != "none")
      lossy.push_back({{"tensor", e.name}, {"transform", e.transform}, {"rel_error", e.rel_error}});
  }
  return {{"weights_params_by_format", weights},
          {"activations", plan.activation_scheme()},
          {"lossy_transforms", lossy},
          {"warnings", plan.warnings()}};
}

}  // namespace latent
