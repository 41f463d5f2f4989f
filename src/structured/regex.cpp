// Regex and choice front ends (compilers.h).
#include <fmt/format.h>

#include <algorithm>

#include "structured/compilers.h"

namespace latent::structured {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [a, b] : r) {
    if (!out.empty() && a <= out.back().second + 1)
      out.back().second = std::max(out.back().second, b);
    else
      out.emplace_back(a, b);
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges n = normalize(r), out;
  uint32_t next = 0;
  for (auto [a, b] : n) {
    if (a > next) out.emplace_back(next, a - 1);
    next = b + 1;
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

// Expression for one code point of the ranges; in JSON-string mode as its escaped form.
ExprId ranges_expr(GrammarBuilder& b, const Ranges& rs, bool json) {
  std::vector<ExprId> alts;
  ByteSet ascii;
  for (auto [lo, hi] : normalize(rs)) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) {
      if (json && (c < 0x20 || c == '"' || c == '\\')) {
        switch (c) {
          case '"': alts.push_back(b.literal("\\\"")); break;
          case '\\': alts.push_back(b.literal("\\\\")); break;
          case '\n': alts.push_back(b.literal("\\n")); break;
          case '\t': alts.push_back(b.literal("\\t")); break;
          case '\r': alts.push_back(b.literal("\\r")); break;
          case '\b': alts.push_back(b.literal("\\b")); break;
          case '\f': alts.push_back(b.literal("\\f")); break;
          default: alts.push_back(b.literal(fmt::format("\\u{:04x}", c))); break;
        }
        continue;
      }
      ascii.set(static_cast<uint8_t>(c));
    }
    if (hi >= 0x80) alts.push_back(b.codepoints(std::max<uint32_t>(lo, 0x80), hi));
  }
  if (!ascii.empty()) alts.push_back(b.bytes(ascii));
  return b.alt(std::move(alts));
}

class RegexParser {
 public:
  RegexParser(GrammarBuilder& b, std::string_view p, bool json) : b_(b), p_(p), json_(json) {}

  ExprId parse() {
    if (!p_.empty() && p_[0] == '^') ++i_;
    ExprId e = alternation();
    if (i_ < p_.size()) fail(p_[i_] == ')' ? "unbalanced ')'" : "unexpected character");
    return e;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw GrammarError(fmt::format("invalid or unsupported regex at offset {}: {}", i_, what));
  }
  bool at_end() const { return i_ >= p_.size(); }

  ExprId alternation() {
    if (++depth_ > 200) fail("groups nested too deeply");
    struct Guard {
      int& d;
      ~Guard() { --d; }
    } guard{depth_};
    std::vector<ExprId> alts{sequence()};
    while (!at_end() && p_[i_] == '|') {
      ++i_;
      alts.push_back(sequence());
    }
    return b_.alt(std::move(alts));
  }

  ExprId sequence() {
    std::vector<ExprId> parts;
    while (!at_end() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$') {
        ++i_;
        if (!at_end() && p_[i_] != ')' && p_[i_] != '|') fail("'$' is supported only at the end");
        continue;
      }
      ExprId a = atom();
      parts.push_back(quantified(a));
    }
    return b_.seq(std::move(parts));
  }

  int read_int() {
    const size_t s = i_;
    long v = 0;
    while (!at_end() && p_[i_] >= '0' && p_[i_] <= '9') {
      v = v * 10 + (p_[i_] - '0');
      if (v > 100000) fail("repetition count too large");
      ++i_;
    }
    if (i_ == s) return -2;
    return static_cast<int>(v);
  }

  ExprId quantified(ExprId a) {
    while (!at_end()) {
      const char c = p_[i_];
      int lo, hi;
      if (c == '*')
        lo = 0, hi = kUnbounded, ++i_;
      else if (c == '+')
        lo = 1, hi = kUnbounded, ++i_;
      else if (c == '?')
        lo = 0, hi = 1, ++i_;
      else if (c == '{') {
        const size_t save = i_;
        ++i_;
        lo = read_int();
        if (lo == -2) {  // a literal '{'
          i_ = save;
          return a;
        }
        hi = lo;
        if (!at_end() && p_[i_] == ',') {
          ++i_;
          hi = read_int();
          if (hi == -2) hi = kUnbounded;
        }
        if (at_end() || p_[i_] != '}') fail("unterminated '{'");
        ++i_;
        if (hi != kUnbounded && hi < lo) fail("repetition {m,n} with n < m");
      } else {
        return a;
      }
      if (!at_end() && (p_[i_] == '?' || p_[i_] == '+')) ++i_;  // lazy / possessive: same language
      a = b_.repeat(a, lo, hi);
    }
    return a;
  }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (at_end()) fail("truncated hex escape");
      const char c = p_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<uint32_t>(c - 'A' + 10);
      else
        fail("bad hex digit");
    }
    return v;
  }

  uint32_t utf8_char() {
    const unsigned char c = static_cast<unsigned char>(p_[i_]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + static_cast<size_t>(n) > p_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(p_[i_ + static_cast<size_t>(k)]) & 0x3F);
    i_ += static_cast<size_t>(n);
    return cp;
  }

  // An escape after '\': a class (\d ...) into `cls`, or a single code point.
  bool escape(Ranges& cls, uint32_t& cp) {
    if (at_end()) fail("trailing backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'd': cls = kDigit; return true;
      case 'D': cls = complement(kDigit); return true;
      case 'w': cls = kWord; return true;
      case 'W': cls = complement(kWord); return true;
      case 's': cls = kSpace; return true;
      case 'S': cls = complement(kSpace); return true;
      case 'n': cp = '\n'; return false;
      case 'r': cp = '\r'; return false;
      case 't': cp = '\t'; return false;
      case 'f': cp = '\f'; return false;
      case 'v': cp = '\v'; return false;
      case '0': cp = 0; return false;
      case 'x': cp = hex(2); return false;
      case 'u':
        if (!at_end() && p_[i_] == '{') {
          ++i_;
          cp = 0;
          while (!at_end() && p_[i_] != '}') cp = (cp << 4) | hex(1);
          if (at_end()) fail("unterminated \\u{");
          ++i_;
        } else {
          cp = hex(4);
        }
        return false;
      case 'b':
      case 'B': fail("word boundaries (\\b) are not supported");
      default:
        if ((c >= '1' && c <= '9')) fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail(fmt::format("unknown escape \\{}", c));
        cp = static_cast<unsigned char>(c);
        return false;
    }
  }

  ExprId char_class() {
    // after '['
    bool neg = false;
    if (!at_end() && p_[i_] == '^') neg = true, ++i_;
    Ranges rs;
    bool first = true;
    while (true) {
      if (at_end()) fail("unterminated character class");
      if (p_[i_] == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      uint32_t lo;
      if (p_[i_] == '\\') {
        ++i_;
        Ranges cls;
        if (escape(cls, lo)) {
          rs.insert(rs.end(), cls.begin(), cls.end());
          continue;
        }
      } else if (p_[i_] == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        fail("POSIX classes are not supported");
      } else {
        lo = utf8_char();
      }
      uint32_t hi = lo;
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (p_[i_] == '\\') {
          ++i_;
          Ranges cls;
          if (escape(cls, hi)) fail("a class escape cannot end a range");
        } else {
          hi = utf8_char();
        }
        if (hi < lo) fail("character range out of order");
      }
      rs.emplace_back(lo, hi);
    }
    if (neg) rs = complement(rs);
    if (rs.empty()) fail("empty character class");
    return ranges_expr(b_, rs, json_);
  }

  ExprId atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (!at_end() && p_[i_] == '?') {
        ++i_;
        if (!at_end() && p_[i_] == ':') {
          ++i_;
        } else if (!at_end() && (p_[i_] == '<' || p_[i_] == 'P')) {
          if (p_[i_] == 'P') ++i_;
          if (at_end() || p_[i_] != '<') fail("unsupported group");
          if (i_ + 1 < p_.size() && (p_[i_ + 1] == '=' || p_[i_ + 1] == '!')) fail("lookbehind is not supported");
          while (!at_end() && p_[i_] != '>') ++i_;
          if (at_end()) fail("unterminated group name");
          ++i_;
        } else {
          fail("lookaround and inline flags are not supported");
        }
      }
      ExprId e = alternation();
      if (at_end() || p_[i_] != ')') fail("missing ')'");
      ++i_;
      return e;
    }
    if (c == '[') {
      ++i_;
      return char_class();
    }
    if (c == '.') {
      ++i_;
      return ranges_expr(b_, complement({{'\n', '\n'}}), json_);
    }
    if (c == '\\') {
      ++i_;
      Ranges cls;
      uint32_t cp;
      if (escape(cls, cp)) return ranges_expr(b_, cls, json_);
      return ranges_expr(b_, {{cp, cp}}, json_);
    }
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    if (c == '^') fail("'^' is supported only at the start");
    const uint32_t cp = utf8_char();
    return ranges_expr(b_, {{cp, cp}}, json_);
  }

  GrammarBuilder& b_;
  std::string_view p_;
  bool json_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

ExprId regex_expr(GrammarBuilder& b, std::string_view pattern, bool json_string_body) {
  return RegexParser(b, pattern, json_string_body).parse();
}

std::shared_ptr<const Grammar> regex_grammar(std::string_view pattern) {
  GrammarBuilder b;
  const int32_t root = b.declare("root");
  b.define(root, regex_expr(b, pattern));
  return compile(b, root);
}

std::shared_ptr<const Grammar> choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) throw GrammarError("the choice list is empty");
  GrammarBuilder b;
  const int32_t root = b.declare("root");
  std::vector<ExprId> alts;
  for (const auto& c : choices) alts.push_back(b.literal(c));
  b.define(root, b.alt(std::move(alts)));
  return compile(b, root);
}

// ---------------------------------------------------------------------------------------------------------------
// GBNF

namespace {

class GbnfParser {
 public:
  GbnfParser(GrammarBuilder& b, std::string_view t) : b_(b), t_(t) {}

  void parse() {
    skip(true);
    while (i_ < t_.size()) {
      const size_t at = i_;
      const std::string name = ident();
      if (name.empty()) fail("expected a rule name");
      skip(false);
      if (t_.compare(i_, 3, "::=") != 0) fail("expected '::='");
      i_ += 3;
      skip(true);
      const int32_t r = b_.declare(name);
      if (b_.n_rules() > 5000) fail("more than 5000 rules");
      if (b_.defined(r)) {
        i_ = at;
        fail(fmt::format("rule '{}' is defined twice", name));
      }
      b_.define(r, alternatives(false));
      skip(true);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < t_.size(); ++k) {
      if (t_[k] == '\n')
        ++line, col = 1;
      else
        ++col;
    }
    throw GrammarError(fmt::format("grammar line {}, column {}: {}", line, col, what));
  }

  // Spaces and comments; newlines too when `newlines`.
  void skip(bool newlines) {
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++i_;
      } else if (c == '#') {
        while (i_ < t_.size() && t_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }

  static bool ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  }

  std::string ident() {
    const size_t s = i_;
    while (i_ < t_.size() && ident_char(t_[i_])) ++i_;
    return std::string(t_.substr(s, i_ - s));
  }

  // At top level an alternative may continue on the next line when that line starts with '|'.
  bool continues_with_bar() {
    size_t k = i_;
    while (k < t_.size()) {
      const char c = t_[k];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++k;
      } else if (c == '#') {
        while (k < t_.size() && t_[k] != '\n') ++k;
      } else {
        break;
      }
    }
    if (k < t_.size() && t_[k] == '|') {
      i_ = k;
      return true;
    }
    return false;
  }

  ExprId alternatives(bool nested) {
    if (++depth_ > 200) fail("groups nested too deeply");
    struct Guard {
      int& d;
      ~Guard() { --d; }
    } guard{depth_};
    std::vector<ExprId> alts{sequence(nested)};
    while (true) {
      skip(nested);
      if (i_ < t_.size() && t_[i_] == '|') {
      } else if (!nested && continues_with_bar()) {
      } else {
        break;
      }
      ++i_;
      skip(true);
      alts.push_back(sequence(nested));
    }
    return b_.alt(std::move(alts));
  }

  uint32_t utf8() {
    const unsigned char c = static_cast<unsigned char>(t_[i_]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + static_cast<size_t>(n) > t_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(t_[i_ + static_cast<size_t>(k)]) & 0x3F);
    i_ += static_cast<size_t>(n);
    return cp;
  }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (i_ >= t_.size()) fail("truncated escape");
      const char c = t_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<uint32_t>(c - 'A' + 10);
      else
        fail("bad hex digit in escape");
    }
    return v;
  }

  uint32_t char_or_escape() {
    if (i_ >= t_.size()) fail("unexpected end of grammar");
    if (t_[i_] != '\\') return utf8();
    ++i_;
    if (i_ >= t_.size()) fail("trailing backslash");
    const char c = t_[i_++];
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '\\': return '\\';
      case '"': return '"';
      case '[': return '[';
      case ']': return ']';
      case '-': return '-';
      case '^': return '^';
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      default: --i_; fail(fmt::format("unknown escape '\\{}'", c));
    }
  }

  ExprId element() {
    const char c = t_[i_];
    if (c == '"') {
      ++i_;
      std::vector<ExprId> parts;
      while (true) {
        if (i_ >= t_.size() || t_[i_] == '\n') fail("unterminated string literal");
        if (t_[i_] == '"') {
          ++i_;
          break;
        }
        const uint32_t cp = char_or_escape();
        parts.push_back(ranges_expr(b_, {{cp, cp}}, false));
      }
      return b_.seq(std::move(parts));
    }
    if (c == '[') {
      ++i_;
      bool neg = false;
      if (i_ < t_.size() && t_[i_] == '^') neg = true, ++i_;
      Ranges rs;
      while (true) {
        if (i_ >= t_.size()) fail("unterminated character class");
        if (t_[i_] == ']') {
          ++i_;
          break;
        }
        const uint32_t lo = char_or_escape();
        uint32_t hi = lo;
        if (i_ + 1 < t_.size() && t_[i_] == '-' && t_[i_ + 1] != ']') {
          ++i_;
          hi = char_or_escape();
          if (hi < lo) fail("character range out of order");
        }
        rs.emplace_back(lo, hi);
      }
      if (neg) rs = complement(rs);
      if (rs.empty()) fail("empty character class");
      return ranges_expr(b_, rs, false);
    }
    if (c == '.') {
      ++i_;
      return ranges_expr(b_, complement({{'\n', '\n'}}), false);
    }
    if (c == '(') {
      ++i_;
      skip(true);
      ExprId e = alternatives(true);
      skip(true);
      if (i_ >= t_.size() || t_[i_] != ')') fail("expected ')'");
      ++i_;
      return e;
    }
    if (ident_char(c)) {
      const std::string name = ident();
      return b_.ref(b_.declare(name));
    }
    fail(fmt::format("unexpected character '{}'", c));
  }

  int number() {
    long v = 0;
    const size_t s = i_;
    while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') {
      v = v * 10 + (t_[i_++] - '0');
      if (v > 100000) fail("repetition count too large");
    }
    if (s == i_) return -2;
    return static_cast<int>(v);
  }

  ExprId sequence(bool nested) {
    std::vector<ExprId> parts;
    while (true) {
      skip(nested);
      if (i_ >= t_.size()) break;
      const char c = t_[i_];
      if (c == '|' || c == ')' || c == '\n') break;
      // The next rule's "name ::=" ends this one (rules on one line each need no separator otherwise).
      if (ident_char(c)) {
        size_t k = i_;
        while (k < t_.size() && ident_char(t_[k])) ++k;
        while (k < t_.size() && (t_[k] == ' ' || t_[k] == '\t')) ++k;
        if (t_.compare(k, 3, "::=") == 0) break;
      }
      ExprId e = element();
      while (i_ < t_.size()) {
        const char q = t_[i_];
        if (q == '*')
          e = b_.star(e), ++i_;
        else if (q == '+')
          e = b_.plus(e), ++i_;
        else if (q == '?')
          e = b_.opt(e), ++i_;
        else if (q == '{') {
          ++i_;
          skip(false);
          const int lo = number();
          if (lo < 0) fail("expected a number after '{'");
          int hi = lo;
          skip(false);
          if (i_ < t_.size() && t_[i_] == ',') {
            ++i_;
            skip(false);
            hi = number();
            if (hi == -2) hi = kUnbounded;
            skip(false);
          }
          if (i_ >= t_.size() || t_[i_] != '}') fail("expected '}'");
          ++i_;
          if (hi != kUnbounded && hi < lo) fail("repetition {m,n} with n < m");
          e = b_.repeat(e, lo, hi);
        } else {
          break;
        }
      }
      parts.push_back(e);
    }
    return b_.seq(std::move(parts));
  }

  GrammarBuilder& b_;
  std::string_view t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

std::shared_ptr<const Grammar> gbnf_grammar(std::string_view text) {
  GrammarBuilder b;
  GbnfParser(b, text).parse();
  const int32_t root = b.rule_id("root");
  if (root < 0) throw GrammarError("the grammar has no 'root' rule");
  for (size_t r = 0; r < b.n_rules(); ++r)
    if (!b.defined(static_cast<int32_t>(r)))
      throw GrammarError(fmt::format("rule '{}' is used but not defined", b.rule_name(static_cast<int32_t>(r))));
  return compile(b, root);
}

}  // namespace latent::structured
