// Flags shared by every command that loads a model: --model, --quantize (repeatable), --max-quant-error,
// --allow-lossy, --threads.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "loader/precision_plan.h"

namespace latent::cli {

struct ModelFlags {
  std::string model;
  std::vector<std::string> quantize;
  double max_quant_error = 0.05;
  bool allow_lossy = false;
  int threads = 0;

  void add_to(CLI::App* cmd, bool model_required = false);
  PlanOptions plan_options() const;  // parses --quantize rules (throws Error on a bad one)
  std::string model_dir() const;     // --model or the bundled default
};

}  // namespace latent::cli
