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

namespace latent::cli {

void register_plan(CLI::App& app) {
  struct Opts {
    ModelFlags model;
    bool json = false;
    std::string activations;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("plan", "Print the precision plan: per tensor stored / compute format, transform, "
                                         "measured error");
  opts->model.add_to(cmd);
  opts->model.add_parallel_to(cmd);
  opts->model.add_speculative_to(cmd);
  cmd->add_flag("--json", opts->json, "One JSON object per weight tensor");
  cmd->add_option("--activations", opts->activations, "fp32 or bf16: the activation mode the plan line reports "
                                                      "(default: bf16 on --device cuda, fp32 on cpu)");
  cmd->callback([opts]() {
    const std::string dir = opts->model.model_dir();
    const ModelConfig cfg = load_model_config(dir);
    const Checkpoint ckpt = Checkpoint::open(dir);
    const PlanOptions popt = opts->model.plan_options();
    const PrecisionPlan plan = PrecisionPlan::build(ckpt, cfg, popt);
    if (popt.mtp_layers > 0 &&
        (cfg.num_nextn_predict_layers < 1 || !plan.has(fmt::format("model.layers.{}.eh_proj.weight", cfg.num_hidden_layers))))
      fail("speculative decoding (method mtp): {} has no MTP layer (config.json num_nextn_predict_layers {}, tensor "
           "'model.layers.{}.eh_proj.weight' {})", dir, cfg.num_nextn_predict_layers, cfg.num_hidden_layers,
           plan.has(fmt::format("model.layers.{}.eh_proj.weight", cfg.num_hidden_layers)) ? "present" : "absent");
    const ParallelConfig pc = opts->model.parallel();
    if (opts->json && pc.active()) {
      // {"plan": [...], "sharding": [...]} when a parallel layout is asked for.
      nlohmann::json out;
      out["plan"] = plan_to_json(plan);
      out["parallel"] = pc.describe();
      out["sharding"] = nlohmann::json::parse(format_sharding_json(cfg, plan, pc));
      std::printf("%s\n", out.dump(1).c_str());
      return;
    }
    if (opts->json) {
      nlohmann::json arr = plan_to_json(plan);
      if (popt.allow_lossy)
        for (auto& o : arr)
          if (o["transform"] != "none" && o["rel_error"].get<double>() > popt.max_quant_error)
            o["guard"] = "lifted by --allow-lossy";
      std::printf("%s\n", arr.dump(1).c_str());
      for (const auto& w : plan.warnings()) std::fprintf(stderr, "latent: warning: %s\n", w.c_str());
    } else {
      std::printf("%s", format_plan_text(plan, cfg, dir, popt.allow_lossy).c_str());
      std::printf("%s\n", opts->model.activations_line(opts->activations).c_str());
      if (pc.active()) std::printf("%s", format_sharding_text(cfg, plan, pc).c_str());
    }
  });
}

}  // namespace latent::cli
