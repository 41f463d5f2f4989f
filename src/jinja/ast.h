// Syntax tree of a parsed template (jinja2's nodes, reduced to what chat templates use).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace latent::jinja {

struct Pos {
  int line = 0;
  int col = 0;
};

// ---- expressions ----
enum class EK : uint8_t {
  Const,
  Name,
  GetAttr,
  GetItem,
  Slice,
  Call,
  Filter,
  Test,
  Neg,
  Pos,
  Not,
  Binary,
  And,
  Or,
  Concat,
  Compare,
  Cond,
  List,
  Tuple,
  Dict,
};

struct Expr {
  explicit Expr(EK k, Pos p) : kind(k), pos(p) {}
  virtual ~Expr() = default;
  EK kind;
  Pos pos;
  bool konst = false;  // jinja2's optimizer may fold it at compile time (set by the parser; see Interpreter::eval)
};
using ExprPtr = std::unique_ptr<Expr>;

struct ArgsNode {
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args;    // *expr
  ExprPtr dyn_kwargs;  // **expr
};

struct ConstExpr : Expr {
  ConstExpr(Pos p, Value v) : Expr(EK::Const, p), value(std::move(v)) {}
  Value value;
};
struct NameExpr : Expr {
  NameExpr(Pos p, std::string n) : Expr(EK::Name, p), name(std::move(n)) {}
  std::string name;
};
struct GetAttrExpr : Expr {
  GetAttrExpr(Pos p, ExprPtr o, std::string a) : Expr(EK::GetAttr, p), obj(std::move(o)), attr(std::move(a)) {}
  ExprPtr obj;
  std::string attr;
};
struct GetItemExpr : Expr {
  GetItemExpr(Pos p, ExprPtr o, ExprPtr i) : Expr(EK::GetItem, p), obj(std::move(o)), index(std::move(i)) {}
  ExprPtr obj;
  ExprPtr index;  // may be a SliceExpr
};
struct SliceExpr : Expr {
  explicit SliceExpr(Pos p) : Expr(EK::Slice, p) {}
  ExprPtr start, stop, step;  // each may be null
};
struct CallExpr : Expr {
  CallExpr(Pos p, ExprPtr c) : Expr(EK::Call, p), callee(std::move(c)) {}
  ExprPtr callee;
  ArgsNode args;
};
struct FilterExpr : Expr {
  FilterExpr(Pos p, ExprPtr n, std::string nm) : Expr(EK::Filter, p), node(std::move(n)), name(std::move(nm)) {}
  ExprPtr node;  // null inside {% filter %} / {% set x | f %}: the captured block text
  std::string name;
  ArgsNode args;
};
struct TestExpr : Expr {
  TestExpr(Pos p, ExprPtr n, std::string nm) : Expr(EK::Test, p), node(std::move(n)), name(std::move(nm)) {}
  ExprPtr node;
  std::string name;
  ArgsNode args;
};
struct UnaryExpr : Expr {  // Neg, Pos, Not
  UnaryExpr(EK k, Pos p, ExprPtr o) : Expr(k, p), operand(std::move(o)) {}
  ExprPtr operand;
};
enum class BinOp : uint8_t { Add, Sub, Mul, Div, FloorDiv, Mod, Pow };
struct BinaryExpr : Expr {  // Binary (op), And, Or
  BinaryExpr(EK k, Pos p, BinOp o, ExprPtr l, ExprPtr r) : Expr(k, p), op(o), left(std::move(l)), right(std::move(r)) {}
  BinOp op;
  ExprPtr left, right;
};
struct ConcatExpr : Expr {
  explicit ConcatExpr(Pos p) : Expr(EK::Concat, p) {}
  std::vector<ExprPtr> parts;
};
enum class CmpOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };
struct CompareExpr : Expr {
  CompareExpr(Pos p, ExprPtr f) : Expr(EK::Compare, p), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<CmpOp, ExprPtr>> ops;
};
struct CondExpr : Expr {
  explicit CondExpr(Pos p) : Expr(EK::Cond, p) {}
  ExprPtr test, then, otherwise;  // otherwise may be null
};
struct ListExpr : Expr {  // List or Tuple
  ListExpr(EK k, Pos p) : Expr(k, p) {}
  std::vector<ExprPtr> items;
};
struct DictExpr : Expr {
  explicit DictExpr(Pos p) : Expr(EK::Dict, p) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

// ---- assignment targets ----
struct Target {
  enum class Kind : uint8_t { Name, Tuple, NsAttr } kind = Kind::Name;
  std::string name;           // Name, NsAttr (the namespace variable)
  std::string attr;           // NsAttr
  std::vector<Target> items;  // Tuple
  Pos pos;
};

// ---- statements ----
enum class SK : uint8_t {
  Data,
  Print,
  If,
  For,
  Set,
  SetBlock,
  Macro,
  CallBlock,
  FilterBlock,
  With,
  Break,
  Continue,
  Scope
};

struct Stmt {
  Stmt(SK k, Pos p) : kind(k), pos(p) {}
  virtual ~Stmt() = default;
  SK kind;
  Pos pos;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct DataStmt : Stmt {
  DataStmt(Pos p, std::string t) : Stmt(SK::Data, p), text(std::move(t)) {}
  std::string text;
};
struct PrintStmt : Stmt {
  PrintStmt(Pos p, ExprPtr e) : Stmt(SK::Print, p), expr(std::move(e)) {}
  ExprPtr expr;
};
struct IfStmt : Stmt {
  explicit IfStmt(Pos p) : Stmt(SK::If, p) {}
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body else_body;
};
struct ForStmt : Stmt {
  explicit ForStmt(Pos p) : Stmt(SK::For, p) {}
  Target target;
  ExprPtr iter;
  ExprPtr filter;  // may be null
  Body body, else_body;
  bool recursive = false;
};
struct SetStmt : Stmt {
  explicit SetStmt(Pos p) : Stmt(SK::Set, p) {}
  Target target;
  ExprPtr value;
};
struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(Pos p) : Stmt(SK::SetBlock, p) {}
  Target target;
  Body body;
  ExprPtr filter;  // FilterExpr chain ending in a null node, or null
};
struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};
struct MacroStmt : Stmt {  // also the body of {% call %} (name "caller")
  explicit MacroStmt(Pos p) : Stmt(SK::Macro, p) {}
  std::string name;
  std::vector<MacroParam> params;
  Body body;
  bool catch_varargs = false, catch_kwargs = false, uses_caller = false;
};
struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(Pos p) : Stmt(SK::CallBlock, p) {}
  std::unique_ptr<MacroStmt> caller;
  ExprPtr call;  // a CallExpr
};
struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(Pos p) : Stmt(SK::FilterBlock, p) {}
  ExprPtr filter;
  Body body;
};
struct WithStmt : Stmt {
  explicit WithStmt(Pos p) : Stmt(SK::With, p) {}
  std::vector<std::pair<Target, ExprPtr>> assigns;
  Body body;
};
struct ScopeStmt : Stmt {  // {% generation %} (transformers' assistant tracker): renders its body
  explicit ScopeStmt(Pos p) : Stmt(SK::Scope, p) {}
  Body body;
};

struct Program {
  std::string name;
  Body body;
};

}  // namespace latent::jinja
