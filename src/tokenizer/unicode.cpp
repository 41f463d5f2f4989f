#include "tokenizer/unicode.h"

#include <algorithm>
#include <cstring>

namespace latent::unicode {

const PropertyTable* find_property(std::string_view name) {
  for (size_t i = 0; i < kPropertyTableCount; ++i)
    if (name == kPropertyTables[i].name) return &kPropertyTables[i];
  return nullptr;
}

bool in_ranges(const CodeRange* ranges, size_t count, uint32_t cp) {
  // First range whose hi >= cp.
  size_t lo = 0, hi = count;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (ranges[mid].hi < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < count && ranges[lo].lo <= cp;
}

namespace {
const PropertyTable& table(const char* name) {
  const PropertyTable* t = find_property(name);
  return *t;  // the generated file always has these
}
}  // namespace

bool is_whitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  static const PropertyTable& t = table("rust_word");
  return in_table(t, cp);
}

bool is_numeric(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  static const PropertyTable& t = table("rust_numeric");
  return in_table(t, cp);
}

bool is_punctuation(uint32_t cp) {
  static const PropertyTable& t = table("rust_punct");
  return in_table(t, cp);
}

bool is_combining_mark(uint32_t cp) {
  if (cp < 0x300) return false;
  static const PropertyTable& t = table("rust_combining");
  return in_table(t, cp);
}

void append_lowercase(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    return;
  }
  const LowercaseEntry* b = kLowercase;
  const LowercaseEntry* e = kLowercase + kLowercaseCount;
  const LowercaseEntry* it = std::lower_bound(b, e, cp, [](const LowercaseEntry& x, uint32_t c) { return x.cp < c; });
  if (it != e && it->cp == cp)
    out += it->lower;
  else
    append_utf8(out, cp);
}

uint32_t last_code_point(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  uint32_t cp = 0;
  decode_valid(s, i, cp);
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
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

namespace {

// For a lead byte: total length and the allowed range of the second byte (Unicode Table 3-7, well-formed UTF-8).
struct Lead {
  uint8_t len;
  uint8_t lo2, hi2;
};

inline Lead lead_info(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// At bytes[i]: returns {bytes matched, complete}. matched >= 1. complete: a whole valid character.
// When not complete, `matched` is the maximal subpart (lead + valid continuation bytes present).
inline std::pair<size_t, bool> scan_one(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const Lead L = lead_info(b0);
  if (L.len == 1) return {1, true};
  if (L.len == 0) return {1, false};
  size_t k = 1;
  if (i + k >= s.size()) return {k, false};
  auto b = static_cast<unsigned char>(s[i + k]);
  if (b < L.lo2 || b > L.hi2) return {k, false};
  ++k;
  while (k < L.len) {
    if (i + k >= s.size()) return {k, false};
    b = static_cast<unsigned char>(s[i + k]);
    if (b < 0x80 || b > 0xBF) return {k, false};
    ++k;
  }
  return {k, true};
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    auto [len, ok] = scan_one(s, i);
    if (!ok) return false;
    i += len;
  }
  return true;
}

void append_utf8_lossy(std::string& out, std::string_view s) {
  size_t i = 0, run = 0;  // [run, i): valid bytes not yet copied
  const size_t n = s.size();
  while (i < n) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    auto [len, ok] = scan_one(s, i);
    if (ok) {
      i += len;
      continue;
    }
    out.append(s.data() + run, i - run);
    out.append("\xEF\xBF\xBD");
    i += len;
    run = i;
  }
  out.append(s.data() + run, n - run);
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_utf8_lossy(out, bytes);
  return out;
}

size_t incomplete_utf8_tail(std::string_view s) {
  const size_t n = s.size();
  // A lead byte within the last 3 bytes whose sequence is a valid prefix running to the end.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x80 && b < 0xC0) continue;  // continuation byte: keep looking for its lead
    const Lead L = lead_info(b);
    if (L.len <= 1) return 0;
    auto [len, ok] = scan_one(s, i);
    if (!ok && i + len == n && len < L.len) return back;
    return 0;
  }
  return 0;
}

}  // namespace latent::unicode
