#include "jinja/lexer.h"

#include <cmath>
#include <cstdlib>

#include "jinja/error.h"
#include "jinja/utf8.h"

namespace latent::jinja {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
int hex_val(char c) { return is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10; }

// Python whitespace at s[i] (one code point); returns its byte length or 0.
size_t ws_len(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return utf8::py_isspace(b) ? 1 : 0;
  size_t j = i;
  const char32_t c = utf8::next(s, j);
  return utf8::py_isspace(c) ? j - i : 0;
}

size_t skip_ws(std::string_view s, size_t i) {
  while (size_t n = ws_len(s, i)) i += n;
  return i;
}

// Python str.rstrip() length.
size_t rstrip_len(std::string_view s) {
  size_t i = 0, end = 0;
  while (i < s.size()) {
    const char32_t c = utf8::next(s, i);
    if (!utf8::py_isspace(c)) end = i;
  }
  return end;
}

bool all_ws(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  while (i < s.size())
    if (!utf8::py_isspace(utf8::next(s, i))) return false;
  return true;
}

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& name, const LexOptions& opt) : name_(name), opt_(opt) {
    // Newlines: \r\n and \r become \n; one trailing newline is dropped unless keep_trailing_newline.
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_ += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        src_ += src[i];
      }
    }
    if (!opt_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    const std::string_view s = src_;
    size_t pos = 0;
    bool line_starting = true;
    while (pos < s.size()) {
      // Find the next tag start.
      size_t p = pos;
      while (true) {
        p = s.find('{', p);
        if (p == std::string_view::npos || p + 1 >= s.size()) {
          p = std::string_view::npos;
          break;
        }
        const char c = s[p + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++p;
      }
      if (p == std::string_view::npos) {
        emit_data(pos, s.substr(pos));
        return finish();
      }
      std::string_view text = s.substr(pos, p - pos);
      const char kind = s[p + 1];
      size_t q = p + 2;
      char sign = 0;
      if (q < s.size() && (s[q] == '-' || s[q] == '+')) sign = s[q++];
      // raw block?
      size_t raw_end = 0;
      const bool raw = kind == '%' && match_raw_begin(s, p, raw_end);
      if (raw) {
        sign = 0;
        size_t k = p + 2;
        if (k < s.size() && (s[k] == '-' || s[k] == '+')) sign = s[k];
      }
      if (sign == '-') {
        text = text.substr(0, rstrip_len(text));
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && all_ws(text.substr(l_pos))) text = text.substr(0, l_pos);
      }
      emit_data(pos, text);
      if (raw) {
        pos = lex_raw(s, p, raw_end, line_starting);
        continue;
      }
      if (kind == '#') {
        pos = lex_comment(s, p, q, line_starting);
        continue;
      }
      add(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, p, std::string(s.substr(p, 2)));
      pos = lex_tag(s, q, kind == '{', line_starting);
    }
    return finish();
  }

 private:
  [[noreturn]] void fail(size_t offset, const std::string& msg) {
    advance(offset);
    throw TemplateError(ErrorKind::Syntax, msg, name_, line_, col_);
  }

  void advance(size_t offset) {
    if (offset < cur_) {  // rewind (rare: error reporting); recount from the start
      cur_ = 0, line_ = 1, col_ = 1;
    }
    const std::string_view s = src_;
    while (cur_ < offset && cur_ < s.size()) {
      if (s[cur_] == '\n') {
        ++line_;
        col_ = 1;
        ++cur_;
      } else {
        utf8::next(s, cur_);
        ++col_;
      }
    }
  }

  Token& add(Tok type, size_t offset, std::string text) {
    advance(offset);
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line_;
    t.col = col_;
    toks_.push_back(std::move(t));
    return toks_.back();
  }

  void emit_data(size_t offset, std::string_view text) {
    if (!text.empty()) add(Tok::Data, offset, std::string(text));
  }

  std::vector<Token> finish() {
    add(Tok::Eof, src_.size(), "");
    return std::move(toks_);
  }

  // {%[-+]?\s*raw\s*(-%}\s*|%})
  bool match_raw_begin(std::string_view s, size_t p, size_t& end) {
    size_t k = p + 2;
    if (k < s.size() && (s[k] == '-' || s[k] == '+')) ++k;
    k = skip_ws(s, k);
    if (s.substr(k, 3) != "raw") return false;
    k = skip_ws(s, k + 3);
    if (s.substr(k, 3) == "-%}") {
      end = skip_ws(s, k + 3);
      return true;
    }
    if (s.substr(k, 2) == "%}") {
      end = k + 2;
      return true;
    }
    return false;
  }

  size_t lex_raw(std::string_view s, size_t p, size_t body, bool& line_starting) {
    line_starting = body > 0 && s[body - 1] == '\n';
    size_t search = body;
    while (true) {
      const size_t t = s.find("{%", search);
      if (t == std::string_view::npos) fail(p, "Missing end of raw directive");
      size_t k = t + 2;
      char sign = 0;
      if (k < s.size() && (s[k] == '-' || s[k] == '+')) sign = s[k++];
      k = skip_ws(s, k);
      if (s.substr(k, 6) != "endraw") {
        search = t + 1;
        continue;
      }
      k = skip_ws(s, k + 6);
      size_t end;
      if (s.substr(k, 3) == "+%}") {
        end = k + 3;
      } else if (s.substr(k, 3) == "-%}") {
        end = skip_ws(s, k + 3);
      } else if (s.substr(k, 2) == "%}") {
        end = k + 2;
        if (opt_.trim_blocks && end < s.size() && s[end] == '\n') ++end;
      } else {
        search = t + 1;
        continue;
      }
      std::string_view text = s.substr(body, t - body);
      if (sign == '-') {
        text = text.substr(0, rstrip_len(text));
      } else if (sign != '+' && opt_.lstrip_blocks) {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && all_ws(text.substr(l_pos))) text = text.substr(0, l_pos);
      }
      emit_data(body, text);
      line_starting = end > 0 && s[end - 1] == '\n';
      return end;
    }
  }

  size_t lex_comment(std::string_view s, size_t p, size_t body, bool& line_starting) {
    const size_t e = s.find("#}", body);
    if (e == std::string_view::npos) fail(p, "Missing end of comment tag");
    size_t end;
    if (e > body && s[e - 1] == '+') {
      end = e + 2;
    } else if (e > body && s[e - 1] == '-') {
      end = skip_ws(s, e + 2);
    } else {
      end = e + 2;
      if (opt_.trim_blocks && end < s.size() && s[end] == '\n') ++end;
    }
    line_starting = s[end - 1] == '\n';
    return end;
  }

  // Tokens inside {{ }} or {% %} up to and including the end delimiter.
  size_t lex_tag(std::string_view s, size_t pos, bool variable, bool& line_starting) {
    std::vector<char> balance;
    while (true) {
      if (pos >= s.size()) {
        line_starting = false;
        return pos;  // the parser reports the unexpected end
      }
      if (balance.empty()) {
        size_t end = 0;
        if (variable) {
          if (s.substr(pos, 3) == "-}}")
            end = skip_ws(s, pos + 3);
          else if (s.substr(pos, 2) == "}}")
            end = pos + 2;
        } else {
          if (s.substr(pos, 3) == "+%}") {
            end = pos + 3;
          } else if (s.substr(pos, 3) == "-%}") {
            end = skip_ws(s, pos + 3);
          } else if (s.substr(pos, 2) == "%}") {
            end = pos + 2;
            if (opt_.trim_blocks && end < s.size() && s[end] == '\n') ++end;
          }
        }
        if (end) {
          add(variable ? Tok::VarEnd : Tok::BlockEnd, pos, "");
          line_starting = s[end - 1] == '\n';
          return end;
        }
      }
      if (size_t n = ws_len(s, pos)) {
        pos = skip_ws(s, pos + n);
        continue;
      }
      const char c = s[pos];
      if (is_digit(c)) {
        pos = lex_number(s, pos);
        continue;
      }
      if (c == '\'' || c == '"') {
        pos = lex_string(s, pos);
        continue;
      }
      if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || static_cast<unsigned char>(c) >= 0x80) {
        size_t k = pos;
        while (k < s.size()) {
          const char d = s[k];
          if (d == '_' || is_digit(d) || (d >= 'a' && d <= 'z') || (d >= 'A' && d <= 'Z')) {
            ++k;
            continue;
          }
          if (static_cast<unsigned char>(d) >= 0x80) {
            size_t j = k;
            const char32_t cp = utf8::next(s, j);
            if (utf8::is_word(cp)) {
              k = j;
              continue;
            }
          }
          break;
        }
        if (k == pos) fail(pos, "unexpected char " + std::string(s.substr(pos, 1)));
        {
          size_t j = pos;
          const char32_t first = utf8::next(s, j);
          if (first >= 0x80 && !utf8::py_isalpha(first)) fail(pos, "Invalid character in identifier");
        }
        add(Tok::Name, pos, std::string(s.substr(pos, k - pos)));
        pos = k;
        continue;
      }
      // operators, longest first
      static const char* const kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (const char* o : kOps2)
        if (s.substr(pos, 2) == o) op = o;
      if (op.empty()) {
        static const std::string_view kOps1 = "+-/*%~[](){}><=.:|,;";
        if (kOps1.find(c) != std::string_view::npos) op = std::string(1, c);
      }
      if (op.empty()) {
        size_t j = pos;
        const char32_t cp = utf8::next(s, j);
        std::string ch;
        utf8::append(ch, cp);
        fail(pos, "unexpected char '" + ch + "'");
      }
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (balance.empty()) fail(pos, "unexpected '" + op + "'");
        if (balance.back() != op[0])
          fail(pos, "unexpected '" + op + "', expected '" + std::string(1, balance.back()) + "'");
        balance.pop_back();
      }
      add(Tok::Op, pos, op);
      pos += op.size();
    }
  }

  // digits with optional single underscores between them: (\d+_)*\d+
  static size_t digits(std::string_view s, size_t k) {
    if (k >= s.size() || !is_digit(s[k])) return 0;
    size_t i = k;
    while (true) {
      while (i < s.size() && is_digit(s[i])) ++i;
      if (i + 1 < s.size() && s[i] == '_' && is_digit(s[i + 1])) {
        ++i;
        continue;
      }
      return i - k;
    }
  }

  size_t lex_number(std::string_view s, size_t pos) {
    // float: (?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+\-]?(\d+_)*\d+|\.(\d+_)*\d+)
    const bool after_dot = pos > 0 && s[pos - 1] == '.';
    if (!after_dot) {
      const size_t n = digits(s, pos);
      size_t k = pos + n;
      size_t end = 0;
      size_t frac_end = k;
      if (k < s.size() && s[k] == '.') {
        const size_t f = digits(s, k + 1);
        if (f) frac_end = k + 1 + f;
      }
      auto exp_at = [&](size_t e) -> size_t {
        if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
          size_t x = e + 1;
          if (x < s.size() && (s[x] == '+' || s[x] == '-')) ++x;
          const size_t d = digits(s, x);
          if (d) return x + d;
        }
        return 0;
      };
      if (size_t e = exp_at(frac_end))
        end = e;
      else if (frac_end > k)
        end = frac_end;
      if (end) {
        std::string txt;
        for (size_t i = pos; i < end; ++i)
          if (s[i] != '_') txt += s[i];
        Token& t = add(Tok::Float, pos, txt);
        t.fval = std::strtod(txt.c_str(), nullptr);
        return end;
      }
    }
    // integer: 0b / 0o / 0x / [1-9](_?\d)* / 0(_?0)*
    size_t k = pos;
    int base = 10;
    std::string digs;
    auto prefixed = [&](char lo, auto pred) -> bool {
      if (s[pos] == '0' && pos + 1 < s.size() && (s[pos + 1] | 0x20) == lo) {
        size_t i = pos + 2;
        std::string d;
        while (true) {
          size_t j = i;
          if (j < s.size() && s[j] == '_') ++j;
          if (j < s.size() && pred(s[j])) {
            d += s[j];
            i = j + 1;
          } else {
            break;
          }
        }
        if (!d.empty()) {
          digs = d;
          k = i;
          return true;
        }
      }
      return false;
    };
    if (prefixed('b', [](char ch) { return ch == '0' || ch == '1'; })) {
      base = 2;
    } else if (prefixed('o', [](char ch) { return ch >= '0' && ch <= '7'; })) {
      base = 8;
    } else if (prefixed('x', [](char ch) { return is_hex(ch); })) {
      base = 16;
    } else if (s[pos] != '0') {
      digs += s[k++];
      while (true) {
        size_t j = k;
        if (j < s.size() && s[j] == '_') ++j;
        if (j < s.size() && is_digit(s[j])) {
          digs += s[j];
          k = j + 1;
        } else {
          break;
        }
      }
    } else {
      digs = "0";
      ++k;
      while (true) {
        size_t j = k;
        if (j < s.size() && s[j] == '_') ++j;
        if (j < s.size() && s[j] == '0') {
          k = j + 1;
        } else {
          break;
        }
      }
    }
    // value with overflow check
    unsigned __int128 v = 0;
    for (char ch : digs) {
      v = v * static_cast<unsigned>(base) + static_cast<unsigned>(hex_val(ch));
      if (v > static_cast<unsigned __int128>(INT64_MAX)) fail(pos, "integer literal too large");
    }
    Token& t = add(Tok::Int, pos, std::string(s.substr(pos, k - pos)));
    t.ival = static_cast<int64_t>(v);
    return k;
  }

  size_t lex_string(std::string_view s, size_t pos) {
    const char q = s[pos];
    size_t k = pos + 1;
    while (true) {
      if (k >= s.size()) fail(pos, "unexpected char " + std::string(1, q));
      if (s[k] == '\\') {
        if (k + 1 >= s.size()) fail(pos, "unexpected char " + std::string(1, q));
        k += 2;
        continue;
      }
      if (s[k] == q) break;
      ++k;
    }
    const std::string_view body = s.substr(pos + 1, k - pos - 1);
    Token& t = add(Tok::String, pos, "");
    t.text = unescape(body, pos);
    return k + 1;
  }

  // Python: body.encode("ascii", "backslashreplace").decode("unicode-escape")
  std::string unescape(std::string_view b, size_t pos) {
    std::string out;
    size_t i = 0;
    while (i < b.size()) {
      if (b[i] != '\\') {
        const size_t st = i;
        utf8::next(b, i);
        out.append(b.substr(st, i - st));
        continue;
      }
      ++i;  // the character after the backslash exists (the string regex guarantees it)
      const char c = b[i];
      if (static_cast<unsigned char>(c) >= 0x80) {
        // backslashreplace turned the character into \xNN / \uNNNN / \UNNNNNNNN; "\\" then decodes to "\".
        const char32_t cp = utf8::next(b, i);
        char buf[16];
        if (cp < 0x100)
          std::snprintf(buf, sizeof buf, "x%02x", static_cast<unsigned>(cp));
        else if (cp < 0x10000)
          std::snprintf(buf, sizeof buf, "u%04x", static_cast<unsigned>(cp));
        else
          std::snprintf(buf, sizeof buf, "U%08x", static_cast<unsigned>(cp));
        out += '\\';
        out += buf;
        continue;
      }
      ++i;
      switch (c) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case '0':
        case '1':
        case '2':
        case '3':
        case '4':
        case '5':
        case '6':
        case '7': {
          unsigned v = static_cast<unsigned>(c - '0');
          for (int n = 0; n < 2 && i < b.size() && b[i] >= '0' && b[i] <= '7'; ++n)
            v = v * 8 + static_cast<unsigned>(b[i++] - '0');
          utf8::append(out, v);
          break;
        }
        case 'x':
        case 'u':
        case 'U': {
          const int n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (int m = 0; m < n; ++m) {
            if (i >= b.size() || !is_hex(b[i])) {
              fail(pos, c == 'x'   ? "truncated \\xXX escape"
                        : c == 'u' ? "truncated \\uXXXX escape"
                                   : "truncated \\UXXXXXXXX escape");
            }
            v = v * 16 + static_cast<uint32_t>(hex_val(b[i++]));
          }
          if (v > 0x10FFFF) fail(pos, "illegal Unicode character");
          utf8::append(out, v);
          break;
        }
        case 'N': fail(pos, "\\N{...} escapes are not supported");
        default: out += '\\'; out += c;
      }
    }
    return out;
  }

  std::string src_;
  std::string name_;
  LexOptions opt_;
  std::vector<Token> toks_;
  size_t cur_ = 0;
  int line_ = 1;
  int col_ = 1;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const std::string& name, const LexOptions& opt) {
  return Lexer(source, name, opt).run();
}

}  // namespace latent::jinja
