#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace latent {

namespace {

using unicode::CodeRange;
using RangeSet = std::vector<CodeRange>;  // sorted, disjoint, non-adjacent after normalize()

constexpr uint32_t kMaxCp = 0x10FFFF;

void normalize(RangeSet& s) {
  std::sort(s.begin(), s.end(), [](const CodeRange& a, const CodeRange& b) { return a.lo < b.lo; });
  RangeSet out;
  for (const auto& r : s) {
    if (!out.empty() && r.lo <= out.back().hi + 1)
      out.back().hi = std::max(out.back().hi, r.hi);
    else
      out.push_back(r);
  }
  s.swap(out);
}

RangeSet complement(const RangeSet& s) {
  RangeSet out;
  uint32_t next = 0;
  for (const auto& r : s) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCp) out.push_back({next, kMaxCp});
  return out;
}

RangeSet intersect(const RangeSet& a, const RangeSet& b) {
  RangeSet out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].lo, b[j].lo), hi = std::min(a[i].hi, b[j].hi);
    if (lo <= hi) out.push_back({lo, hi});
    if (a[i].hi < b[j].hi)
      ++i;
    else
      ++j;
  }
  return out;
}

void add(RangeSet& s, const RangeSet& t) { s.insert(s.end(), t.begin(), t.end()); }

// ---------------------------------------------------------------------------------------------------------------
// PCRE2 plumbing

struct Scratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* js = nullptr;
  Scratch() {
    md = pcre2_match_data_create(1, nullptr);
    mc = pcre2_match_context_create(nullptr);
    js = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    if (mc && js) pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~Scratch() {
    if (js) pcre2_jit_stack_free(js);
    if (mc) pcre2_match_context_free(mc);
    if (md) pcre2_match_data_free(md);
  }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return std::string(reinterpret_cast<const char*>(buf));
}

pcre2_code* compile_pcre2(const std::string& translated, const std::string& original, bool& jit) {
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &off, cc);
  pcre2_compile_context_free(cc);
  if (!code) fail("regex {:?}: PCRE2 cannot compile it: {} (at offset {})", original, pcre2_message(err), off);
  jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return code;
}

// Members of a property PCRE2 knows but the generated tables do not: probed once over all code points.
RangeSet probe_property(const std::string& escape) {
  static std::mutex mu;
  static std::map<std::string, RangeSet> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(escape); it != cache.end()) return it->second;
  bool jit = false;
  pcre2_code* code = compile_pcre2(escape, escape, jit);  // throws for an unknown property
  std::string all;                                        // every code point once
  all.reserve(4400000);
  for (uint32_t cp = 0; cp <= kMaxCp; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    unicode::append_utf8(all, cp);
  }
  RangeSet out;
  Scratch& s = scratch();
  size_t start = 0;
  while (start < all.size()) {
    const int rc =
        pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(all.data()), all.size(), start, PCRE2_NO_UTF_CHECK, s.md, s.mc);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
    uint32_t cp = 0;
    unicode::decode_valid(all, ov[0], cp);
    out.push_back({cp, cp});
    start = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
  }
  pcre2_code_free(code);
  normalize(out);
  cache[escape] = out;
  return out;
}

RangeSet table_set(const unicode::PropertyTable& t) { return RangeSet(t.ranges, t.ranges + t.count); }

// ---------------------------------------------------------------------------------------------------------------
// Translator

std::string canon_property(std::string_view name) {
  std::string k;
  for (char c : name)
    if (c != '_' && c != ' ' && c != '-') k.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  static const std::pair<const char*, const char*> kAliases[] = {
      {"letter", "L"},
      {"uppercaseletter", "Lu"},
      {"lowercaseletter", "Ll"},
      {"titlecaseletter", "Lt"},
      {"modifierletter", "Lm"},
      {"otherletter", "Lo"},
      {"mark", "M"},
      {"combiningmark", "M"},
      {"nonspacingmark", "Mn"},
      {"spacingmark", "Mc"},
      {"enclosingmark", "Me"},
      {"number", "N"},
      {"decimalnumber", "Nd"},
      {"letternumber", "Nl"},
      {"othernumber", "No"},
      {"punctuation", "P"},
      {"punct", "P"},
      {"connectorpunctuation", "Pc"},
      {"dashpunctuation", "Pd"},
      {"openpunctuation", "Ps"},
      {"closepunctuation", "Pe"},
      {"initialpunctuation", "Pi"},
      {"finalpunctuation", "Pf"},
      {"otherpunctuation", "Po"},
      {"symbol", "S"},
      {"mathsymbol", "Sm"},
      {"currencysymbol", "Sc"},
      {"modifiersymbol", "Sk"},
      {"othersymbol", "So"},
      {"separator", "Z"},
      {"spaceseparator", "Zs"},
      {"lineseparator", "Zl"},
      {"paragraphseparator", "Zp"},
      {"control", "Cc"},
      {"cntrl", "Cc"},
      {"format", "Cf"},
      {"privateuse", "Co"},
      {"han", "Han"},
      {"hani", "Han"},
      {"hiragana", "Hiragana"},
      {"hira", "Hiragana"},
      {"katakana", "Katakana"},
      {"kana", "Katakana"},
      {"hangul", "Hangul"},
      {"hang", "Hangul"},
      {"latin", "Latin"},
      {"latn", "Latin"},
      {"greek", "Greek"},
      {"grek", "Greek"},
      {"cyrillic", "Cyrillic"},
      {"cyrl", "Cyrillic"},
      {"arabic", "Arabic"},
      {"arab", "Arabic"},
      {"hebrew", "Hebrew"},
      {"hebr", "Hebrew"},
      {"thai", "Thai"},
      {"devanagari", "Devanagari"},
      {"deva", "Devanagari"},
      {"common", "Common"},
      {"zyyy", "Common"},
      {"inherited", "Inherited"},
      {"zinh", "Inherited"},
  };
  for (const auto& [a, b] : kAliases)
    if (k == a) return b;
  // General-category short names in any case ("l", "lu").
  static const char* kShort[] = {"L",  "Lu", "Ll", "Lt", "Lm", "Lo", "M",  "Mn", "Mc", "Me", "N", "Nd",
                                 "Nl", "No", "P",  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm",
                                 "Sc", "Sk", "So", "Z",  "Zs", "Zl", "Zp", "Cc", "Cf", "Co"};
  for (const char* s : kShort) {
    std::string l = s;
    for (auto& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (k == l) return s;
  }
  return std::string(name);
}

RangeSet property_set(std::string_view name) {
  const std::string canon = canon_property(name);
  if (const auto* t = unicode::find_property(canon)) return table_set(*t);
  return probe_property("\\p{" + std::string(name) + "}");
}

RangeSet shorthand_set(char c) {  // s w d h (lower case)
  if (c == 'h') return {{'0', '9'}, {'A', 'F'}, {'a', 'f'}};
  const char name[2] = {c, 0};
  return table_set(*unicode::find_property(name));
}

void append_cp(std::string& out, uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\x{%X}", cp);
  out += buf;
}

std::string emit_class(const RangeSet& set, bool negated) {
  // PCRE2 rejects surrogate code points in UTF mode.
  RangeSet s = intersect(set, {{0, 0xD7FF}, {0xE000, kMaxCp}});
  if (s.empty()) return negated ? "(?s:.)" : "(?!)";
  // PCRE2's JIT tests the ranges of a large class one after another, in pattern order: put the blocks that
  // real text hits most (CJK, kana, Hangul, Cyrillic, ...) first, then wider ranges before narrow ones.
  static constexpr CodeRange kHot[] = {{0x4E00, 0x9FFF}, {0x3040, 0x30FF}, {0xAC00, 0xD7AF}, {0x3000, 0x303F},
                                       {0xFF00, 0xFFEF}, {0x0400, 0x04FF}, {0x0370, 0x03FF}, {0x0600, 0x06FF},
                                       {0x0900, 0x097F}, {0x0E00, 0x0E7F}, {0x0590, 0x05FF}, {0x1F300, 0x1FAFF}};
  auto hot = [](const CodeRange& r) {
    for (const auto& h : kHot)
      if (r.lo <= h.hi && h.lo <= r.hi) return true;
    return false;
  };
  std::stable_sort(s.begin(), s.end(), [&](const CodeRange& a, const CodeRange& b) {
    const bool ha = hot(a), hb = hot(b);
    if (ha != hb) return ha;
    return a.hi - a.lo > b.hi - b.lo;
  });
  std::string out = negated ? "[^" : "[";
  for (const auto& r : s) {
    append_cp(out, r.lo);
    if (r.hi != r.lo) {
      out += '-';
      append_cp(out, r.hi);
    }
  }
  out += ']';
  return out;
}

class Translator {
 public:
  explicit Translator(std::string_view p) : p_(p) {}

  std::string run() {
    while (i_ < p_.size()) {
      const char c = p_[i_];
      if (c == '\\') {
        ++i_;
        top_escape();
      } else if (c == '[') {
        ++i_;
        bool negated = false;
        RangeSet s = parse_class(&negated);
        out_ += emit_class(s, negated);
      } else if (c == '(' && i_ + 1 < p_.size() && p_[i_ + 1] == '?') {
        group_options();
      } else {
        out_ += c;
        ++i_;
      }
    }
    return out_;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail("regex {:?}: {} at offset {} (cannot translate this Oniguruma construct to PCRE2)", std::string(p_), what, i_);
  }

  bool eof() const { return i_ >= p_.size(); }

  uint32_t read_cp() {  // literal UTF-8 character at i_
    if (eof()) error("unexpected end of pattern");
    uint32_t cp = 0;
    i_ += unicode::decode_valid(p_, i_, cp);
    return cp;
  }

  uint32_t read_hex(size_t max_digits, bool braces) {
    uint32_t v = 0;
    size_t n = 0;
    while (!eof() && n < max_digits && std::isxdigit(static_cast<unsigned char>(p_[i_]))) {
      v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(p_[i_]))
                                             ? p_[i_] - '0'
                                             : std::tolower(static_cast<unsigned char>(p_[i_])) - 'a' + 10);
      ++i_;
      ++n;
      if (v > kMaxCp) error("code point out of range");
    }
    if (n == 0) error("expected hex digits");
    if (braces) {
      if (eof() || p_[i_] != '}') error("expected '}'");
      ++i_;
    }
    return v;
  }

  // Result of an escape: a set (possibly negated), a literal code point, or (top level only) verbatim text.
  struct Esc {
    enum Kind { kSet, kLiteral, kVerbatim } kind;
    RangeSet set;
    bool negated = false;
    uint32_t cp = 0;
    std::string text;
  };

  // i_ is just after the backslash.
  Esc escape(bool in_class) {
    if (eof()) error("trailing backslash");
    const char c = p_[i_++];
    Esc e{Esc::kLiteral, {}, false, 0, {}};
    switch (c) {
      case 'p':
      case 'P': {
        std::string name;
        bool neg = c == 'P';
        if (!eof() && p_[i_] == '{') {
          const size_t close = p_.find('}', i_);
          if (close == std::string_view::npos) error("unterminated \\p{");
          name = std::string(p_.substr(i_ + 1, close - i_ - 1));
          i_ = close + 1;
          if (!name.empty() && name[0] == '^') {
            neg = !neg;
            name.erase(0, 1);
          }
        } else {
          if (eof()) error("bad \\p");
          name = std::string(1, p_[i_++]);
        }
        e.kind = Esc::kSet;
        e.set = property_set(name);
        e.negated = neg;
        return e;
      }
      case 's':
      case 'w':
      case 'd':
      case 'h':
        e.kind = Esc::kSet;
        e.set = shorthand_set(c);
        return e;
      case 'S':
      case 'W':
      case 'D':
      case 'H':
        e.kind = Esc::kSet;
        e.set = shorthand_set(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
        e.negated = true;
        return e;
      case 'u': {
        const size_t start = i_;
        e.cp = read_hex(4, false);
        if (i_ - start != 4) error("\\u needs 4 hex digits");
        return e;
      }
      case 'x':
        if (!eof() && p_[i_] == '{') {
          ++i_;
          e.cp = read_hex(8, true);
        } else {
          e.cp = read_hex(2, false);
        }
        return e;
      case 't': e.cp = 0x09; return e;
      case 'n': e.cp = 0x0A; return e;
      case 'r': e.cp = 0x0D; return e;
      case 'f': e.cp = 0x0C; return e;
      case 'v': e.cp = 0x0B; return e;
      case 'a': e.cp = 0x07; return e;
      case 'e': e.cp = 0x1B; return e;
      case '0': {
        uint32_t v = 0;
        for (int k = 0; k < 2 && !eof() && p_[i_] >= '0' && p_[i_] <= '7'; ++k) v = v * 8 + (p_[i_++] - '0');
        e.cp = v;
        return e;
      }
      case 'b':
        if (in_class) {
          e.cp = 0x08;
          return e;
        }
        e.kind = Esc::kVerbatim;
        e.text = "\\b";
        return e;
      default: break;
    }
    if (!in_class) {
      if ((c != 0 && std::strchr("ABzZGKRX", c)) || (c >= '1' && c <= '9')) {
        e.kind = Esc::kVerbatim;
        e.text = std::string("\\") + c;
        return e;
      }
      if (c == 'k' || c == 'g') {
        e.kind = Esc::kVerbatim;
        e.text = std::string("\\") + c;
        if (!eof() && (p_[i_] == '<' || p_[i_] == '\'')) {
          const char close = p_[i_] == '<' ? '>' : '\'';
          const size_t end = p_.find(close, i_ + 1);
          if (end == std::string_view::npos) error("unterminated group reference");
          e.text += std::string(p_.substr(i_, end + 1 - i_));
          i_ = end + 1;
        }
        return e;
      }
    }
    if (std::isalnum(static_cast<unsigned char>(c))) error(std::string("unsupported escape \\") + c);
    // Escaped punctuation or a non-ASCII character: the literal itself.
    --i_;
    e.cp = read_cp();
    return e;
  }

  void top_escape() {
    Esc e = escape(false);
    switch (e.kind) {
      case Esc::kSet: out_ += emit_class(e.set, e.negated); break;
      case Esc::kLiteral: append_cp(out_, e.cp); break;
      case Esc::kVerbatim: out_ += e.text; break;
    }
  }

  // i_ just after '['. Returns the set; *negated tells whether the class was [^...] (kept so that PCRE2 can apply
  // case-insensitive matching the way Oniguruma does for negated classes).
  RangeSet parse_class(bool* negated) {
    bool neg = false;
    if (!eof() && p_[i_] == '^') {
      neg = true;
      ++i_;
    }
    RangeSet s = parse_class_body(true);
    if (negated) {
      *negated = neg;
      return s;
    }
    return neg ? complement(s) : s;
  }

  // Items up to and including the closing ']'.
  RangeSet parse_class_body(bool at_start) {
    RangeSet acc;
    bool first = at_start;
    for (;;) {
      if (eof()) error("unterminated character class");
      const char c = p_[i_];
      if (c == ']' && !first) {
        ++i_;
        normalize(acc);
        return acc;
      }
      first = false;
      if (c == '&' && i_ + 1 < p_.size() && p_[i_ + 1] == '&') {
        i_ += 2;
        normalize(acc);
        RangeSet rhs = parse_class_body(false);  // consumes the closing ']'
        return intersect(acc, rhs);
      }
      if (c == '[') {
        if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') error("POSIX bracket expressions are not supported");
        ++i_;
        RangeSet nested = parse_class(nullptr);
        add(acc, nested);
        continue;
      }
      uint32_t lo = 0;
      if (c == '\\') {
        ++i_;
        Esc e = escape(true);
        if (e.kind == Esc::kSet) {
          RangeSet t = e.set;
          if (e.negated) {
            normalize(t);
            t = complement(t);
          }
          add(acc, t);
          continue;
        }
        lo = e.cp;
      } else {
        lo = read_cp();
      }
      // Range?
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        uint32_t hi = 0;
        if (p_[i_] == '\\') {
          ++i_;
          Esc e = escape(true);
          if (e.kind != Esc::kLiteral) error("bad character range");
          hi = e.cp;
        } else if (p_[i_] == '[') {
          error("bad character range");
        } else {
          hi = read_cp();
        }
        if (hi < lo) error("character range out of order");
        acc.push_back({lo, hi});
      } else {
        acc.push_back({lo, lo});
      }
    }
  }

  // "(?" at i_: Ruby option groups (?imx-imx) / (?imx-imx:...) with m meaning dot-all; others verbatim.
  void group_options() {
    size_t j = i_ + 2;
    while (j < p_.size() && std::strchr("imx-", p_[j]) && p_[j] != 0) ++j;
    if (j > i_ + 2 && j < p_.size() && (p_[j] == ':' || p_[j] == ')')) {
      out_ += "(?";
      for (size_t k = i_ + 2; k < j; ++k) out_ += p_[k] == 'm' ? 's' : p_[k];
      i_ = j;
      return;
    }
    out_ += "(?";
    i_ += 2;
  }

  std::string_view p_;
  size_t i_ = 0;
  std::string out_;
};

}  // namespace

std::string translate_oniguruma(std::string_view pattern) {
  if (!unicode::is_valid_utf8(pattern)) fail("regex pattern is not valid UTF-8");
  return Translator(pattern).run();
}

Regex::Regex(std::string_view pattern) : pattern_(pattern) {
  translated_ = translate_oniguruma(pattern);
  code_ = compile_pcre2(translated_, pattern_, jit_);
}

Regex::~Regex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Regex::Regex(Regex&& o) noexcept
    : pattern_(std::move(o.pattern_)), translated_(std::move(o.translated_)), code_(o.code_), jit_(o.jit_) {
  o.code_ = nullptr;
}

Regex& Regex::operator=(Regex&& o) noexcept {
  if (this != &o) {
    if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
    pattern_ = std::move(o.pattern_);
    translated_ = std::move(o.translated_);
    code_ = o.code_;
    jit_ = o.jit_;
    o.code_ = nullptr;
  }
  return *this;
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  Scratch& s = scratch();
  if (!s.md || !s.mc) fail("regex {:?}: out of memory for match data", pattern_);
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t start = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (start <= n) {
    const int rc = jit_ ? pcre2_jit_match(code, subj, n, start, 0, s.md, s.mc)
                        : pcre2_match(code, subj, n, start, PCRE2_NO_UTF_CHECK, s.md, s.mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("regex {:?}: matching failed: {}", pattern_, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
    const size_t b = ov[0], e = ov[1];
    if (b == e && have_last && b == last_end) {
      // An empty match right after the previous match is skipped (onig crate find_iter).
      if (start >= n) break;
      start += unicode::utf8_len(static_cast<unsigned char>(text[start]));
      continue;
    }
    out.emplace_back(b, e);
    have_last = true;
    last_end = e;
    start = e;  // after an empty match the rule above moves the next search forward
  }
}

}  // namespace latent
