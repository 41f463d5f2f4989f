// Leveled logging to stderr, one line per message with a UTC timestamp (ISO 8601, milliseconds). The level comes from
// LATENT_LOG_LEVEL=debug|info|warn|error|off (default info) or set_level(); the format is text (default) or JSON
// lines (set_format, `latent serve --log-format json`): {"ts":…,"level":…,"msg":…, fields…}.
#pragma once
#include <fmt/format.h>

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace latent::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };
enum class Format { Text, Json };
Level level();
void set_level(Level l);
// "debug" | "info" | "warn" | "error" | "off"; nullopt for anything else.
std::optional<Level> parse_level(std::string_view s);
void set_format(Format f);
Format format();
void write(Level l, const std::string& msg);
// A structured line: text format writes `msg k=v k=v ...`; JSON writes the fields as members.
void event(Level l, std::string_view msg, const nlohmann::ordered_json& fields);

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
