#include "cli/model_flags.h"

#include <cmath>

#include "cli/commands.h"
#include "core/error.h"

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
  cmd->add_option("--threads", threads, "Worker threads (0 = all cores)");
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

ParallelConfig ModelFlags::parallel() const {
  return parallel_config(tensor_parallel_size, expert_parallel, expert_parallel_size);
}

bool ModelFlags::bf16_activations(const std::string& activations) const {
  if (activations.empty()) return device == "cuda";
  if (activations != "fp32" && activations != "bf16")
    fail("--activations must be fp32 or bf16 (got '{}')", activations);
  return activations == "bf16";
}

std::string ModelFlags::activations_line(const std::string& activations) const {
  const bool bf16 = bf16_activations(activations);
  if (!activations.empty()) return fmt::format("activations: {} (--activations {})", bf16 ? "bf16" : "fp32", activations);
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
  return o;
}

std::string ModelFlags::model_dir() const { return resolve_model_dir(model); }

}  // namespace latent::cli
