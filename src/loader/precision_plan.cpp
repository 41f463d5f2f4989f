// Per-tensor precision decisions (docs/quantization.md §detection): the safetensors dtype is ground truth, companion
// scale tensors decide the scheme, quantization_config only cross-checks (a disagreement is a warning naming the
// module, never a re-interpretation). User transforms (--quantize) are applied in quant_transform.cpp.
#include "loader/precision_plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "loader/quant_config.h"
#include "loader/quant_transform.h"

namespace latent {

namespace {

bool ends_with(std::string_view s, std::string_view suf) {
  return s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf;
}

// Companion tensors are consumed together with the weight they scale.
constexpr std::string_view kCompanionSuffixes[] = {".weight_scale_inv", ".weight_scale",    ".weight_scale_2",
                                                   ".input_scale",      ".input_scale_inv", "_scales"};

bool is_companion(std::string_view name) {
  for (auto s : kCompanionSuffixes)
    if (ends_with(name, s)) return true;
  return false;
}

// "model.layers.12.mlp..." -> 12; -1 when the name has no layer index.
int64_t layer_index(std::string_view name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return -1;
  size_t i = kPrefix.size();
  int64_t v = 0;
  bool any = false;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
    v = v * 10 + (name[i] - '0');
    any = true;
    ++i;
    if (v > 1'000'000) return -1;
  }
  return any && i < name.size() && name[i] == '.' ? v : -1;
}

// Linear modules of the three architectures, by the last component of the module name.
bool is_linear_module(std::string_view module) {
  static constexpr std::string_view kLinear[] = {
      "q_a_proj", "q_b_proj",     "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",    "q_proj",  "wq_b",
      "wk",       "weights_proj", "gate_proj",          "up_proj",   "down_proj", "lm_head", "eh_proj"};
  size_t dot = module.rfind('.');
  std::string_view last = dot == std::string_view::npos ? module : module.substr(dot + 1);
  for (auto l : kLinear)
    if (last == l) return true;
  // The MoE router `mlp.gate` is a Linear [E, D] (computed in fp32 as HF does); an MTP layer's own head
  // `shared_head.head` [V, D].
  return ends_with(module, ".mlp.gate") || ends_with(module, ".shared_head.head");
}

std::string shape_str(const Shape& s) { return s.str(); }

}  // namespace

// ----------------------------------------------------------------------------------------------------------------
// Scheme detection for one Linear weight
// ----------------------------------------------------------------------------------------------------------------

namespace {

struct Detector {
  const Checkpoint& ckpt;
  const ModelConfig& cfg;
  const QuantConfig& qcfg;

  const TensorInfo* companion(const std::string& module, std::string_view suffix) const {
    auto* e = ckpt.find(module + std::string(suffix));
    return e ? e->info : nullptr;
  }

  void check_e8m0_scales(const std::string& name, const TensorView& v) const {
    const uint8_t* p = v.bytes();
    for (uint64_t i = 0; i < v.nbytes; ++i)
      if (p[i] == 0xFF) fail("{}: tensor '{}': e8m0 scale code 0xFF (NaN) at element {}", ckpt.file_of(name), name, i);
  }

  void check_f32_scales(const std::string& name, const TensorView& v) const {
    for (int64_t i = 0; i < v.numel(); ++i) {
      float f;  // memcpy: a tensor in a mapped file need not be 4-byte aligned
      std::memcpy(&f, v.bytes() + 4 * i, 4);
      if (!std::isfinite(f) || f <= 0.0f)
        fail("{}: tensor '{}': scale {} at element {} is not a finite positive number", ckpt.file_of(name), name, f, i);
    }
  }

  // Fills e.stored / e.scheme / e.weight / e.companions / e.shape for a 2-D Linear weight.
  void detect(PlanEntry& e) const {
    const auto& info = ckpt.info(e.name);
    const std::string file = ckpt.file_of(e.name);
    TensorView w = ckpt.view(e.name);
    if (info.shape.ndim != 2)
      fail("{}: tensor '{}': Linear weight must be 2-D [out, in], got shape {}", file, e.name, shape_str(info.shape));
    const int64_t rows = info.shape[0], cols = info.shape[1];
    QuantWeight q;
    q.rows = rows;
    q.data = w.data;

    switch (info.dtype) {
      case DType::F32:
      case DType::BF16:
      case DType::F16: {
        q.format = info.dtype == DType::F32    ? WeightFormat::F32
                   : info.dtype == DType::BF16 ? WeightFormat::BF16
                                               : WeightFormat::F16;
        q.cols = cols;
        for (auto s : kCompanionSuffixes)
          if (auto* c = companion(e.module, s))
            fail("{}: tensor '{}' is {} (unquantized) but has a scale tensor '{}': unknown combination", file, e.name,
                 dtype_name(info.dtype), c->name);
        break;
      }
      case DType::U8:
      case DType::I8:
      case DType::F4_E2M1: {
        const TensorInfo* sc = companion(e.module, ".weight_scale");
        if (!sc)
          fail("{}: tensor '{}' is packed {} but has no '{}.weight_scale' tensor (missing scale tensor)", file, e.name,
               dtype_name(info.dtype), e.module);
        const int64_t logical = info.dtype == DType::F4_E2M1 ? cols : cols * 2;
        if (sc->dtype == DType::F8_E4M3)
          fail("{}: tensor '{}': FP4 weight with E4M3 block scales (NVFP4) is not supported yet", file, e.name);
        if (info.dtype == DType::I8)
          fail("{}: tensor '{}': I8 weight with scale '{}' (int8 quantization) is not supported", file, e.name,
               sc->name);
        if (sc->dtype != DType::U8 && sc->dtype != DType::F8_E8M0)
          fail("{}: tensor '{}': MXFP4 scale '{}' must be U8 or F8_E8M0, got {}", file, e.name, sc->name,
               dtype_name(sc->dtype));
        if (logical % 32 != 0)
          fail("{}: tensor '{}': MXFP4 in-features {} is not a multiple of 32", file, e.name, logical);
        if (sc->shape.ndim != 2 || sc->shape[0] != rows || sc->shape[1] * 32 != logical)
          fail("{}: tensor '{}': scale shape {} does not match weight {} (expected [{}, {}] for MXFP4 blocks of 32)",
               ckpt.file_of(sc->name), sc->name, shape_str(sc->shape), shape_str(info.shape), rows, logical / 32);
        TensorView sv = ckpt.view(sc->name);
        check_e8m0_scales(sc->name, sv);
        q.format = WeightFormat::MXFP4;
        q.cols = logical;
        q.scale = sv.data;
        e.scheme = fmt::format("{}, e8m0/32", qcfg.method.empty() ? "mx" : qcfg.method);
        e.companions.push_back(sc->name);
        break;
      }
      case DType::F8_E4M3:
      case DType::F8_E4M3FNUZ: {
        q.cols = cols;
        q.fnuz = info.dtype == DType::F8_E4M3FNUZ;
        const TensorInfo* sinv = companion(e.module, ".weight_scale_inv");
        const TensorInfo* s = companion(e.module, ".weight_scale");
        const TensorInfo* sc = sinv ? sinv : s;
        if (!sc)
          fail(
              "{}: tensor '{}' is {} but has neither '{}.weight_scale_inv' nor '.weight_scale' (missing scale "
              "tensor)",
              file, e.name, dtype_name(info.dtype), e.module);
        if (sc->dtype != DType::F32)
          fail("{}: tensor '{}': FP8 scale must be F32, got {}", ckpt.file_of(sc->name), sc->name,
               dtype_name(sc->dtype));
        const int64_t br = qcfg.block_rows, bc = qcfg.block_cols;
        const int64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
        const bool block_shape = sc->shape.ndim == 2 && sc->shape[0] == nbr && sc->shape[1] == nbc;
        const int64_t n = sc->shape.numel();
        if (sinv || (block_shape && n > 1)) {
          if (!block_shape)
            fail("{}: tensor '{}': scale shape {} does not match weight {} with {}x{} blocks (expected [{}, {}])",
                 ckpt.file_of(sc->name), sc->name, shape_str(sc->shape), shape_str(info.shape), br, bc, nbr, nbc);
          q.format = WeightFormat::FP8_E4M3_BLOCK;
          q.block_rows = br;
          q.block_cols = bc;
          e.scheme = std::string(sinv ? "scale_inv" : "scale") + " f32";
          if (br != 128 || bc != 128) e.scheme += fmt::format(", block {}x{}", br, bc);
        } else if (n == 1) {  // per-tensor ([], [1] or [1, 1]: one scale for the whole matrix)
          q.format = WeightFormat::FP8_E4M3_TENSOR;
          e.scheme = "per-tensor f32 scale";
        } else if (n == rows && (sc->shape.ndim == 1 || (sc->shape.ndim == 2 && sc->shape[1] == 1))) {
          q.format = WeightFormat::FP8_E4M3_CHANNEL;
          e.scheme = "per-channel f32 scale";
        } else {
          fail(
              "{}: tensor '{}': scale shape {} fits no FP8 scheme for weight {} (per-tensor [1], per-channel [{}], "
              "block [{}, {}])",
              ckpt.file_of(sc->name), sc->name, shape_str(sc->shape), shape_str(info.shape), rows, nbr, nbc);
        }
        TensorView sv = ckpt.view(sc->name);
        check_f32_scales(sc->name, sv);
        q.scale = sv.data;
        e.companions.push_back(sc->name);
        if (q.fnuz) e.scheme += ", fnuz";
        break;
      }
      default:
        fail("{}: tensor '{}': Linear weight of dtype {} is an unknown combination", file, e.name,
             dtype_name(info.dtype));
    }
    e.stored = q.format;
    e.compute = q.format;
    e.weight = q;
    e.shape = Shape{rows, q.cols};
    e.is_linear = true;
  }
};

}  // namespace

// ----------------------------------------------------------------------------------------------------------------

PrecisionPlan PrecisionPlan::build(const Checkpoint& ckpt, const ModelConfig& cfg, const PlanOptions& opt) {
  PrecisionPlan plan;
  plan.ckpt_ = &ckpt;
  const QuantConfig qcfg = QuantConfig::parse(cfg.quantization_config, ckpt.dir());
  plan.activation_scheme_ = qcfg.activation_scheme;
  Detector det{ckpt, cfg, qcfg};

  std::set<std::string> consumed;  // companions used by some weight
  for (const std::string& name : ckpt.names()) {
    if (is_companion(name)) continue;
    PlanEntry e;
    e.name = name;
    e.module = ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : name;
    const TensorInfo& info = ckpt.info(name);
    e.dtype = info.dtype;
    e.shape = info.shape;
    const int64_t layer = layer_index(name);

    if (layer >= cfg.num_hidden_layers + opt.mtp_layers) {
      e.skipped = true;
      e.skip_reason = layer < cfg.num_hidden_layers + cfg.num_nextn_predict_layers
                          ? "MTP layer (speculative decoding is off)"
                          : "beyond num_hidden_layers + num_nextn_predict_layers";
    } else if (ends_with(name, "rotary_emb.inv_freq")) {
      e.skipped = true;
      e.skip_reason = "recomputed from config";
    } else if (layer >= 0 && layer < cfg.num_hidden_layers && cfg.has_indexer() &&
               name.find(".self_attn.indexer.") != std::string::npos &&
               !cfg.layer_has_indexer[static_cast<size_t>(layer)]) {
      e.skipped = true;
      e.skip_reason = "IndexShare: layer reuses the previous layer's selection";
    }

    const bool linear = ends_with(name, ".weight") && is_linear_module(e.module);
    e.bytes = info.end - info.begin;
    if (linear) {
      det.detect(e);
      for (auto& c : e.companions) e.bytes += ckpt.info(c).end - ckpt.info(c).begin;
      for (auto& c : e.companions) consumed.insert(c);
      // Cross-check against quantization_config.
      const std::optional<bool> cfg_quantized = qcfg.expects_quantized(e.module);
      if (!e.skipped && cfg_quantized && *cfg_quantized != is_quantized(e.stored)) {
        plan.warnings_.push_back(fmt::format(
            "{}: stored {} but quantization_config ({}) {}; using the stored format", e.module,
            weight_format_name(e.stored), qcfg.method,
            *cfg_quantized ? "does not exclude it (expects it quantized)" : "excludes it (expects it unquantized)"));
      } else if (!e.skipped && !qcfg.present && is_quantized(e.stored)) {
        plan.warnings_.push_back(fmt::format("{}: stored {} but config.json has no quantization_config", e.module,
                                             weight_format_name(e.stored)));
      }
    } else {
      // Non-Linear tensors (embeddings, norms, biases) must be plain floats.
      const bool plain = info.dtype == DType::F32 || info.dtype == DType::BF16 || info.dtype == DType::F16;
      if (!plain && !e.skipped)
        fail("{}: tensor '{}' has dtype {}, expected an unquantized float (f32/bf16/f16)", ckpt.file_of(name), name,
             dtype_name(info.dtype));
      e.stored = info.dtype == DType::F32   ? WeightFormat::F32
                 : info.dtype == DType::F16 ? WeightFormat::F16
                                            : WeightFormat::BF16;
      e.compute = e.stored;
    }
    plan.by_name_[e.name] = plan.entries_.size();
    if (e.is_linear) plan.by_module_[e.module] = plan.entries_.size();
    plan.entries_.push_back(std::move(e));
  }
  for (const std::string& name : ckpt.names())
    if (is_companion(name) && !consumed.count(name) && layer_index(name) < cfg.num_hidden_layers + opt.mtp_layers)
      plan.warnings_.push_back(fmt::format("{}: scale tensor has no matching quantized weight; ignored", name));

  apply_quantize_rules(plan.entries_, opt, plan.owned_);
  plan.act_fp8_pow2_ = qcfg.act_pow2;
  for (PlanEntry& e : plan.entries_) {
    if (!e.is_linear || e.skipped || !is_quantized(e.stored) || qcfg.act_declared.empty()) continue;
    e.act_declared = qcfg.act_declared;
    e.act_declared_by = qcfg.act_declared_by;
    if (!qcfg.act_fp8_dynamic)
      e.act_note = "not implemented: latent runs declared activations for fp8 dynamic 1x128 only";
    else if (e.stored != WeightFormat::FP8_E4M3_BLOCK)
      e.act_note = fmt::format("not implemented for {} weights", weight_format_name(e.stored));
    else if (e.transform != "none")
      e.act_note = "the weight is transformed (--quantize)";
    else if (ends_with(e.module, ".kv_b_proj"))
      e.act_note = "kv_b_proj is absorbed into attention (not a linear of its input), as in DeepSeek's inference";
    else if (ends_with(e.module, "lm_head") || ends_with(e.module, ".shared_head.head") ||
             ends_with(e.module, ".mlp.gate") || ends_with(e.module, "embed_tokens"))
      e.act_note = "the head, router and embeddings run at the run's precision";
    else
      e.weight.act_fp8 = true;
  }
  return plan;
}

bool PrecisionPlan::act_fp8_declared() const {
  return std::any_of(entries_.begin(), entries_.end(), [](const PlanEntry& e) { return e.weight.act_fp8; });
}

const PlanEntry* PrecisionPlan::find(const std::string& tensor_name) const {
  auto it = by_name_.find(tensor_name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

const QuantWeight& PrecisionPlan::linear(const std::string& module) const {
  auto it = by_module_.find(module);
  if (it == by_module_.end()) fail("{}: Linear weight '{}.weight' not found in the checkpoint", ckpt_->dir(), module);
  const PlanEntry& e = entries_[it->second];
  if (e.skipped) fail("{}: '{}' is not loaded ({})", ckpt_->dir(), e.name, e.skip_reason);
  return e.weight;
}

TensorView PrecisionPlan::tensor(const std::string& tensor_name) const {
  const PlanEntry* e = find(tensor_name);
  if (!e) fail("{}: tensor '{}' not found in the checkpoint", ckpt_->dir(), tensor_name);
  return ckpt_->view(tensor_name);
}

bool PrecisionPlan::lossy() const {
  return std::any_of(entries_.begin(), entries_.end(), [](const PlanEntry& e) { return e.transform != "none"; });
}

}  // namespace latent
