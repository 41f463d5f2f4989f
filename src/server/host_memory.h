// Giving memory back after large requests (glibc malloc). A 20 MB body, its JSON DOM, the rendered prompt and the
// tokenizer's buffers are freed when the request is answered, but glibc keeps freed memory in its arenas: chunks
// in the bins until malloc_trim, and the top of every thread's arena (which malloc_trim does not release) up to a
// trim threshold that grows to twice the largest block freed so far, as the mmap threshold grows to it. With
// several worker threads parsing large requests at once, each keeps its own.
//
//  - tune_allocator_for_serving() (latent serve, at start) fixes both thresholds: a block of 4 MiB or more is
//    mapped on its own and unmapped when freed, and a thread's arena top above 4 MiB is returned on free.
//  - LargeRequestTracker: the server counts the large requests in flight; when the last one is done (its
//    buffers freed), malloc_trim(0) returns what the arenas' bins still hold.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/memory_info.h"

namespace latent::server {

// Block size from which glibc maps a block on its own, and the arena top kept on free, once tuned.
inline constexpr size_t kAllocatorThreshold = size_t{4} << 20;

// Process-wide (mallopt); call once, before the server's threads start allocating.
void tune_allocator_for_serving();

// Returns the free memory the allocator holds to the system (malloc_trim(0) with glibc; a no-op elsewhere).
void release_free_memory();

// Large requests in flight; release_free_memory() runs when the last one ends.
class LargeRequestTracker {
 public:
  void begin() { n_.fetch_add(1); }
  // True when this was the last one (the caller then releases, off the io threads).
  bool end() { return n_.fetch_sub(1) == 1; }
  int64_t in_flight() const { return n_.load(); }

 private:
  std::atomic<int64_t> n_{0};
};

// Memory this process may still use (core/memory_info.h; --kv-cache-bytes auto on the CPU).
using ::latent::host_available_memory;

}  // namespace latent::server
