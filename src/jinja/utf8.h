// UTF-8 helpers for the Jinja interpreter: Python strings are sequences of code points, ours are UTF-8 bytes.
// Invalid bytes decode to U+DC80+byte (Python's "surrogateescape") and encode back to the same byte, so any byte
// string survives a decode/encode round trip. Character classes follow Python 3 str methods (isspace, isprintable,
// isalnum, upper/lower) using utf8proc's Unicode tables.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace latent::jinja::utf8 {

// Decodes one code point at s[i]; advances i.
char32_t next(std::string_view s, size_t& i);
void append(std::string& out, char32_t cp);
std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
size_t length(std::string_view s);  // number of code points
bool is_ascii(std::string_view s);

// Python str.isspace() for one code point (Unicode White_Space plus U+001C..U+001F).
bool py_isspace(char32_t c);
// Python str.isprintable() for one code point (repr escapes the others).
bool py_isprintable(char32_t c);
bool py_isalpha(char32_t c);
bool py_isdigit(char32_t c);    // Nd (approximates Python isdigit)
bool py_isnumeric(char32_t c);  // N*
bool py_isalnum(char32_t c);
bool py_isupper(char32_t c);  // cased upper
bool py_islower(char32_t c);
bool py_iscased(char32_t c);
bool is_word(char32_t c);  // Python regex \w
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);
char32_t to_title(char32_t c);
// Python str.splitlines() line-break characters.
bool py_is_linebreak(char32_t c);

// Full case mappings as Python str.upper/lower/title apply them ("ß" -> "SS", final sigma in lower()).
void append_upper(std::string& out, char32_t c);
void append_lower(std::string& out, char32_t c);
void append_title(std::string& out, char32_t c);
std::string upper(std::string_view s);
std::string lower(std::string_view s);

}  // namespace latent::jinja::utf8
