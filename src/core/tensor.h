// TensorView: a non-owning view {data, dtype, shape} over row-major contiguous storage (memory-mapped weights,
// arena buffers). Ownership lives elsewhere (MappedFile, std::vector, arenas).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "core/dtype.h"

namespace latent {

constexpr int kMaxDims = 6;

struct Shape {
  std::array<int64_t, kMaxDims> dims{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    for (int64_t x : d) dims[ndim++] = x;
  }
  static Shape of(std::span<const int64_t> d) {
    Shape s;
    for (int64_t x : d) s.dims[s.ndim++] = x;
    return s;
  }
  int64_t operator[](int i) const { return dims[i < 0 ? ndim + i : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const {  // "[a, b, c]"
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }
};

struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t nbytes = 0;

  template <class T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(data); }
  int64_t numel() const { return shape.numel(); }
  bool valid() const { return data != nullptr || nbytes == 0; }
};

}  // namespace latent
