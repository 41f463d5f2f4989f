// Grammars for constrained decoding: a context-free grammar over bytes.
//
// A GrammarBuilder collects rules whose bodies are expressions (byte classes, sequences, alternatives, bounded or
// unbounded repetition, references to rules). compile() lowers every rule to an epsilon-free NFA over bytes whose
// edges either consume one byte of a class or call another rule (a recursive transition network), removes the
// parts that can never complete, and rejects left recursion (which a top-down matcher cannot run) and rules that
// match nothing. The compilers (json_schema.h, regex.h, gbnf.h, tool grammars) all produce GrammarBuilders; the
// matcher (matcher.h) runs the compiled form.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace latent::structured {

// A grammar, schema or regex the compilers cannot accept. `keyword` names the unsupported JSON Schema keyword
// when that is the reason (empty otherwise).
class GrammarError : public std::runtime_error {
 public:
  explicit GrammarError(const std::string& what, std::string keyword = {})
      : std::runtime_error(what), keyword_(std::move(keyword)) {}
  const std::string& keyword() const { return keyword_; }

 private:
  std::string keyword_;
};

struct ByteSet {
  std::array<uint64_t, 4> w{};
  bool test(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1u; }
  void set(uint8_t b) { w[b >> 6] |= uint64_t{1} << (b & 63); }
  void set_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
  }
  bool empty() const { return !(w[0] | w[1] | w[2] | w[3]); }
  ByteSet operator|(const ByteSet& o) const {
    ByteSet r;
    for (int i = 0; i < 4; ++i) r.w[i] = w[i] | o.w[i];
    return r;
  }
  ByteSet operator~() const {
    ByteSet r;
    for (int i = 0; i < 4; ++i) r.w[i] = ~w[i];
    return r;
  }
  ByteSet operator&(const ByteSet& o) const {
    ByteSet r;
    for (int i = 0; i < 4; ++i) r.w[i] = w[i] & o.w[i];
    return r;
  }
  bool operator==(const ByteSet& o) const { return w == o.w; }
  static ByteSet of(uint8_t b) {
    ByteSet s;
    s.set(b);
    return s;
  }
  static ByteSet range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.set_range(lo, hi);
    return s;
  }
};

using ExprId = int32_t;
constexpr int32_t kUnbounded = -1;

class GrammarBuilder {
 public:
  struct Expr {
    enum class Kind { Empty, Bytes, Seq, Alt, Repeat, Ref } kind = Kind::Empty;
    ByteSet set;
    std::vector<ExprId> kids;
    int32_t min = 0, max = 0;  // Repeat
    int32_t rule = -1;         // Ref
  };

  // Rules are referenced by id; declare first (for recursion), define later.
  int32_t declare(const std::string& name);
  void define(int32_t rule, ExprId body);
  int32_t rule_id(const std::string& name) const;  // -1 when absent
  const std::string& rule_name(int32_t r) const { return names_[static_cast<size_t>(r)]; }
  size_t n_rules() const { return names_.size(); }
  bool defined(int32_t r) const { return bodies_[static_cast<size_t>(r)] >= 0; }

  ExprId empty();
  ExprId bytes(const ByteSet& s);
  ExprId byte(uint8_t b) { return bytes(ByteSet::of(b)); }
  ExprId literal(std::string_view s);
  ExprId seq(std::vector<ExprId> parts);
  ExprId alt(std::vector<ExprId> options);
  ExprId repeat(ExprId e, int32_t min, int32_t max);  // max kUnbounded = no limit
  ExprId opt(ExprId e) { return repeat(e, 0, 1); }
  ExprId star(ExprId e) { return repeat(e, 0, kUnbounded); }
  ExprId plus(ExprId e) { return repeat(e, 1, kUnbounded); }
  ExprId ref(int32_t rule);
  // One UTF-8 encoded code point in [lo, hi] (well-formed sequences only, surrogates excluded).
  ExprId codepoints(uint32_t lo, uint32_t hi);
  // Any well-formed UTF-8 code point >= 0x80.
  ExprId any_non_ascii() { return codepoints(0x80, 0x10FFFF); }

  const Expr& expr(ExprId e) const { return exprs_[static_cast<size_t>(e)]; }
  ExprId body(int32_t r) const { return bodies_[static_cast<size_t>(r)]; }

 private:
  void utf8_ranges(uint32_t lo, uint32_t hi, std::vector<ExprId>& out);
  std::vector<Expr> exprs_;
  std::vector<std::string> names_;
  std::vector<ExprId> bodies_;
};

// The compiled grammar: per rule an epsilon-free NFA. Nodes are global ids.
struct Grammar {
  struct Edge {
    ByteSet set;
    int32_t to;
  };
  struct Call {
    int32_t rule;
    int32_t ret;  // node to continue at in the caller after the callee completes
  };
  struct Node {
    int32_t rule = -1;
    bool final = false;  // the rule may complete here
    std::vector<Edge> edges;
    std::vector<Call> calls;
  };
  std::vector<Node> nodes;
  std::vector<int32_t> rule_start;  // per rule
  std::vector<std::string> rule_names;
  int32_t root = 0;
  uint64_t uid = 0;  // unique per compiled grammar in this process
};

// Lowers `b` with `root` as the start rule. Throws GrammarError: undefined rule, left recursion, a rule (reachable
// from the root) that matches no string, more than `max_nodes` NFA nodes.
std::shared_ptr<const Grammar> compile(const GrammarBuilder& b, int32_t root, size_t max_nodes = 200000);

}  // namespace latent::structured
