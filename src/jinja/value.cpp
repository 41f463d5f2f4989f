#include "jinja/value.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "jinja/error.h"
#include "jinja/utf8.h"

namespace latent::jinja {

namespace {

// Guards recursion through nested values (objects can nest without bound, e.g. a namespace holding itself).
thread_local int g_value_recursion = 0;
struct RecursionGuard {
  RecursionGuard() {
    if (++g_value_recursion > 2 * static_cast<int>(kMaxValueDepth)) {
      --g_value_recursion;
      throw_error(ErrorKind::Limit, "value nesting too deep (recursive structure?)");
    }
  }
  ~RecursionGuard() { --g_value_recursion; }
  RecursionGuard(const RecursionGuard&) = delete;
  RecursionGuard& operator=(const RecursionGuard&) = delete;
};

void hex_escape(std::string& out, const char* prefix, unsigned v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%0*x", digits, v);
  out += prefix;
  out += buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Construction

Value Value::list(std::vector<Value> items, ListKind kind) {
  auto l = std::make_shared<ListData>();
  uint32_t d = 0;
  for (auto& v : items) d = std::max(d, v.depth());
  if (d + 1 > kMaxValueDepth)
    throw_error(ErrorKind::Limit, "value nesting deeper than " + std::to_string(kMaxValueDepth));
  l->depth = d + 1;
  l->items = std::move(items);
  l->kind = kind;
  return Value(std::shared_ptr<const ListData>(std::move(l)));
}

Value Value::dict(DictData d) {
  if (d.depth > kMaxValueDepth)
    throw_error(ErrorKind::Limit, "value nesting deeper than " + std::to_string(kMaxValueDepth));
  return Value(std::shared_ptr<const DictData>(std::make_shared<DictData>(std::move(d))));
}

uint32_t Value::depth() const {
  switch (type()) {
    case Type::List: return list().depth;
    case Type::Dict: return dict().depth;
    default: return 0;
  }
}

void DictData::build_index() {
  str_index_.clear();
  for (size_t i = 0; i < items_.size(); ++i)
    if (items_[i].first.is_string()) str_index_.emplace(items_[i].first.str(), i);
}

const Value* DictData::find(std::string_view key) const {
  if (items_.size() < kIndexFrom) {
    for (auto& [k, v] : items_)
      if (k.is_string() && k.str() == key) return &v;
    return nullptr;
  }
  auto it = str_index_.find(key);
  return it == str_index_.end() ? nullptr : &items_[it->second].second;
}

const Value* DictData::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  for (auto& [k, v] : items_)
    if (!k.is_string() && py_eq(k, key)) return &v;
  return nullptr;
}

void DictData::set(Value key, Value value) {
  if (!hashable(key)) throw_error(ErrorKind::Type, "unhashable type: '" + type_name(key) + "'");
  depth = std::max({depth, value.depth() + 1, key.depth() + 1});
  if (key.is_string()) {
    if (items_.size() < kIndexFrom) {
      for (auto& [k, v] : items_) {
        if (k.is_string() && k.str() == key.str()) {
          v = std::move(value);
          return;
        }
      }
    } else {
      auto it = str_index_.find(std::string_view(key.str()));
      if (it != str_index_.end()) {
        items_[it->second].second = std::move(value);
        return;
      }
      str_index_.emplace(key.str(), items_.size());
    }
    items_.emplace_back(std::move(key), std::move(value));
    if (items_.size() == kIndexFrom) build_index();
    return;
  }
  for (auto& [k, v] : items_) {
    if (!k.is_string() && py_eq(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
  if (items_.size() == kIndexFrom) build_index();
}

Value Object::get_attr(Interpreter&, const std::string& name) {
  return Value::undefined("'" + type_name() + "' object has no attribute '" + name + "'");
}

Value Object::call(Interpreter&, CallArgs&) {
  throw_error(ErrorKind::Type, "'" + type_name() + "' object is not callable");
}

Value Namespace::get_attr(Interpreter&, const std::string& name) {
  if (const Value* v = attrs.find(std::string_view(name))) return *v;
  return Value::undefined("'Namespace' object has no attribute '" + name + "'");
}

std::string Namespace::repr() const {
  // Python's repr guard: a namespace reached again while it is being printed shows as {...}.
  thread_local std::vector<const Namespace*> active;
  if (std::find(active.begin(), active.end(), this) != active.end()) return "<Namespace {...}>";
  RecursionGuard g;
  active.push_back(this);
  struct Pop {
    ~Pop() { active.pop_back(); }
  } pop;
  std::string out = "<Namespace {";
  bool first = true;
  for (auto& [k, v] : attrs.items()) {
    if (!first) out += ", ";
    first = false;
    out += jinja::repr(k);
    out += ": ";
    out += jinja::repr(v);
  }
  out += "}>";
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Python semantics

bool truthy(const Value& v) {
  switch (v.type()) {
    case Type::Undefined:
    case Type::None: return false;
    case Type::Bool: return v.as_bool();
    case Type::Int: return v.as_int() != 0;
    case Type::Float: return v.as_float() != 0.0;
    case Type::String: return !v.str().empty();
    case Type::List: return v.list().kind == ListKind::Generator || !v.list().items.empty();
    case Type::Dict: return !v.dict().empty();
    case Type::Object: return v.obj().truthy();
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, res.ptr);
  std::string out;
  size_t pos = 0;
  if (s[0] == '-') {
    out = "-";
    pos = 1;
  }
  const size_t e_pos = s.find('e');
  std::string digits;
  for (size_t i = pos; i < e_pos; ++i)
    if (s[i] != '.') digits += s[i];
  const int exp = std::stoi(s.substr(e_pos + 1));
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
    return out;
  }
  const int decpt = exp + 1;
  const int nd = static_cast<int>(digits.size());
  if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= nd) {
    out += digits;
    out.append(static_cast<size_t>(decpt - nd), '0');
    out += ".0";
  } else {
    out.append(digits, 0, static_cast<size_t>(decpt));
    out += '.';
    out.append(digits, static_cast<size_t>(decpt));
  }
  return out;
}

std::string repr_string(std::string_view s) {
  const bool has_sq = s.find('\'') != std::string_view::npos;
  const bool has_dq = s.find('"') != std::string_view::npos;
  const char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out += q;
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const char32_t c = utf8::next(s, i);
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      hex_escape(out, "\\x", static_cast<unsigned>(c), 2);
    } else if (c < 0x7F) {
      out += static_cast<char>(c);
    } else if (utf8::py_isprintable(c)) {
      out.append(s.substr(start, i - start));
    } else if (c < 0x100) {
      hex_escape(out, "\\x", static_cast<unsigned>(c), 2);
    } else if (c < 0x10000) {
      hex_escape(out, "\\u", static_cast<unsigned>(c), 4);
    } else {
      hex_escape(out, "\\U", static_cast<unsigned>(c), 8);
    }
  }
  out += q;
  return out;
}

static void repr_items(std::string& out, const std::vector<Value>& items) {
  bool first = true;
  for (auto& v : items) {
    if (!first) out += ", ";
    first = false;
    out += repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.type()) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "None";
    case Type::Bool: return v.as_bool() ? "True" : "False";
    case Type::Int: return std::to_string(v.as_int());
    case Type::Float: return float_repr(v.as_float());
    case Type::String: return repr_string(v.str());
    case Type::Object: return v.obj().repr();
    case Type::List: {
      RecursionGuard g;
      const ListData& l = v.list();
      std::string out;
      switch (l.kind) {
        case ListKind::List:
          out = "[";
          repr_items(out, l.items);
          out += "]";
          break;
        case ListKind::Tuple:
        case ListKind::GroupTuple:
          out = "(";
          repr_items(out, l.items);
          if (l.items.size() == 1) out += ",";
          out += ")";
          break;
        case ListKind::Generator: out = "<generator object>"; break;
        case ListKind::KeysView:
        case ListKind::ValuesView:
        case ListKind::ItemsView:
          out = l.kind == ListKind::KeysView     ? "dict_keys(["
                : l.kind == ListKind::ValuesView ? "dict_values(["
                                                 : "dict_items([";
          repr_items(out, l.items);
          out += "])";
          break;
        case ListKind::Range:
          out = "range(" + std::to_string(l.range_start) + ", " + std::to_string(l.range_stop);
          if (l.range_step != 1) out += ", " + std::to_string(l.range_step);
          out += ")";
          break;
      }
      return out;
    }
    case Type::Dict: {
      RecursionGuard g;
      std::string out = "{";
      bool first = true;
      for (auto& [k, val] : v.dict().items()) {
        if (!first) out += ", ";
        first = false;
        out += repr(k);
        out += ": ";
        out += repr(val);
      }
      out += "}";
      return out;
    }
  }
  return "";
}

std::string to_str(const Value& v) {
  switch (v.type()) {
    case Type::Undefined: return "";
    case Type::String: return v.str();
    default: return repr(v);
  }
}

std::string type_name(const Value& v) {
  switch (v.type()) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "str";
    case Type::Dict: return "dict";
    case Type::Object: return v.obj().type_name();
    case Type::List:
      switch (v.list().kind) {
        case ListKind::List: return "list";
        case ListKind::Tuple: return "tuple";
        case ListKind::GroupTuple: return "_GroupTuple";
        case ListKind::Generator: return "generator";
        case ListKind::KeysView: return "dict_keys";
        case ListKind::ValuesView: return "dict_values";
        case ListKind::ItemsView: return "dict_items";
        case ListKind::Range: return "range";
      }
  }
  return "object";
}

static int num_cmp(const Value& a, const Value& b) {  // -1, 0, 1; 2 = unordered (NaN)
  if (a.is_integral() && b.is_integral()) {
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_integral() || b.is_integral()) {
    // int vs float: compare exactly when the float is integral and within range.
    const bool a_int = a.is_integral();
    const int64_t i = a_int ? a.as_int() : b.as_int();
    const double f = a_int ? b.as_float() : a.as_float();
    if (std::isnan(f)) return 2;
    int r;
    if (f >= 9.2233720368547758e18)
      r = -1;  // i < f
    else if (f < -9.2233720368547758e18)
      r = 1;  // i > f
    else {
      const double fl = std::floor(f);
      const auto fi = static_cast<int64_t>(fl);
      if (i < fi)
        r = -1;
      else if (i > fi)
        r = 1;
      else
        r = (fl == f) ? 0 : -1;
    }
    return a_int ? r : -r;
  }
  const double x = a.as_float(), y = b.as_float();
  if (std::isnan(x) || std::isnan(y)) return 2;
  return x < y ? -1 : x > y ? 1 : 0;
}

static bool is_tuple_kind(ListKind k) { return k == ListKind::Tuple || k == ListKind::GroupTuple; }

bool py_eq(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return num_cmp(a, b) == 0;
  switch (a.type()) {
    case Type::Undefined: return b.is_undefined();
    case Type::None: return b.is_none();
    case Type::String: return b.is_string() && a.str() == b.str();
    case Type::List: {
      if (!b.is_list()) return false;
      const ListData& x = a.list();
      const ListData& y = b.list();
      if (&x == &y) return true;
      const bool same_kind = x.kind == y.kind || (is_tuple_kind(x.kind) && is_tuple_kind(y.kind));
      if (!same_kind || x.kind == ListKind::Generator) return false;
      if (x.items.size() != y.items.size()) return false;
      RecursionGuard g;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!py_eq(x.items[i], y.items[i])) return false;
      return true;
    }
    case Type::Dict: {
      if (!b.is_dict()) return false;
      const DictData& x = a.dict();
      const DictData& y = b.dict();
      if (x.size() != y.size()) return false;
      RecursionGuard g;
      for (auto& [k, v] : x.items()) {
        const Value* o = y.find(k);
        if (!o || !py_eq(v, *o)) return false;
      }
      return true;
    }
    case Type::Object: return b.is_object() && a.obj_ptr() == b.obj_ptr();
    default: return false;
  }
}

[[noreturn]] static void not_supported(const Value& a, const Value& b, std::string_view op) {
  throw_error(ErrorKind::Type, "'" + std::string(op) + "' not supported between instances of '" + type_name(a) +
                                   "' and '" + type_name(b) + "'");
}

static bool apply_cmp(int c, std::string_view op) {
  if (c == 2) return false;
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

bool py_compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) return apply_cmp(num_cmp(a, b), op);
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return apply_cmp(c < 0 ? -1 : c > 0 ? 1 : 0, op);
  }
  if (a.is_list() && b.is_list()) {
    const ListData& x = a.list();
    const ListData& y = b.list();
    const bool ok =
        (x.kind == ListKind::List && y.kind == ListKind::List) || (is_tuple_kind(x.kind) && is_tuple_kind(y.kind));
    if (!ok) not_supported(a, b, op);
    RecursionGuard g;
    const size_t n = std::min(x.items.size(), y.items.size());
    for (size_t i = 0; i < n; ++i) {
      if (!py_eq(x.items[i], y.items[i])) return py_compare(x.items[i], y.items[i], op);
    }
    const size_t p = x.items.size(), q = y.items.size();
    return apply_cmp(p < q ? -1 : p > q ? 1 : 0, op);
  }
  not_supported(a, b, op);
}

bool hashable(const Value& v) {
  switch (v.type()) {
    case Type::Dict: return false;
    case Type::List: {
      const ListData& l = v.list();
      if (l.kind == ListKind::Range || l.kind == ListKind::Generator) return true;
      if (!is_tuple_kind(l.kind)) return false;
      RecursionGuard g;
      for (auto& x : l.items)
        if (!hashable(x)) return false;
      return true;
    }
    default: return true;
  }
}

int64_t py_len(const Value& v) {
  switch (v.type()) {
    case Type::Undefined: return 0;
    case Type::String: return static_cast<int64_t>(utf8::length(v.str()));
    case Type::Dict: return static_cast<int64_t>(v.dict().size());
    case Type::List:
      if (v.list().kind != ListKind::Generator) return static_cast<int64_t>(v.list().items.size());
      break;
    default: break;
  }
  throw_error(ErrorKind::Type, "object of type '" + type_name(v) + "' has no len()");
}

// ---------------------------------------------------------------------------------------------------------------
// JSON

static void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const char32_t c = utf8::next(s, i);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20) {
      hex_escape(out, "\\u", static_cast<unsigned>(c), 4);
    } else if (!ensure_ascii || (c < 0x7F)) {
      out.append(s.substr(start, i - start));
    } else if (c < 0x10000) {
      hex_escape(out, "\\u", static_cast<unsigned>(c), 4);
    } else {
      const char32_t u = c - 0x10000;
      hex_escape(out, "\\u", static_cast<unsigned>(0xD800 + (u >> 10)), 4);
      hex_escape(out, "\\u", static_cast<unsigned>(0xDC00 + (u & 0x3FF)), 4);
    }
  }
  out += '"';
}

static std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return float_repr(d);
}

static void json_value(std::string& out, const Value& v, const JsonOptions& opt, int level);

static void json_newline(std::string& out, const JsonOptions& opt, int level) {
  out += '\n';
  for (int i = 0; i < level; ++i) out += *opt.indent;
}

static void json_value(std::string& out, const Value& v, const JsonOptions& opt, int level) {
  switch (v.type()) {
    case Type::None: out += "null"; return;
    case Type::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Type::Int: out += std::to_string(v.as_int()); return;
    case Type::Float: out += json_float(v.as_float()); return;
    case Type::String: json_string(out, v.str(), opt.ensure_ascii); return;
    case Type::List: {
      const ListData& l = v.list();
      if (l.kind != ListKind::List && !is_tuple_kind(l.kind)) break;
      RecursionGuard g;
      if (l.items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (auto& x : l.items) {
        if (!first) out += opt.item_sep;
        first = false;
        if (opt.indent) json_newline(out, opt, level + 1);
        json_value(out, x, opt, level + 1);
      }
      if (opt.indent) json_newline(out, opt, level);
      out += ']';
      return;
    }
    case Type::Dict: {
      RecursionGuard g;
      const DictData& d = v.dict();
      if (d.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (auto& kv : d.items()) items.push_back(&kv);
      if (opt.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return py_compare(a->first, b->first, "<"); });
      }
      out += '{';
      bool first = true;
      for (auto* kv : items) {
        if (!first) out += opt.item_sep;
        first = false;
        if (opt.indent) json_newline(out, opt, level + 1);
        const Value& k = kv->first;
        switch (k.type()) {
          case Type::String: json_string(out, k.str(), opt.ensure_ascii); break;
          case Type::Int: out += '"' + std::to_string(k.as_int()) + '"'; break;
          case Type::Bool: out += k.as_bool() ? "\"true\"" : "\"false\""; break;
          case Type::Float: out += '"' + json_float(k.as_float()) + '"'; break;
          case Type::None: out += "\"null\""; break;
          default: throw_error(ErrorKind::Type, "keys must be str, int, float, bool or None, not " + type_name(k));
        }
        out += opt.key_sep;
        json_value(out, kv->second, opt, level + 1);
      }
      if (opt.indent) json_newline(out, opt, level);
      out += '}';
      return;
    }
    default: break;
  }
  throw_error(ErrorKind::Type, "Object of type " + type_name(v) + " is not JSON serializable");
}

std::string to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  json_value(out, v, opt, 0);
  return out;
}

template <class J>
static Value from_json_impl(const J& j, int depth) {
  if (depth > static_cast<int>(kMaxValueDepth))
    throw_error(ErrorKind::Limit, "JSON nesting deeper than " + std::to_string(kMaxValueDepth));
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get_ref<const std::string&>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (auto& x : j) items.push_back(from_json_impl(x, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      DictData d;
      for (auto it = j.begin(); it != j.end(); ++it) d.set(Value(it.key()), from_json_impl(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    default: return Value::none();
  }
}

Value from_json(const nlohmann::json& j) { return from_json_impl(j, 0); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_impl(j, 0); }

}  // namespace latent::jinja
