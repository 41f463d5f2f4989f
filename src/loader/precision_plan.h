// PrecisionPlan: for every logical weight of a checkpoint, the format it is stored in (decided from the
// safetensors dtypes and companion scale tensors — the header dtype is ground truth), the format it is computed
// in (never lower than stored), and any transform the user asked for (--quantize), with its measured error.
// docs/quantization.md §policy, §detection, §transforms.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "quant/weight_format.h"

namespace latent {

// One user rule: --quantize PATTERN=FORMAT (PATTERN a glob over module names, e.g. "*.kv_b_proj").
struct QuantizeRule {
  std::string pattern;
  WeightFormat format = WeightFormat::BF16;
  static QuantizeRule parse(const std::string& text);  // throws Error on a bad rule
};

struct PlanOptions {
  std::vector<QuantizeRule> quantize;
  double max_quant_error = 0.05;
  bool allow_lossy = false;
  // Multi-token-prediction layers to load (speculative decoding): the tensors of layers L .. L + mtp_layers - 1
  // (L = num_hidden_layers) get formats like any other instead of being skipped.
  int64_t mtp_layers = 0;
};

struct PlanEntry {
  std::string name;          // checkpoint tensor name, e.g. "model.layers.3.mlp.experts.7.up_proj.weight"
  std::string module;        // module name, e.g. "model.layers.3.mlp.experts.7.up_proj" (the name without ".weight")
  Shape shape;               // logical [out, in] for Linear weights, else the tensor's shape
  DType dtype = DType::F32;  // safetensors dtype of the main tensor
  WeightFormat stored = WeightFormat::F32;
  WeightFormat compute = WeightFormat::F32;
  std::string scheme;                   // human detail: "quark, e8m0/32", "fp8 block 128x128, scale_inv f32", ""
  std::vector<std::string> companions;  // scale tensors used, e.g. "...weight_scale_inv"
  std::string transform = "none";       // "none" or e.g. "bf16->mxfp4 (user --quantize)"
  double rel_error = 0.0;               // relative Frobenius error of the transform (0 when none)
  uint64_t bytes = 0;                   // bytes as computed: checkpoint bytes of the tensor + companions, or the
                                        // transformed codes + scales
  bool skipped = false;                 // MTP layer / unused tensor: not loaded
  std::string skip_reason;
  // Activations (docs/quantization.md §declared-activations): what the checkpoint declares for this module's input
  // ("" = nothing: an unquantized module or a weight-only checkpoint; e.g. "fp8 dynamic 1x128"), the config field
  // that says so, and, when it declares something latent does not run as declared even with --activations
  // declared, why (weight.act_fp8 is set where it does run it).
  std::string act_declared;
  std::string act_declared_by;
  std::string act_note;
  bool is_linear = false;  // a Linear weight [out, in] usable as QuantWeight
  QuantWeight weight;      // view for compute (points into the mmap or into owned transform storage)
};

class PrecisionPlan {
 public:
  // Decides every tensor's format. Throws Error naming the tensor on an unknown combination, a missing or
  // malformed scale tensor, or (without allow_lossy) a transform whose error exceeds max_quant_error.
  static PrecisionPlan build(const Checkpoint& ckpt, const ModelConfig& cfg, const PlanOptions& opt = {});

  const std::vector<PlanEntry>& entries() const { return entries_; }
  // Entry by checkpoint tensor name ("...weight"); nullptr when absent.
  const PlanEntry* find(const std::string& tensor_name) const;
  // Linear weight of a module ("model.layers.0.self_attn.q_a_proj"); throws Error when absent / not linear.
  const QuantWeight& linear(const std::string& module) const;
  // Any non-Linear tensor (norm weights, biases, embeddings); throws Error when absent.
  TensorView tensor(const std::string& tensor_name) const;
  bool has(const std::string& tensor_name) const { return find(tensor_name) != nullptr; }
  // The checkpoint's directory (for error messages).
  const std::string& dir() const { return ckpt_->dir(); }

  const std::vector<std::string>& warnings() const { return warnings_; }
  std::string activation_scheme() const { return activation_scheme_; }
  // Some module can run declared FP8 activations (weight.act_fp8); their scales are powers of two (ue8m0).
  bool act_fp8_declared() const;
  bool act_fp8_pow2() const { return act_fp8_pow2_; }
  bool lossy() const;  // any transform applied

 private:
  const Checkpoint* ckpt_ = nullptr;
  std::vector<PlanEntry> entries_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, size_t> by_module_;
  std::vector<std::string> warnings_;
  std::string activation_scheme_;
  bool act_fp8_pow2_ = false;
  std::vector<std::shared_ptr<void>> owned_;  // storage of transformed weights
};

}  // namespace latent
