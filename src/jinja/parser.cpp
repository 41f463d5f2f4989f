#include "jinja/parser.h"

#include <functional>
#include <initializer_list>
#include <vector>

#include "jinja/builtins.h"
#include "jinja/error.h"
#include "jinja/lexer.h"

namespace latent::jinja {

namespace {

class Parser {
 public:
  Parser(std::vector<Token> toks, std::string name) : t_(std::move(toks)), name_(std::move(name)) {}

  std::unique_ptr<Program> run() {
    auto prog = std::make_unique<Program>();
    prog->name = name_;
    prog->body = subparse({});
    if (cur().type != Tok::Eof) fail("unexpected token");
    check_body(prog->body, false);
    mark_body(prog->body);
    return prog;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[i_ + 1 < t_.size() ? i_ + 1 : i_]; }
  Pos pos() const { return Pos{cur().line, cur().col}; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Data: return "template data";
      case Tok::VarBegin: return "begin of print statement";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockBegin: return "begin of statement block";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::Name: return t.text;
      case Tok::String: return "string";
      case Tok::Int: return "integer";
      case Tok::Float: return "float";
      case Tok::Op: return t.text;
      case Tok::Eof: return "end of template";
    }
    return "?";
  }

  [[noreturn]] void fail(const std::string& msg) const { fail_at(pos(), msg); }
  [[noreturn]] void fail_at(Pos p, const std::string& msg) const {
    throw TemplateError(ErrorKind::Syntax, msg, name_, p.line, p.col);
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected token '") + op + "', got '" + describe(cur()) + "'");
  }
  void expect_name(const char* n) {
    if (!skip_name(n)) fail(std::string("expected token '") + n + "', got '" + describe(cur()) + "'");
  }
  std::string expect_any_name() {
    if (cur().type != Tok::Name) fail("expected token 'name', got '" + describe(cur()) + "'");
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail("expected token 'end of statement block', got '" + describe(cur()) + "'");
    next();
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxParseDepth)
        p_.fail("template nesting too deep (limit " + std::to_string(kMaxParseDepth) + ")");
    }
    ~DepthGuard() { --p_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
    Parser& p_;
  };
  // Whether break/continue are allowed (inside a for body, not inside a macro defined there).
  struct FrameGuard {
    FrameGuard(Parser& p, bool loop) : p_(p), loop_(p.in_loop_) { p.in_loop_ = loop; }
    ~FrameGuard() { p_.in_loop_ = loop_; }
    FrameGuard(const FrameGuard&) = delete;
    FrameGuard& operator=(const FrameGuard&) = delete;
    Parser& p_;
    bool loop_;
  };

  // ---- statements ----
  using EndSet = std::initializer_list<const char*>;

  bool at_end_tag(EndSet ends) const {
    for (const char* e : ends)
      if (is_name(e)) return true;
    return false;
  }

  Body subparse(EndSet ends) {
    DepthGuard g(*this);
    Body body;
    while (cur().type != Tok::Eof) {
      const Token& tk = cur();
      if (tk.type == Tok::Data) {
        body.push_back(std::make_unique<DataStmt>(pos(), tk.text));
        next();
      } else if (tk.type == Tok::VarBegin) {
        next();
        Pos p = pos();
        body.push_back(std::make_unique<PrintStmt>(p, parse_tuple(false, true, {}, false)));
        if (cur().type != Tok::VarEnd) fail("expected token 'end of print statement', got '" + describe(cur()) + "'");
        next();
      } else if (tk.type == Tok::BlockBegin) {
        next();
        if (ends.size() && at_end_tag(ends)) return body;
        parse_statement(body);
        expect_block_end();
      } else {
        fail("unexpected '" + describe(tk) + "'");
      }
    }
    if (ends.size()) {
      std::string list;
      for (const char* e : ends) list += (list.empty() ? "'" : ", '") + std::string(e) + "'";
      fail("Unexpected end of template. Jinja was looking for the following tags: " + list + ".");
    }
    return body;
  }

  // parse_statements: expects the block end, parses until one of `ends`; leaves the end name current.
  Body statements(EndSet ends) {
    skip_op(":");
    expect_block_end();
    return subparse(ends);
  }
  // ... and consumes the end name.
  Body statements_drop(EndSet ends) {
    Body b = statements(ends);
    next();
    return b;
  }

  void parse_statement(Body& out) {
    if (cur().type != Tok::Name) fail("tag name expected");
    const std::string tag = cur().text;
    const Pos p = pos();
    if (tag == "for") return out.push_back(parse_for());
    if (tag == "if") return out.push_back(parse_if());
    if (tag == "set") return out.push_back(parse_set());
    if (tag == "macro") return out.push_back(parse_macro());
    if (tag == "call") return out.push_back(parse_call_block());
    if (tag == "filter") return out.push_back(parse_filter_block());
    if (tag == "with") return out.push_back(parse_with());
    if (tag == "print") {
      next();
      bool first = true;
      while (cur().type != Tok::BlockEnd) {
        if (!first) expect_op(",");
        first = false;
        Pos ep = pos();
        out.push_back(std::make_unique<PrintStmt>(ep, parse_expression(true)));
      }
      return;
    }
    if (tag == "break" || tag == "continue") {
      if (!in_loop_) fail_at(p, "'" + tag + "' outside loop");
      next();
      out.push_back(std::make_unique<Stmt>(tag == "break" ? SK::Break : SK::Continue, p));
      return;
    }
    if (tag == "generation") {
      next();
      auto s = std::make_unique<ScopeStmt>(p);
      s->body = statements_drop({"endgeneration"});
      out.push_back(std::move(s));
      return;
    }
    if (tag == "block") {  // no inheritance here: a block renders in place
      next();
      expect_any_name();
      skip_name("scoped");
      skip_name("required");
      auto s = std::make_unique<ScopeStmt>(p);
      s->body = statements_drop({"endblock"});
      if (cur().type == Tok::Name) next();
      out.push_back(std::move(s));
      return;
    }
    if (tag == "extends" || tag == "include" || tag == "import" || tag == "from")
      fail_at(p, "'" + tag + "' is not supported (templates are rendered without a loader)");
    if (tag == "autoescape") fail_at(p, "'autoescape' is not supported");
    fail_at(p, "Encountered unknown tag '" + tag + "'.");
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<ForStmt>(pos());
    next();
    s->target = parse_assign_target(true, false, {"in"}, false);
    expect_name("in");
    s->iter = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) {
      FrameGuard f(*this, false);
      s->filter = parse_expression(true);
    }
    s->recursive = skip_name("recursive");
    {
      FrameGuard f(*this, true);
      s->body = statements({"endfor", "else"});
    }
    const bool has_else = is_name("else");
    next();
    if (has_else) {
      FrameGuard f(*this, false);
      s->else_body = statements_drop({"endfor"});
    }
    return s;
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<IfStmt>(pos());
    next();
    FrameGuard f(*this, in_loop_);
    while (true) {
      ExprPtr test = parse_tuple(false, false, {}, false);
      Body body = statements({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(test), std::move(body));
      if (skip_name("elif")) continue;
      if (skip_name("else")) {
        s->else_body = statements_drop({"endif"});
        break;
      }
      next();  // endif
      break;
    }
    return s;
  }

  StmtPtr parse_set() {
    const Pos p = pos();
    next();
    Target target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto s = std::make_unique<SetStmt>(p);
      s->target = std::move(target);
      s->value = parse_tuple(false, true, {}, false);
      return s;
    }
    auto s = std::make_unique<SetBlockStmt>(p);
    s->target = std::move(target);
    FrameGuard f(*this, in_loop_);
    s->filter = parse_filter(nullptr, false);
    s->body = statements_drop({"endset"});
    return s;
  }

  void parse_signature(MacroStmt& m) {
    expect_op("(");
    bool seen_default = false;
    while (!is_op(")")) {
      if (!m.params.empty()) expect_op(",");
      MacroParam prm;
      prm.name = expect_any_name();
      if (skip_op("=")) {
        prm.default_value = parse_expression(true);
        seen_default = true;
      } else if (seen_default) {
        fail("non-default argument follows default argument");
      }
      m.params.push_back(std::move(prm));
    }
    expect_op(")");
  }

  // Names a macro body reads: caller / varargs / kwargs switch on the matching macro features.
  static void scan_expr(const Expr* e, MacroStmt& m) {
    if (!e) return;
    switch (e->kind) {
      case EK::Name: {
        const auto& n = static_cast<const NameExpr*>(e)->name;
        if (n == "caller") m.uses_caller = true;
        if (n == "varargs") m.catch_varargs = true;
        if (n == "kwargs") m.catch_kwargs = true;
        return;
      }
      case EK::GetAttr: return scan_expr(static_cast<const GetAttrExpr*>(e)->obj.get(), m);
      case EK::GetItem: {
        auto* g = static_cast<const GetItemExpr*>(e);
        scan_expr(g->obj.get(), m);
        return scan_expr(g->index.get(), m);
      }
      case EK::Slice: {
        auto* s = static_cast<const SliceExpr*>(e);
        scan_expr(s->start.get(), m);
        scan_expr(s->stop.get(), m);
        return scan_expr(s->step.get(), m);
      }
      case EK::Call: {
        auto* c = static_cast<const CallExpr*>(e);
        scan_expr(c->callee.get(), m);
        return scan_args(c->args, m);
      }
      case EK::Filter: {
        auto* c = static_cast<const FilterExpr*>(e);
        scan_expr(c->node.get(), m);
        return scan_args(c->args, m);
      }
      case EK::Test: {
        auto* c = static_cast<const TestExpr*>(e);
        scan_expr(c->node.get(), m);
        return scan_args(c->args, m);
      }
      case EK::Neg:
      case EK::Pos:
      case EK::Not: return scan_expr(static_cast<const UnaryExpr*>(e)->operand.get(), m);
      case EK::Binary:
      case EK::And:
      case EK::Or: {
        auto* b = static_cast<const BinaryExpr*>(e);
        scan_expr(b->left.get(), m);
        return scan_expr(b->right.get(), m);
      }
      case EK::Concat:
        for (auto& x : static_cast<const ConcatExpr*>(e)->parts) scan_expr(x.get(), m);
        return;
      case EK::Compare: {
        auto* c = static_cast<const CompareExpr*>(e);
        scan_expr(c->first.get(), m);
        for (auto& [op, x] : c->ops) scan_expr(x.get(), m);
        return;
      }
      case EK::Cond: {
        auto* c = static_cast<const CondExpr*>(e);
        scan_expr(c->test.get(), m);
        scan_expr(c->then.get(), m);
        return scan_expr(c->otherwise.get(), m);
      }
      case EK::List:
      case EK::Tuple:
        for (auto& x : static_cast<const ListExpr*>(e)->items) scan_expr(x.get(), m);
        return;
      case EK::Dict:
        for (auto& [k, v] : static_cast<const DictExpr*>(e)->items) {
          scan_expr(k.get(), m);
          scan_expr(v.get(), m);
        }
        return;
      case EK::Const: return;
    }
  }
  static void scan_args(const ArgsNode& a, MacroStmt& m) {
    for (auto& x : a.args) scan_expr(x.get(), m);
    for (auto& [k, x] : a.kwargs) scan_expr(x.get(), m);
    scan_expr(a.dyn_args.get(), m);
    scan_expr(a.dyn_kwargs.get(), m);
  }
  static void scan_body(const Body& body, MacroStmt& m) {
    for (auto& st : body) {
      switch (st->kind) {
        case SK::Print: scan_expr(static_cast<const PrintStmt*>(st.get())->expr.get(), m); break;
        case SK::If: {
          auto* s = static_cast<const IfStmt*>(st.get());
          for (auto& [t, b] : s->branches) {
            scan_expr(t.get(), m);
            scan_body(b, m);
          }
          scan_body(s->else_body, m);
          break;
        }
        case SK::For: {
          auto* s = static_cast<const ForStmt*>(st.get());
          scan_expr(s->iter.get(), m);
          scan_expr(s->filter.get(), m);
          scan_body(s->body, m);
          scan_body(s->else_body, m);
          break;
        }
        case SK::Set: scan_expr(static_cast<const SetStmt*>(st.get())->value.get(), m); break;
        case SK::SetBlock: {
          auto* s = static_cast<const SetBlockStmt*>(st.get());
          scan_expr(s->filter.get(), m);
          scan_body(s->body, m);
          break;
        }
        case SK::Macro: {
          auto* s = static_cast<const MacroStmt*>(st.get());
          for (auto& prm : s->params) scan_expr(prm.default_value.get(), m);
          scan_body(s->body, m);
          break;
        }
        case SK::CallBlock: {
          auto* s = static_cast<const CallBlockStmt*>(st.get());
          scan_expr(s->call.get(), m);
          scan_body(s->caller->body, m);
          break;
        }
        case SK::FilterBlock: {
          auto* s = static_cast<const FilterBlockStmt*>(st.get());
          scan_expr(s->filter.get(), m);
          scan_body(s->body, m);
          break;
        }
        case SK::With: {
          auto* s = static_cast<const WithStmt*>(st.get());
          for (auto& [t, v] : s->assigns) scan_expr(v.get(), m);
          scan_body(s->body, m);
          break;
        }
        case SK::Scope: scan_body(static_cast<const ScopeStmt*>(st.get())->body, m); break;
        default: break;
      }
    }
  }
  static void finish_macro(MacroStmt& m) {
    scan_body(m.body, m);
    for (auto& prm : m.params) {
      if (prm.name == "caller") m.uses_caller = true;  // explicit caller parameter
      if (prm.name == "varargs") m.catch_varargs = false;
      if (prm.name == "kwargs") m.catch_kwargs = false;
    }
  }

  StmtPtr parse_macro() {
    auto m = std::make_unique<MacroStmt>(pos());
    next();
    m->name = expect_any_name();
    FrameGuard f(*this, false);
    parse_signature(*m);
    m->body = statements_drop({"endmacro"});
    finish_macro(*m);
    return m;
  }

  StmtPtr parse_call_block() {
    auto s = std::make_unique<CallBlockStmt>(pos());
    next();
    s->caller = std::make_unique<MacroStmt>(s->pos);
    s->caller->name = "caller";
    if (is_op("(")) {
      FrameGuard f(*this, false);
      parse_signature(*s->caller);
    }
    const Pos cp = pos();
    s->call = parse_expression(true);
    if (s->call->kind != EK::Call) fail_at(cp, "expected call");
    {
      FrameGuard f(*this, false);
      s->caller->body = statements_drop({"endcall"});
    }
    finish_macro(*s->caller);
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = std::make_unique<FilterBlockStmt>(pos());
    next();
    FrameGuard f(*this, in_loop_);
    s->filter = parse_filter(nullptr, true);
    s->body = statements_drop({"endfilter"});
    return s;
  }

  StmtPtr parse_with() {
    auto s = std::make_unique<WithStmt>(pos());
    next();
    while (cur().type != Tok::BlockEnd) {
      if (!s->assigns.empty()) expect_op(",");
      Target t = parse_assign_target(true, false, {}, false);
      expect_op("=");
      ExprPtr v = parse_expression(true);
      s->assigns.emplace_back(std::move(t), std::move(v));
    }
    FrameGuard f(*this, in_loop_);
    s->body = statements_drop({"endwith"});
    return s;
  }

  // ---- assignment targets ----
  Target to_target(const Expr& e) {
    Target t;
    t.pos = e.pos;
    if (e.kind == EK::Name) {
      t.kind = Target::Kind::Name;
      t.name = static_cast<const NameExpr&>(e).name;
      return t;
    }
    if (e.kind == EK::Tuple) {
      t.kind = Target::Kind::Tuple;
      for (auto& item : static_cast<const ListExpr&>(e).items) {
        if (item->kind != EK::Name && item->kind != EK::Tuple) fail_at(item->pos, "can't assign to this expression");
        t.items.push_back(to_target(*item));
      }
      return t;
    }
    fail_at(e.pos, "can't assign to this expression");
  }

  Target parse_assign_target(bool with_tuple, bool name_only, EndSet extra_end, bool with_namespace) {
    Target t;
    t.pos = pos();
    if (name_only) {
      t.name = expect_any_name();
      return t;
    }
    // A namespace attribute target: name '.' name
    if (with_namespace && cur().type == Tok::Name && look().type == Tok::Op && look().text == ".") {
      t.kind = Target::Kind::NsAttr;
      t.name = cur().text;
      next();
      next();
      t.attr = expect_any_name();
      if (!with_tuple || !is_op(",")) return t;
      fail("can't assign to a tuple containing a namespace attribute");
    }
    ExprPtr e = with_tuple ? parse_tuple(true, true, extra_end, false) : parse_primary();
    if (e->kind == EK::Name) {
      const auto& n = static_cast<const NameExpr&>(*e).name;
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
        fail_at(e->pos, "can't assign to 'const'");
    }
    return to_target(*e);
  }

  // ---- expressions ----
  bool is_tuple_end(EndSet extra) const {
    const Tok ty = cur().type;
    if (ty == Tok::VarEnd || ty == Tok::BlockEnd || (ty == Tok::Op && cur().text == ")")) return true;
    for (const char* e : extra)
      if (is_name(e)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, EndSet extra_end, bool explicit_parens) {
    const Pos p = pos();
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail("Expected an expression, got '" + describe(cur()) + "'");
    }
    auto t = std::make_unique<ListExpr>(EK::Tuple, p);
    t->items = std::move(args);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    Pos p = pos();
    ExprPtr expr1 = parse_or();
    while (is_name("if")) {
      next();
      auto c = std::make_unique<CondExpr>(p);
      c->test = parse_or();
      c->then = std::move(expr1);
      if (skip_name("else")) c->otherwise = parse_condexpr();
      expr1 = std::move(c);
      p = pos();
    }
    return expr1;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const Pos p = pos();
      next();
      left = std::make_unique<BinaryExpr>(EK::Or, p, BinOp::Add, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const Pos p = pos();
      next();
      left = std::make_unique<BinaryExpr>(EK::And, p, BinOp::Add, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      const Pos p = pos();
      next();
      return std::make_unique<UnaryExpr>(EK::Not, p, parse_not());
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Pos p = pos();
    ExprPtr expr = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    while (true) {
      CmpOp op;
      if (is_op("=="))
        op = CmpOp::Eq;
      else if (is_op("!="))
        op = CmpOp::Ne;
      else if (is_op("<"))
        op = CmpOp::Lt;
      else if (is_op("<="))
        op = CmpOp::Le;
      else if (is_op(">"))
        op = CmpOp::Gt;
      else if (is_op(">="))
        op = CmpOp::Ge;
      else if (is_name("in"))
        op = CmpOp::In;
      else if (is_name("not") && look().type == Tok::Name && look().text == "in") {
        op = CmpOp::NotIn;
        next();
      } else {
        break;
      }
      next();
      if (!cmp) cmp = std::make_unique<CompareExpr>(p, std::move(expr));
      cmp->ops.emplace_back(op, parse_math1());
    }
    if (cmp) return cmp;
    return expr;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Pos p = pos();
      const BinOp op = is_op("+") ? BinOp::Add : BinOp::Sub;
      next();
      left = std::make_unique<BinaryExpr>(EK::Binary, p, op, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    const Pos p = pos();
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto c = std::make_unique<ConcatExpr>(p);
    c->parts.push_back(std::move(first));
    while (skip_op("~")) c->parts.push_back(parse_math2());
    return c;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Pos p = pos();
      const std::string o = cur().text;
      const BinOp op = o == "*" ? BinOp::Mul : o == "/" ? BinOp::Div : o == "//" ? BinOp::FloorDiv : BinOp::Mod;
      next();
      left = std::make_unique<BinaryExpr>(EK::Binary, p, op, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Pos p = pos();
      next();
      left = std::make_unique<BinaryExpr>(EK::Binary, p, BinOp::Pow, std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this);
    const Pos p = pos();
    ExprPtr node;
    if (is_op("-")) {
      next();
      node = std::make_unique<UnaryExpr>(EK::Neg, p, parse_unary(false));
    } else if (is_op("+")) {
      next();
      node = std::make_unique<UnaryExpr>(EK::Pos, p, parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    DepthGuard g(*this);
    const Token& tk = cur();
    const Pos p = pos();
    switch (tk.type) {
      case Tok::Name: {
        std::string n = tk.text;
        next();
        if (n == "true" || n == "True") return std::make_unique<ConstExpr>(p, Value(true));
        if (n == "false" || n == "False") return std::make_unique<ConstExpr>(p, Value(false));
        if (n == "none" || n == "None") return std::make_unique<ConstExpr>(p, Value::none());
        return std::make_unique<NameExpr>(p, std::move(n));
      }
      case Tok::String: {
        std::string buf = tk.text;
        next();
        while (cur().type == Tok::String) {
          buf += cur().text;
          next();
        }
        return std::make_unique<ConstExpr>(p, Value(std::move(buf)));
      }
      case Tok::Int: {
        const int64_t v = tk.ival;
        next();
        return std::make_unique<ConstExpr>(p, Value(v));
      }
      case Tok::Float: {
        const double v = tk.fval;
        next();
        return std::make_unique<ConstExpr>(p, Value(v));
      }
      case Tok::Op:
        if (tk.text == "(") {
          next();
          ExprPtr e = parse_tuple(false, true, {}, true);
          expect_op(")");
          return e;
        }
        if (tk.text == "[") {
          next();
          auto l = std::make_unique<ListExpr>(EK::List, p);
          while (!is_op("]")) {
            if (!l->items.empty()) expect_op(",");
            if (is_op("]")) break;
            l->items.push_back(parse_expression(true));
          }
          expect_op("]");
          return l;
        }
        if (tk.text == "{") {
          next();
          auto d = std::make_unique<DictExpr>(p);
          while (!is_op("}")) {
            if (!d->items.empty()) expect_op(",");
            if (is_op("}")) break;
            ExprPtr k = parse_expression(true);
            expect_op(":");
            ExprPtr v = parse_expression(true);
            d->items.emplace_back(std::move(k), std::move(v));
          }
          expect_op("}");
          return d;
        }
        break;
      default: break;
    }
    fail("unexpected '" + describe(tk) + "'");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    DepthGuard g(*this);
    const Pos p = pos();
    if (skip_op(".")) {
      const Token& at = cur();
      if (at.type == Tok::Name) {
        std::string a = at.text;
        next();
        return std::make_unique<GetAttrExpr>(p, std::move(node), std::move(a));
      }
      if (at.type != Tok::Int) fail("expected name or number");
      auto idx = std::make_unique<ConstExpr>(pos(), Value(at.ival));
      next();
      return std::make_unique<GetItemExpr>(p, std::move(node), std::move(idx));
    }
    expect_op("[");
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    ExprPtr arg;
    if (args.size() == 1) {
      arg = std::move(args[0]);
    } else {
      auto t = std::make_unique<ListExpr>(EK::Tuple, p);
      t->items = std::move(args);
      arg = std::move(t);
    }
    return std::make_unique<GetItemExpr>(p, std::move(node), std::move(arg));
  }

  ExprPtr parse_subscribed() {
    const Pos p = pos();
    ExprPtr start;
    if (is_op(":")) {
      next();
    } else {
      ExprPtr e = parse_expression(true);
      if (!is_op(":")) return e;
      next();
      start = std::move(e);
    }
    auto s = std::make_unique<SliceExpr>(p);
    s->start = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) s->stop = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) s->step = parse_expression(true);
    }
    return s;
  }

  void parse_call_args(ArgsNode& a) {
    const Pos p = pos();
    expect_op("(");
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail_at(p, "invalid syntax for function call expression");
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        ensure(!a.dyn_args && !a.dyn_kwargs);
        next();
        a.dyn_args = parse_expression(true);
      } else if (is_op("**")) {
        ensure(!a.dyn_kwargs);
        next();
        a.dyn_kwargs = parse_expression(true);
      } else if (cur().type == Tok::Name && look().type == Tok::Op && look().text == "=") {
        ensure(!a.dyn_kwargs);
        std::string key = cur().text;
        next();
        next();
        a.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!a.dyn_args && !a.dyn_kwargs && a.kwargs.empty());
        a.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    DepthGuard g(*this);
    auto c = std::make_unique<CallExpr>(pos(), std::move(node));
    parse_call_args(c->args);
    return c;
  }

  std::string dotted_name() {
    std::string name = expect_any_name();
    while (is_op(".")) {
      next();
      name += "." + expect_any_name();
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      DepthGuard g(*this);
      if (!start_inline) next();
      start_inline = false;
      const Pos p = pos();
      std::string name = dotted_name();
      auto f = std::make_unique<FilterExpr>(p, std::move(node), std::move(name));
      if (is_op("(")) parse_call_args(f->args);
      node = std::move(f);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    DepthGuard g(*this);
    next();  // 'is'
    bool negated = false;
    if (is_name("not")) {
      next();
      negated = true;
    }
    const Pos p = pos();
    std::string name = dotted_name();
    auto t = std::make_unique<TestExpr>(p, std::move(node), std::move(name));
    const Token& c = cur();
    if (is_op("(")) {
      parse_call_args(t->args);
    } else if ((c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Int || c.type == Tok::Float ||
                (c.type == Tok::Op && (c.text == "(" || c.text == "[" || c.text == "{"))) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      ExprPtr arg = parse_postfix(parse_primary());
      t->args.args.push_back(std::move(arg));
    }
    if (negated) return std::make_unique<UnaryExpr>(EK::Not, p, std::move(t));
    return t;
  }

  // ---- jinja2's compile-time check: unknown filters and tests fail before rendering, except in "soft" frames
  // (an {% if %} test or body, an inline if) where the error waits until the filter is actually called. ----
  void check_args(const ArgsNode& a, bool soft) const {
    for (auto& x : a.args) check_expr(x.get(), soft);
    for (auto& [k, x] : a.kwargs) check_expr(x.get(), soft);
    check_expr(a.dyn_args.get(), soft);
    check_expr(a.dyn_kwargs.get(), soft);
  }
  void check_expr(const Expr* e, bool soft) const {
    if (!e) return;
    switch (e->kind) {
      case EK::GetAttr: return check_expr(static_cast<const GetAttrExpr*>(e)->obj.get(), soft);
      case EK::GetItem: {
        auto* g = static_cast<const GetItemExpr*>(e);
        check_expr(g->obj.get(), soft);
        return check_expr(g->index.get(), soft);
      }
      case EK::Slice: {
        auto* s = static_cast<const SliceExpr*>(e);
        check_expr(s->start.get(), soft);
        check_expr(s->stop.get(), soft);
        return check_expr(s->step.get(), soft);
      }
      case EK::Call: {
        auto* c = static_cast<const CallExpr*>(e);
        check_expr(c->callee.get(), soft);
        return check_args(c->args, soft);
      }
      case EK::Filter: {
        auto* f = static_cast<const FilterExpr*>(e);
        if (!soft && !find_filter(f->name)) fail_at(f->pos, "No filter named '" + f->name + "'.");
        check_expr(f->node.get(), soft);
        return check_args(f->args, soft);
      }
      case EK::Test: {
        auto* t = static_cast<const TestExpr*>(e);
        if (!soft && !find_test(t->name)) fail_at(t->pos, "No test named '" + t->name + "'.");
        check_expr(t->node.get(), soft);
        return check_args(t->args, soft);
      }
      case EK::Neg:
      case EK::Pos:
      case EK::Not: return check_expr(static_cast<const UnaryExpr*>(e)->operand.get(), soft);
      case EK::Binary:
      case EK::And:
      case EK::Or: {
        auto* b = static_cast<const BinaryExpr*>(e);
        check_expr(b->left.get(), soft);
        return check_expr(b->right.get(), soft);
      }
      case EK::Concat:
        for (auto& x : static_cast<const ConcatExpr*>(e)->parts) check_expr(x.get(), soft);
        return;
      case EK::Compare: {
        auto* c = static_cast<const CompareExpr*>(e);
        check_expr(c->first.get(), soft);
        for (auto& [op, x] : c->ops) check_expr(x.get(), soft);
        return;
      }
      case EK::Cond: {
        auto* c = static_cast<const CondExpr*>(e);
        check_expr(c->test.get(), true);
        check_expr(c->then.get(), true);
        return check_expr(c->otherwise.get(), true);
      }
      case EK::List:
      case EK::Tuple:
        for (auto& x : static_cast<const ListExpr*>(e)->items) check_expr(x.get(), soft);
        return;
      case EK::Dict:
        for (auto& [k, v] : static_cast<const DictExpr*>(e)->items) {
          check_expr(k.get(), soft);
          check_expr(v.get(), soft);
        }
        return;
      default: return;
    }
  }
  void check_body(const Body& body, bool soft) const {
    for (auto& st : body) {
      switch (st->kind) {
        case SK::Print: check_expr(static_cast<const PrintStmt*>(st.get())->expr.get(), soft); break;
        case SK::If: {
          auto* s = static_cast<const IfStmt*>(st.get());
          for (auto& [t, b] : s->branches) {
            check_expr(t.get(), true);
            check_body(b, true);
          }
          check_body(s->else_body, true);
          break;
        }
        case SK::For: {
          auto* s = static_cast<const ForStmt*>(st.get());
          check_expr(s->iter.get(), soft);
          check_expr(s->filter.get(), false);
          check_body(s->body, false);
          check_body(s->else_body, false);
          break;
        }
        case SK::Set: check_expr(static_cast<const SetStmt*>(st.get())->value.get(), soft); break;
        case SK::SetBlock: {
          auto* s = static_cast<const SetBlockStmt*>(st.get());
          check_body(s->body, false);
          check_expr(s->filter.get(), false);
          break;
        }
        case SK::Macro: {
          auto* s = static_cast<const MacroStmt*>(st.get());
          for (auto& prm : s->params) check_expr(prm.default_value.get(), false);
          check_body(s->body, false);
          break;
        }
        case SK::CallBlock: {
          auto* s = static_cast<const CallBlockStmt*>(st.get());
          for (auto& prm : s->caller->params) check_expr(prm.default_value.get(), false);
          check_body(s->caller->body, false);
          check_expr(s->call.get(), soft);
          break;
        }
        case SK::FilterBlock: {
          auto* s = static_cast<const FilterBlockStmt*>(st.get());
          check_body(s->body, false);
          check_expr(s->filter.get(), false);
          break;
        }
        case SK::With: {
          auto* s = static_cast<const WithStmt*>(st.get());
          for (auto& [t, v] : s->assigns) check_expr(v.get(), soft);
          check_body(s->body, false);
          break;
        }
        case SK::Scope: check_body(static_cast<const ScopeStmt*>(st.get())->body, false); break;
        default: break;
      }
    }
  }

  // ---- constant folding: which expressions jinja2's optimizer may evaluate at compile time ----
  static bool mark_args(const ArgsNode& a) {
    bool k = !a.dyn_args && !a.dyn_kwargs;
    for (auto& x : a.args) k = mark(x.get()) && k;
    for (auto& [n, x] : a.kwargs) k = mark(x.get()) && k;
    if (a.dyn_args) mark(a.dyn_args.get());
    if (a.dyn_kwargs) mark(a.dyn_kwargs.get());
    return k;
  }
  // Marks every node; returns whether e is constant (null counts as constant).
  static bool mark(Expr* e) {
    if (!e) return true;
    bool k = false;
    switch (e->kind) {
      case EK::Const: k = true; break;
      case EK::Name: k = false; break;
      case EK::Call: {
        auto* c = static_cast<CallExpr*>(e);
        mark(c->callee.get());
        mark_args(c->args);
        k = false;
        break;
      }
      case EK::GetAttr: k = mark(static_cast<GetAttrExpr*>(e)->obj.get()); break;
      case EK::GetItem: {
        auto* g = static_cast<GetItemExpr*>(e);
        const bool a = mark(g->obj.get());
        k = mark(g->index.get()) && a;
        break;
      }
      case EK::Slice: {
        auto* s = static_cast<SliceExpr*>(e);
        const bool a = mark(s->start.get()), b = mark(s->stop.get());
        k = mark(s->step.get()) && a && b;
        break;
      }
      case EK::Filter: {
        auto* f = static_cast<FilterExpr*>(e);
        static const char* const kContextFilters[] = {"map", "select", "reject", "selectattr", "rejectattr", "random"};
        bool pure = find_filter(f->name) != nullptr;
        for (const char* n : kContextFilters)
          if (f->name == n) pure = false;
        const bool a = f->node != nullptr && mark(f->node.get());
        k = mark_args(f->args) && a && pure;
        break;
      }
      case EK::Test: {
        auto* t = static_cast<TestExpr*>(e);
        const bool a = mark(t->node.get());
        k = mark_args(t->args) && a && find_test(t->name) != nullptr;
        break;
      }
      case EK::Neg:
      case EK::Pos:
      case EK::Not: k = mark(static_cast<UnaryExpr*>(e)->operand.get()); break;
      case EK::Binary: {
        auto* b = static_cast<BinaryExpr*>(e);
        const bool a = mark(b->left.get());
        k = mark(b->right.get()) && a;
        break;
      }
      case EK::And:
      case EK::Or: {  // short-circuit: a constant left side may decide alone
        auto* b = static_cast<BinaryExpr*>(e);
        k = mark(b->left.get());
        mark(b->right.get());
        break;
      }
      case EK::Concat:
        k = true;
        for (auto& x : static_cast<ConcatExpr*>(e)->parts) k = mark(x.get()) && k;
        break;
      case EK::Compare: {
        auto* c = static_cast<CompareExpr*>(e);
        k = mark(c->first.get());
        for (auto& [op, x] : c->ops) k = mark(x.get()) && k;
        break;
      }
      case EK::Cond: {  // only the branch the constant test picks has to be constant
        auto* c = static_cast<CondExpr*>(e);
        const bool a = mark(c->test.get()), b = mark(c->then.get());
        const bool o = c->otherwise && mark(c->otherwise.get());
        k = a && (b || o);
        break;
      }
      case EK::List:
      case EK::Tuple:
        k = true;
        for (auto& x : static_cast<ListExpr*>(e)->items) k = mark(x.get()) && k;
        break;
      case EK::Dict:
        k = true;
        for (auto& [a, b] : static_cast<DictExpr*>(e)->items) {
          k = mark(a.get()) && k;
          k = mark(b.get()) && k;
        }
        break;
    }
    e->konst = k;
    return k;
  }
  static void mark_body(Body& body) {
    for (auto& st : body) {
      switch (st->kind) {
        case SK::Print: mark(static_cast<PrintStmt*>(st.get())->expr.get()); break;
        case SK::If: {
          auto* s = static_cast<IfStmt*>(st.get());
          for (auto& [t, b] : s->branches) {
            mark(t.get());
            mark_body(b);
          }
          mark_body(s->else_body);
          break;
        }
        case SK::For: {
          auto* s = static_cast<ForStmt*>(st.get());
          mark(s->iter.get());
          mark(s->filter.get());
          mark_body(s->body);
          mark_body(s->else_body);
          break;
        }
        case SK::Set: mark(static_cast<SetStmt*>(st.get())->value.get()); break;
        case SK::SetBlock: {
          auto* s = static_cast<SetBlockStmt*>(st.get());
          mark(s->filter.get());
          mark_body(s->body);
          break;
        }
        case SK::Macro: {
          auto* s = static_cast<MacroStmt*>(st.get());
          for (auto& prm : s->params) mark(prm.default_value.get());
          mark_body(s->body);
          break;
        }
        case SK::CallBlock: {
          auto* s = static_cast<CallBlockStmt*>(st.get());
          for (auto& prm : s->caller->params) mark(prm.default_value.get());
          mark_body(s->caller->body);
          mark(s->call.get());
          break;
        }
        case SK::FilterBlock: {
          auto* s = static_cast<FilterBlockStmt*>(st.get());
          mark(s->filter.get());
          mark_body(s->body);
          break;
        }
        case SK::With: {
          auto* s = static_cast<WithStmt*>(st.get());
          for (auto& [t, v] : s->assigns) mark(v.get());
          mark_body(s->body);
          break;
        }
        case SK::Scope: mark_body(static_cast<ScopeStmt*>(st.get())->body); break;
        default: break;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  std::string name_;
  int depth_ = 0;
  bool in_loop_ = false;
};

}  // namespace

std::unique_ptr<Program> parse_template(std::string_view source, const std::string& name) {
  return Parser(tokenize(source, name), name).run();
}

}  // namespace latent::jinja
