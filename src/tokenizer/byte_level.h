// The GPT-2 / HF ByteLevel byte <-> character map (docs/tokenizer.md §ByteLevel): bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF
// map to themselves; the other 68 bytes, in increasing order, map to U+0100..U+0143.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace latent::byte_level {

// Code point that stands for byte b.
uint32_t byte_to_cp(uint8_t b);
// The byte a code point stands for, or -1 when the code point is not in the map.
int cp_to_byte(uint32_t cp);

// Appends the ByteLevel characters (UTF-8) of raw bytes.
void encode(std::string_view bytes, std::string& out);
// Raw bytes of a token whose characters are all in the map; nullopt otherwise (the decoder then passes the
// token's own UTF-8 through, docs/tokenizer.md §decoding).
std::optional<std::string> decode(std::string_view token);

}  // namespace latent::byte_level
