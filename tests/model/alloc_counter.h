// Test support: counts heap allocations (global operator new) made on any thread while armed. The replacement
// operators live in alloc_counter.cpp, their own translation unit, so that they are never inlined into callers.
#pragma once
#include <atomic>
#include <cstdint>

namespace latent::testing {
extern std::atomic<bool> g_count_allocs;
extern std::atomic<int64_t> g_allocs;
}  // namespace latent::testing
