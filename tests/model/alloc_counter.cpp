#include "alloc_counter.h"

#include <execinfo.h>
#include <unistd.h>
#include <cstdlib>
#include <new>

namespace latent::testing {
std::atomic<bool> g_count_allocs{false};
std::atomic<int64_t> g_allocs{0};
}  // namespace latent::testing

void* operator new(std::size_t n) {
  if (latent::testing::g_count_allocs.load(std::memory_order_relaxed)) {
    latent::testing::g_allocs.fetch_add(1, std::memory_order_relaxed);
    if (std::getenv("BT")) {
      latent::testing::g_count_allocs = false;
      void* b[32];
      int k = backtrace(b, 32);
      backtrace_symbols_fd(b, k, 2);
      latent::testing::g_count_allocs = true;
    }
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// Every other form goes through the same malloc / free pair, so that no allocation meets a foreign deallocator
// (AddressSanitizer checks the pairing).
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (latent::testing::g_count_allocs.load(std::memory_order_relaxed)) {
    latent::testing::g_allocs.fetch_add(1, std::memory_order_relaxed);
    if (std::getenv("BT")) {
      latent::testing::g_count_allocs = false;
      void* b[32];
      int k = backtrace(b, 32);
      backtrace_symbols_fd(b, k, 2);
      latent::testing::g_count_allocs = true;
    }
  }
  const std::size_t al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
