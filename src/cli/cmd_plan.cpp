// latent plan [--model DIR] [--json] [--quantize PAT=FMT ...]: the precision plan of a checkpoint.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "loader/plan_report.h"
#include "loader/precision_plan.h"
#include "model/shard.h"
#include "model/weights.h"

namespace latent::cli {

void register_plan(CLI::App& app) {
  struct Opts {
    ModelFlags model;
    bool json = false;
    std::string activations;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("plan",
                                 "Print the precision plan: per tensor stored / compute format, transform, "
                                 "measured error");
  opts->model.add_to(cmd);
  opts->model.add_parallel_to(cmd);
  opts->model.add_speculative_to(cmd);
  cmd->add_flag("--json", opts->json, "One JSON object per weight tensor");
  cmd->add_option("--activations", opts->activations,
                  "fp32, bf16 or declared: the activation mode the plan reports per module "
                  "(default: bf16 on --device cuda, fp32 on cpu)");
  cmd->callback([opts]() {
    // Every flag is checked before the checkpoint is read, whatever the output form.
    const PlanOptions popt = opts->model.plan_options();
    const ParallelConfig pc = opts->model.parallel();
    const std::string activations_line = opts->model.activations_line(opts->activations);
    const std::string dir = opts->model.model_dir();
    const ModelConfig cfg = load_model_config(dir);
    const Checkpoint ckpt = Checkpoint::open(dir);
    const PrecisionPlan plan = PrecisionPlan::build(ckpt, cfg, popt);
    PlanActivations run;
    run.dtype = opts->model.bf16_activations(opts->activations) ? "bf16" : "fp32";
    run.declared = opts->model.act_fp8_declared(opts->activations, plan);
    // As strict as the load: every tensor the config implies, with its shape (the check Model runs).
    resolve_weights(cfg, plan, popt.mtp_layers);
    std::vector<std::string> warnings = plan.warnings();
    if (popt.mtp_layers == 0 && cfg.num_nextn_predict_layers > 0) {
      const std::vector<std::string> mtp_missing = missing_tensors(cfg, plan, cfg.num_nextn_predict_layers);
      if (!mtp_missing.empty())
        warnings.push_back(fmt::format(
            "config.json announces {} MTP layer(s) (num_nextn_predict_layers) but {} of their tensors are missing, "
            "the first '{}': speculative decoding would be refused",
            cfg.num_nextn_predict_layers, mtp_missing.size(), mtp_missing.front()));
    }
    if (opts->json) {
      nlohmann::json arr = plan_to_json(plan, run);
      if (popt.allow_lossy)
        for (auto& o : arr)
          if (o["transform"] != "none" && o["rel_error"].get<double>() > popt.max_quant_error)
            o["guard"] = "lifted by --allow-lossy";
      if (pc.active()) {  // {"plan": [...], "parallel": ..., "sharding": [...]} when a parallel layout is asked for
        nlohmann::json out;
        out["plan"] = std::move(arr);
        out["parallel"] = pc.describe();
        out["sharding"] = nlohmann::json::parse(format_sharding_json(cfg, plan, pc));
        std::printf("%s\n", out.dump(1).c_str());
      } else {
        std::printf("%s\n", arr.dump(1).c_str());
      }
      for (const auto& w : warnings) std::fprintf(stderr, "latent: warning: %s\n", w.c_str());
    } else {
      const std::string sharding = pc.active() ? format_sharding_text(cfg, plan, pc) : "";  // may refuse: print after
      std::printf("%s", format_plan_text(plan, cfg, dir, popt.allow_lossy, run).c_str());
      for (size_t i = plan.warnings().size(); i < warnings.size(); ++i)
        std::printf("warning      %s\n", warnings[i].c_str());
      std::printf("%s\n", activations_line.c_str());
      std::printf("%s", sharding.c_str());
    }
  });
}

}  // namespace latent::cli
