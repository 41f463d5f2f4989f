// latent — one binary, many subcommands (CLI11). Every command exits non-zero with one clear line on stderr
// when it cannot do its job.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "cli/build_info.h"
#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"latent: inference engine and OpenAI-compatible server for MLA + MoE models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", latent::cli::version_line());
  latent::cli::register_all(app);
  // One line naming the flag and what it accepts (CLI11's validators say both), e.g.
  // "latent: error: --port: Value 99999 not in range [1 - 65535]".
  app.failure_message(
      [](const CLI::App*, const CLI::Error& e) { return std::string("latent: error: ") + e.what() + "\n"; });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const latent::Error& e) {
    std::fprintf(stderr, "latent: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "latent: internal error: %s\n", e.what());
    return 2;
  }
  return latent::cli::exit_code();
}
