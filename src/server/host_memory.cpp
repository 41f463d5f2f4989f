// Giving memory back after large requests (host_memory.h).
#include "server/host_memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace latent::server {

void tune_allocator_for_serving() {
#if defined(__GLIBC__)
  // Fixed values also stop glibc from raising them as large blocks are freed (its dynamic thresholds).
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kAllocatorThreshold));
  mallopt(M_TRIM_THRESHOLD, static_cast<int>(kAllocatorThreshold));
#endif
}

void release_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace latent::server
