// Python str semantics on UTF-8 strings (code-point based), shared by the str methods and the filters.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace latent::jinja::pystr {

// str.strip / lstrip / rstrip; chars == nullptr: Python whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split / rsplit; sep == nullptr: runs of whitespace. maxsplit < 0: no limit. Empty sep: ValueError.
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count, size_t max_bytes);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
std::string swapcase(std::string_view s);
std::string pad(std::string_view s, int64_t width, char32_t fill, char align);  // align: '<' '>' '^'
bool is_all(std::string_view s, bool (*pred)(char32_t));  // non-empty and every code point satisfies pred
bool is_cased_upper(std::string_view s);                  // str.isupper()
bool is_cased_lower(std::string_view s);                  // str.islower()
bool is_title(std::string_view s);                        // str.istitle()
// Index (in code points) of sub in s[start:end] or -1; start/end already normalised to code points.
int64_t find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse);
int64_t count(std::string_view s, std::string_view sub, int64_t start, int64_t end);
std::string substr_cp(std::string_view s, int64_t start, int64_t end);  // code-point slice [start, end)

}  // namespace latent::jinja::pystr
