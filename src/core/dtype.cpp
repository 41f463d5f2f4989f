#include "core/dtype.h"

#include <array>

namespace latent {

namespace {
constexpr std::array<DTypeTraits, static_cast<size_t>(DType::kCount)> kTraits = {{
    {"f64", "F64", 1, 8, true},
    {"f32", "F32", 1, 4, true},
    {"f16", "F16", 1, 2, true},
    {"bf16", "BF16", 1, 2, true},
    {"f8_e4m3", "F8_E4M3", 1, 1, true},
    {"f8_e5m2", "F8_E5M2", 1, 1, true},
    {"f8_e4m3fnuz", "F8_E4M3FNUZ", 1, 1, true},
    {"f8_e5m2fnuz", "F8_E5M2FNUZ", 1, 1, true},
    {"f8_e8m0", "F8_E8M0", 1, 1, true},
    {"f4_e2m1", "F4", 2, 1, true},
    {"i64", "I64", 1, 8, false},
    {"i32", "I32", 1, 4, false},
    {"i16", "I16", 1, 2, false},
    {"i8", "I8", 1, 1, false},
    {"u64", "U64", 1, 8, false},
    {"u32", "U32", 1, 4, false},
    {"u16", "U16", 1, 2, false},
    {"u8", "U8", 1, 1, false},
    {"bool", "BOOL", 1, 1, false},
}};
}  // namespace

const DTypeTraits& traits(DType t) { return kTraits[static_cast<size_t>(t)]; }

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (size_t i = 0; i < kTraits.size(); ++i)
    if (!kTraits[i].st_name.empty() && kTraits[i].st_name == s) return static_cast<DType>(i);
  // Aliases seen in the wild.
  if (s == "F8_E8M0FNU") return DType::F8_E8M0;
  if (s == "F4_E2M1" || s == "F4_E2M1FN_X2") return DType::F4_E2M1;
  return std::nullopt;
}

std::optional<uint64_t> dtype_storage_bytes(DType t, uint64_t n) {
  const auto& tr = traits(t);
  if (n % tr.block_elems != 0) return std::nullopt;
  uint64_t blocks = n / tr.block_elems;
  if (tr.block_bytes != 0 && blocks > UINT64_MAX / tr.block_bytes) return std::nullopt;
  return blocks * tr.block_bytes;
}

}  // namespace latent
