// Minimal leveled logging to stderr. LATENT_LOG_LEVEL=debug|info|warn|error (default info).
#pragma once
#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace latent::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };
Level level();
void set_level(Level l);
void write(Level l, const std::string& msg);

template <class... A>
void debug(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::Debug) write(Level::Debug, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void info(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::Info) write(Level::Info, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void warn(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::Warn) write(Level::Warn, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void error(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::Error) write(Level::Error, fmt::format(f, std::forward<A>(a)...));
}

}  // namespace latent::log
