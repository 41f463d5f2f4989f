// Fidelity: compares two precision plans of one checkpoint (docs/quantization.md §errors; docs/fidelity.md).
// For each prompt: per-layer relative error of the residual stream (candidate vs baseline),
// KL divergence and top-1 agreement of the next-token distributions along the prompt (teacher-forced), the first
// step at which the greedy continuations diverge, and whether each continuation fell into a repetition loop; and,
// when the checkpoint has an MTP layer, each plan's MTP draft acceptance per draft position (mtp_drafts_along:
// teacher-forced along the plan's own greedy continuation, see MtpAcceptance).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loader/precision_plan.h"
#include "runtime/repetition.h"

namespace latent {

struct FidelityOptions {
  // --quantize: transforms applied to BOTH plans, under the same guard as every other command (a transform whose
  // error exceeds max_quant_error is refused unless allow_lossy).
  std::vector<QuantizeRule> shared;
  double max_quant_error = 0.05;
  bool allow_lossy = false;
  // The plans compared, on top of `shared` (a side rule wins where both match). Measured on purpose, so not
  // refused by the guard; tensors over max_quant_error are flagged in the report.
  std::vector<QuantizeRule> baseline;   // empty = as stored
  std::vector<QuantizeRule> candidate;  // empty = as stored
  // Each plan's activations: "" or "fp32" (the exactness mode), "bf16", or "declared" (fp32, and the linears whose
  // checkpoint declares dynamic FP8 activations quantize their input as declared;
  // docs/fidelity.md §declared-activations).
  std::string baseline_activations, candidate_activations;
  int64_t max_tokens = 32;  // greedy continuation length
  int threads = 0;
  std::string backend = "cpu";    // "cpu" or "cuda" (--device)
  std::vector<int64_t> stop_ids;  // greedy continuations end at one of these (EOS); empty = never
  // Draft positions of the MTP acceptance (0: not measured). The checkpoint must have an MTP layer when > 0; it is
  // then part of both plans (their rules apply to it too).
  int64_t mtp_drafts = 0;
};

// MTP draft acceptance of one plan, greedy, per draft position j = 1..k: at every position q of the plan's own
// greedy continuation g_0 .. g_{n-1} (slot q pairs the main model's head-input row of q-1 with the token at q; the
// first slot is that of g_0), the MTP layer makes k recursive drafts; draft j proposes the token at q + j and is
// counted (proposed) while that token is in the continuation, and accepted when drafts 1..j all equal the
// continuation's tokens: what greedy verification would accept there. accepted[j-1] / proposed[j-1].
struct MtpAcceptance {
  std::vector<int64_t> proposed, accepted;  // [k]
  double rate(size_t j) const {
    return proposed[j] ? static_cast<double>(accepted[j]) / static_cast<double>(proposed[j]) : 0.0;
  }
  void add(const MtpAcceptance& o);
};

struct TensorError {
  std::string name;
  std::string transform;
  double rel_error = 0.0;
  bool over_budget = false;  // rel_error > FidelityOptions::max_quant_error
};

struct PromptFidelity {
  std::string label;  // prompt text or "ids:…"
  std::vector<int32_t> prompt;
  std::vector<double> layer_rel_error;  // [L+1]: embeddings, decoder layers 1..L-1, final-norm output
  double kl_mean = 0.0, kl_max = 0.0;   // KL(p_baseline || p_candidate) per position, nats
  double top1_agreement = 1.0;          // fraction of prompt positions with the same argmax
  std::vector<int32_t> greedy_baseline, greedy_candidate;
  int64_t diverge_step = -1;  // first index where the continuations differ; -1 when equal over the shorter length
  std::optional<LoopInfo> loop_baseline, loop_candidate;
  MtpAcceptance mtp_baseline, mtp_candidate;  // empty vectors when not measured
};

struct FidelityReport {
  std::string model_dir;
  double max_quant_error = 0.05;
  std::vector<TensorError> baseline_transforms, candidate_transforms;
  std::vector<PromptFidelity> prompts;
  std::vector<double> mean_layer_rel_error;   // over prompts
  int64_t mtp_drafts = 0;                     // 0: no MTP acceptance measured
  MtpAcceptance mtp_baseline, mtp_candidate;  // over all prompts
  // Each plan's activations as run ("fp32", "bf16", "declared fp8 on N linears + fp32"), and the linears whose
  // input the candidate / baseline quantizes as declared.
  std::string baseline_activations = "fp32", candidate_activations = "fp32";
  int64_t baseline_declared_linears = 0, candidate_declared_linears = 0;
};

// Builds both plans (the guard applies to opt.shared only: fidelity measures lossy side rules on purpose) and runs
// every prompt through both models.
FidelityReport run_fidelity(const std::string& model_dir, const std::vector<std::vector<int32_t>>& prompts,
                            const std::vector<std::string>& labels, const FidelityOptions& opt);

std::string fidelity_table(const FidelityReport& r);
// "PATTERN=FORMAT, …" or "as stored" when empty.
std::string rules_text(const std::vector<QuantizeRule>& rules);
nlohmann::json fidelity_json(const FidelityReport& r);

// Numerics shared with tests.
double relative_error(const float* ref, const float* x, size_t n);              // ||x - ref|| / ||ref||
double kl_divergence(const float* logits_p, const float* logits_q, int64_t n);  // KL(softmax p || softmax q)
// The acceptance of one continuation from the drafts after each of its slots (drafts[q][j-1] proposes
// continuation[q + j]; rows q = 0 .. n-1, k columns), as MtpAcceptance defines it.
MtpAcceptance mtp_acceptance(const std::vector<int32_t>& continuation, const std::vector<int32_t>& drafts, int64_t k);

}  // namespace latent
