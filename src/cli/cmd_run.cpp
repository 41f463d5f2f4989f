// latent run [--model DIR] (--prompt TEXT | --prompt-tokens IDS) [--max-tokens N] [--temperature T] [--seed S]
// Plain generation without a chat template: prints the generated ids (one line, streamed), then their text on a
// second line when the model directory has a tokenizer.json. --prompt is encoded with add_special_tokens (the
// post-processor's BOS, as HF tokenizer(text) does).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "model/generate.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace latent::cli {

void register_run(CLI::App& app) {
  struct Opts {
    ModelFlags model;
    std::string prompt, prompt_tokens, activations = "fp32", backend = "cpu";
    int64_t max_tokens = 16;
    double temperature = 0.0;
    uint64_t seed = 0;
    bool ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("run", "One plain generation on the terminal (no chat template)");
  o->model.add_to(cmd);
  auto* p_text = cmd->add_option("--prompt", o->prompt, "Prompt text (needs tokenizer.json)");
  auto* p_ids = cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt token ids, e.g. \"1 2 3\"");
  p_text->excludes(p_ids);
  cmd->add_option("--max-tokens", o->max_tokens, "Number of tokens to generate (default 16)");
  cmd->add_option("--temperature", o->temperature, "0 = greedy (default)");
  cmd->add_option("--seed", o->seed, "Sampling seed");
  cmd->add_option("--activations", o->activations, "fp32 (default) or bf16");
  cmd->add_option("--backend", o->backend, "ref or cpu (default)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at an end-of-sequence token");
  cmd->callback([o]() {
    if (o->prompt.empty() && o->prompt_tokens.empty()) fail("run: give --prompt TEXT or --prompt-tokens IDS");
    if (o->max_tokens < 0) fail("--max-tokens must be >= 0 (got {})", o->max_tokens);
    if (o->temperature < 0) fail("--temperature must be >= 0 (got {})", o->temperature);
    if (o->activations != "fp32" && o->activations != "bf16")
      fail("--activations must be fp32 or bf16 (got '{}')", o->activations);
    const std::string dir = o->model.model_dir();
    const bool have_tok = std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json");
    std::optional<Tokenizer> tok;
    if (have_tok) tok = Tokenizer::from_file(dir);
    std::vector<int32_t> prompt;
    if (!o->prompt_tokens.empty()) {
      prompt = parse_token_ids(o->prompt_tokens);
    } else {
      if (!tok) fail("run: --prompt needs {}/tokenizer.json; use --prompt-tokens", dir);
      prompt = tok->encode(o->prompt, true);
    }
    if (prompt.empty()) fail("run: the prompt has no tokens");
    ModelFiles mf = open_model_files(dir, o->model.plan_options());
    for (const auto& w : mf.plan->warnings()) std::fprintf(stderr, "latent: warning: %s\n", w.c_str());
    auto be = make_backend(o->backend, o->model.threads);
    ModelOptions mo;
    mo.bf16_activations = o->activations == "bf16";
    Model model(*mf.cfg, *mf.plan, *be, mo);
    GenerateOptions g;
    g.max_new_tokens = o->max_tokens;
    g.temperature = o->temperature;
    g.seed = o->seed;
    if (!o->ignore_eos) g.stop_ids = mf.cfg->eos_token_ids;
    if (o->max_tokens == 0) {
      std::printf("\n");
      return;
    }
    bool first = true;
    const std::vector<int32_t> out = generate(model, prompt, g, [&](int32_t id) {
      std::printf(first ? "%d" : " %d", id);
      std::fflush(stdout);
      first = false;
    });
    std::printf("\n");
    if (tok) std::printf("%s\n", tok->decode(out).c_str());
  });
}

}  // namespace latent::cli
