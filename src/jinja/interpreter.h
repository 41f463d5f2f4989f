// Tree-walking evaluator of a parsed template with jinja2's semantics under transformers' sandboxed environment:
// scoping (loop bodies and macros get their own scope, `if` does not), Undefined, the sandbox (no mutation of
// lists/dicts, no private attributes), and hard limits against runaway templates.
#pragma once
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace latent::jinja {

struct Limits {
  uint64_t max_steps = 1'000'000;  // loop iterations, macro calls and per-item filter work, in total
  int max_call_depth = 200;        // macro / recursive-loop nesting
  int max_eval_depth = 4000;       // evaluator recursion (expressions within macros within ...)
  size_t max_output = 64u << 20;   // bytes of output, and of any single string the template builds
};

struct RenderOptions {
  Limits limits;
  std::function<std::tm()> now;  // clock for strftime_now; empty: local time
};

struct Scope {
  explicit Scope(std::shared_ptr<Scope> p) : parent(std::move(p)) {}
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
  Value* find_local(std::string_view n) {
    for (auto& [k, v] : vars)
      if (k == n) return &v;
    return nullptr;
  }
  void set(const std::string& n, Value v) {
    if (Value* p = find_local(n))
      *p = std::move(v);
    else
      vars.emplace_back(n, std::move(v));
  }
};
using ScopePtr = std::shared_ptr<Scope>;

struct LoopState;

class Interpreter {
 public:
  Interpreter(const Program& prog, const RenderOptions& opt);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // context: a dict of top-level variables.
  std::string render(const Value& context);

  // ---- semantics shared with builtins ----
  Value getattr(const Value& obj, const std::string& name);  // jinja2 sandbox getattr
  Value getitem(const Value& obj, const Value& key);         // jinja2 sandbox getitem
  Value call(const Value& callee, CallArgs& args);
  Value call_filter(const std::string& name, const Value& v, CallArgs& args);
  bool call_test(const std::string& name, const Value& v, CallArgs& args);
  std::vector<Value> iterate(const Value& v);                // Python iter(); TypeError if not iterable
  bool contains(const Value& container, const Value& item);  // Python `item in container`
  void tick(uint64_t n = 1);
  void check_size(size_t bytes) const;
  const RenderOptions& options() const { return opt_; }
  std::tm now() const;
  // Registers an object so that its references are dropped after the render (breaks cycles).
  void track(const std::shared_ptr<Object>& o);
  template <class T, class... A>
  std::shared_ptr<T> make(A&&... a) {
    auto p = std::make_shared<T>(std::forward<A>(a)...);
    track(p);
    return p;
  }

  // ---- used by Macro / Loop objects ----
  Value call_macro(const MacroStmt& m, const ScopePtr& closure, CallArgs& args);
  Value loop_recurse(LoopState& st, CallArgs& args);

  // Arithmetic with Python semantics (also used by filters such as sum).
  Value binary(BinOp op, const Value& a, const Value& b);

 private:
  enum class Flow { Normal, Break, Continue };

  Flow exec_body(const Body& body);
  Flow exec(const Stmt& s);
  Value eval(const Expr& e);
  Value eval_inner(const Expr& e);
  void eval_args(const ArgsNode& a, CallArgs& out);
  Value lookup(const std::string& name);
  void assign(const Target& t, const Value& v);
  void exec_for(const ForStmt& s);
  void run_loop(const ForStmt& s, const Value& iterable, int depth0);
  Value slice(const Value& obj, const SliceExpr& s);
  Value eval_call(const CallExpr& c);
  Value eval_filter(const FilterExpr& f, const Value* block_value);
  std::string capture(const Body& body);
  void write(std::string_view s);
  [[noreturn]] void undefined_error(const Value& u);

  friend struct OutGuard;
  friend struct ScopeGuard;

  const Program& prog_;
  RenderOptions opt_;
  ScopePtr scope_;
  DictData globals_;
  Value context_;
  std::string* out_ = nullptr;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
  bool in_const_ = false;              // evaluating a sub-expression jinja2 folds at compile time
  const Expr* output_root_ = nullptr;  // the {{ }} expression being printed
  std::vector<std::weak_ptr<Object>> objects_;
  size_t objects_compact_at_ = 1024;
};

}  // namespace latent::jinja
