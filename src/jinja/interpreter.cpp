#include "jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "jinja/builtins.h"
#include "jinja/error.h"
#include "jinja/utf8.h"

namespace latent::jinja {

// ---------------------------------------------------------------------------------------------------------------
// Objects defined by the interpreter

namespace {

class MacroObject : public Object {
 public:
  MacroObject(const MacroStmt* d, ScopePtr c) : def(d), closure(std::move(c)) {}
  std::string type_name() const override { return "Macro"; }
  std::string repr() const override { return "<Macro " + repr_string(def->name) + ">"; }
  bool callable() const override { return true; }
  Value call(Interpreter& in, CallArgs& args) override {
    if (!closure) throw_error(ErrorKind::Runtime, "macro called after the render finished");
    return in.call_macro(*def, closure, args);
  }
  Value get_attr(Interpreter& in, const std::string& name) override {
    if (name == "name") return Value(def->name);
    return Object::get_attr(in, name);
  }
  void release() override { closure.reset(); }
  const MacroStmt* def;
  ScopePtr closure;
};

}  // namespace

struct LoopState {
  std::vector<Value> items;
  size_t index0 = 0;
  int depth0 = 0;
  bool has_last_changed = false;
  Value last_changed;
  const ForStmt* stmt = nullptr;
  ScopePtr outer;
};

namespace {

class BuiltinObject : public Object {
 public:
  BuiltinObject(std::string n, std::function<Value(Interpreter&, CallArgs&)> f)
      : name(std::move(n)), fn(std::move(f)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override { return "<built-in function " + name + ">"; }
  bool callable() const override { return true; }
  Value call(Interpreter& in, CallArgs& args) override { return fn(in, args); }
  void release() override { fn = nullptr; }
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

class LoopObject : public Object {
 public:
  explicit LoopObject(std::shared_ptr<LoopState> s) : st(std::move(s)) {}
  std::string type_name() const override { return "LoopContext"; }
  std::string repr() const override {
    return "<LoopContext " + std::to_string(st->index0 + 1) + "/" + std::to_string(st->items.size()) + ">";
  }
  bool callable() const override { return st->stmt && st->stmt->recursive; }
  Value call(Interpreter& in, CallArgs& args) override {
    if (!callable()) {
      throw_error(ErrorKind::Type, "The loop must have the 'recursive' marker to be called recursively.");
    }
    return in.loop_recurse(*st, args);
  }
  Value get_attr(Interpreter& in, const std::string& name) override {
    const auto n = static_cast<int64_t>(st->items.size());
    const auto i = static_cast<int64_t>(st->index0);
    if (name == "index0") return Value(i);
    if (name == "index") return Value(i + 1);
    if (name == "revindex") return Value(n - i);
    if (name == "revindex0") return Value(n - i - 1);
    if (name == "first") return Value(i == 0);
    if (name == "last") return Value(i == n - 1);
    if (name == "length") return Value(n);
    if (name == "depth") return Value(static_cast<int64_t>(st->depth0 + 1));
    if (name == "depth0") return Value(static_cast<int64_t>(st->depth0));
    if (name == "previtem") {
      if (i == 0) return Value::undefined("there is no previous item");
      return st->items[static_cast<size_t>(i - 1)];
    }
    if (name == "nextitem") {
      if (i + 1 >= n) return Value::undefined("there is no next item");
      return st->items[static_cast<size_t>(i + 1)];
    }
    if (name == "cycle") {
      auto s = st;
      return Value(std::static_pointer_cast<Object>(in.make<BuiltinObject>("cycle", [s](Interpreter&, CallArgs& a) {
        if (a.pos.empty()) throw_error(ErrorKind::Type, "no items for cycling given");
        return a.pos[s->index0 % a.pos.size()];
      })));
    }
    if (name == "changed") {
      auto s = st;
      return Value(std::static_pointer_cast<Object>(in.make<BuiltinObject>("changed", [s](Interpreter&, CallArgs& a) {
        Value cur = Value::tuple(a.pos);
        if (!s->has_last_changed || !py_eq(cur, s->last_changed)) {
          s->has_last_changed = true;
          s->last_changed = std::move(cur);
          return Value(true);
        }
        return Value(false);
      })));
    }
    return Object::get_attr(in, name);
  }
  void release() override {
    st->items.clear();
    st->last_changed = Value();
    st->outer.reset();
  }
  std::shared_ptr<LoopState> st;
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// RAII helpers

struct OutGuard {
  OutGuard(Interpreter& in, std::string* buf) : in_(in), saved_(in.out_) { in.out_ = buf; }
  ~OutGuard() { in_.out_ = saved_; }
  OutGuard(const OutGuard&) = delete;
  OutGuard& operator=(const OutGuard&) = delete;
  Interpreter& in_;
  std::string* saved_;
};

struct ScopeGuard {
  ScopeGuard(Interpreter& in, ScopePtr s) : in_(in), saved_(std::move(in.scope_)) { in.scope_ = std::move(s); }
  ~ScopeGuard() { in_.scope_ = std::move(saved_); }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
  Interpreter& in_;
  ScopePtr saved_;
};

namespace {
struct DepthCounter {
  DepthCounter(int& d, int limit, const char* what) : d_(d) {
    if (++d_ > limit) {
      --d_;
      throw_error(ErrorKind::Limit, std::string(what) + " nested too deeply (limit " + std::to_string(limit) + ")");
    }
  }
  ~DepthCounter() { --d_; }
  DepthCounter(const DepthCounter&) = delete;
  DepthCounter& operator=(const DepthCounter&) = delete;
  int& d_;
};
}  // namespace

// ---------------------------------------------------------------------------------------------------------------

Interpreter::Interpreter(const Program& prog, const RenderOptions& opt) : prog_(prog), opt_(opt) {}

Interpreter::~Interpreter() {
  // Break reference cycles (a namespace holding itself, macros holding the scope they live in), oldest first
  // so that long chains are dismantled one link at a time.
  scope_.reset();
  for (auto& w : objects_)
    if (auto p = w.lock()) p->release();
}

void Interpreter::track(const std::shared_ptr<Object>& o) {
  if (objects_.size() >= objects_compact_at_) {
    std::erase_if(objects_, [](const std::weak_ptr<Object>& w) { return w.expired(); });
    objects_compact_at_ = std::max<size_t>(1024, objects_.size() * 2);
  }
  objects_.push_back(o);
}

std::tm Interpreter::now() const {
  if (opt_.now) return opt_.now();
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

void Interpreter::tick(uint64_t n) {
  steps_ += n;
  if (steps_ > opt_.limits.max_steps)
    throw_error(ErrorKind::Limit,
                "template exceeded " + std::to_string(opt_.limits.max_steps) + " steps (runaway loop?)");
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > opt_.limits.max_output)
    throw_error(ErrorKind::Limit, "string or output larger than " + std::to_string(opt_.limits.max_output) + " bytes");
}

void Interpreter::write(std::string_view s) {
  out_->append(s);
  check_size(out_->size());
}

std::string Interpreter::render(const Value& context) {
  context_ = context;
  add_globals(*this, globals_);
  scope_ = std::make_shared<Scope>(nullptr);
  std::string out;
  OutGuard g(*this, &out);
  exec_body(prog_.body);
  return out;
}

[[noreturn]] void Interpreter::undefined_error(const Value& u) {
  const UndefinedInfo& info = u.undef();
  if (info.unsafe) throw_error(ErrorKind::Security, info.hint);
  throw_error(ErrorKind::Undefined, info.hint.empty() ? "value is undefined" : info.hint);
}

// ---------------------------------------------------------------------------------------------------------------
// Statements

Interpreter::Flow Interpreter::exec_body(const Body& body) {
  for (auto& st : body) {
    const Flow f = exec(*st);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

std::string Interpreter::capture(const Body& body) {
  std::string buf;
  OutGuard g(*this, &buf);
  exec_body(body);
  return buf;
}

Interpreter::Flow Interpreter::exec(const Stmt& s) {
  DepthCounter dc(eval_depth_, opt_.limits.max_eval_depth, "template evaluation");
  try {
    switch (s.kind) {
      case SK::Data: write(static_cast<const DataStmt&>(s).text); return Flow::Normal;
      case SK::Print: {
        const Expr& expr = *static_cast<const PrintStmt&>(s).expr;
        const Expr* saved = output_root_;
        output_root_ = &expr;
        Value v;
        try {
          v = eval(expr);
        } catch (...) {
          output_root_ = saved;
          throw;
        }
        output_root_ = saved;
        if (v.is_string())
          write(v.str());
        else
          write(to_str(v));
        return Flow::Normal;
      }
      case SK::If: {
        auto& st = static_cast<const IfStmt&>(s);
        for (auto& [test, body] : st.branches)
          if (truthy(eval(*test))) return exec_body(body);
        return exec_body(st.else_body);
      }
      case SK::For: exec_for(static_cast<const ForStmt&>(s)); return Flow::Normal;
      case SK::Set: {
        auto& st = static_cast<const SetStmt&>(s);
        assign(st.target, eval(*st.value));
        return Flow::Normal;
      }
      case SK::SetBlock: {
        auto& st = static_cast<const SetBlockStmt&>(s);
        std::string text;
        {
          ScopeGuard sg(*this, std::make_shared<Scope>(scope_));
          text = capture(st.body);
        }
        Value v(std::move(text));
        if (st.filter) v = eval_filter(static_cast<const FilterExpr&>(*st.filter), &v);
        assign(st.target, v);
        return Flow::Normal;
      }
      case SK::Macro: {
        auto& st = static_cast<const MacroStmt&>(s);
        scope_->set(st.name, Value(std::static_pointer_cast<Object>(make<MacroObject>(&st, scope_))));
        return Flow::Normal;
      }
      case SK::CallBlock: {
        auto& st = static_cast<const CallBlockStmt&>(s);
        auto& c = static_cast<const CallExpr&>(*st.call);
        Value caller(std::static_pointer_cast<Object>(make<MacroObject>(st.caller.get(), scope_)));
        Value callee = eval(*c.callee);
        CallArgs args;
        eval_args(c.args, args);
        args.kw.emplace_back("caller", caller);
        const Value r = call(callee, args);
        write(to_str(r));
        return Flow::Normal;
      }
      case SK::FilterBlock: {
        auto& st = static_cast<const FilterBlockStmt&>(s);
        std::string text;
        {
          ScopeGuard sg(*this, std::make_shared<Scope>(scope_));
          text = capture(st.body);
        }
        const Value base(std::move(text));
        write(to_str(eval_filter(static_cast<const FilterExpr&>(*st.filter), &base)));
        return Flow::Normal;
      }
      case SK::With: {
        auto& st = static_cast<const WithStmt&>(s);
        std::vector<Value> vals;
        for (auto& [t, e] : st.assigns) vals.push_back(eval(*e));
        ScopeGuard sg(*this, std::make_shared<Scope>(scope_));
        for (size_t i = 0; i < vals.size(); ++i) assign(st.assigns[i].first, vals[i]);
        return exec_body(st.body);
      }
      case SK::Break: return Flow::Break;
      case SK::Continue: return Flow::Continue;
      case SK::Scope: return exec_body(static_cast<const ScopeStmt&>(s).body);
    }
  } catch (const TemplateError& e) {
    if (!e.has_position()) throw e.at(prog_.name, s.pos.line, s.pos.col);
    throw;
  }
  return Flow::Normal;
}

void Interpreter::assign(const Target& t, const Value& v) {
  switch (t.kind) {
    case Target::Kind::Name: scope_->set(t.name, v); return;
    case Target::Kind::NsAttr: {
      const Value ns = lookup(t.name);
      auto* n = ns.is_object() ? dynamic_cast<Namespace*>(&ns.obj()) : nullptr;
      if (!n) throw_error(ErrorKind::Runtime, "cannot assign attribute on non-namespace object");
      n->attrs.set(t.attr, v);
      return;
    }
    case Target::Kind::Tuple: {
      const std::vector<Value> items = iterate(v);
      if (items.size() > t.items.size())
        throw_error(ErrorKind::Type, "too many values to unpack (expected " + std::to_string(t.items.size()) + ")");
      if (items.size() < t.items.size()) {
        throw_error(ErrorKind::Type, "not enough values to unpack (expected " + std::to_string(t.items.size()) +
                                         ", got " + std::to_string(items.size()) + ")");
      }
      for (size_t i = 0; i < items.size(); ++i) assign(t.items[i], items[i]);
      return;
    }
  }
}

void Interpreter::exec_for(const ForStmt& s) {
  const Value iterable = eval(*s.iter);
  run_loop(s, iterable, 0);
}

void Interpreter::run_loop(const ForStmt& s, const Value& iterable, int depth0) {
  auto st = std::make_shared<LoopState>();
  st->stmt = &s;
  st->outer = scope_;
  st->depth0 = depth0;
  std::vector<Value> items = iterate(iterable);
  if (s.filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      tick();
      ScopeGuard sg(*this, std::make_shared<Scope>(st->outer));
      assign(s.target, item);
      if (truthy(eval(*s.filter))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  st->items = std::move(items);
  if (st->items.empty()) {
    ScopeGuard sg(*this, std::make_shared<Scope>(st->outer));
    exec_body(s.else_body);
    return;
  }
  const Value loop(std::static_pointer_cast<Object>(make<LoopObject>(st)));
  for (size_t i = 0; i < st->items.size(); ++i) {
    tick();
    st->index0 = i;
    ScopeGuard sg(*this, std::make_shared<Scope>(st->outer));
    assign(s.target, st->items[i]);
    scope_->set("loop", loop);
    if (exec_body(s.body) == Flow::Break) break;
  }
}

Value Interpreter::loop_recurse(LoopState& st, CallArgs& args) {
  if (args.pos.size() != 1 || !args.kw.empty()) throw_error(ErrorKind::Type, "loop() takes exactly one argument");
  DepthCounter dc(call_depth_, opt_.limits.max_call_depth, "recursive loop");
  std::string buf;
  {
    OutGuard g(*this, &buf);
    ScopeGuard sg(*this, st.outer);
    run_loop(*st.stmt, args.pos[0], st.depth0 + 1);
  }
  return Value(std::move(buf));
}

Value Interpreter::call_macro(const MacroStmt& m, const ScopePtr& closure, CallArgs& args) {
  DepthCounter dc(call_depth_, opt_.limits.max_call_depth, "macro call");
  tick();
  auto scope = std::make_shared<Scope>(closure);
  const size_t n = m.params.size();
  std::vector<const Value*> bound(n, nullptr);
  for (size_t i = 0; i < std::min(n, args.pos.size()); ++i) bound[i] = &args.pos[i];
  std::vector<bool> used_kw(args.kw.size(), false);
  auto take_kw = [&](const std::string& name) -> const Value* {
    for (size_t k = 0; k < args.kw.size(); ++k) {
      if (!used_kw[k] && args.kw[k].first == name) {
        used_kw[k] = true;
        return &args.kw[k].second;
      }
    }
    return nullptr;
  };
  bool found_caller = false;
  bool explicit_caller = false;
  for (auto& p : m.params)
    if (p.name == "caller") explicit_caller = true;
  if (args.pos.size() < n) {
    for (size_t i = args.pos.size(); i < n; ++i) {
      bound[i] = take_kw(m.params[i].name);
      if (m.params[i].name == "caller") found_caller = true;
    }
  } else {
    found_caller = explicit_caller;
  }
  Value caller;
  const bool set_caller = m.uses_caller && !found_caller;
  if (set_caller) {
    const Value* c = take_kw("caller");
    caller = c ? *c : Value::undefined("No caller defined");
  }
  DictData extra_kw;
  for (size_t k = 0; k < args.kw.size(); ++k) {
    if (used_kw[k]) continue;
    if (!m.catch_kwargs) {
      if (args.kw[k].first == "caller") {
        throw_error(ErrorKind::Type,
                    "macro '" + m.name +
                        "' was invoked with two values for the special caller argument. This is most likely a bug.");
      }
      throw_error(ErrorKind::Type, "macro '" + m.name + "' takes no keyword argument '" + args.kw[k].first + "'");
    }
    extra_kw.set(args.kw[k].first, args.kw[k].second);
  }
  if (!m.catch_varargs && args.pos.size() > n)
    throw_error(ErrorKind::Type, "macro '" + m.name + "' takes not more than " + std::to_string(n) + " argument(s)");

  ScopeGuard sg(*this, scope);
  for (size_t i = 0; i < n; ++i) {
    if (bound[i]) {
      scope->set(m.params[i].name, *bound[i]);
    } else if (m.params[i].default_value) {
      scope->set(m.params[i].name, eval(*m.params[i].default_value));
    } else {
      scope->set(m.params[i].name, Value::undefined("parameter '" + m.params[i].name + "' was not provided"));
    }
  }
  if (set_caller) scope->set("caller", caller);
  if (m.catch_kwargs) scope->set("kwargs", Value::dict(std::move(extra_kw)));
  if (m.catch_varargs) {
    std::vector<Value> rest;
    for (size_t i = n; i < args.pos.size(); ++i) rest.push_back(args.pos[i]);
    scope->set("varargs", Value::tuple(std::move(rest)));
  }
  return Value(capture(m.body));
}

// ---------------------------------------------------------------------------------------------------------------
// Expressions

Value Interpreter::lookup(const std::string& name) {
  for (Scope* s = scope_.get(); s; s = s->parent.get())
    if (Value* v = s->find_local(name)) return *v;
  if (context_.is_dict())
    if (const Value* v = context_.dict().find(std::string_view(name))) return *v;
  if (const Value* v = globals_.find(std::string_view(name))) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

// jinja2's has_safe_repr: what its optimizer accepts as a folded constant.
static bool safe_const(const Value& v) {
  switch (v.type()) {
    case Type::None:
    case Type::Bool:
    case Type::Int:
    case Type::Float:
    case Type::String: return true;
    case Type::List: {
      const ListData& l = v.list();
      if (l.kind == ListKind::Range) return true;
      if (l.kind != ListKind::List && l.kind != ListKind::Tuple) return false;
      for (auto& x : l.items)
        if (!safe_const(x)) return false;
      return true;
    }
    case Type::Dict:
      for (auto& [k, x] : v.dict().items())
        if (!safe_const(k) || !safe_const(x)) return false;
      return true;
    default: return false;
  }
}

namespace {
struct ConstImpossible {};  // jinja2's nodes.Impossible: the expression cannot be folded
}  // namespace

Value Interpreter::eval(const Expr& e) {
  DepthCounter dc(eval_depth_, opt_.limits.max_eval_depth, "template evaluation");
  if (in_const_) {
    if (!e.konst) throw ConstImpossible{};
  } else if (e.konst) {
    // jinja2 folds constant sub-expressions at compile time (sandbox getitem semantics for slices) when the
    // result is a plain value; a whole {{ }} expression is folded whatever the result.
    in_const_ = true;
    try {
      Value v = eval_inner(e);
      in_const_ = false;
      if (&e == output_root_ || safe_const(v)) return v;
    } catch (const TemplateError&) {
      in_const_ = false;
    } catch (const ConstImpossible&) {
      in_const_ = false;
    }
  }
  try {
    return eval_inner(e);
  } catch (const TemplateError& err) {
    if (!err.has_position()) throw err.at(prog_.name, e.pos.line, e.pos.col);
    throw;
  }
}

void Interpreter::eval_args(const ArgsNode& a, CallArgs& out) {
  for (auto& x : a.args) out.pos.push_back(eval(*x));
  for (auto& [k, x] : a.kwargs) out.kw.emplace_back(k, eval(*x));
  if (a.dyn_args) {
    for (auto& v : iterate(eval(*a.dyn_args))) out.pos.push_back(v);
  }
  if (a.dyn_kwargs) {
    const Value d = eval(*a.dyn_kwargs);
    if (!d.is_dict()) throw_error(ErrorKind::Type, "argument after ** must be a mapping, not " + type_name(d));
    for (auto& [k, v] : d.dict().items()) {
      if (!k.is_string()) throw_error(ErrorKind::Type, "keywords must be strings");
      out.kw.emplace_back(k.str(), v);
    }
  }
}

static bool is_tuple_like(const Value& v) {
  return v.is_list() && (v.list().kind == ListKind::Tuple || v.list().kind == ListKind::GroupTuple);
}

Value Interpreter::eval_inner(const Expr& e) {
  switch (e.kind) {
    case EK::Const: return static_cast<const ConstExpr&>(e).value;
    case EK::Name: return lookup(static_cast<const NameExpr&>(e).name);
    case EK::GetAttr: {
      auto& g = static_cast<const GetAttrExpr&>(e);
      return getattr(eval(*g.obj), g.attr);
    }
    case EK::GetItem: {
      auto& g = static_cast<const GetItemExpr&>(e);
      const Value obj = eval(*g.obj);
      if (g.index->kind == EK::Slice) {
        try {
          return slice(obj, static_cast<const SliceExpr&>(*g.index));
        } catch (const TemplateError& err) {
          // jinja2 evaluates a constant {{ expression }} at compile time, where slicing goes through the
          // sandbox's getitem and a TypeError becomes undefined; elsewhere the slice is a Python subscript.
          if (err.kind() == ErrorKind::Type && !err.has_position() && in_const_ &&
              err.message().find("step cannot be zero") == std::string::npos)
            return Value::undefined(err.message());
          throw;
        }
      }
      return getitem(obj, eval(*g.index));
    }
    case EK::Slice: throw_error(ErrorKind::Syntax, "slice outside of a subscript");
    case EK::Call: return eval_call(static_cast<const CallExpr&>(e));
    case EK::Filter: return eval_filter(static_cast<const FilterExpr&>(e), nullptr);
    case EK::Test: {
      auto& t = static_cast<const TestExpr&>(e);
      const Value v = eval(*t.node);
      CallArgs args;
      eval_args(t.args, args);
      return Value(call_test(t.name, v, args));
    }
    case EK::Neg:
    case EK::Pos: {
      const Value v = eval(*static_cast<const UnaryExpr&>(e).operand);
      if (v.is_undefined()) undefined_error(v);
      if (v.is_integral()) {
        if (e.kind == EK::Pos) return Value(v.as_int());
        if (v.as_int() == std::numeric_limits<int64_t>::min()) throw_error(ErrorKind::Type, "integer overflow");
        return Value(-v.as_int());
      }
      if (v.is_float()) return Value(e.kind == EK::Neg ? -v.as_float() : v.as_float());
      throw_error(ErrorKind::Type, std::string("bad operand type for unary ") + (e.kind == EK::Neg ? "-" : "+") +
                                       ": '" + type_name(v) + "'");
    }
    case EK::Not: return Value(!truthy(eval(*static_cast<const UnaryExpr&>(e).operand)));
    case EK::And: {
      auto& b = static_cast<const BinaryExpr&>(e);
      Value l = eval(*b.left);
      if (!truthy(l)) return l;
      return eval(*b.right);
    }
    case EK::Or: {
      auto& b = static_cast<const BinaryExpr&>(e);
      Value l = eval(*b.left);
      if (truthy(l)) return l;
      return eval(*b.right);
    }
    case EK::Binary: {
      auto& b = static_cast<const BinaryExpr&>(e);
      const Value l = eval(*b.left);
      const Value r = eval(*b.right);
      return binary(b.op, l, r);
    }
    case EK::Concat: {
      std::string s;
      for (auto& p : static_cast<const ConcatExpr&>(e).parts) {
        const Value v = eval(*p);
        if (v.is_string())
          s += v.str();
        else
          s += to_str(v);
        check_size(s.size());
      }
      return Value(std::move(s));
    }
    case EK::Compare: {
      auto& c = static_cast<const CompareExpr&>(e);
      Value left = eval(*c.first);
      for (auto& [op, expr] : c.ops) {
        Value right = eval(*expr);
        bool r = false;
        switch (op) {
          case CmpOp::Eq: r = py_eq(left, right); break;
          case CmpOp::Ne: r = !py_eq(left, right); break;
          case CmpOp::In: r = contains(right, left); break;
          case CmpOp::NotIn: r = !contains(right, left); break;
          default: {
            if (left.is_undefined()) undefined_error(left);
            if (right.is_undefined()) undefined_error(right);
            const char* o = op == CmpOp::Lt ? "<" : op == CmpOp::Le ? "<=" : op == CmpOp::Gt ? ">" : ">=";
            r = py_compare(left, right, o);
          }
        }
        if (!r) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case EK::Cond: {
      auto& c = static_cast<const CondExpr&>(e);
      if (truthy(eval(*c.test))) return eval(*c.then);
      if (c.otherwise) return eval(*c.otherwise);
      if (in_const_) throw ConstImpossible{};
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
    }
    case EK::List:
    case EK::Tuple: {
      auto& l = static_cast<const ListExpr&>(e);
      std::vector<Value> items;
      items.reserve(l.items.size());
      for (auto& x : l.items) items.push_back(eval(*x));
      return Value::list(std::move(items), e.kind == EK::Tuple ? ListKind::Tuple : ListKind::List);
    }
    case EK::Dict: {
      DictData d;
      for (auto& [k, v] : static_cast<const DictExpr&>(e).items) {
        Value key = eval(*k);
        d.set(std::move(key), eval(*v));
      }
      return Value::dict(std::move(d));
    }
  }
  return Value();
}

Value Interpreter::eval_call(const CallExpr& c) {
  if (c.callee->kind == EK::GetAttr) {
    // obj.method(...): call Python methods of str/list/dict directly.
    auto& g = static_cast<const GetAttrExpr&>(*c.callee);
    const Value obj = eval(*g.obj);
    if (obj.is_string() || obj.is_list() || obj.is_dict()) {
      CallArgs args;
      eval_args(c.args, args);
      if (auto r = call_method(*this, obj, g.attr, args)) return std::move(*r);
      const Value callee = getattr(obj, g.attr);
      return call(callee, args);
    }
    const Value callee = getattr(obj, g.attr);
    CallArgs args;
    eval_args(c.args, args);
    return call(callee, args);
  }
  const Value callee = eval(*c.callee);
  CallArgs args;
  eval_args(c.args, args);
  return call(callee, args);
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) undefined_error(callee);
  if (callee.is_object() && callee.obj().callable()) return callee.obj().call(*this, args);
  throw_error(ErrorKind::Type, "'" + type_name(callee) + "' object is not callable");
}

Value Interpreter::eval_filter(const FilterExpr& f, const Value* block_value) {
  Value v;
  if (f.node) {
    if (block_value && f.node->kind == EK::Filter)
      v = eval_filter(static_cast<const FilterExpr&>(*f.node), block_value);
    else
      v = eval(*f.node);
  } else if (block_value) {
    v = *block_value;
  }
  CallArgs args;
  eval_args(f.args, args);
  try {
    return call_filter(f.name, v, args);
  } catch (const TemplateError& err) {
    if (!err.has_position()) throw err.at(prog_.name, f.pos.line, f.pos.col);
    throw;
  }
}

Value Interpreter::call_filter(const std::string& name, const Value& v, CallArgs& args) {
  const FilterFn fn = find_filter(name);
  if (!fn) throw_error(ErrorKind::Runtime, "No filter named '" + name + "' found.");
  tick();
  return fn(*this, v, args);
}

bool Interpreter::call_test(const std::string& name, const Value& v, CallArgs& args) {
  const TestFn fn = find_test(name);
  if (!fn) throw_error(ErrorKind::Runtime, "No test named '" + name + "' found.");
  return fn(*this, v, args);
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.type()) {
    case Type::Undefined: return {};
    case Type::String: {
      std::vector<Value> out;
      const std::string& s = v.str();
      size_t i = 0;
      while (i < s.size()) {
        const size_t st = i;
        utf8::next(s, i);
        out.emplace_back(std::string_view(s).substr(st, i - st));
      }
      return out;
    }
    case Type::List: {
      const ListData& l = v.list();
      if (l.kind == ListKind::Generator) {
        if (l.consumed) return {};
        l.consumed = true;
      }
      return l.items;
    }
    case Type::Dict: {
      std::vector<Value> out;
      out.reserve(v.dict().size());
      for (auto& [k, val] : v.dict().items()) out.push_back(k);
      return out;
    }
    default: break;
  }
  throw_error(ErrorKind::Type, "'" + type_name(v) + "' object is not iterable");
}

bool Interpreter::contains(const Value& c, const Value& item) {
  switch (c.type()) {
    case Type::Undefined: return false;
    case Type::String:
      if (!item.is_string()) {
        throw_error(ErrorKind::Type, "'in <string>' requires string as left operand, not " + type_name(item));
      }
      return c.str().find(item.str()) != std::string::npos;
    case Type::List: {
      for (auto& x : iterate(c))
        if (py_eq(x, item)) return true;
      return false;
    }
    case Type::Dict:
      if (!hashable(item)) throw_error(ErrorKind::Type, "unhashable type: '" + type_name(item) + "'");
      return c.dict().find(item) != nullptr;
    default: break;
  }
  throw_error(ErrorKind::Type, "argument of type '" + type_name(c) + "' is not iterable");
}

// ---- attribute / item access (jinja2 SandboxedEnvironment.getattr / getitem) ----

static std::string obj_desc(const Value& v) {
  if (v.is_none()) return "'None'";
  return "'" + type_name(v) + " object'";
}

static bool is_dunder(const std::string& n) { return n.size() > 4 && n.starts_with("__") && n.ends_with("__"); }

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (is_dunder(name)) {
    return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.", true);
  }
  switch (obj.type()) {
    case Type::Object: return obj.obj().get_attr(*this, name);
    case Type::String:
    case Type::List:
    case Type::Dict: {
      if (auto m = method_attr(*this, obj, name)) return *m;
      if (obj.is_dict()) {
        if (const Value* v = obj.dict().find(std::string_view(name))) return *v;
      }
      if (obj.is_list() && obj.list().kind == ListKind::GroupTuple && obj.list().items.size() == 2) {
        if (name == "grouper") return obj.list().items[0];
        if (name == "list") return obj.list().items[1];
      }
      break;
    }
    default: break;
  }
  return Value::undefined(obj_desc(obj) + " has no attribute '" + name + "'");
}

static bool index_of(const Value& key, int64_t len, int64_t& idx) {
  if (!key.is_integral()) return false;
  idx = key.as_int();
  if (idx < 0) idx += len;
  return idx >= 0 && idx < len;
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  switch (obj.type()) {
    case Type::String: {
      const std::string& s = obj.str();
      if (key.is_integral()) {
        if (utf8::is_ascii(s)) {
          int64_t idx;
          if (index_of(key, static_cast<int64_t>(s.size()), idx)) return Value(s.substr(static_cast<size_t>(idx), 1));
        } else {
          const std::u32string u = utf8::decode(s);
          int64_t idx;
          if (index_of(key, static_cast<int64_t>(u.size()), idx)) {
            std::string out;
            utf8::append(out, u[static_cast<size_t>(idx)]);
            return Value(std::move(out));
          }
        }
      }
      break;
    }
    case Type::List: {
      const ListData& l = obj.list();
      if (l.kind == ListKind::List || is_tuple_like(obj) || l.kind == ListKind::Range) {
        int64_t idx;
        if (index_of(key, static_cast<int64_t>(l.items.size()), idx)) return l.items[static_cast<size_t>(idx)];
      }
      break;
    }
    case Type::Dict:
      if (hashable(key))
        if (const Value* v = obj.dict().find(key)) return *v;
      break;
    default: break;
  }
  if (key.is_string()) {
    // jinja2 falls back to the attribute of that name (d['items'] is the method when there is no such key)
    const std::string& name = key.str();
    if (is_dunder(name)) {
      return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.", true);
    }
    if (obj.is_object()) return obj.obj().get_attr(*this, name);
    if (obj.is_string() || obj.is_list() || obj.is_dict())
      if (auto m = method_attr(*this, obj, name)) return *m;
    return Value::undefined(obj_desc(obj) + " has no attribute '" + name + "'");
  }
  return Value::undefined(obj_desc(obj) + " has no element " + repr(key));
}

// Python slice index normalisation.
static void slice_indices(int64_t len, const Value* start, const Value* stop, int64_t step, int64_t& b, int64_t& e) {
  const int64_t lower = step > 0 ? 0 : -1;
  const int64_t upper = step > 0 ? len : len - 1;
  auto adj = [&](const Value* v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = v->as_int();
    if (x < 0) {
      x += len;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  b = adj(start, step > 0 ? lower : upper);
  e = adj(stop, step > 0 ? upper : lower);
}

Value Interpreter::slice(const Value& obj, const SliceExpr& s) {
  // jinja2 compiles slices to a plain Python subscript (no sandbox getitem), so errors propagate.
  if (obj.is_undefined()) undefined_error(obj);
  Value vs, ve, vst;
  if (s.start) vs = eval(*s.start);
  if (s.stop) ve = eval(*s.stop);
  if (s.step) vst = eval(*s.step);
  const bool seq = obj.is_string() || (obj.is_list() && (obj.list().kind == ListKind::List || is_tuple_like(obj) ||
                                                         obj.list().kind == ListKind::Range));
  if (!seq) {
    if (obj.is_dict()) throw_error(ErrorKind::Type, "unhashable type: 'slice'");
    throw_error(ErrorKind::Type, "'" + type_name(obj) + "' object is not subscriptable");
  }
  auto idx_ok = [](const Value& v) { return v.is_undefined() || v.is_none() || v.is_integral(); };
  if (!idx_ok(vs) || !idx_ok(ve) || !idx_ok(vst))
    throw_error(ErrorKind::Type, "slice indices must be integers or None or have an __index__ method");
  const Value* ps = vs.is_integral() ? &vs : nullptr;
  const Value* pe = ve.is_integral() ? &ve : nullptr;
  const int64_t step = vst.is_integral() ? vst.as_int() : 1;
  if (step == 0) throw_error(ErrorKind::Type, "slice step cannot be zero");
  if (obj.is_string()) {
    const std::u32string u = utf8::decode(obj.str());
    int64_t b, e;
    slice_indices(static_cast<int64_t>(u.size()), ps, pe, step, b, e);
    std::u32string out;
    if (step > 0) {
      for (int64_t i = b; i < e; i += step) out.push_back(u[static_cast<size_t>(i)]);
    } else {
      for (int64_t i = b; i > e; i += step) out.push_back(u[static_cast<size_t>(i)]);
    }
    return Value(utf8::encode(out));
  }
  const ListData& l = obj.list();
  int64_t b, e;
  slice_indices(static_cast<int64_t>(l.items.size()), ps, pe, step, b, e);
  std::vector<Value> out;
  if (step > 0) {
    for (int64_t i = b; i < e; i += step) out.push_back(l.items[static_cast<size_t>(i)]);
  } else {
    for (int64_t i = b; i > e; i += step) out.push_back(l.items[static_cast<size_t>(i)]);
  }
  if (l.kind == ListKind::Range) {  // range slicing gives a range
    auto r = std::make_shared<ListData>();
    r->kind = ListKind::Range;
    r->range_start = l.range_start + b * l.range_step;
    r->range_stop = l.range_start + e * l.range_step;
    r->range_step = l.range_step * step;
    r->items = std::move(out);
    return Value(std::shared_ptr<const ListData>(std::move(r)));
  }
  return Value::list(std::move(out), l.kind == ListKind::GroupTuple ? ListKind::Tuple : l.kind);
}

// ---- arithmetic ----

[[noreturn]] static void unsupported(const char* op, const Value& a, const Value& b) {
  throw_error(ErrorKind::Type, std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" +
                                   type_name(b) + "'");
}

static Value repeat(Interpreter& in, const Value& seq, int64_t n) {
  if (n <= 0) return seq.is_string() ? Value(std::string()) : Value::list({}, seq.list().kind);
  if (seq.is_string()) {
    const std::string& s = seq.str();
    in.check_size(s.size() * static_cast<size_t>(std::min<int64_t>(n, INT32_MAX)));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  const auto& items = seq.list().items;
  const uint64_t total = items.size() * static_cast<uint64_t>(std::min<int64_t>(n, INT32_MAX));
  in.tick(total);
  std::vector<Value> out;
  out.reserve(total);
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), seq.list().kind);
}

static double py_float_mod(double a, double b, double& floordiv) {
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, b);
  }
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, a / b);
  }
  return mod;
}

Value Interpreter::binary(BinOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = a.is_integral() && b.is_integral();
  switch (op) {
    case BinOp::Add:
      if (ints) {
        int64_t r;
        if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) throw_error(ErrorKind::Type, "integer overflow");
        return Value(r);
      }
      if (nums) return Value(a.as_float() + b.as_float());
      if (a.is_string() && b.is_string()) {
        check_size(a.str().size() + b.str().size());
        return Value(a.str() + b.str());
      }
      if (a.is_string()) {
        throw_error(ErrorKind::Type, "can only concatenate str (not \"" + type_name(b) + "\") to str");
      }
      if (a.is_list() && b.is_list()) {
        const ListKind ka = a.list().kind, kb = b.list().kind;
        const bool ta = ka == ListKind::Tuple || ka == ListKind::GroupTuple;
        const bool tb = kb == ListKind::Tuple || kb == ListKind::GroupTuple;
        if ((ka == ListKind::List && kb == ListKind::List) || (ta && tb)) {
          tick(a.list().items.size() + b.list().items.size());
          std::vector<Value> out = a.list().items;
          out.insert(out.end(), b.list().items.begin(), b.list().items.end());
          return Value::list(std::move(out), ta ? ListKind::Tuple : ListKind::List);
        }
        if (ka == ListKind::List || ta) {
          throw_error(ErrorKind::Type,
                      "can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
        }
      }
      unsupported("+", a, b);
    case BinOp::Sub:
      if (ints) {
        int64_t r;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) throw_error(ErrorKind::Type, "integer overflow");
        return Value(r);
      }
      if (nums) return Value(a.as_float() - b.as_float());
      unsupported("-", a, b);
    case BinOp::Mul:
      if (ints) {
        int64_t r;
        if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) throw_error(ErrorKind::Type, "integer overflow");
        return Value(r);
      }
      if (nums) return Value(a.as_float() * b.as_float());
      {
        auto seqok = [](const Value& v) {
          return v.is_string() ||
                 (v.is_list() && (v.list().kind == ListKind::List || v.list().kind == ListKind::Tuple));
        };
        if (seqok(a) && b.is_integral()) return repeat(*this, a, b.as_int());
        if (seqok(b) && a.is_integral()) return repeat(*this, b, a.as_int());
        if (seqok(a) || seqok(b)) {
          throw_error(ErrorKind::Type,
                      "can't multiply sequence by non-int of type '" + type_name(seqok(a) ? b : a) + "'");
        }
      }
      unsupported("*", a, b);
    case BinOp::Div:
      if (nums) {
        if (b.as_float() == 0.0) throw_error(ErrorKind::Type, "division by zero");
        if (ints) return Value(static_cast<double>(a.as_int()) / static_cast<double>(b.as_int()));
        return Value(a.as_float() / b.as_float());
      }
      unsupported("/", a, b);
    case BinOp::FloorDiv:
    case BinOp::Mod:
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) throw_error(ErrorKind::Type, "integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          if (op == BinOp::Mod) return Value(static_cast<int64_t>(0));
          throw_error(ErrorKind::Type, "integer overflow");
        }
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          q -= 1;
          r += y;
        }
        return Value(op == BinOp::FloorDiv ? q : r);
      }
      if (nums) {
        if (b.as_float() == 0.0)
          throw_error(ErrorKind::Type, op == BinOp::Mod ? "float modulo" : "float floor division by zero");
        double fd;
        const double m = py_float_mod(a.as_float(), b.as_float(), fd);
        return Value(op == BinOp::FloorDiv ? fd : m);
      }
      if (op == BinOp::Mod && a.is_string()) {
        std::string r = percent_format(*this, a.str(), b);
        check_size(r.size());
        return Value(std::move(r));
      }
      unsupported(op == BinOp::Mod ? "%" : "//", a, b);
    case BinOp::Pow:
      if (ints && b.as_int() >= 0) {
        int64_t base = a.as_int(), e = b.as_int(), r = 1;
        while (e > 0) {
          if (e & 1)
            if (__builtin_mul_overflow(r, base, &r)) throw_error(ErrorKind::Type, "integer overflow");
          e >>= 1;
          if (e > 0 && __builtin_mul_overflow(base, base, &base)) throw_error(ErrorKind::Type, "integer overflow");
        }
        return Value(r);
      }
      if (nums) {
        const double x = a.as_float(), y = b.as_float();
        if (x == 0.0 && y < 0) throw_error(ErrorKind::Type, "0.0 cannot be raised to a negative power");
        if (x < 0 && y != std::floor(y)) throw_error(ErrorKind::Type, "complex results are not supported");
        const double r = std::pow(x, y);
        if (std::isinf(r) && std::isfinite(x) && std::isfinite(y))
          throw_error(ErrorKind::Type, "(34, 'Numerical result out of range')");
        return Value(r);
      }
      unsupported("** or pow()", a, b);
  }
  unsupported("?", a, b);
}

}  // namespace latent::jinja
