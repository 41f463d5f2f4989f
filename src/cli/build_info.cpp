#include "cli/build_info.h"

// Generated into the build tree (CMakeLists.txt, "Build version"); the fallback keeps a build without the
// generator honest.
#if __has_include("latent_build_info.h")
#include "latent_build_info.h"
#endif
#ifndef LATENT_GIT_COMMIT
#define LATENT_GIT_COMMIT "unknown"
#endif
#ifndef LATENT_VERSION
#define LATENT_VERSION "0.0.0"
#endif

namespace latent::cli {

std::string build_version() { return LATENT_VERSION; }
std::string build_commit() { return LATENT_GIT_COMMIT; }

std::string build_type() {
#ifdef NDEBUG
  return "Release";
#else
  return "Debug";
#endif
}

std::string version_line() {
  return "latent " + build_version() + " (commit " + build_commit() + ", " + build_type() + ")";
}

}  // namespace latent::cli
