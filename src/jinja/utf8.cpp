#include "jinja/utf8.h"

#include <utf8proc.h>

namespace latent::jinja::utf8 {

char32_t next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int n = 0;
  char32_t cp = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 1, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 2, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 3, cp = b0 & 0x07, min = 0x10000;
  } else {
    ++i;
    return 0xDC00 + b0;
  }
  if (i + static_cast<size_t>(n) >= s.size()) {
    ++i;
    return 0xDC00 + b0;
  }
  for (int k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return 0xDC00 + b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF) {
    ++i;
    return 0xDC00 + b0;
  }
  i += static_cast<size_t>(n) + 1;
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out.push_back(static_cast<char>(cp - 0xDC00));  // surrogateescape: the original byte
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out.push_back(next(s, i));
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append(out, c);
  return out;
}

size_t length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  size_t n = 0, i = 0;
  while (i < s.size()) {
    next(s, i);
    ++n;
  }
  return n;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

static utf8proc_category_t cat(char32_t c) {
  if (c > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool py_isspace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return c >= 0x2000 && c <= 0x200A;
  }
}

bool py_isprintable(char32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  if (c >= 0xD800 && c <= 0xDFFF) return false;
  switch (cat(c)) {
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: return false;
    default: return true;
  }
}

bool py_isalpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  auto k = cat(c);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
bool py_isdigit(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return cat(c) == UTF8PROC_CATEGORY_ND;
}
bool py_isnumeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  auto k = cat(c);
  return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
bool py_isalnum(char32_t c) { return py_isalpha(c) || py_isnumeric(c); }
bool is_word(char32_t c) { return c == '_' || py_isalnum(c); }

char32_t to_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c > 0x10FFFF) return c;
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c > 0x10FFFF) return c;
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_title(char32_t c) {
  if (c < 0x80) return to_upper(c);
  if (c > 0x10FFFF) return c;
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}
bool py_isupper(char32_t c) { return to_lower(c) != c || cat(c) == UTF8PROC_CATEGORY_LU; }
bool py_islower(char32_t c) { return to_upper(c) != c || cat(c) == UTF8PROC_CATEGORY_LL; }
bool py_iscased(char32_t c) { return py_isupper(c) || py_islower(c) || cat(c) == UTF8PROC_CATEGORY_LT; }

bool py_is_linebreak(char32_t c) {
  switch (c) {
    case '\n':
    case '\r':
    case 0x0B:
    case 0x0C:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x85:
    case 0x2028:
    case 0x2029: return true;
    default: return false;
  }
}

namespace {

struct SpecialCase {
  char32_t cp;
  char32_t map[4];
};
#include "jinja/case_special.inc"

template <size_t N>
const SpecialCase* find_special(const SpecialCase (&table)[N], char32_t c) {
  size_t lo = 0, hi = N;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (table[mid].cp < c)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < N && table[lo].cp == c ? &table[lo] : nullptr;
}

bool append_special(std::string& out, const SpecialCase* s) {
  if (!s) return false;
  for (char32_t m : s->map)
    if (m) append(out, m);
  return true;
}

bool case_ignorable(char32_t c) {
  if (c == '\'' || c == '.' || c == ':' || c == '^' || c == '`' || c == 0xB7 || c == 0x2019) return true;
  switch (cat(c)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK: return true;
    default: return false;
  }
}

}  // namespace

void append_upper(std::string& out, char32_t c) {
  if (c < 0x80) return out.push_back(static_cast<char>(to_upper(c)));
  if (!append_special(out, find_special(kSpecialUpper, c))) append(out, to_upper(c));
}
void append_lower(std::string& out, char32_t c) {
  if (c < 0x80) return out.push_back(static_cast<char>(to_lower(c)));
  if (!append_special(out, find_special(kSpecialLower, c))) append(out, to_lower(c));
}
void append_title(std::string& out, char32_t c) {
  if (c < 0x80) return out.push_back(static_cast<char>(to_upper(c)));
  if (!append_special(out, find_special(kSpecialTitle, c))) append(out, to_title(c));
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) append_upper(out, next(s, i));
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (is_ascii(s)) {
    for (char c : s) out.push_back(static_cast<char>(to_lower(static_cast<unsigned char>(c))));
    return out;
  }
  const std::u32string u = decode(s);
  for (size_t i = 0; i < u.size(); ++i) {
    if (u[i] == 0x3A3) {
      // Final_Sigma: preceded by a cased letter and not followed by one (case-ignorable characters skipped).
      size_t j = i;
      bool before = false;
      while (j > 0) {
        --j;
        if (case_ignorable(u[j])) continue;
        before = py_iscased(u[j]);
        break;
      }
      bool after = false;
      for (size_t k = i + 1; k < u.size(); ++k) {
        if (case_ignorable(u[k])) continue;
        after = py_iscased(u[k]);
        break;
      }
      append(out, before && !after ? 0x3C2 : 0x3C3);
      continue;
    }
    append_lower(out, u[i]);
  }
  return out;
}

}  // namespace latent::jinja::utf8
