#include "cli/model_flags.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

namespace latent::cli {

void ModelFlags::add_to(CLI::App* cmd, bool model_required) {
  auto* m = cmd->add_option("--model", model, "Hugging Face model directory (default: the bundled demo model)");
  if (model_required) m->required();
  cmd->add_option("--quantize", quantize,
                  "Opt-in lossy transform PATTERN=FORMAT (repeatable), FORMAT one of mxfp4, fp8_e4m3_tensor, "
                  "fp8_e4m3_block128, bf16; PATTERN a module glob such as '*.kv_b_proj'");
  cmd->add_option("--max-quant-error", max_quant_error,
                  "Refuse any --quantize transform whose relative Frobenius error exceeds this (default 0.05)");
  cmd->add_flag("--allow-lossy", allow_lossy, "Lift the --max-quant-error guard on --quantize (the plan says so)");
  cmd->add_option("--threads", threads,
                  "Worker threads (0 = the CPUs this process may use: affinity mask, cgroup quota)");
  cmd->add_option("--device", device, "cpu (default) or cuda (the CUDA backend on GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

void ModelFlags::add_parallel_to(CLI::App* cmd) {
  cmd->add_option("--tensor-parallel-size", tensor_parallel_size,
                  "Ranks (GPUs; threads on the CPU) to split attention heads, MLPs, embedding and lm_head over "
                  "(default 1)");
  cmd->add_flag("--expert-parallel", expert_parallel,
                "Spread the routed experts over the --tensor-parallel-size ranks (whole experts per rank)");
  cmd->add_option("--expert-parallel-size", expert_parallel_size,
                  "Ranks to spread only the routed experts over (attention replicated); excludes "
                  "--tensor-parallel-size");
}

void ModelFlags::add_speculative_to(CLI::App* cmd) {
  cmd->add_option("--speculative-config", speculative_config,
                  "Speculative decoding as JSON with vLLM's keys: {\"method\": \"mtp\" (or \"deepseek_mtp\"), "
                  "\"num_speculative_tokens\": N, \"disable_by_batch_size\": B} (the checkpoint's MTP layer drafts)");
  cmd->add_option("--num-speculative-tokens", num_speculative_tokens_flag,
                  "Draft tokens per step from the checkpoint's MTP layer (0 = off); the same as --speculative-config "
                  "'{\"method\": \"mtp\", \"num_speculative_tokens\": N}'");
  cmd->add_option("--speculative-disable-batch-size", speculative_disable_batch,
                  "No drafts while more than this many sequences decode (serve: measured at start when not given)");
}

namespace {

struct SpecConfig {
  int64_t k = -1, disable = -1;
};

SpecConfig parse_spec_config(const std::string& text) {
  SpecConfig c;
  if (text.empty()) return c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("--speculative-config: not valid JSON ({})", e.what());
  }
  if (!j.is_object()) fail("--speculative-config: expected a JSON object, got {}", j.dump());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "method") {
      if (!it->is_string() || (it->get<std::string>() != "mtp" && it->get<std::string>() != "deepseek_mtp"))
        fail(
            "--speculative-config: method {} is not supported (\"mtp\" or \"deepseek_mtp\": the checkpoint's "
            "multi-token-prediction layer)",
            it->dump());
    } else if (k == "num_speculative_tokens" || k == "disable_by_batch_size") {
      if (!it->is_number_integer() || it->get<int64_t>() < 0)
        fail("--speculative-config: {} must be an integer >= 0 (got {})", k, it->dump());
      (k == "num_speculative_tokens" ? c.k : c.disable) = it->get<int64_t>();
    } else {
      fail("--speculative-config: key '{}' is not supported (method, num_speculative_tokens, disable_by_batch_size)",
           k);
    }
  }
  if (!j.contains("method")) fail("--speculative-config: \"method\" is required (\"mtp\")");
  if (c.k < 0) fail("--speculative-config: \"num_speculative_tokens\" is required");
  return c;
}

}  // namespace

int64_t ModelFlags::num_speculative_tokens() const {
  const SpecConfig c = parse_spec_config(speculative_config);
  if (num_speculative_tokens_flag < -1 || num_speculative_tokens_flag > 16)
    fail("--num-speculative-tokens must be in [0, 16] (got {})", num_speculative_tokens_flag);
  if (c.k > 16) fail("--speculative-config: num_speculative_tokens must be in [0, 16] (got {})", c.k);
  if (c.k >= 0 && num_speculative_tokens_flag >= 0 && c.k != num_speculative_tokens_flag)
    fail("--num-speculative-tokens {} disagrees with --speculative-config num_speculative_tokens {}",
         num_speculative_tokens_flag, c.k);
  return c.k >= 0 ? c.k : std::max(num_speculative_tokens_flag, 0);
}

int64_t ModelFlags::speculative_disable_batch_size() const {
  const SpecConfig c = parse_spec_config(speculative_config);
  if (speculative_disable_batch < -1)
    fail("--speculative-disable-batch-size must be >= 0 (got {})", speculative_disable_batch);
  if (c.disable >= 0 && speculative_disable_batch >= 0 && c.disable != speculative_disable_batch)
    fail("--speculative-disable-batch-size {} disagrees with --speculative-config disable_by_batch_size {}",
         speculative_disable_batch, c.disable);
  return c.disable >= 0 ? c.disable : speculative_disable_batch;
}

ParallelConfig ModelFlags::parallel() const {
  return parallel_config(tensor_parallel_size, expert_parallel, expert_parallel_size);
}

bool ModelFlags::bf16_activations(const std::string& activations) const {
  if (activations.empty() || activations == "declared") return device == "cuda";
  if (activations != "fp32" && activations != "bf16")
    fail("--activations must be fp32, bf16 or declared (got '{}')", activations);
  return activations == "bf16";
}

bool ModelFlags::act_fp8_declared(const std::string& activations, const PrecisionPlan& plan) const {
  if (!declared_activations(activations)) return false;
  if (plan.act_fp8_declared()) return true;
  log::info(
      "--activations declared: {}; no module runs declared FP8 activations, so every activation is {} (the "
      "default)",
      plan.activation_scheme(), bf16_activations(activations) ? "bf16" : "fp32");
  return false;
}

std::string ModelFlags::activations_line(const std::string& activations) const {
  const bool bf16 = bf16_activations(activations);
  if (declared_activations(activations))
    return fmt::format(
        "activations: declared (--activations declared): the linears whose checkpoint declares dynamic FP8 "
        "activations quantize their input as declared (per token, 1x128 groups, e4m3); everything else {}",
        bf16 ? "bf16 with fp32 accumulation (the default on --device cuda)" : "fp32 (the default on --device cpu)");
  if (!activations.empty())
    return fmt::format("activations: {} (--activations {})", bf16 ? "bf16" : "fp32", activations);
  return bf16 ? "activations: bf16 with fp32 accumulation (the default on --device cuda; --activations fp32 for the "
                "exactness mode)"
              : "activations: fp32 (the default on --device cpu; --activations bf16 rounds as HF bf16 runs do)";
}

std::string ModelFlags::backend_name(const std::string& cpu_backend) const {
  if (device == "cuda") {
    if (cpu_backend == "ref") fail("--device cuda and --backend ref exclude each other (ref is the CPU oracle)");
    return "cuda";
  }
  return cpu_backend;
}

PlanOptions ModelFlags::plan_options() const {
  if (!(max_quant_error >= 0.0) || !std::isfinite(max_quant_error))
    fail("--max-quant-error must be a finite number >= 0 (got {})", max_quant_error);
  PlanOptions o;
  for (const auto& q : quantize) o.quantize.push_back(QuantizeRule::parse(q));
  o.max_quant_error = max_quant_error;
  o.allow_lossy = allow_lossy;
  o.mtp_layers = num_speculative_tokens() > 0 ? 1 : 0;
  return o;
}

std::string ModelFlags::model_dir() const { return resolve_model_dir(model); }

}  // namespace latent::cli
