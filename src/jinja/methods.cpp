// Python methods of str / list / dict values, Python string helpers, str % args and str.format().
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "jinja/builtins.h"
#include "jinja/error.h"
#include "jinja/interpreter.h"
#include "jinja/pystr.h"
#include "jinja/utf8.h"

namespace latent::jinja {

// ---------------------------------------------------------------------------------------------------------------
// pystr

namespace pystr {

namespace {
bool in_chars(char32_t c, const std::u32string& set) { return set.find(c) != std::u32string::npos; }
}  // namespace

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::u32string set;
  if (chars) set = utf8::decode(*chars);
  auto strip_it = [&](char32_t c) { return chars ? in_chars(c, set) : utf8::py_isspace(c); };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t j = b;
      if (!strip_it(utf8::next(s, j))) break;
      b = j;
    }
  }
  if (right) {
    while (e > b) {
      size_t st = e - 1;  // start of the last code point (or a lone byte)
      while (st > b && (static_cast<unsigned char>(s[st]) & 0xC0) == 0x80 && e - st < 4) --st;
      size_t j = st;
      const char32_t c = utf8::next(s, j);
      if (j != e) {  // not a well-formed code point ending at e: treat the last byte alone
        st = e - 1;
        j = st;
        if (!strip_it(utf8::next(s, j))) break;
        e = st;
        continue;
      }
      if (!strip_it(c)) break;
      e = st;
    }
  }
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw_error(ErrorKind::Type, "empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t f = s.find(*sep, pos);
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  const std::u32string u = utf8::decode(s);
  size_t i = 0;
  const size_t n = u.size();
  while (true) {
    while (i < n && utf8::py_isspace(u[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(utf8::encode(std::u32string_view(u).substr(i)));
      break;
    }
    const size_t st = i;
    while (i < n && !utf8::py_isspace(u[i])) ++i;
    out.push_back(utf8::encode(std::u32string_view(u).substr(st, i - st)));
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw_error(ErrorKind::Type, "empty separator");
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t f = s.rfind(*sep, end - sep->size());
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
      end = f;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const std::u32string u = utf8::decode(s);
  size_t i = u.size();
  while (true) {
    while (i > 0 && utf8::py_isspace(u[i - 1])) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(utf8::encode(std::u32string_view(u).substr(0, i)));
      break;
    }
    const size_t e = i;
    while (i > 0 && !utf8::py_isspace(u[i - 1])) --i;
    out.push_back(utf8::encode(std::u32string_view(u).substr(i, e - i)));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  const std::u32string u = utf8::decode(s);
  size_t i = 0, st = 0;
  while (i < u.size()) {
    if (utf8::py_is_linebreak(u[i])) {
      size_t eol = i + 1;
      if (u[i] == '\r' && eol < u.size() && u[eol] == '\n') ++eol;
      out.push_back(utf8::encode(std::u32string_view(u).substr(st, (keepends ? eol : i) - st)));
      st = i = eol;
    } else {
      ++i;
    }
  }
  if (st < u.size()) out.push_back(utf8::encode(std::u32string_view(u).substr(st)));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count, size_t max_bytes) {
  std::string out;
  auto grow = [&](std::string_view part) {
    out.append(part);
    if (out.size() > max_bytes)
      throw_error(ErrorKind::Limit, "string larger than " + std::to_string(max_bytes) + " bytes");
  };
  if (old.empty()) {
    int64_t n = 0;
    size_t i = 0;
    while (i <= s.size()) {
      if (count < 0 || n < count) {
        grow(repl);
        ++n;
      } else {
        grow(s.substr(i));
        return out;
      }
      if (i == s.size()) break;
      const size_t st = i;
      utf8::next(s, i);
      grow(s.substr(st, i - st));
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(old, pos);
    if (f == std::string_view::npos) break;
    grow(s.substr(pos, f - pos));
    grow(repl);
    pos = f + old.size();
    ++n;
  }
  grow(s.substr(pos));
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = utf8::next(s, i);
    if (prev_cased)
      utf8::append_lower(out, c);
    else
      utf8::append_title(out, c);
    prev_cased = utf8::py_iscased(c);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  size_t i = 0;
  bool first = true;
  while (i < s.size()) {
    const char32_t c = utf8::next(s, i);
    if (first)
      utf8::append_title(out, c);
    else
      utf8::append_lower(out, c);
    first = false;
  }
  return out;
}

std::string swapcase(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = utf8::next(s, i);
    if (utf8::py_isupper(c))
      utf8::append_lower(out, c);
    else if (utf8::py_islower(c))
      utf8::append_upper(out, c);
    else
      utf8::append(out, c);
  }
  return out;
}

std::string pad(std::string_view s, int64_t width, char32_t fill, char align) {
  const auto len = static_cast<int64_t>(utf8::length(s));
  if (width <= len) return std::string(s);
  if (width > (1 << 26)) throw_error(ErrorKind::Limit, "padding width too large");
  const int64_t total = width - len;
  int64_t left = 0;
  if (align == '>')
    left = total;
  else if (align == '^')
    left = total / 2 + (total & width & 1);  // CPython str.center rounding
  std::string f;
  utf8::append(f, fill);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += f;
  out += s;
  for (int64_t i = 0; i < total - left; ++i) out += f;
  return out;
}

bool is_all(std::string_view s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  size_t i = 0;
  while (i < s.size())
    if (!pred(utf8::next(s, i))) return false;
  return true;
}

bool is_cased_upper(std::string_view s) {
  bool cased = false;
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = utf8::next(s, i);
    if (utf8::py_islower(c) && !utf8::py_isupper(c)) return false;
    if (utf8::py_isupper(c)) cased = true;
  }
  return cased;
}

bool is_cased_lower(std::string_view s) {
  bool cased = false;
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = utf8::next(s, i);
    if (utf8::py_isupper(c) && !utf8::py_islower(c)) return false;
    if (utf8::py_islower(c)) cased = true;
  }
  return cased;
}

bool is_title(std::string_view s) {
  bool cased = false, prev_cased = false;
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = utf8::next(s, i);
    const bool up = utf8::to_lower(c) != c;
    const bool lo = utf8::to_upper(c) != c;
    if (up) {
      if (prev_cased) return false;
      prev_cased = cased = true;
    } else if (lo) {
      if (!prev_cased) return false;
      prev_cased = cased = true;
    } else {
      prev_cased = false;
    }
  }
  return cased;
}

static size_t cp_offset(std::string_view s, int64_t cp) {
  size_t i = 0;
  for (int64_t k = 0; k < cp && i < s.size(); ++k) utf8::next(s, i);
  return i;
}

std::string substr_cp(std::string_view s, int64_t start, int64_t end) {
  const size_t b = cp_offset(s, start);
  const size_t e = cp_offset(s, end);
  return std::string(s.substr(b, e > b ? e - b : 0));
}

int64_t find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse) {
  const auto len = static_cast<int64_t>(utf8::length(s));
  if (start > len || start > end) return -1;
  const size_t b = cp_offset(s, start);
  const size_t e = cp_offset(s, end);
  const std::string_view hay = s.substr(b, e - b);
  const size_t f = reverse ? hay.rfind(sub) : hay.find(sub);
  if (f == std::string_view::npos) return -1;
  return start + static_cast<int64_t>(utf8::length(hay.substr(0, f)));
}

int64_t count(std::string_view s, std::string_view sub, int64_t start, int64_t end) {
  const auto len = static_cast<int64_t>(utf8::length(s));
  if (start > len || start > end) return 0;
  const size_t b = cp_offset(s, start);
  const size_t e = cp_offset(s, end);
  const std::string_view hay = s.substr(b, e - b);
  if (sub.empty()) return static_cast<int64_t>(utf8::length(hay)) + 1;
  int64_t n = 0;
  size_t pos = 0;
  while (true) {
    const size_t f = hay.find(sub, pos);
    if (f == std::string_view::npos) break;
    ++n;
    pos = f + sub.size();
  }
  return n;
}

}  // namespace pystr

// ---------------------------------------------------------------------------------------------------------------
// ArgBinder

ArgBinder::ArgBinder(const char* func, CallArgs& args, std::initializer_list<const char*> names, size_t skip)
    : vals_(names.size(), nullptr) {
  const std::vector<const char*> nm(names);
  if (args.pos.size() > skip + nm.size()) {
    throw_error(ErrorKind::Type, std::string(func) + "() takes at most " + std::to_string(nm.size()) +
                                     " argument(s) (" + std::to_string(args.pos.size() - skip) + " given)");
  }
  for (size_t i = skip; i < args.pos.size(); ++i) vals_[i - skip] = &args.pos[i];
  for (auto& [k, v] : args.kw) {
    size_t idx = nm.size();
    for (size_t i = 0; i < nm.size(); ++i)
      if (k == nm[i]) idx = i;
    if (idx == nm.size())
      throw_error(ErrorKind::Type, std::string(func) + "() got an unexpected keyword argument '" + k + "'");
    if (vals_[idx]) throw_error(ErrorKind::Type, std::string(func) + "() got multiple values for argument '" + k + "'");
    vals_[idx] = &v;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Methods

namespace {

class BoundMethod : public Object {
 public:
  BoundMethod(Value r, std::string n) : recv(std::move(r)), name(std::move(n)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override {
    return "<built-in method " + name + " of " + jinja::type_name(recv) + " object>";
  }
  bool callable() const override { return true; }
  Value call(Interpreter& in, CallArgs& args) override {
    if (auto r = call_method(in, recv, name, args)) return std::move(*r);
    throw_error(ErrorKind::Type, "'" + name + "' is not callable");
  }
  void release() override { recv = Value(); }
  Value recv;
  std::string name;
};

const std::unordered_set<std::string_view> kStrMethods = {
    "strip",        "lstrip",    "rstrip",      "split",     "rsplit",     "splitlines",   "startswith",
    "endswith",     "replace",   "upper",       "lower",     "title",      "capitalize",   "swapcase",
    "casefold",     "find",      "rfind",       "index",     "rindex",     "count",        "join",
    "center",       "ljust",     "rjust",       "zfill",     "format",     "isdigit",      "isalpha",
    "isalnum",      "isspace",   "isupper",     "islower",   "istitle",    "isnumeric",    "isdecimal",
    "isidentifier", "isascii",   "isprintable", "partition", "rpartition", "removeprefix", "removesuffix",
    "expandtabs",   "format_map"};
const std::unordered_set<std::string_view> kListMutators = {"append", "extend",  "insert", "pop",
                                                            "remove", "reverse", "sort",   "clear"};
const std::unordered_set<std::string_view> kDictMutators = {"update", "pop", "popitem", "setdefault", "clear"};

bool is_tuple(const Value& v) {
  return v.is_list() && (v.list().kind == ListKind::Tuple || v.list().kind == ListKind::GroupTuple);
}

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_string()) throw_error(ErrorKind::Type, std::string(what) + " must be str, not " + type_name(v));
  return v.str();
}

int64_t need_int(const Value& v, const char* what) {
  if (!v.is_integral()) {
    throw_error(ErrorKind::Type,
                std::string("'") + type_name(v) + "' object cannot be interpreted as an integer (" + what + ")");
  }
  return v.as_int();
}

// Python's slice-style normalisation of start/end arguments (None allowed).
void norm_range(const ArgBinder& b, size_t i_start, size_t i_end, int64_t len, int64_t& start, int64_t& end) {
  start = 0;
  end = len;
  if (b.has(i_start) && !b.get(i_start).is_none()) start = need_int(b.get(i_start), "start");
  if (b.has(i_end) && !b.get(i_end).is_none()) end = need_int(b.get(i_end), "end");
  if (start < 0) start = std::max<int64_t>(0, start + len);
  if (end < 0) end = std::max<int64_t>(0, end + len);
  end = std::min(end, len);
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return Value::list(std::move(out));
}

std::optional<Value> str_method(Interpreter& in, const std::string& s, const std::string& name, CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ArgBinder b(name.c_str(), args, {"chars"});
    const std::string* chars = nullptr;
    if (b.has(0) && !b.get(0).is_none()) chars = &need_str(b.get(0), "strip arg");
    return Value(pystr::strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    ArgBinder b(name.c_str(), args, {"sep", "maxsplit"});
    const std::string* sep = nullptr;
    if (b.has(0) && !b.get(0).is_none()) sep = &need_str(b.get(0), "sep");
    const int64_t maxsplit = b.has(1) ? need_int(b.get(1), "maxsplit") : -1;
    if (sep && sep->empty()) throw_error(ErrorKind::Type, "empty separator");
    auto parts = name == "split" ? pystr::split(s, sep, maxsplit) : pystr::rsplit(s, sep, maxsplit);
    in.tick(parts.size());
    return str_list(std::move(parts));
  }
  if (name == "splitlines") {
    ArgBinder b("splitlines", args, {"keepends"});
    return str_list(pystr::splitlines(s, b.has(0) && truthy(b.get(0))));
  }
  if (name == "startswith" || name == "endswith") {
    ArgBinder b(name.c_str(), args, {"prefix", "start", "end"});
    if (!b.has(0)) throw_error(ErrorKind::Type, name + "() takes at least 1 argument (0 given)");
    std::vector<std::string> cands;
    const Value& p = b.get(0);
    if (p.is_string()) {
      cands.push_back(p.str());
    } else if (is_tuple(p)) {
      for (auto& x : p.list().items) cands.push_back(need_str(x, "tuple for startswith"));
    } else {
      throw_error(ErrorKind::Type, name + " first arg must be str or a tuple of str, not " + type_name(p));
    }
    int64_t start, end;
    const auto len = static_cast<int64_t>(utf8::length(s));
    norm_range(b, 1, 2, len, start, end);
    if (start > len) return Value(false);
    const std::string hay = (start == 0 && end == len) ? s : pystr::substr_cp(s, start, std::max(start, end));
    for (auto& c : cands) {
      if (end - start < static_cast<int64_t>(utf8::length(c))) continue;
      if (name == "startswith" ? hay.starts_with(c) : hay.ends_with(c)) return Value(true);
    }
    return Value(false);
  }
  if (name == "replace") {
    ArgBinder b("replace", args, {"old", "new", "count"});
    if (!b.has(0) || !b.has(1)) throw_error(ErrorKind::Type, "replace expected at least 2 arguments");
    const int64_t count = b.has(2) ? need_int(b.get(2), "count") : -1;
    return Value(pystr::replace(s, need_str(b.get(0), "replace() argument 1"),
                                need_str(b.get(1), "replace() argument 2"), count, in.options().limits.max_output));
  }
  if (name == "upper") return Value(utf8::upper(s));
  if (name == "lower" || name == "casefold") return Value(utf8::lower(s));
  if (name == "title") return Value(pystr::title(s));
  if (name == "capitalize") return Value(pystr::capitalize(s));
  if (name == "swapcase") return Value(pystr::swapcase(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    ArgBinder b(name.c_str(), args, {"sub", "start", "end"});
    if (!b.has(0)) throw_error(ErrorKind::Type, name + "() takes at least 1 argument (0 given)");
    const std::string& sub = need_str(b.get(0), "must be str");
    int64_t start, end;
    norm_range(b, 1, 2, static_cast<int64_t>(utf8::length(s)), start, end);
    if (name == "count") return Value(pystr::count(s, sub, start, end));
    const int64_t r = pystr::find(s, sub, start, end, name[0] == 'r');
    if (r < 0 && (name == "index" || name == "rindex")) throw_error(ErrorKind::Type, "substring not found");
    return Value(r);
  }
  if (name == "join") {
    if (args.pos.size() != 1 || !args.kw.empty()) throw_error(ErrorKind::Type, "join() takes exactly one argument");
    std::string out;
    size_t i = 0;
    for (auto& item : in.iterate(args.pos[0])) {
      if (!item.is_string()) {
        throw_error(ErrorKind::Type,
                    "sequence item " + std::to_string(i) + ": expected str instance, " + type_name(item) + " found");
      }
      if (i++) out += s;
      out += item.str();
      in.check_size(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    ArgBinder b(name.c_str(), args, {"width", "fillchar"});
    if (!b.has(0)) throw_error(ErrorKind::Type, name + "() takes at least 1 argument (0 given)");
    char32_t fill = ' ';
    if (b.has(1)) {
      const std::string& f = need_str(b.get(1), "fill character");
      if (utf8::length(f) != 1) throw_error(ErrorKind::Type, "The fill character must be exactly one character long");
      size_t k = 0;
      fill = utf8::next(f, k);
    }
    return Value(pystr::pad(s, need_int(b.get(0), "width"), fill,
                            name == "center"  ? '^'
                            : name == "ljust" ? '<'
                                              : '>'));
  }
  if (name == "zfill") {
    ArgBinder b("zfill", args, {"width"});
    if (!b.has(0)) throw_error(ErrorKind::Type, "zfill() takes exactly one argument (0 given)");
    const int64_t width = need_int(b.get(0), "width");
    const auto len = static_cast<int64_t>(utf8::length(s));
    if (width <= len) return Value(s);
    if (width > (1 << 26)) throw_error(ErrorKind::Limit, "padding width too large");
    std::string sign, rest = s;
    if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
      sign = s.substr(0, 1);
      rest = s.substr(1);
    }
    return Value(sign + std::string(static_cast<size_t>(width - len), '0') + rest);
  }
  if (name == "format") return Value(str_format(in, s, args));
  if (name == "format_map") {
    if (args.pos.size() != 1) throw_error(ErrorKind::Type, "format_map() takes exactly one argument");
    CallArgs a;
    if (!args.pos[0].is_dict()) throw_error(ErrorKind::Type, "format_map() argument must be a mapping");
    for (auto& [k, v] : args.pos[0].dict().items())
      if (k.is_string()) a.kw.emplace_back(k.str(), v);
    return Value(str_format(in, s, a));
  }
  if (name == "isdigit") return Value(pystr::is_all(s, utf8::py_isdigit));
  if (name == "isdecimal") return Value(pystr::is_all(s, utf8::py_isdigit));
  if (name == "isnumeric") return Value(pystr::is_all(s, utf8::py_isnumeric));
  if (name == "isalpha") return Value(pystr::is_all(s, utf8::py_isalpha));
  if (name == "isalnum") return Value(pystr::is_all(s, utf8::py_isalnum));
  if (name == "isspace") return Value(pystr::is_all(s, utf8::py_isspace));
  if (name == "isprintable") return Value(s.empty() || pystr::is_all(s, utf8::py_isprintable));
  if (name == "isascii") return Value(utf8::is_ascii(s));
  if (name == "isupper") return Value(pystr::is_cased_upper(s));
  if (name == "islower") return Value(pystr::is_cased_lower(s));
  if (name == "istitle") return Value(pystr::is_title(s));
  if (name == "isidentifier") {
    if (s.empty()) return Value(false);
    size_t i = 0;
    const char32_t c0 = utf8::next(s, i);
    if (!(c0 == '_' || utf8::py_isalpha(c0))) return Value(false);
    while (i < s.size())
      if (!utf8::is_word(utf8::next(s, i))) return Value(false);
    return Value(true);
  }
  if (name == "partition" || name == "rpartition") {
    if (args.pos.size() != 1) throw_error(ErrorKind::Type, name + "() takes exactly one argument");
    const std::string& sep = need_str(args.pos[0], "sep");
    if (sep.empty()) throw_error(ErrorKind::Type, "empty separator");
    const size_t f = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (f == std::string::npos) {
      if (name == "partition") return Value::tuple({Value(s), Value(""), Value("")});
      return Value::tuple({Value(""), Value(""), Value(s)});
    }
    return Value::tuple({Value(s.substr(0, f)), Value(sep), Value(s.substr(f + sep.size()))});
  }
  if (name == "removeprefix" || name == "removesuffix") {
    if (args.pos.size() != 1) throw_error(ErrorKind::Type, name + "() takes exactly one argument");
    const std::string& a = need_str(args.pos[0], name.c_str());
    if (name == "removeprefix") return Value(s.starts_with(a) ? s.substr(a.size()) : s);
    return Value(s.ends_with(a) ? s.substr(0, s.size() - a.size()) : s);
  }
  if (name == "expandtabs") {
    ArgBinder b("expandtabs", args, {"tabsize"});
    const int64_t ts = b.has(0) ? need_int(b.get(0), "tabsize") : 8;
    std::string out;
    int64_t col = 0;
    size_t i = 0;
    while (i < s.size()) {
      const char32_t c = utf8::next(s, i);
      if (c == '\t') {
        if (ts > 0) {
          const int64_t n = ts - col % ts;
          if (n > (1 << 20)) throw_error(ErrorKind::Limit, "tab size too large");
          out.append(static_cast<size_t>(n), ' ');
          col += n;
        }
      } else {
        utf8::append(out, c);
        col = (c == '\n' || c == '\r') ? 0 : col + 1;
      }
      in.check_size(out.size());
    }
    return Value(std::move(out));
  }
  return std::nullopt;
}

std::optional<Value> list_method(Interpreter& in, const Value& recv, const std::string& name, CallArgs& args) {
  const ListData& l = recv.list();
  const bool seq = l.kind == ListKind::List || l.kind == ListKind::Tuple || l.kind == ListKind::GroupTuple ||
                   l.kind == ListKind::Range;
  if (!seq) return std::nullopt;
  if (name == "index") {
    ArgBinder b("index", args, {"value", "start", "stop"});
    if (!b.has(0)) throw_error(ErrorKind::Type, "index expected at least 1 argument, got 0");
    int64_t start, end;
    norm_range(b, 1, 2, static_cast<int64_t>(l.items.size()), start, end);
    for (int64_t i = start; i < end; ++i)
      if (py_eq(l.items[static_cast<size_t>(i)], b.get(0))) return Value(i);
    throw_error(ErrorKind::Type, repr(b.get(0)) + " is not in " + type_name(recv));
  }
  if (name == "count") {
    if (args.pos.size() != 1) throw_error(ErrorKind::Type, "count() takes exactly one argument");
    int64_t n = 0;
    for (auto& x : l.items)
      if (py_eq(x, args.pos[0])) ++n;
    return Value(n);
  }
  if (name == "copy" && l.kind == ListKind::List) {
    in.tick(l.items.size());
    return Value::list(l.items);
  }
  return std::nullopt;
}

std::optional<Value> dict_method(Interpreter& in, const Value& recv, const std::string& name, CallArgs& args) {
  const DictData& d = recv.dict();
  if (name == "items" || name == "keys" || name == "values") {
    if (!args.pos.empty() || !args.kw.empty()) throw_error(ErrorKind::Type, name + "() takes no arguments");
    in.tick(d.size());
    std::vector<Value> out;
    out.reserve(d.size());
    for (auto& [k, v] : d.items()) {
      if (name == "items")
        out.push_back(Value::tuple({k, v}));
      else
        out.push_back(name == "keys" ? k : v);
    }
    return Value::list(std::move(out), name == "items"  ? ListKind::ItemsView
                                       : name == "keys" ? ListKind::KeysView
                                                        : ListKind::ValuesView);
  }
  if (name == "get") {
    if (args.pos.empty() || args.pos.size() > 2 || !args.kw.empty())
      throw_error(ErrorKind::Type, "get expected 1 or 2 arguments");
    if (!hashable(args.pos[0])) throw_error(ErrorKind::Type, "unhashable type: '" + type_name(args.pos[0]) + "'");
    if (const Value* v = d.find(args.pos[0])) return *v;
    return args.pos.size() > 1 ? args.pos[1] : Value::none();
  }
  if (name == "copy") {
    in.tick(d.size());
    return recv;  // immutable: sharing is a copy
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> method_attr(Interpreter& in, const Value& recv, const std::string& name) {
  auto bound = [&]() { return Value(std::static_pointer_cast<Object>(in.make<BoundMethod>(recv, name))); };
  auto unsafe = [&]() {
    return Value::undefined("access to attribute '" + name + "' of '" + type_name(recv) + "' object is unsafe.", true);
  };
  if (recv.is_string()) {
    if (kStrMethods.count(name)) return bound();
    return std::nullopt;
  }
  if (recv.is_list()) {
    const ListKind k = recv.list().kind;
    if (k == ListKind::List && kListMutators.count(name)) return unsafe();
    if ((name == "index" || name == "count") &&
        (k == ListKind::List || k == ListKind::Tuple || k == ListKind::GroupTuple || k == ListKind::Range))
      return bound();
    if (name == "copy" && k == ListKind::List) return bound();
    return std::nullopt;
  }
  if (recv.is_dict()) {
    if (kDictMutators.count(name)) return unsafe();
    if (name == "items" || name == "keys" || name == "values" || name == "get" || name == "copy") return bound();
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<Value> call_method(Interpreter& in, const Value& recv, const std::string& name, CallArgs& args) {
  if (recv.is_string()) {
    if (!kStrMethods.count(name)) return std::nullopt;
    return str_method(in, recv.str(), name, args);
  }
  if (recv.is_list()) return list_method(in, recv, name, args);
  if (recv.is_dict()) return dict_method(in, recv, name, args);
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------------
// Formatting

namespace {

// Float in fixed / exponent / general notation with a precision, as Python's format() does it.
std::string float_fmt(double v, char type, int prec, bool alt) {
  if (std::isnan(v)) return (type >= 'A' && type <= 'Z') ? "NAN" : "nan";
  if (std::isinf(v)) {
    const char* s = (type >= 'A' && type <= 'Z') ? "INF" : "inf";
    return v < 0 ? std::string("-") + s : s;
  }
  if (prec > 500) throw_error(ErrorKind::Limit, "precision too large");
  std::string spec = "%";
  if (alt) spec += '#';
  spec += ".*";
  spec += type;
  char buf[1024];
  const int n = std::snprintf(buf, sizeof buf, spec.c_str(), prec, v);
  if (n < 0 || static_cast<size_t>(n) >= sizeof buf) {
    // very large fixed-point numbers
    std::string big(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
    std::snprintf(big.data(), big.size(), spec.c_str(), prec, v);
    big.resize(static_cast<size_t>(std::max(n, 0)));
    return big;
  }
  return std::string(buf, static_cast<size_t>(n));
}

std::string int_to_base(int64_t v, int base, bool upper) {
  if (v == 0) return "0";
  const bool neg = v < 0;
  uint64_t u = neg ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string out;
  const char* digs = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  while (u) {
    out += digs[u % static_cast<uint64_t>(base)];
    u /= static_cast<uint64_t>(base);
  }
  if (neg) out += '-';
  std::reverse(out.begin(), out.end());
  return out;
}

std::string group_digits(const std::string& digits, char sep, int every) {
  std::string out;
  const int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i && (n - i) % every == 0) out += sep;
    out += digits[static_cast<size_t>(i)];
  }
  return out;
}

struct Spec {
  char32_t fill = ' ';
  char align = 0;
  char sign = 0;
  bool alt = false;
  bool zero = false;
  int64_t width = -1;
  char grouping = 0;
  int precision = -1;
  char type = 0;
};

Spec parse_spec(const std::string& s) {
  Spec sp;
  const std::u32string u = utf8::decode(s);
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (u.size() >= 2 && is_align(u[1])) {
    sp.fill = u[0];
    sp.align = static_cast<char>(u[1]);
    i = 2;
  } else if (!u.empty() && is_align(u[0])) {
    sp.align = static_cast<char>(u[0]);
    i = 1;
  }
  if (i < u.size() && (u[i] == '+' || u[i] == '-' || u[i] == ' ')) sp.sign = static_cast<char>(u[i++]);
  if (i < u.size() && u[i] == 'z') ++i;
  if (i < u.size() && u[i] == '#') {
    sp.alt = true;
    ++i;
  }
  if (i < u.size() && u[i] == '0') {
    sp.zero = true;
    ++i;
  }
  if (i < u.size() && u[i] >= '0' && u[i] <= '9') {
    sp.width = 0;
    while (i < u.size() && u[i] >= '0' && u[i] <= '9') {
      sp.width = sp.width * 10 + (u[i++] - '0');
      if (sp.width > (1 << 26)) throw_error(ErrorKind::Limit, "format width too large");
    }
  }
  if (i < u.size() && (u[i] == ',' || u[i] == '_')) sp.grouping = static_cast<char>(u[i++]);
  if (i < u.size() && u[i] == '.') {
    ++i;
    if (i >= u.size() || u[i] < '0' || u[i] > '9') throw_error(ErrorKind::Type, "Format specifier missing precision");
    sp.precision = 0;
    while (i < u.size() && u[i] >= '0' && u[i] <= '9') {
      sp.precision = sp.precision * 10 + static_cast<int>(u[i++] - '0');
      if (sp.precision > 500) throw_error(ErrorKind::Limit, "precision too large");
    }
  }
  if (i < u.size()) sp.type = static_cast<char>(u[i++]);
  if (i < u.size()) throw_error(ErrorKind::Type, "Invalid format specifier '" + s + "'");
  return sp;
}

std::string apply_align(std::string body, const Spec& sp, char default_align, bool numeric) {
  const auto len = static_cast<int64_t>(utf8::length(body));
  if (sp.width <= len) return body;
  char align = sp.align ? sp.align : default_align;
  char32_t fill = sp.fill;
  if (!sp.align && sp.zero && numeric) {
    align = '=';
    fill = '0';
  }
  if (align == '=') {
    size_t sign_len = 0;
    if (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) sign_len = 1;
    if (body.size() > sign_len + 1 && body[sign_len] == '0' &&
        (body[sign_len + 1] == 'x' || body[sign_len + 1] == 'X' || body[sign_len + 1] == 'o' ||
         body[sign_len + 1] == 'b'))
      sign_len += 2;
    std::string f;
    utf8::append(f, fill);
    std::string pad;
    for (int64_t i = 0; i < sp.width - len; ++i) pad += f;
    return body.substr(0, sign_len) + pad + body.substr(sign_len);
  }
  return pystr::pad(body, sp.width, fill, align);
}

std::string format_value(const Value& v, const std::string& spec_str) {
  if (spec_str.empty()) return to_str(v);
  const Spec sp = parse_spec(spec_str);
  if (v.is_string() || v.is_undefined()) {
    if (sp.type && sp.type != 's')
      throw_error(ErrorKind::Type, std::string("Unknown format code '") + sp.type + "' for object of type 'str'");
    std::string s = to_str(v);
    if (sp.precision >= 0) s = pystr::substr_cp(s, 0, sp.precision);
    return apply_align(s, sp, '<', false);
  }
  if (v.is_integral() && sp.type != 'e' && sp.type != 'E' && sp.type != 'f' && sp.type != 'F' && sp.type != 'g' &&
      sp.type != 'G' && sp.type != '%') {
    const int64_t x = v.as_int();
    std::string digits;
    std::string prefix;
    switch (sp.type) {
      case 0:
      case 'd':
      case 'n': digits = int_to_base(x < 0 ? -x : x, 10, false); break;
      case 'x':
        digits = int_to_base(x < 0 ? -x : x, 16, false);
        prefix = sp.alt ? "0x" : "";
        break;
      case 'X':
        digits = int_to_base(x < 0 ? -x : x, 16, true);
        prefix = sp.alt ? "0X" : "";
        break;
      case 'o':
        digits = int_to_base(x < 0 ? -x : x, 8, false);
        prefix = sp.alt ? "0o" : "";
        break;
      case 'b':
        digits = int_to_base(x < 0 ? -x : x, 2, false);
        prefix = sp.alt ? "0b" : "";
        break;
      case 'c': {
        std::string s;
        utf8::append(s, static_cast<char32_t>(x));
        return apply_align(s, sp, '<', false);
      }
      default:
        throw_error(ErrorKind::Type, std::string("Unknown format code '") + sp.type + "' for object of type 'int'");
    }
    if (sp.grouping) digits = group_digits(digits, sp.grouping, (sp.type == 0 || sp.type == 'd') ? 3 : 4);
    std::string sign = x < 0 ? "-" : (sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "");
    return apply_align(sign + prefix + digits, sp, '>', true);
  }
  if (v.is_number()) {
    const double x = v.as_float();
    std::string body;
    const double ax = std::fabs(x);
    switch (sp.type) {
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': body = float_fmt(ax, sp.type, sp.precision < 0 ? 6 : sp.precision, sp.alt); break;
      case '%': body = float_fmt(ax * 100, 'f', sp.precision < 0 ? 6 : sp.precision, sp.alt) + "%"; break;
      case 0:
      case 'n':
        if (sp.precision < 0) {
          body = float_repr(ax);
        } else {
          body = float_fmt(ax, 'g', sp.precision == 0 ? 1 : sp.precision, sp.alt);
          if (std::isfinite(ax) && body.find_first_of(".e") == std::string::npos) body += ".0";
        }
        break;
      default:
        throw_error(ErrorKind::Type, std::string("Unknown format code '") + sp.type + "' for object of type 'float'");
    }
    if (sp.grouping) {
      const size_t dot = body.find_first_of(".e%");
      const std::string ip = body.substr(0, dot);
      if (!ip.empty() && std::isdigit(static_cast<unsigned char>(ip[0])))
        body = group_digits(ip, sp.grouping, 3) + (dot == std::string::npos ? "" : body.substr(dot));
    }
    const bool neg = std::signbit(x) && !std::isnan(x);
    std::string sign = neg ? "-" : (sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "");
    return apply_align(sign + body, sp, '>', true);
  }
  throw_error(ErrorKind::Type, "unsupported format string passed to " + type_name(v) + ".__format__");
}

}  // namespace

std::string str_format(Interpreter& in, const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t i = 0;
  int auto_idx = 0;
  bool used_auto = false, used_manual = false;
  while (i < fmt.size()) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        i += 2;
        continue;
      }
      throw_error(ErrorKind::Type, "Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      ++i;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      i += 2;
      continue;
    }
    // replacement field: find the matching '}' (one level of nesting in the spec)
    size_t j = i + 1;
    int depth = 1;
    while (j < fmt.size() && depth) {
      if (fmt[j] == '{')
        ++depth;
      else if (fmt[j] == '}')
        --depth;
      if (depth) ++j;
    }
    if (j >= fmt.size()) throw_error(ErrorKind::Type, "expected '}' before end of string");
    std::string field = fmt.substr(i + 1, j - i - 1);
    i = j + 1;
    std::string spec;
    char conv = 0;
    size_t colon = std::string::npos;
    {
      int br = 0;
      for (size_t k = 0; k < field.size(); ++k) {
        if (field[k] == '[')
          ++br;
        else if (field[k] == ']')
          --br;
        else if (field[k] == ':' && br == 0) {
          colon = k;
          break;
        }
      }
    }
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      if (bang + 2 != field.size()) throw_error(ErrorKind::Type, "expected ':' after conversion specifier");
      conv = field[bang + 1];
      field = field.substr(0, bang);
    }
    // nested fields in the spec
    if (spec.find('{') != std::string::npos) spec = str_format(in, spec, args);
    // field name: first part, then .attr / [key]
    size_t k = 0;
    while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
    const std::string first = field.substr(0, k);
    Value v;
    if (first.empty()) {
      if (used_manual)
        throw_error(ErrorKind::Type, "cannot switch from manual field specification to automatic field numbering");
      used_auto = true;
      const auto idx = static_cast<size_t>(auto_idx++);
      if (idx >= args.pos.size())
        throw_error(ErrorKind::Type,
                    "Replacement index " + std::to_string(idx) + " out of range for positional args tuple");
      v = args.pos[idx];
    } else if (std::all_of(first.begin(), first.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      if (used_auto)
        throw_error(ErrorKind::Type, "cannot switch from automatic field numbering to manual field specification");
      used_manual = true;
      const size_t idx = first.size() > 9 ? SIZE_MAX : std::stoul(first);
      if (idx >= args.pos.size())
        throw_error(ErrorKind::Type, "Replacement index " + first + " out of range for positional args tuple");
      v = args.pos[idx];
    } else {
      const Value* kv = args.kwarg(first);
      if (!kv) throw_error(ErrorKind::Type, "KeyError: '" + first + "'");
      v = *kv;
    }
    while (k < field.size()) {
      if (field[k] == '.') {
        size_t e = k + 1;
        while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
        v = in.getattr(v, field.substr(k + 1, e - k - 1));
        k = e;
      } else {
        const size_t e = field.find(']', k);
        if (e == std::string::npos) throw_error(ErrorKind::Type, "Missing ']' in format string");
        const std::string key = field.substr(k + 1, e - k - 1);
        const bool numeric =
            !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        v = in.getitem(v, numeric && key.size() < 18 ? Value(static_cast<int64_t>(std::stoll(key))) : Value(key));
        k = e + 1;
      }
    }
    if (conv == 'r' || conv == 'a')
      v = Value(repr(v));
    else if (conv == 's')
      v = Value(to_str(v));
    else if (conv)
      throw_error(ErrorKind::Type, std::string("Unknown conversion specifier ") + conv);
    out += format_value(v, spec);
    in.check_size(out.size());
  }
  return out;
}

std::string percent_format(Interpreter& in, const std::string& fmt, const Value& args) {
  std::vector<Value> pos;
  const DictData* mapping = nullptr;
  if (args.is_list() && (args.list().kind == ListKind::Tuple || args.list().kind == ListKind::GroupTuple)) {
    pos = args.list().items;
  } else {
    if (args.is_dict()) mapping = &args.dict();
    pos.push_back(args);
  }
  // Python skips the "not all arguments converted" check when the argument supports item access
  // (dict, list, range), not only for real mappings.
  const bool subscriptable =
      args.is_dict() || (args.is_list() && (args.list().kind == ListKind::List || args.list().kind == ListKind::Range));
  size_t next_arg = 0;
  bool used_mapping = false;
  auto take = [&]() -> const Value& {
    if (next_arg >= pos.size()) throw_error(ErrorKind::Type, "not enough arguments for format string");
    return pos[next_arg++];
  };
  std::string out;
  size_t i = 0;
  while (i < fmt.size()) {
    const char c = fmt[i];
    if (c != '%') {
      out += c;
      ++i;
      continue;
    }
    ++i;
    if (i >= fmt.size()) throw_error(ErrorKind::Type, "incomplete format");
    Value v;
    bool have_v = false;
    if (fmt[i] == '(') {
      const size_t e = fmt.find(')', i);
      if (e == std::string::npos) throw_error(ErrorKind::Type, "incomplete format key");
      if (!mapping) throw_error(ErrorKind::Type, "format requires a mapping");
      const Value* mv = mapping->find(std::string_view(fmt).substr(i + 1, e - i - 1));
      if (!mv) throw_error(ErrorKind::Type, "KeyError: '" + fmt.substr(i + 1, e - i - 1) + "'");
      v = *mv;
      have_v = true;
      used_mapping = true;
      i = e + 1;
    }
    Spec sp;
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) flags += fmt[i++];
    if (flags.find('-') != std::string::npos) sp.align = '<';
    if (flags.find('+') != std::string::npos)
      sp.sign = '+';
    else if (flags.find(' ') != std::string::npos)
      sp.sign = ' ';
    sp.alt = flags.find('#') != std::string::npos;
    const bool zero = flags.find('0') != std::string::npos && !sp.align;
    auto star = [&]() -> int64_t {
      const Value& w = take();
      if (!w.is_integral()) throw_error(ErrorKind::Type, "* wants int");
      const int64_t n = w.as_int();
      if (n > (1 << 26) || n < -(1 << 26)) throw_error(ErrorKind::Limit, "format width too large");
      return n;
    };
    if (i < fmt.size() && fmt[i] == '*') {
      sp.width = star();
      if (sp.width < 0) {  // Python: a negative * width means left-aligned
        sp.align = '<';
        sp.width = -sp.width;
      }
      ++i;
    } else {
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        sp.width = std::max<int64_t>(sp.width, 0) * 10 + (fmt[i++] - '0');
        if (sp.width > (1 << 26)) throw_error(ErrorKind::Limit, "format width too large");
      }
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      sp.precision = 0;
      if (i < fmt.size() && fmt[i] == '*') {
        sp.precision = static_cast<int>(std::clamp<int64_t>(star(), 0, 500));
        ++i;
      } else {
        while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
          sp.precision = sp.precision * 10 + (fmt[i++] - '0');
          if (sp.precision > 500) throw_error(ErrorKind::Limit, "precision too large");
        }
      }
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) throw_error(ErrorKind::Type, "incomplete format");
    const char type = fmt[i++];
    if (type == '%') {
      out += '%';
      continue;
    }
    if (!have_v) v = take();
    std::string body;
    bool numeric = false;
    switch (type) {
      case 's':
        body = to_str(v);
        if (sp.precision >= 0) body = pystr::substr_cp(body, 0, sp.precision);
        break;
      case 'r':
      case 'a':
        body = repr(v);
        if (sp.precision >= 0) body = pystr::substr_cp(body, 0, sp.precision);
        break;
      case 'd':
      case 'i':
      case 'u': {
        if (!v.is_number())
          throw_error(ErrorKind::Type,
                      std::string("%") + type + " format: a real number is required, not " + type_name(v));
        const int64_t x = v.is_float() ? static_cast<int64_t>(std::trunc(v.as_float())) : v.as_int();
        body = int_to_base(x, 10, false);
        if (sp.precision > 0 && static_cast<int>(body.size()) < sp.precision + (x < 0)) {
          const size_t neg = x < 0 ? 1 : 0;
          body.insert(neg, static_cast<size_t>(sp.precision) - (body.size() - neg), '0');
        }
        if (x >= 0 && sp.sign) body = std::string(1, sp.sign) + body;
        numeric = true;
        break;
      }
      case 'x':
      case 'X':
      case 'o': {
        if (!v.is_integral())
          throw_error(ErrorKind::Type,
                      std::string("%") + type + " format: an integer is required, not " + type_name(v));
        const int64_t x = v.as_int();
        body = int_to_base(x < 0 ? -x : x, type == 'o' ? 8 : 16, type == 'X');
        if (sp.alt) body = (type == 'o' ? "0o" : type == 'x' ? "0x" : "0X") + body;
        body = (x < 0 ? "-" : sp.sign ? std::string(1, sp.sign) : "") + body;
        numeric = true;
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (!v.is_number()) throw_error(ErrorKind::Type, "must be real number, not " + type_name(v));
        const double x = v.as_float();
        body = float_fmt(std::fabs(x), type, sp.precision < 0 ? 6 : sp.precision, sp.alt);
        body = ((std::signbit(x) && !std::isnan(x)) ? "-" : sp.sign ? std::string(1, sp.sign) : "") + body;
        numeric = true;
        break;
      }
      case 'c':
        if (v.is_integral())
          utf8::append(body, static_cast<char32_t>(v.as_int()));
        else if (v.is_string() && utf8::length(v.str()) == 1)
          body = v.str();
        else
          throw_error(ErrorKind::Type, "%c requires int or char");
        break;
      default: throw_error(ErrorKind::Type, std::string("unsupported format character '") + type + "'");
    }
    Spec ap = sp;
    ap.zero = zero && numeric;
    if (!ap.align) ap.align = (ap.zero ? 0 : '>');
    out += apply_align(body, ap, '>', numeric);
    in.check_size(out.size());
  }
  if (!used_mapping && next_arg < pos.size() && !subscriptable)
    throw_error(ErrorKind::Type, "not all arguments converted during string formatting");
  return out;
}

}  // namespace latent::jinja
