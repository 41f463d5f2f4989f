// Unicode helpers for the tokenizer: UTF-8 decoding / lossy repair, and the character classes exactly as the
// reference `tokenizers` build sees them (generated tables in unicode_tables.cpp, see
// tools/gen_tokenizer_fixtures.py --unicode-tables), so results never depend on the system PCRE2's Unicode version.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace latent::unicode {

struct CodeRange {
  uint32_t lo, hi;  // inclusive
};

struct PropertyTable {
  const char* name;  // "L", "Lu", "N", "Han", "s", "w", "d", "rust_word", "rust_numeric", "rust_punct", ...
  const CodeRange* ranges;
  size_t count;
};

extern const PropertyTable kPropertyTables[];
extern const size_t kPropertyTableCount;

struct LowercaseEntry {
  uint32_t cp;
  const char* lower;  // UTF-8
};
extern const LowercaseEntry kLowercase[];  // sorted by cp; only code points that change
extern const size_t kLowercaseCount;

// The table with this exact name, or nullptr.
const PropertyTable* find_property(std::string_view name);
bool in_ranges(const CodeRange* ranges, size_t count, uint32_t cp);
inline bool in_table(const PropertyTable& t, uint32_t cp) { return in_ranges(t.ranges, t.count, cp); }

// Unicode White_Space (Rust char::is_whitespace, regex \s).
bool is_whitespace(uint32_t cp);
// Rust regex-crate \w (used by added-token single_word and the Whitespace pre-tokenizer).
bool is_word_char(uint32_t cp);
// Rust char::is_numeric (Nd, Nl, No): the Digits pre-tokenizer.
bool is_numeric(uint32_t cp);
// The Punctuation / BertPreTokenizer punctuation test.
bool is_punctuation(uint32_t cp);
// What the StripAccents normalizer removes.
bool is_combining_mark(uint32_t cp);
// Rust char::to_lowercase of one code point (the Lowercase normalizer), appended as UTF-8.
void append_lowercase(std::string& out, uint32_t cp);

// --- UTF-8 -----------------------------------------------------------------------------------------------------

// Decodes the code point at s[i] of a string known to be valid UTF-8; returns its byte length.
inline size_t decode_valid(std::string_view s, size_t i, uint32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  if (b0 < 0xE0) {
    cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
    return 2;
  }
  if (b0 < 0xF0) {
    cp = ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
         (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
    return 3;
  }
  cp = ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
       ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) | (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
  return 4;
}

// Length of the UTF-8 sequence that starts with lead byte b (1 for ASCII and for bytes that cannot start one).
inline size_t utf8_len(unsigned char b) { return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

// Code point of the last character of a valid UTF-8 string (which must not be empty).
uint32_t last_code_point(std::string_view s);

void append_utf8(std::string& out, uint32_t cp);

bool is_valid_utf8(std::string_view s);

// Valid UTF-8 from arbitrary bytes: each maximal invalid subsequence (Unicode "maximal subpart") becomes one
// U+FFFD, as Rust String::from_utf8_lossy and Python bytes.decode("utf-8", "replace") do.
std::string utf8_lossy(std::string_view bytes);
void append_utf8_lossy(std::string& out, std::string_view bytes);

// Number of trailing bytes of `bytes` that form a valid but incomplete UTF-8 sequence (0-3): what a streaming
// decoder must hold back because more bytes could still complete it.
size_t incomplete_utf8_tail(std::string_view bytes);

}  // namespace latent::unicode
