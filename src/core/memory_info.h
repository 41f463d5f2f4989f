// What memory this process may still use: MemAvailable from /proc/meminfo, lowered to the cgroup v2 / v1 limit less
// its usage when there is one; 0 when neither can be read. (--kv-cache-bytes auto on the CPU; the CPU backend's
// budget for weight copies.)
#pragma once
#include <cstdint>

namespace latent {

int64_t host_available_memory();

}  // namespace latent
