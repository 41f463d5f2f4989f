// What memory this process may still use (memory_info.h).
#include "core/memory_info.h"

#include <algorithm>
#include <cctype>
#include <exception>
#include <fstream>
#include <string>

namespace latent {

namespace {

// The first integer of a one-line file ("max" and unreadable: -1).
int64_t read_int_file(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) return -1;
  try {
    return static_cast<int64_t>(std::stoull(s));
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

int64_t host_available_memory() {
  int64_t avail = -1;
  {
    std::ifstream f("/proc/meminfo");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("MemAvailable:", 0) == 0) {
        try {
          avail = static_cast<int64_t>(std::stoll(line.substr(13))) * 1024;  // "MemAvailable:   20754836 kB"
        } catch (const std::exception&) {
        }
        break;
      }
  }
  // cgroup v2, then v1: a limit far above the machine's memory means none.
  int64_t limit = read_int_file("/sys/fs/cgroup/memory.max"), used = read_int_file("/sys/fs/cgroup/memory.current");
  if (limit < 0) {
    limit = read_int_file("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    used = read_int_file("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  if (limit > 0 && limit < (int64_t{1} << 60)) {
    const int64_t left = std::max<int64_t>(0, limit - std::max<int64_t>(0, used));
    avail = avail < 0 ? left : std::min(avail, left);
  }
  return std::max<int64_t>(0, avail);
}

}  // namespace latent
