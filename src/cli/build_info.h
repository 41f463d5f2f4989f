// What this binary was built from: the project version and the git commit of the source tree (cmake/
// git_version.cmake regenerates it at every build). `latent --version` and the server's /version report the same.
#pragma once
#include <string>

namespace latent::cli {

std::string build_version();  // the project version, e.g. "0.1.0"
std::string build_commit();   // 12 hex digits, with "-dirty" when tracked files differed; "unknown" without git
std::string build_type();     // "Release" (NDEBUG) or "Debug"
std::string version_line();   // "latent 0.1.0 (commit 1a2b3c4d5e6f, Release)"

}  // namespace latent::cli
