// Internal: grow-only scratch vectors of the CPU backend with 64-byte aligned storage, so that the kernels' 512-bit
// loads of activations, prepared x and attention rows never straddle two cache lines (a std::vector<float> is only
// 16-byte aligned; a split load costs about a second load, measured ~10-30 % on the attention GEMMs).
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace latent::cpu {

template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}  // NOLINT(google-explicit-constructor): allocator rebinding
  T* allocate(size_t n) { return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{64}); }
  template <class U>
  bool operator==(const Aligned64<U>&) const {
    return true;
  }
};

template <class T>
using AlignedVec = std::vector<T, Aligned64<T>>;

}  // namespace latent::cpu
