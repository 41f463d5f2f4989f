// latent::Error — the one exception type for input-dependent failures (files, configs, requests).
// The message names the file / tensor / field and the offending values. Caught only at the CLI, the request
// handler and model load. Kernels never throw.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace latent {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace latent
