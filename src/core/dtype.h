// DType: one enum for plain and packed element types, with a constexpr traits table.
// Packed types (F4_E2M1: two codes per byte) have block_elems > 1: a tensor of n logical elements occupies
// n / block_elems * block_bytes bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace latent {

enum class DType : uint8_t {
  F64,
  F32,
  F16,
  BF16,
  F8_E4M3,      // OCP e4m3fn: bias 7, max 448, NaN 0x7F/0xFF, no Inf
  F8_E5M2,      // OCP e5m2: bias 15, max 57344, Inf/NaN like IEEE
  F8_E4M3FNUZ,  // AMD: bias 8, max 240, NaN 0x80 only
  F8_E5M2FNUZ,  // AMD: bias 16, NaN 0x80 only
  F8_E8M0,      // unsigned power-of-two scale: 2^(code-127), 0xFF = NaN
  F4_E2M1,      // packed: two E2M1 codes per byte, element 2k in the low nibble
  I64,
  I32,
  I16,
  I8,
  U64,
  U32,
  U16,
  U8,
  BOOL,
  kCount
};

struct DTypeTraits {
  std::string_view name;     // our name, e.g. "bf16"
  std::string_view st_name;  // safetensors header name, e.g. "BF16" (empty if none)
  uint32_t block_elems;      // logical elements per storage block
  uint32_t block_bytes;      // bytes per storage block
  bool is_float;
};

const DTypeTraits& traits(DType t);
inline std::string_view dtype_name(DType t) { return traits(t).name; }

// Parses a safetensors dtype string ("BF16", "F8_E4M3", "F8_E8M0", "F4", ...). nullopt if unknown.
std::optional<DType> dtype_from_safetensors(std::string_view s);

// Bytes needed for n logical elements; nullopt when n is not a whole number of blocks or on overflow.
std::optional<uint64_t> dtype_storage_bytes(DType t, uint64_t n_elems);

}  // namespace latent
