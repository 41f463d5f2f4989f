// Filters, tests and globals of jinja2 3.1 as configured by transformers (tojson overridden with json.dumps
// semantics, raise_exception, strftime_now).
#include "jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unordered_map>

#include "jinja/error.h"
#include "jinja/interpreter.h"
#include "jinja/pystr.h"
#include "jinja/utf8.h"

namespace latent::jinja {

namespace {

// ---- helpers ----

void no_args(const char* name, const CallArgs& a) {
  if (!a.pos.empty() || !a.kw.empty()) throw_error(ErrorKind::Type, std::string(name) + "() takes no arguments");
}

int64_t as_index(const Value& v, const char* what) {
  if (!v.is_integral()) {
    throw_error(ErrorKind::Type, "'" + type_name(v) + "' object cannot be interpreted as an integer (" + what + ")");
  }
  return v.as_int();
}

Value gen(std::vector<Value> items) { return Value::list(std::move(items), ListKind::Generator); }

[[noreturn]] void undefined_error(const Value& v) {
  throw_error(v.undef().unsafe ? ErrorKind::Security : ErrorKind::Undefined,
              v.undef().hint.empty() ? "value is undefined" : v.undef().hint);
}

Value ignore_case(const Value& v) { return v.is_string() ? Value(utf8::lower(v.str())) : v; }

// make_attrgetter: "a.b.0" → getitem chain.
std::vector<Value> attr_parts(const Value& attribute) {
  std::vector<Value> parts;
  if (attribute.is_none() || attribute.is_undefined()) return parts;
  if (!attribute.is_string()) {
    parts.push_back(attribute);
    return parts;
  }
  std::string s = attribute.str();
  size_t pos = 0;
  while (true) {
    const size_t d = s.find('.', pos);
    std::string part = s.substr(pos, d == std::string::npos ? std::string::npos : d - pos);
    const bool digits =
        !part.empty() && pystr::is_all(part, utf8::py_isdigit) && utf8::is_ascii(part) && part.size() < 18;
    parts.push_back(digits ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (d == std::string::npos) break;
    pos = d + 1;
  }
  return parts;
}

Value get_path(Interpreter& in, Value item, const std::vector<Value>& parts, const Value* dflt) {
  for (auto& p : parts) {
    item = in.getitem(item, p);
    if (dflt && !dflt->is_none() && item.is_undefined()) item = *dflt;
  }
  return item;
}

bool lt(const Value& a, const Value& b) {
  if (a.is_undefined())
    throw_error(ErrorKind::Undefined, a.undef().hint.empty() ? "value is undefined" : a.undef().hint);
  if (b.is_undefined())
    throw_error(ErrorKind::Undefined, b.undef().hint.empty() ? "value is undefined" : b.undef().hint);
  return py_compare(a, b, "<");
}

// Python list comparison of sort keys.
bool keys_lt(const std::vector<Value>& a, const std::vector<Value>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (!py_eq(a[i], b[i])) return lt(a[i], b[i]);
  }
  return a.size() < b.size();
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Python int(str, base) for base 10 (and 0/2/8/16).
bool parse_py_int(const std::string& text, int base, int64_t& out) {
  std::string s = pystr::strip(text, nullptr, true, true);
  bool neg = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (i + 1 < s.size() && s[i] == '0') {
      const char p = static_cast<char>(s[i + 1] | 0x20);
      const int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (pb && (base == 0 || base == pb)) {
        base = pb;
        i += 2;
        if (i < s.size() && s[i] == '_') ++i;
      }
    }
    if (base == 0) base = 10;
  }
  if (base < 2 || base > 36 || i >= s.size()) return false;
  __int128 v = 0;
  bool prev_us = true;
  bool any = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      if (prev_us) return false;
      prev_us = true;
      continue;
    }
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
      d = (c | 0x20) - 'a' + 10;
    else
      return false;
    if (d >= base) return false;
    v = v * base + d;
    if (v > static_cast<__int128>(INT64_MAX) + 1) return false;
    prev_us = false;
    any = true;
  }
  if (!any || prev_us) return false;
  if (neg) v = -v;
  if (v > INT64_MAX || v < INT64_MIN) return false;
  out = static_cast<int64_t>(v);
  return true;
}

// Python float(str).
bool parse_py_float(const std::string& text, double& out) {
  std::string s = pystr::strip(text, nullptr, true, true);
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1])))
        return false;
      continue;
    }
    t += s[i];
  }
  if (t.empty()) return false;
  std::string low = utf8::lower(t);
  std::string body = low;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body = body.substr(1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : INFINITY;
    if (low[0] == '-') out = -out;
    return true;
  }
  for (char c : body)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-')) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end && *end == '\0';
}

// ---- filters ----

Value f_abs(Interpreter&, const Value& v, CallArgs& a) {
  no_args("abs", a);
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) throw_error(ErrorKind::Type, "integer overflow");
    return Value(static_cast<int64_t>(std::llabs(v.as_int())));
  }
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  throw_error(ErrorKind::Type, "bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("attr", a, {"name"});
  if (!b.has(0)) throw_error(ErrorKind::Type, "attr() missing required argument 'name'");
  const std::string name = to_str(b.get(0));
  if (v.is_undefined()) undefined_error(v);
  if (v.is_object()) return v.obj().get_attr(in, name);
  if (v.is_string() || v.is_list() || v.is_dict())
    if (auto m = method_attr(in, v, name)) return *m;
  return Value::undefined("'" + type_name(v) + " object' has no attribute '" + name + "'");
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("batch", a, {"linecount", "fill_with"});
  if (!b.has(0)) throw_error(ErrorKind::Type, "batch() missing required argument 'linecount'");
  const int64_t n = as_index(b.get(0), "linecount");
  std::vector<Value> out, tmp;
  for (auto& item : in.iterate(v)) {
    in.tick();
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(item);
  }
  if (!tmp.empty()) {
    if (b.has(1) && !b.get(1).is_none())
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(b.get(1));
    out.push_back(Value::list(std::move(tmp)));
  }
  return gen(std::move(out));
}

Value f_capitalize(Interpreter&, const Value& v, CallArgs& a) {
  no_args("capitalize", a);
  return Value(pystr::capitalize(to_str(v)));
}

Value f_center(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("center", a, {"width"});
  return Value(pystr::pad(to_str(v), b.has(0) ? as_index(b.get(0), "width") : 80, ' ', '^'));
}

Value f_length(Interpreter&, const Value& v, CallArgs& a) {
  no_args("length", a);
  return Value(py_len(v));
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("default", a, {"default_value", "boolean"});
  const bool boolean = b.has(1) && truthy(b.get(1));
  if (v.is_undefined() || (boolean && !truthy(v))) return b.get_or(0, Value(""));
  return v;
}

Value f_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_dict()) throw_error(ErrorKind::Type, "'" + type_name(v) + "' object has no attribute 'items'");
  const bool cs = b.has(0) && truthy(b.get(0));
  const std::string by = b.has(1) ? to_str(b.get(1)) : "key";
  if (by != "key" && by != "value") throw_error(ErrorKind::Type, "You can only sort by either \"key\" or \"value\"");
  const bool rev = b.has(2) && truthy(b.get(2));
  const size_t pos = by == "key" ? 0 : 1;
  std::vector<std::pair<Value, Value>> items;  // (sort key, tuple)
  for (auto& [k, val] : v.dict().items()) {
    const Value& key = pos == 0 ? k : val;
    items.emplace_back(cs ? key : ignore_case(key), Value::tuple({k, val}));
  }
  in.tick(items.size());
  std::stable_sort(items.begin(), items.end(),
                   [&](const auto& x, const auto& y) { return rev ? lt(y.first, x.first) : lt(x.first, y.first); });
  std::vector<Value> out;
  for (auto& [k, t] : items) out.push_back(std::move(t));
  return Value::list(std::move(out));
}

Value f_escape(Interpreter&, const Value& v, CallArgs& a) {
  no_args("escape", a);
  return Value(html_escape(to_str(v)));
}

Value f_filesizeformat(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("filesizeformat", a, {"binary"});
  const bool binary = b.has(0) && truthy(b.get(0));
  if (v.is_undefined()) undefined_error(v);
  double bytes;
  if (v.is_number())
    bytes = v.as_float();
  else if (!(v.is_string() && parse_py_float(v.str(), bytes)))
    throw_error(ErrorKind::Type, "could not convert to float");
  const double base = binary ? 1024 : 1000;
  static const char* kBin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  static const char* kDec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  if (bytes == 1) return Value("1 Byte");
  if (bytes < base) return Value(std::to_string(static_cast<int64_t>(bytes)) + " Bytes");
  double unit = base;
  const char* prefix = "";
  for (int i = 0; i < 8; ++i) {
    unit = std::pow(base, i + 2);
    prefix = binary ? kBin[i] : kDec[i];
    if (bytes < unit) break;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s", base * bytes / unit, prefix);
  return Value(std::string(buf));
}

Value f_first(Interpreter& in, const Value& v, CallArgs& a) {
  no_args("first", a);
  if (v.is_string()) {
    if (v.str().empty()) return Value::undefined("No first item, sequence was empty.");
    size_t i = 0;
    utf8::next(v.str(), i);
    return Value(v.str().substr(0, i));
  }
  const std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter& in, const Value& v, CallArgs& a) {
  no_args("last", a);
  if (v.is_list() && v.list().kind == ListKind::Generator)
    throw_error(ErrorKind::Type, "'generator' object is not reversible");
  if (v.is_object()) throw_error(ErrorKind::Type, "'" + type_name(v) + "' object is not reversible");
  const std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("float", a, {"default"});
  if (v.is_undefined()) undefined_error(v);  // Undefined.__float__ raises
  if (v.is_number()) return Value(v.as_float());
  double d;
  if (v.is_string() && parse_py_float(v.str(), d)) return Value(d);
  return b.get_or(0, Value(0.0));
}

Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  if (!a.pos.empty() && !a.kw.empty())
    throw_error(ErrorKind::Type, "can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kw.empty()) {
    DictData d;
    for (auto& [k, x] : a.kw) d.set(k, x);
    args = Value::dict(std::move(d));
  } else {
    args = Value::tuple(a.pos);
  }
  return Value(percent_format(in, to_str(v), args));
}

Value f_groupby(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("groupby", a, {"attribute", "default", "case_sensitive"});
  if (!b.has(0)) throw_error(ErrorKind::Type, "groupby() missing required argument 'attribute'");
  const std::vector<Value> parts = attr_parts(b.get(0));
  const Value dflt = b.get_or(1, Value::none());
  const bool cs = b.has(2) && truthy(b.get(2));
  std::vector<std::pair<Value, Value>> items;
  for (auto& item : in.iterate(v)) {
    in.tick();
    Value key = get_path(in, item, parts, &dflt);
    items.emplace_back(cs ? key : ignore_case(key), item);
  }
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) { return lt(x.first, y.first); });
  std::vector<Value> out;
  size_t i = 0;
  while (i < items.size()) {
    size_t j = i;
    std::vector<Value> group;
    while (j < items.size() && py_eq(items[j].first, items[i].first)) group.push_back(items[j++].second);
    Value grouper = cs ? items[i].first : get_path(in, group.front(), parts, &dflt);
    out.push_back(Value::list({grouper, Value::list(std::move(group))}, ListKind::GroupTuple));
    i = j;
  }
  return Value::list(std::move(out));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("indent", a, {"width", "first", "blank"});
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_string())
    throw_error(ErrorKind::Type, "unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  std::string ind;
  if (b.has(0) && b.get(0).is_string()) {
    ind = b.get(0).str();
  } else {
    const int64_t w = b.has(0) ? as_index(b.get(0), "width") : 4;
    if (w > (1 << 20)) throw_error(ErrorKind::Limit, "indent width too large");
    ind = std::string(static_cast<size_t>(std::max<int64_t>(w, 0)), ' ');
  }
  const bool first = b.has(1) && truthy(b.get(1));
  const bool blank = b.has(2) && truthy(b.get(2));
  std::vector<std::string> lines = pystr::splitlines(v.str() + "\n", false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += lines[i];
      in.check_size(rv.size());
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += ind;
      rv += lines[i];
      in.check_size(rv.size());
    }
  }
  if (first) rv = ind + rv;
  return Value(std::move(rv));
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("int", a, {"default", "base"});
  if (v.is_undefined()) undefined_error(v);  // Undefined.__int__ raises
  const Value dflt = b.get_or(0, Value(static_cast<int64_t>(0)));
  if (v.is_integral()) return Value(v.as_int());
  if (v.is_float()) {
    const double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return dflt;
    return Value(static_cast<int64_t>(std::trunc(d)));
  }
  if (v.is_string()) {
    const int base = b.has(1) ? static_cast<int>(as_index(b.get(1), "base")) : 10;
    int64_t r;
    if (parse_py_int(v.str(), base, r)) return Value(r);
    double d;
    if (parse_py_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
      return Value(static_cast<int64_t>(std::trunc(d)));
  }
  return dflt;
}

Value f_items(Interpreter& in, const Value& v, CallArgs& a) {
  no_args("items", a);
  if (v.is_undefined()) return gen({});
  if (!v.is_dict()) throw_error(ErrorKind::Type, "Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (auto& [k, x] : v.dict().items()) out.push_back(Value::tuple({k, x}));
  in.tick(out.size());
  return gen(std::move(out));
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("join", a, {"d", "attribute"});
  const std::string sep = b.has(0) ? to_str(b.get(0)) : "";
  std::vector<Value> parts;
  const bool attr = b.has(1) && !b.get(1).is_none();
  std::vector<Value> path = attr ? attr_parts(b.get(1)) : std::vector<Value>{};
  std::string out;
  size_t i = 0;
  for (auto& item : in.iterate(v)) {
    in.tick();
    if (i++) out += sep;
    out += to_str(attr ? get_path(in, item, path, nullptr) : item);
    in.check_size(out.size());
  }
  return Value(std::move(out));
}

Value f_list(Interpreter& in, const Value& v, CallArgs& a) {
  no_args("list", a);
  std::vector<Value> items = in.iterate(v);
  in.tick(items.size());
  return Value::list(std::move(items));
}

Value f_lower(Interpreter&, const Value& v, CallArgs& a) {
  no_args("lower", a);
  return Value(utf8::lower(to_str(v)));
}

Value f_upper(Interpreter&, const Value& v, CallArgs& a) {
  no_args("upper", a);
  return Value(utf8::upper(to_str(v)));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  if (!truthy(v)) return gen({});
  std::vector<Value> out;
  if (a.pos.empty() && a.kwarg("attribute")) {
    Value attribute, dflt = Value::none();
    for (auto& [k, x] : a.kw) {
      if (k == "attribute")
        attribute = x;
      else if (k == "default")
        dflt = x;
      else
        throw_error(ErrorKind::Type, "Unexpected keyword argument '" + k + "'");
    }
    const std::vector<Value> parts = attr_parts(attribute);
    for (auto& item : in.iterate(v)) {
      in.tick();
      out.push_back(get_path(in, item, parts, &dflt));
    }
    return gen(std::move(out));
  }
  if (a.pos.empty()) throw_error(ErrorKind::Type, "map requires a filter argument");
  const std::string name = to_str(a.pos[0]);
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (auto& item : in.iterate(v)) {
    CallArgs copy = rest;
    out.push_back(in.call_filter(name, item, copy));
  }
  return gen(std::move(out));
}

Value min_max(Interpreter& in, const Value& v, CallArgs& a, bool is_max) {
  ArgBinder b(is_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const bool cs = b.has(0) && truthy(b.get(0));
  const std::vector<Value> parts = b.has(1) ? attr_parts(b.get(1)) : std::vector<Value>{};
  const std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  in.tick(items.size());
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    Value k = get_path(in, items[i], parts, nullptr);
    if (!cs) k = ignore_case(k);
    if (i == 0 || (is_max ? lt(best_key, k) : lt(k, best_key))) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }

Value f_pprint(Interpreter&, const Value& v, CallArgs& a) {
  no_args("pprint", a);
  return Value(repr(v));
}

Value select_or_reject(Interpreter& in, const Value& v, CallArgs& a, bool select, bool lookup_attr) {
  if (!truthy(v)) return gen({});
  size_t off = 0;
  std::vector<Value> parts;
  if (lookup_attr) {
    if (a.pos.empty()) throw_error(ErrorKind::Type, "Missing parameter for attribute name");
    parts = attr_parts(a.pos[0]);
    off = 1;
  }
  std::string test;
  CallArgs targs;
  const bool has_test = a.pos.size() > off;
  if (has_test) {
    test = to_str(a.pos[off]);
    targs.pos.assign(a.pos.begin() + static_cast<long>(off) + 1, a.pos.end());
  }
  targs.kw = a.kw;
  std::vector<Value> out;
  for (auto& item : in.iterate(v)) {
    in.tick();
    const Value x = lookup_attr ? get_path(in, item, parts, nullptr) : item;
    bool r;
    if (has_test) {
      CallArgs copy = targs;
      r = in.call_test(test, x, copy);
    } else {
      r = truthy(x);
    }
    if (r == select) out.push_back(item);
  }
  return gen(std::move(out));
}
Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, false); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, true); }

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("replace", a, {"old", "new", "count"});
  if (!b.has(0) || !b.has(1)) throw_error(ErrorKind::Type, "replace() missing required arguments");
  int64_t count = -1;
  if (b.has(2) && !b.get(2).is_none()) count = as_index(b.get(2), "count");
  return Value(pystr::replace(to_str(v), to_str(b.get(0)), to_str(b.get(1)), count, in.options().limits.max_output));
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs& a) {
  no_args("reverse", a);
  if (v.is_string()) {
    std::u32string u = utf8::decode(v.str());
    std::reverse(u.begin(), u.end());
    return Value(utf8::encode(u));
  }
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  if (v.is_list() && v.list().kind == ListKind::Generator) return Value::list(std::move(items));
  return gen(std::move(items));
}

// Python round(x, n) for floats: correctly rounded, ties to even.
double py_round(double x, int64_t n) {
  if (!std::isfinite(x) || x == 0.0) return x;
  if (n > 320) return x;
  if (n >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(n), x);
    return std::strtod(buf, nullptr);
  }
  if (n < -330) return std::copysign(0.0, x);
  const double pow1 = std::pow(10.0, static_cast<double>(-n));
  const double y = x / pow1;
  double z = std::nearbyint(y);
  return z * pow1;
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("round", a, {"precision", "method"});
  const int64_t prec = b.has(0) ? as_index(b.get(0), "precision") : 0;
  const std::string method = b.has(1) ? to_str(b.get(1)) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    throw_error(ErrorKind::Type, "method must be common, ceil or floor");
  if (!v.is_number()) throw_error(ErrorKind::Type, "type " + type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (v.is_integral()) {
      const int64_t x = v.as_int();
      if (prec >= 0) return Value(x);
      if (prec < -18) return Value(static_cast<int64_t>(0));
      int64_t p = 1;
      for (int64_t i = 0; i < -prec; ++i) p *= 10;
      int64_t q = x / p, r = x % p;
      if (r < 0) {
        r += p;
        q -= 1;
      }
      if (r * 2 > p || (r * 2 == p && (q & 1))) q += 1;
      return Value(q * p);
    }
    return Value(py_round(v.as_float(), prec));
  }
  const double scale = std::pow(10.0, static_cast<double>(prec));
  const double x = v.as_float() * scale;
  const double r = method == "ceil" ? std::ceil(x) : std::floor(x);
  return Value(r / scale);
}

Value f_safe(Interpreter&, const Value& v, CallArgs& a) {
  no_args("safe", a);
  return Value(to_str(v));
}

Value f_slice(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("slice", a, {"slices", "fill_with"});
  if (!b.has(0)) throw_error(ErrorKind::Type, "slice() missing required argument 'slices'");
  const int64_t slices = as_index(b.get(0), "slices");
  if (slices <= 0) throw_error(ErrorKind::Type, "integer division or modulo by zero");
  if (slices > 100000) throw_error(ErrorKind::Limit, "too many slices");
  const std::vector<Value> seq = in.iterate(v);
  const auto length = static_cast<int64_t>(seq.size());
  const int64_t per = length / slices, extra = length % slices;
  int64_t offset = 0;
  std::vector<Value> out;
  for (int64_t s = 0; s < slices; ++s) {
    in.tick();
    const int64_t start = offset + s * per;
    if (s < extra) ++offset;
    const int64_t end = offset + (s + 1) * per;
    std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
    if (b.has(1) && !b.get(1).is_none() && s >= extra) tmp.push_back(b.get(1));
    out.push_back(Value::list(std::move(tmp)));
  }
  return gen(std::move(out));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("sort", a, {"reverse", "case_sensitive", "attribute"});
  const bool rev = b.has(0) && truthy(b.get(0));
  const bool cs = b.has(1) && truthy(b.get(1));
  std::vector<std::vector<Value>> attrs;
  if (b.has(2) && !b.get(2).is_none()) {
    if (b.get(2).is_string()) {
      const std::string& s = b.get(2).str();
      size_t pos = 0;
      while (true) {
        const size_t c = s.find(',', pos);
        attrs.push_back(attr_parts(Value(s.substr(pos, c == std::string::npos ? std::string::npos : c - pos))));
        if (c == std::string::npos) break;
        pos = c + 1;
      }
    } else {
      attrs.push_back(attr_parts(b.get(2)));
    }
  } else {
    attrs.emplace_back();
  }
  std::vector<std::pair<std::vector<Value>, Value>> items;
  for (auto& item : in.iterate(v)) {
    std::vector<Value> key;
    for (auto& parts : attrs) {
      Value k = get_path(in, item, parts, nullptr);
      key.push_back(cs ? k : ignore_case(k));
    }
    items.emplace_back(std::move(key), item);
  }
  in.tick(items.size());
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    return rev ? keys_lt(y.first, x.first) : keys_lt(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& [k, item] : items) out.push_back(std::move(item));
  return Value::list(std::move(out));
}

Value f_string(Interpreter&, const Value& v, CallArgs& a) {
  no_args("string", a);
  return Value(to_str(v));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("sum", a, {"attribute", "start"});
  Value acc = b.get_or(1, Value(static_cast<int64_t>(0)));
  const std::vector<Value> parts = b.has(0) && !b.get(0).is_none() ? attr_parts(b.get(0)) : std::vector<Value>{};
  for (auto& item : in.iterate(v)) {
    in.tick();
    acc = in.binary(BinOp::Add, acc, get_path(in, item, parts, nullptr));
  }
  return acc;
}

Value f_title(Interpreter&, const Value& v, CallArgs& a) {
  no_args("title", a);
  // jinja2: split on runs of [-\s({\[<], upper-case the first char of every piece, lower-case the rest.
  const std::u32string u = utf8::decode(to_str(v));
  auto is_sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || utf8::py_isspace(c);
  };
  std::string out;
  bool start = true;
  for (char32_t c : u) {
    if (is_sep(c)) {
      utf8::append(out, c);
      start = true;
    } else {
      if (start)
        utf8::append_upper(out, c);
      else
        utf8::append_lower(out, c);
      start = false;
    }
  }
  return Value(std::move(out));
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = b.has(0) && truthy(b.get(0));
  if (b.has(1) && !b.get(1).is_none()) {
    const Value& ind = b.get(1);
    if (ind.is_string()) {
      o.indent = ind.str();
    } else {
      const int64_t n = as_index(ind, "indent");
      if (n > 1024) throw_error(ErrorKind::Limit, "indent too large");
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
    }
    o.item_sep = ",";
  }
  if (b.has(2) && !b.get(2).is_none()) {
    const std::vector<Value> seps = in.iterate(b.get(2));
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string())
      throw_error(ErrorKind::Type, "separators must be a pair of strings");
    o.item_sep = seps[0].str();
    o.key_sep = seps[1].str();
  }
  o.sort_keys = b.has(3) && truthy(b.get(3));
  std::string out = to_json(v, o);
  in.check_size(out.size());
  return Value(std::move(out));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("trim", a, {"chars"});
  std::string chars;
  const bool has = b.has(0) && !b.get(0).is_none();
  if (has) chars = to_str(b.get(0));
  return Value(pystr::strip(to_str(v), has ? &chars : nullptr, true, true));
}

Value f_truncate(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("truncate", a, {"length", "killwords", "end", "leeway"});
  if (!v.is_string()) {
    // jinja2 does not convert: len() of the value decides, and only a short enough sequence passes through.
    const int64_t n = py_len(v);
    const int64_t lim = (b.has(0) ? as_index(b.get(0), "length") : 255) +
                        (b.has(3) && !b.get(3).is_none() ? as_index(b.get(3), "leeway") : 5);
    if (n <= lim) return v;
    throw_error(ErrorKind::Type, "'" + type_name(v) + "' object has no attribute 'rsplit'");
  }
  const std::string s = v.str();
  const int64_t length = b.has(0) ? as_index(b.get(0), "length") : 255;
  const bool kill = b.has(1) && truthy(b.get(1));
  const std::string end = b.has(2) ? to_str(b.get(2)) : "...";
  const int64_t leeway = b.has(3) && !b.get(3).is_none() ? as_index(b.get(3), "leeway") : 5;
  const auto end_len = static_cast<int64_t>(utf8::length(end));
  if (length < end_len)
    throw_error(ErrorKind::Type, "expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (leeway < 0) throw_error(ErrorKind::Type, "expected leeway >= 0, got " + std::to_string(leeway));
  if (static_cast<int64_t>(utf8::length(s)) <= length + leeway) return Value(s);
  std::string head = pystr::substr_cp(s, 0, length - end_len);
  if (kill) return Value(head + end);
  const size_t sp = head.rfind(' ');
  if (sp != std::string::npos) head = head.substr(0, sp);
  return Value(head + end);
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("unique", a, {"case_sensitive", "attribute"});
  const bool cs = b.has(0) && truthy(b.get(0));
  const std::vector<Value> parts = b.has(1) && !b.get(1).is_none() ? attr_parts(b.get(1)) : std::vector<Value>{};
  std::vector<Value> seen, out;
  for (auto& item : in.iterate(v)) {
    Value key = get_path(in, item, parts, nullptr);
    if (!cs) key = ignore_case(key);
    if (!hashable(key)) throw_error(ErrorKind::Type, "unhashable type: '" + type_name(key) + "'");
    in.tick(1 + seen.size() / 64);
    bool dup = false;
    for (auto& s : seen)
      if (py_eq(s, key)) {
        dup = true;
        break;
      }
    if (!dup) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return gen(std::move(out));
}

std::string url_quote(const std::string& s, bool for_qs) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || (!for_qs && c == '/')) {
      out += static_cast<char>(c);
    } else if (for_qs && c == ' ') {
      out += '+';
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

Value f_urlencode(Interpreter& in, const Value& v, CallArgs& a) {
  no_args("urlencode", a);
  if (v.is_string() || !(v.is_list() || v.is_dict() || v.is_undefined())) return Value(url_quote(to_str(v), false));
  std::string out;
  std::vector<Value> pairs;
  if (v.is_dict()) {
    for (auto& [k, x] : v.dict().items()) pairs.push_back(Value::tuple({k, x}));
  } else {
    pairs = in.iterate(v);
  }
  bool first = true;
  for (auto& p : pairs) {
    const std::vector<Value> kv = in.iterate(p);
    if (kv.size() != 2) throw_error(ErrorKind::Type, "urlencode expects pairs");
    if (!first) out += "&";
    first = false;
    out += url_quote(to_str(kv[0]), true) + "=" + url_quote(to_str(kv[1]), true);
  }
  return Value(out);
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs& a) {
  no_args("wordcount", a);
  const std::string s = to_str(v);
  int64_t n = 0;
  bool in_word = false;
  size_t i = 0;
  while (i < s.size()) {
    const bool w = utf8::is_word(utf8::next(s, i));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> m = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"filesizeformat", f_filesizeformat},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_escape},
      {"format", f_format},
      {"groupby", f_groupby},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"pprint", f_pprint},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"slice", f_slice},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"urlencode", f_urlencode},
      {"wordcount", f_wordcount},
  };
  return m;
}

// ---- tests ----

bool t_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_iterable(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined() || v.is_string() || v.is_list() || v.is_dict()) return true;
  return v.is_object() && v.obj().type_name() == "LoopContext";
}
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined() || v.is_string() || v.is_dict()) return true;
  if (v.is_list()) {
    const ListKind k = v.list().kind;
    return k == ListKind::List || k == ListKind::Tuple || k == ListKind::GroupTuple || k == ListKind::Range;
  }
  return false;
}
bool t_callable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_undefined() || (v.is_object() && (v.obj().callable() || v.obj().type_name() == "LoopContext"));
}
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  if (a.pos.size() != 1) throw_error(ErrorKind::Type, "sameas() takes exactly one argument");
  const Value& o = a.pos[0];
  if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
  if (v.is_bool() || o.is_bool()) return v.is_bool() && o.is_bool() && v.as_bool() == o.as_bool();
  if (v.is_int() && o.is_int()) return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
  if (v.is_list() && o.is_list()) return v.list_ptr() == o.list_ptr();
  if (v.is_dict() && o.is_dict()) return &v.dict() == &o.dict();
  if (v.is_object() && o.is_object()) return v.obj_ptr() == o.obj_ptr();
  if (v.is_string() && o.is_string()) return v.str() == o.str();
  return false;
}
bool t_escaped(Interpreter&, const Value&, CallArgs&) { return false; }
bool t_lower(Interpreter&, const Value& v, CallArgs&) { return pystr::is_cased_lower(to_str(v)); }
bool t_upper(Interpreter&, const Value& v, CallArgs&) { return pystr::is_cased_upper(to_str(v)); }
bool mod_eq(Interpreter& in, const Value& v, const Value& m, int64_t r) {
  return py_eq(in.binary(BinOp::Mod, v, m), Value(r));
}
bool t_odd(Interpreter& in, const Value& v, CallArgs&) { return mod_eq(in, v, Value(static_cast<int64_t>(2)), 1); }
bool t_even(Interpreter& in, const Value& v, CallArgs&) { return mod_eq(in, v, Value(static_cast<int64_t>(2)), 0); }
bool t_divisibleby(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("divisibleby", a, {"num"});
  if (!b.has(0)) throw_error(ErrorKind::Type, "divisibleby() missing required argument 'num'");
  return mod_eq(in, v, b.get(0), 0);
}
bool t_in(Interpreter& in, const Value& v, CallArgs& a) {
  if (a.pos.size() != 1) throw_error(ErrorKind::Type, "in() takes exactly one argument");
  return in.contains(a.pos[0], v);
}
const Value& one_arg(const char* name, CallArgs& a) {
  if (a.pos.size() != 1 || !a.kw.empty())
    throw_error(ErrorKind::Type, std::string(name) + "() takes exactly one argument");
  return a.pos[0];
}
void undef_check(const Value& x) {
  if (x.is_undefined())
    throw_error(ErrorKind::Undefined, x.undef().hint.empty() ? "value is undefined" : x.undef().hint);
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return py_eq(v, one_arg("eq", a)); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !py_eq(v, one_arg("ne", a)); }
bool cmp_test(const Value& v, CallArgs& a, const char* op) {
  const Value& o = one_arg(op, a);
  undef_check(v);
  undef_check(o);
  return py_compare(v, o, op);
}
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return cmp_test(v, a, "<"); }
bool t_le(Interpreter&, const Value& v, CallArgs& a) { return cmp_test(v, a, "<="); }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return cmp_test(v, a, ">"); }
bool t_ge(Interpreter&, const Value& v, CallArgs& a) { return cmp_test(v, a, ">="); }
bool t_filter(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_filter(v.str()) != nullptr; }
bool t_test(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_test(v.str()) != nullptr; }

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> m = {
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"filter", t_filter},
      {"test", t_test},
      {"none", t_none},
      {"boolean", t_boolean},
      {"false", t_false},
      {"true", t_true},
      {"integer", t_integer},
      {"float", t_float},
      {"lower", t_lower},
      {"upper", t_upper},
      {"string", t_string},
      {"mapping", t_mapping},
      {"number", t_number},
      {"sequence", t_sequence},
      {"iterable", t_iterable},
      {"callable", t_callable},
      {"sameas", t_sameas},
      {"escaped", t_escaped},
      {"in", t_in},
      {"==", t_eq},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"!=", t_ne},
      {"ne", t_ne},
      {">", t_gt},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">=", t_ge},
      {"ge", t_ge},
      {"<", t_lt},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<=", t_le},
      {"le", t_le},
  };
  return m;
}

// ---- globals ----

class GlobalFn : public Object {
 public:
  using Fn = Value (*)(Interpreter&, CallArgs&);
  GlobalFn(std::string n, Fn f) : name(std::move(n)), fn(f) {}
  std::string type_name() const override { return "function"; }
  std::string repr() const override { return "<function " + name + ">"; }
  bool callable() const override { return true; }
  Value call(Interpreter& in, CallArgs& args) override { return fn(in, args); }
  std::string name;
  Fn fn;
};

constexpr int64_t kMaxRange = 100000;  // jinja2 sandbox MAX_RANGE

Value g_range(Interpreter& in, CallArgs& a) {
  if (!a.kw.empty()) throw_error(ErrorKind::Type, "range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) throw_error(ErrorKind::Type, "range expected at most 3 arguments");
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = as_index(a.pos[0], "range");
  } else {
    start = as_index(a.pos[0], "range");
    stop = as_index(a.pos[1], "range");
    if (a.pos.size() == 3) step = as_index(a.pos[2], "range");
  }
  if (step == 0) throw_error(ErrorKind::Type, "range() arg 3 must not be zero");
  __int128 n = 0;
  if (step > 0 && stop > start) n = (static_cast<__int128>(stop) - start + step - 1) / step;
  if (step < 0 && stop < start) n = (static_cast<__int128>(start) - stop - step - 1) / -step;
  if (n > kMaxRange) {
    throw_error(ErrorKind::Security,
                "Range too big. The sandbox blocks ranges larger than MAX_RANGE (" + std::to_string(kMaxRange) + ").");
  }
  in.tick(static_cast<uint64_t>(n));
  auto l = std::make_shared<ListData>();
  l->kind = ListKind::Range;
  l->range_start = start;
  l->range_stop = stop;
  l->range_step = step;
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) l->items.emplace_back(start + i * step);
  return Value(std::shared_ptr<const ListData>(std::move(l)));
}

void dict_from(Interpreter& in, DictData& d, CallArgs& a, const char* name) {
  if (a.pos.size() > 1) throw_error(ErrorKind::Type, std::string(name) + " expected at most 1 argument");
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      for (auto& [k, v] : src.dict().items()) d.set(k, v);
    } else {
      for (auto& item : in.iterate(src)) {
        const std::vector<Value> kv = in.iterate(item);
        if (kv.size() != 2) throw_error(ErrorKind::Type, "dictionary update sequence element has wrong length");
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : a.kw) d.set(k, v);
}

Value g_dict(Interpreter& in, CallArgs& a) {
  DictData d;
  dict_from(in, d, a, "dict");
  return Value::dict(std::move(d));
}

Value g_namespace(Interpreter& in, CallArgs& a) {
  auto ns = in.make<Namespace>();
  dict_from(in, ns->attrs, a, "namespace");
  return Value(std::static_pointer_cast<Object>(ns));
}

Value g_raise_exception(Interpreter&, CallArgs& a) {
  std::string msg;
  if (!a.pos.empty())
    msg = to_str(a.pos[0]);
  else if (const Value* m = a.kwarg("message"))
    msg = to_str(*m);
  throw_error(ErrorKind::Raised, msg);
}

Value g_strftime_now(Interpreter& in, CallArgs& a) {
  if (a.pos.size() != 1 || !a.pos[0].is_string())
    throw_error(ErrorKind::Type, "strftime_now() takes one string argument");
  const std::string& f = a.pos[0].str();
  // Python datetime.now() is naive: %z and %Z are empty, %f is the microseconds.
  std::string fmt;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '%' && i + 1 < f.size()) {
      const char c = f[i + 1];
      if (c == 'z' || c == 'Z') {
        ++i;
        continue;
      }
      if (c == 'f') {
        fmt += "000000";
        ++i;
        continue;
      }
      fmt += f[i];
      fmt += f[++i];
      continue;
    }
    fmt += f[i];
  }
  const std::tm tm = in.now();
  if (fmt.empty()) return Value("");
  std::string buf(256 + fmt.size() * 4, '\0');
  for (int attempt = 0; attempt < 6; ++attempt) {
    const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    if (n > 0) {
      buf.resize(n);
      return Value(buf);
    }
    buf.resize(buf.size() * 4);
  }
  return Value("");
}

class Joiner : public Object {
 public:
  explicit Joiner(std::string s) : sep(std::move(s)) {}
  std::string type_name() const override { return "Joiner"; }
  bool callable() const override { return true; }
  Value call(Interpreter&, CallArgs&) override {
    if (!used) {
      used = true;
      return Value("");
    }
    return Value(sep);
  }
  std::string sep;
  bool used = false;
};

Value g_joiner(Interpreter& in, CallArgs& a) {
  ArgBinder b("joiner", a, {"sep"});
  return Value(std::static_pointer_cast<Object>(in.make<Joiner>(b.has(0) ? to_str(b.get(0)) : ", ")));
}

class Cycler : public Object, public std::enable_shared_from_this<Cycler> {
 public:
  explicit Cycler(std::vector<Value> i) : items(std::move(i)) {}
  std::string type_name() const override { return "Cycler"; }
  Value get_attr(Interpreter& in, const std::string& name) override;
  void release() override { items.clear(); }
  std::vector<Value> items;
  size_t pos = 0;
};

class CyclerMethod : public Object {
 public:
  CyclerMethod(std::shared_ptr<Cycler> c, std::string n) : cyc(std::move(c)), name(std::move(n)) {}
  std::string type_name() const override { return "method"; }
  bool callable() const override { return true; }
  Value call(Interpreter&, CallArgs&) override {
    if (name == "reset") {
      cyc->pos = 0;
      return Value::none();
    }
    if (cyc->items.empty()) return Value::none();
    Value r = cyc->items[cyc->pos];
    cyc->pos = (cyc->pos + 1) % cyc->items.size();
    return r;
  }
  void release() override { cyc.reset(); }
  std::shared_ptr<Cycler> cyc;
  std::string name;
};

Value Cycler::get_attr(Interpreter& in, const std::string& name) {
  if (name == "current") return items.empty() ? Value::none() : items[pos];
  if (name == "next" || name == "reset") {
    return Value(std::static_pointer_cast<Object>(in.make<CyclerMethod>(shared_from_this(), name)));
  }
  return Object::get_attr(in, name);
}

Value g_cycler(Interpreter& in, CallArgs& a) {
  if (!a.kw.empty()) throw_error(ErrorKind::Type, "cycler() takes no keyword arguments");
  return Value(std::static_pointer_cast<Object>(in.make<Cycler>(a.pos)));
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  auto& m = filters();
  auto it = m.find(name);
  return it == m.end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  auto& m = tests();
  auto it = m.find(name);
  return it == m.end() ? nullptr : it->second;
}

void add_globals(Interpreter& in, DictData& g) {
  auto fn = [&](const char* name, GlobalFn::Fn f) {
    g.set(name, Value(std::static_pointer_cast<Object>(in.make<GlobalFn>(name, f))));
  };
  fn("range", g_range);
  fn("dict", g_dict);
  fn("namespace", g_namespace);
  fn("joiner", g_joiner);
  fn("cycler", g_cycler);
  fn("raise_exception", g_raise_exception);
  fn("strftime_now", g_strftime_now);
}

}  // namespace latent::jinja
