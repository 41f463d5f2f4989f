#include "kernels/cpu/weight_arena.h"

#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace latent::cpu {
namespace {

constexpr size_t kHuge = size_t{2} << 20;     // the x86-64 PMD page
constexpr size_t kChunk = size_t{256} << 20;  // address space per chunk (only touched pages take memory)

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

WeightArena::~WeightArena() {
  for (const Chunk& c : chunks_) {
#if defined(__linux__)
    if (c.mapped) {
      munmap(c.base, c.size);
      continue;
    }
#endif
    ::operator delete (c.base, std::align_val_t{64});
  }
}

bool WeightArena::owns(const void* p) const {
  const auto* b = static_cast<const uint8_t*>(p);
  for (const Chunk& c : chunks_)
    if (b >= c.base && b < c.base + c.used) return true;
  return false;
}

uint8_t* WeightArena::alloc(size_t bytes) {
  bytes = round_up(bytes > 0 ? bytes : 1, 64);
  if (!chunks_.empty()) {
    Chunk& c = chunks_.back();
    if (c.size - c.used >= bytes) {
      uint8_t* p = c.base + c.used;
      c.used += bytes;
      return p;
    }
  }
  const size_t size = round_up(bytes > kChunk ? bytes : kChunk, kHuge);
#if defined(__linux__)
  // Reserve one huge page more, then trim the head and tail so the chunk starts on a 2 MiB boundary (the kernel
  // backs a MADV_HUGEPAGE range with huge pages only where whole aligned 2 MiB pages fit in it).
  void* raw = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw != MAP_FAILED) {
    const uintptr_t r = reinterpret_cast<uintptr_t>(raw), a = round_up(r, kHuge);
    if (a > r) munmap(raw, a - r);
    if (a + size < r + size + kHuge) munmap(reinterpret_cast<void*>(a + size), r + size + kHuge - (a + size));
    uint8_t* base = reinterpret_cast<uint8_t*>(a);
#if defined(MADV_HUGEPAGE)
    if (madvise(base, size, MADV_HUGEPAGE) == 0) advised_ = true;
#endif
    chunks_.push_back({base, size, bytes, true});
    return base;
  }
#endif
  uint8_t* base = static_cast<uint8_t*>(::operator new (size, std::align_val_t{64}));
  chunks_.push_back({base, size, bytes, false});
  return base;
}

}  // namespace latent::cpu
