// NumPy .npy reader and writer for float32 ('<f4') and int64 ('<i8'), little-endian, C order (format versions
// 1.0, 2.0 and 3.0 read; 1.0 written). The reader validates strictly: magic, version, header dict (exactly the
// keys descr / fortran_order / shape), dtype, fortran_order False, shape, and that the data size matches.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace latent {

struct NpyArray {
  enum class Kind { F32, I64 } kind = Kind::F32;
  std::vector<int64_t> shape;
  std::vector<float> f32;    // kind == F32
  std::vector<int64_t> i64;  // kind == I64
  int64_t numel() const;
};

// Parses .npy bytes; `name` is used in error messages. Throws latent::Error.
NpyArray parse_npy(std::string_view bytes, const std::string& name);
NpyArray read_npy(const std::string& path);

// Serialized .npy bytes.
std::string npy_bytes_f32(const float* data, std::span<const int64_t> shape);
std::string npy_bytes_i64(const int64_t* data, std::span<const int64_t> shape);
// Writes a file (throws latent::Error naming the path on failure).
void write_npy_f32(const std::string& path, const float* data, std::span<const int64_t> shape);
void write_npy_i64(const std::string& path, const int64_t* data, std::span<const int64_t> shape);

}  // namespace latent
