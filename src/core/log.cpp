#include "core/log.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace latent::log {

namespace {
Level initial_level() {
  const char* e = std::getenv("LATENT_LOG_LEVEL");
  if (!e) return Level::Info;
  if (!std::strcmp(e, "debug")) return Level::Debug;
  if (!std::strcmp(e, "warn")) return Level::Warn;
  if (!std::strcmp(e, "error")) return Level::Error;
  if (!std::strcmp(e, "off")) return Level::Off;
  return Level::Info;
}
std::atomic<Level> g_level{initial_level()};
std::mutex g_mu;
}  // namespace

Level level() { return g_level.load(std::memory_order_relaxed); }
void set_level(Level l) { g_level.store(l); }

void write(Level l, const std::string& msg) {
  static const char* kNames[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lk(g_mu);
  std::fprintf(stderr, "[latent %s] %s\n", kNames[static_cast<int>(l)], msg.c_str());
}

}  // namespace latent::log
