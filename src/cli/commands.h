// Subcommand registration. Each cmd_*.cpp defines one register_<name>(CLI::App&) that adds its subcommand and
// a callback; callbacks throw latent::Error on failure (main prints it as one line, exit 1).
#pragma once
#include <CLI/CLI.hpp>

namespace latent::cli {

void register_all(CLI::App& app);
int exit_code();  // exit status set by the command that ran (default 0)
void set_exit_code(int code);
// Model directory given by --model, or the bundled default model when empty.
std::string resolve_model_dir(const std::string& flag);

void register_plan(CLI::App& app);
void register_logits(CLI::App& app);
void register_run(CLI::App& app);
void register_serve(CLI::App& app);
void register_fidelity(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_detokenize(CLI::App& app);
void register_render(CLI::App& app);

}  // namespace latent::cli
