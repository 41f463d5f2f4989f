#include "cli/commands.h"

#include <filesystem>

#include "core/error.h"

namespace latent::cli {

namespace {
int g_exit = 0;
}
int exit_code() { return g_exit; }
void set_exit_code(int code) { g_exit = code; }

std::string resolve_model_dir(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* e = std::getenv("LATENT_MODEL")) return e;
  // The bundled default model, next to the source tree the binary was built from.
  std::string d = LATENT_DEFAULT_MODEL_DIR;
  if (!std::filesystem::exists(d)) fail("no --model given and the bundled default model {} is missing", d);
  return d;
}

void register_all(CLI::App& app) {
  register_plan(app);
  register_logits(app);
  register_run(app);
  register_serve(app);
  register_fidelity(app);
  register_tokenize(app);
  register_detokenize(app);
  register_render(app);
}

}  // namespace latent::cli
