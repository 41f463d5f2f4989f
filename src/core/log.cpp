#include "core/log.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace latent::log {

namespace {
Level initial_level() {
  const char* e = std::getenv("LATENT_LOG_LEVEL");
  if (!e) return Level::Info;
  return parse_level(e).value_or(Level::Info);
}
std::atomic<Level> g_level{initial_level()};
std::atomic<Format> g_format{Format::Text};
std::mutex g_mu;
const char* const kNames[] = {"debug", "info", "warn", "error", "off"};

std::string timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

void emit(const std::string& line) {
  std::lock_guard<std::mutex> lk(g_mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}
}  // namespace

Level level() { return g_level.load(std::memory_order_relaxed); }
void set_level(Level l) { g_level.store(l); }
void set_format(Format f) { g_format.store(f); }
Format format() { return g_format.load(std::memory_order_relaxed); }

std::optional<Level> parse_level(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(Level::Off); ++i)
    if (s == kNames[i]) return static_cast<Level>(i);
  if (s == "warning") return Level::Warn;
  return std::nullopt;
}

void write(Level l, const std::string& msg) {
  if (format() == Format::Json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    j["ts"] = timestamp();
    j["level"] = kNames[static_cast<int>(l)];
    j["msg"] = msg;
    emit(dump(j) + "\n");
    return;
  }
  emit(fmt::format("{} [latent {}] {}\n", timestamp(), kNames[static_cast<int>(l)], msg));
}

void event(Level l, std::string_view msg, const nlohmann::ordered_json& fields) {
  if (level() > l) return;
  if (format() == Format::Json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    j["ts"] = timestamp();
    j["level"] = kNames[static_cast<int>(l)];
    j["msg"] = msg;
    for (auto it = fields.begin(); it != fields.end(); ++it) j[it.key()] = it.value();
    emit(dump(j) + "\n");
    return;
  }
  std::string line = fmt::format("{} [latent {}] {}", timestamp(), kNames[static_cast<int>(l)], msg);
  for (auto it = fields.begin(); it != fields.end(); ++it) {
    line += ' ';
    line += it.key();
    line += '=';
    line += it.value().is_string() ? it.value().get<std::string>() : dump(it.value());
  }
  line += '\n';
  emit(line);
}

}  // namespace latent::log
