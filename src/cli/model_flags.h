// Flags shared by every command that loads a model (plan, run, logits, serve, fidelity), with one meaning:
//   --model DIR            the Hugging Face checkpoint (default: the bundled demo model)
//   --quantize PAT=FMT     opt-in lossy transform applied at load (repeatable; nothing is transformed without it)
//   --max-quant-error E    refuse a --quantize transform whose relative weight error exceeds E (default 0.05)
//   --allow-lossy          lift that guard (the plan says so)
//   --threads N            worker threads (0 = the CPUs this process may use: affinity mask, cgroup quota)
//   --device cpu|cuda      where the model runs (default cpu; cuda needs a CUDA build and a GPU: a clear error
//                          otherwise)
// and, for run / serve / plan (add_parallel_to; model/shard.h):
//   --tensor-parallel-size N   N ranks (GPUs; threads on the CPU): attention heads, dense MLP, shared experts,
//                              embedding and lm_head split over them
//   --expert-parallel          the routed experts spread over those ranks (whole experts) instead of split
//   --expert-parallel-size N   N ranks with only the routed experts spread (attention replicated)
// and, for run / serve / plan (add_speculative_to): speculative decoding with the checkpoint's MTP layer
//   --speculative-config JSON      vLLM's keys: {"method": "mtp" | "deepseek_mtp", "num_speculative_tokens": N,
//                                  "disable_by_batch_size": B (optional)}
//   --num-speculative-tokens N     the same as {"method": "mtp", "num_speculative_tokens": N}
//   --speculative-disable-batch-size B   no drafts while more than B sequences decode (serve: measured if absent)
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "loader/precision_plan.h"
#include "model/shard.h"

namespace latent::cli {

struct ModelFlags {
  std::string model;
  std::vector<std::string> quantize;
  double max_quant_error = 0.05;
  bool allow_lossy = false;
  int threads = 0;
  std::string device = "cpu";
  int tensor_parallel_size = 1;
  bool expert_parallel = false;
  int expert_parallel_size = 0;
  std::string speculative_config;
  int num_speculative_tokens_flag = -1;
  int speculative_disable_batch = -1;

  // The activation mode of a command's --activations value: fp32 or bf16 as given; empty (not given) or declared:
  // the device's default, bf16 (fp32 accumulation) on cuda, fp32 on cpu. Throws Error on another value.
  bool bf16_activations(const std::string& activations) const;
  // --activations declared (docs/quantization.md §declared-activations): the linears whose checkpoint declares
  // dynamic FP8 activations run them (ModelOptions::act_fp8_declared), the rest in the device's default dtype.
  static bool declared_activations(const std::string& activations) { return activations == "declared"; }
  // ModelOptions::act_fp8_declared for this plan: declared and some module of the checkpoint declares FP8
  // activations latent runs; when declared but none does, says so in one log line (the run is the default one).
  bool act_fp8_declared(const std::string& activations, const PrecisionPlan& plan) const;
  // One line for the plan / load log: the activation mode and where it came from.
  std::string activations_line(const std::string& activations) const;

  // The backend to make: "cuda" for --device cuda, else the command's CPU backend choice (cpu or ref).
  std::string backend_name(const std::string& cpu_backend = "cpu") const;
  void add_to(CLI::App* cmd, bool model_required = false);
  void add_parallel_to(CLI::App* cmd);
  void add_speculative_to(CLI::App* cmd);
  // Draft tokens per step from --speculative-config / --num-speculative-tokens (0: off); throws Error on a bad
  // value, an unknown key or method, or the two flags disagreeing.
  int64_t num_speculative_tokens() const;
  // disable_by_batch_size / --speculative-disable-batch-size (-1: not given).
  int64_t speculative_disable_batch_size() const;
  // Some speculative flag was given (even with 0 tokens).
  bool speculation_flags_given() const { return !speculative_config.empty() || num_speculative_tokens_flag >= 0; }
  ParallelConfig parallel() const;   // validates the parallel flags (throws Error)
  PlanOptions plan_options() const;  // parses --quantize rules (throws Error on a bad one); MTP layer with speculation
  std::string model_dir() const;     // --model or the bundled default
};

}  // namespace latent::cli
