// Builtin filters, tests, globals and Python methods of str / list / dict (jinja2 3.1 + transformers' tojson).
#pragma once
#include <string>
#include <string_view>

#include "jinja/value.h"

namespace latent::jinja {

using FilterFn = Value (*)(Interpreter& in, const Value& v, CallArgs& args);
using TestFn = bool (*)(Interpreter& in, const Value& v, CallArgs& args);

FilterFn find_filter(std::string_view name);  // nullptr when unknown
TestFn find_test(std::string_view name);

// Globals of the HF environment: range, dict, namespace, joiner, cycler, raise_exception, strftime_now.
void add_globals(Interpreter& in, DictData& globals);

// Python attribute lookup on str/list/dict values: a bound method, an "unsafe" undefined for the mutating
// methods the sandbox forbids (calling it raises SecurityError), or nullopt when Python has no such attribute.
std::optional<Value> method_attr(Interpreter& in, const Value& recv, const std::string& name);
// Calls recv.name(args) directly (no bound-method object). nullopt when there is no such method.
std::optional<Value> call_method(Interpreter& in, const Value& recv, const std::string& name, CallArgs& args);

// Python str % args and str.format(*args, **kwargs).
std::string percent_format(Interpreter& in, const std::string& fmt, const Value& args);
std::string str_format(Interpreter& in, const std::string& fmt, CallArgs& args);

// Small argument binder: positional or keyword, in the order of `names`.
class ArgBinder {
 public:
  ArgBinder(const char* func, CallArgs& args, std::initializer_list<const char*> names, size_t skip = 0);
  bool has(size_t i) const { return vals_[i] != nullptr; }
  const Value& get(size_t i) const { return *vals_[i]; }
  Value get_or(size_t i, Value dflt) const { return vals_[i] ? *vals_[i] : std::move(dflt); }

 private:
  std::vector<const Value*> vals_;
};

}  // namespace latent::jinja
