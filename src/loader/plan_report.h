// Human and JSON views of a PrecisionPlan (used by `latent plan`, the server start log and /v1/models).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "loader/precision_plan.h"

namespace latent {

struct PlanGroup {
  std::string pattern;    // e.g. "model.layers.{1-3}.mlp.experts.*.{gate,up,down}_proj.weight"
  std::string stored;     // "mxfp4 (quark, e8m0/32)"
  std::string compute;    // "mxfp4 -> fp32 in registers"
  std::string transform;  // "none" or the transform
  int64_t tensors = 0;
  int64_t params = 0;
  uint64_t bytes = 0;
  double max_rel_error = 0.0;
};

// Groups entries whose names differ only by layer / expert index (and then by projection name) and that share
// stored / compute / transform. Skipped tensors (MTP, IndexShare) are grouped with transform "skipped: <why>".
std::vector<PlanGroup> group_plan(const PrecisionPlan& plan);

// The run's activation mode, for the per-module activation lines: the float dtype of every activation ("fp32" or
// "bf16") and whether --activations declared is on (docs/quantization.md §declared-activations).
struct PlanActivations {
  std::string dtype = "fp32";
  bool declared = false;
};
// What a Linear entry's input runs in under `run`, and where that comes from: e.g. "fp8 dynamic 1x128 (checkpoint
// declares it: quantization_config.activation_scheme; --activations declared)" or "bf16 (run default, above the
// declared fp8 dynamic 1x128 (quantization_config.activation_scheme); --activations declared runs it)".
std::string activation_label(const PlanEntry& e, const PlanActivations& run);

// The table printed by `latent plan` (groups, totals per stored format, activation scheme, the activations of the
// Linear modules grouped like the table, warnings).
std::string format_plan_text(const PrecisionPlan& plan, const ModelConfig& cfg, const std::string& model_dir,
                             bool allow_lossy, const PlanActivations& run = {});

// One object per weight tensor: name, shape, dtype, stored, compute, transform, rel_error, scheme, companions,
// skipped (+ skip_reason); Linear entries also "activations": {runs, source, declared, declared_by, note}.
nlohmann::json plan_to_json(const PrecisionPlan& plan, const PlanActivations& run = {});

// Short summary for /v1/models and logs: {"weights": {"mxfp4": params, ...}, "lossy_transforms": [...], ...}.
nlohmann::json plan_summary(const PrecisionPlan& plan);

// Bytes the entry occupies in the checkpoint (weight + companions).
uint64_t entry_bytes(const PrecisionPlan& plan, const PlanEntry& e);

}  // namespace latent
