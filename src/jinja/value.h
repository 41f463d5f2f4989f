// latent::jinja::Value — the dynamic value of the Jinja interpreter, modelled on the Python objects jinja2 sees:
// undefined, None, bool, int, float, str (UTF-8), list/tuple (and the lazy shapes Python has: generator, dict views,
// range), dict (insertion-ordered, Python key equality: 1 == 1.0 == True) and objects (namespace, macro, loop,
// builtin functions). Lists and dicts are immutable once built (the HF sandbox forbids mutation), so they are
// shared. Printing follows Python str()/repr(); tojson follows json.dumps as transformers configures it.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace latent::jinja {

class Value;
struct ListData;
class DictData;
class Object;
class Interpreter;

enum class Type : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Object };

// What Python type a list-like value stands for: decides printing, subscripting, len() and truthiness.
enum class ListKind : uint8_t {
  List,        // [1, 2]
  Tuple,       // (1, 2)
  Generator,   // map/select/... results: always truthy, no len(), single pass
  KeysView,    // dict_keys([...])
  ValuesView,  // dict_values([...])
  ItemsView,   // dict_items([...])
  Range,       // range(a, b[, c])
  GroupTuple,  // groupby() result: (grouper, list) with .grouper/.list
};

struct UndefinedInfo {
  std::string hint;     // why it is undefined; used in the error raised when it is misused
  bool unsafe = false;  // sandbox: calling it raises SecurityError
};

struct NoneT {
  bool operator==(const NoneT&) const = default;
};

class Value {
 public:
  Value() = default;  // undefined
  Value(NoneT) : v_(NoneT{}) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::shared_ptr<const ListData> l) : v_(std::move(l)) {}
  Value(std::shared_ptr<const DictData> d) : v_(std::move(d)) {}
  Value(std::shared_ptr<Object> o) : v_(std::move(o)) {}

  static Value undefined(std::string hint = {}, bool unsafe = false) {
    Value v;
    v.v_ = UndefinedInfo{std::move(hint), unsafe};
    return v;
  }
  static Value none() { return Value(NoneT{}); }
  static Value list(std::vector<Value> items, ListKind kind = ListKind::List);
  static Value tuple(std::vector<Value> items) { return list(std::move(items), ListKind::Tuple); }
  static Value dict(DictData d);

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_undefined() const { return type() == Type::Undefined; }
  bool is_none() const { return type() == Type::None; }
  bool is_bool() const { return type() == Type::Bool; }
  bool is_int() const { return type() == Type::Int; }
  bool is_float() const { return type() == Type::Float; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_integral() const { return is_int() || is_bool(); }
  bool is_string() const { return type() == Type::String; }
  bool is_list() const { return type() == Type::List; }
  bool is_dict() const { return type() == Type::Dict; }
  bool is_object() const { return type() == Type::Object; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return is_bool() ? (as_bool() ? 1 : 0) : std::get<int64_t>(v_); }  // int or bool
  double as_float() const { return is_float() ? std::get<double>(v_) : static_cast<double>(as_int()); }
  const std::string& str() const { return std::get<std::string>(v_); }
  const ListData& list() const { return *std::get<std::shared_ptr<const ListData>>(v_); }
  const std::shared_ptr<const ListData>& list_ptr() const { return std::get<std::shared_ptr<const ListData>>(v_); }
  const DictData& dict() const { return *std::get<std::shared_ptr<const DictData>>(v_); }
  Object& obj() const { return *std::get<std::shared_ptr<Object>>(v_); }
  const std::shared_ptr<Object>& obj_ptr() const { return std::get<std::shared_ptr<Object>>(v_); }
  const UndefinedInfo& undef() const { return std::get<UndefinedInfo>(v_); }

  // Nesting depth of containers (scalars and objects 0); bounded so destruction and printing never overflow.
  uint32_t depth() const;

 private:
  std::variant<UndefinedInfo, NoneT, bool, int64_t, double, std::string, std::shared_ptr<const ListData>,
               std::shared_ptr<const DictData>, std::shared_ptr<Object>>
      v_;
};

constexpr uint32_t kMaxValueDepth = 256;

struct ListData {
  std::vector<Value> items;
  ListKind kind = ListKind::List;
  int64_t range_start = 0, range_stop = 0, range_step = 1;  // for ListKind::Range printing
  uint32_t depth = 1;
  mutable bool consumed = false;  // ListKind::Generator after the first iteration
};

// Insertion-ordered mapping with Python key semantics. String keys are indexed.
class DictData {
 public:
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Inserts or overwrites (an existing key keeps its position and its original key object). Throws TypeError for
  // unhashable keys.
  void set(Value key, Value value);
  uint32_t depth = 1;

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  static constexpr size_t kIndexFrom = 12;  // smaller dicts are scanned linearly
  void build_index();
  std::vector<std::pair<Value, Value>> items_;
  std::unordered_map<std::string, size_t, Hash, std::equal_to<>> str_index_;  // string keys, once size >= kIndexFrom
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(std::string_view name) const {
    for (auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

// Objects with identity: namespace(), macros, loop, builtin functions and bound methods.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;  // Python type name for messages
  virtual std::string repr() const { return "<" + type_name() + " object>"; }
  // Python attribute lookup; an undefined Value when missing.
  virtual Value get_attr(Interpreter& in, const std::string& name);
  virtual bool callable() const { return false; }
  virtual Value call(Interpreter& in, CallArgs& args);
  // Breaks reference cycles (namespaces holding themselves, macros holding their scope) after a render.
  virtual void release() {}
  virtual bool truthy() const { return true; }
};

class Namespace : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  std::string repr() const override;
  Value get_attr(Interpreter& in, const std::string& name) override;
  void release() override { attrs = DictData(); }
  DictData attrs;
};

// ---- Python semantics ----
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v); undefined → ""
std::string repr(const Value& v);    // repr(v)
std::string repr_string(std::string_view s);
std::string float_repr(double d);       // Python repr(float)
std::string type_name(const Value& v);  // Python type name: 'str', 'int', 'NoneType', 'list', ...
bool py_eq(const Value& a, const Value& b);
// a < b etc. with Python rules; TypeError for unorderable types. op is one of "<", "<=", ">", ">=".
bool py_compare(const Value& a, const Value& b, std::string_view op);
bool hashable(const Value& v);
// len(); throws TypeError when Python has no len() for it.
int64_t py_len(const Value& v);

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: one line
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ...) as transformers' tojson override does it.
std::string to_json(const Value& v, const JsonOptions& opt = {});
// JSON (OpenAI request shapes, kwargs) → Value, keeping int vs float.
Value from_json(const nlohmann::json& j);          // nlohmann::json sorts object keys: prefer ordered_json
Value from_json(const nlohmann::ordered_json& j);  // keeps the request's key order (tojson output depends on it)

}  // namespace latent::jinja
