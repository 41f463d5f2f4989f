#include "structured/grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>

namespace latent::structured {

int32_t GrammarBuilder::declare(const std::string& name) {
  const int32_t id = rule_id(name);
  if (id >= 0) return id;
  names_.push_back(name);
  bodies_.push_back(-1);
  return static_cast<int32_t>(names_.size() - 1);
}

void GrammarBuilder::define(int32_t rule, ExprId body) { bodies_[static_cast<size_t>(rule)] = body; }

int32_t GrammarBuilder::rule_id(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return static_cast<int32_t>(i);
  return -1;
}

ExprId GrammarBuilder::empty() {
  exprs_.push_back(Expr{});
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId GrammarBuilder::bytes(const ByteSet& s) {
  Expr e;
  e.kind = Expr::Kind::Bytes;
  e.set = s;
  exprs_.push_back(e);
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId GrammarBuilder::literal(std::string_view s) {
  std::vector<ExprId> parts;
  for (unsigned char c : s) parts.push_back(byte(c));
  return seq(std::move(parts));
}

ExprId GrammarBuilder::seq(std::vector<ExprId> parts) {
  if (parts.empty()) return empty();
  if (parts.size() == 1) return parts[0];
  Expr e;
  e.kind = Expr::Kind::Seq;
  e.kids = std::move(parts);
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId GrammarBuilder::alt(std::vector<ExprId> options) {
  if (options.size() == 1) return options[0];
  Expr e;
  e.kind = Expr::Kind::Alt;  // zero options: matches nothing
  e.kids = std::move(options);
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId GrammarBuilder::repeat(ExprId x, int32_t min, int32_t max) {
  if (min < 0 || (max != kUnbounded && max < min))
    throw GrammarError(fmt::format("invalid repetition {{{},{}}}", min, max));
  if (min == 1 && max == 1) return x;
  Expr e;
  e.kind = Expr::Kind::Repeat;
  e.kids = {x};
  e.min = min;
  e.max = max;
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId GrammarBuilder::ref(int32_t rule) {
  Expr e;
  e.kind = Expr::Kind::Ref;
  e.rule = rule;
  exprs_.push_back(e);
  return static_cast<ExprId>(exprs_.size() - 1);
}

namespace {

int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void utf8_encode(uint32_t cp, uint8_t* out) {
  const int n = utf8_len(cp);
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  static constexpr uint8_t kLead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  out[0] = static_cast<uint8_t>(kLead[n] | cp);
}

}  // namespace

// Byte sequences of the code points in [lo, hi], all of one encoded length, as alternatives of byte-range
// sequences.
void GrammarBuilder::utf8_ranges(uint32_t lo, uint32_t hi, std::vector<ExprId>& out) {
  const int n = utf8_len(lo);
  uint8_t a[4], b[4];
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  // Recursive split on the first differing byte.
  auto cont_bytes = [&](int from, const uint8_t* lo_b, const uint8_t* hi_b, std::vector<ExprId>& parts) {
    for (int k = from; k < n; ++k) parts.push_back(bytes(ByteSet::range(lo_b[k], hi_b[k])));
  };
  std::function<void(int, const uint8_t*, const uint8_t*, std::vector<ExprId>)> split =
      [&](int d, const uint8_t* x, const uint8_t* y, std::vector<ExprId> prefix) {
        if (d == n - 1) {
          prefix.push_back(bytes(ByteSet::range(x[d], y[d])));
          out.push_back(seq(std::move(prefix)));
          return;
        }
        if (x[d] == y[d]) {
          prefix.push_back(byte(x[d]));
          split(d + 1, x, y, std::move(prefix));
          return;
        }
        uint8_t lo_min[4], hi_max[4];
        for (int k = 0; k < 4; ++k) {
          lo_min[k] = 0x80;
          hi_max[k] = 0xBF;
        }
        bool x_tail_min = true, y_tail_max = true;
        for (int k = d + 1; k < n; ++k) {
          if (x[k] != 0x80) x_tail_min = false;
          if (y[k] != 0xBF) y_tail_max = false;
        }
        uint8_t first_full = x_tail_min ? x[d] : static_cast<uint8_t>(x[d] + 1);
        uint8_t last_full = y_tail_max ? y[d] : static_cast<uint8_t>(y[d] - 1);
        if (!x_tail_min) {
          uint8_t xmax[4];
          std::copy(x, x + 4, xmax);
          for (int k = d + 1; k < n; ++k) xmax[k] = 0xBF;
          auto p = prefix;
          p.push_back(byte(x[d]));
          split(d + 1, x, xmax, std::move(p));
        }
        if (first_full <= last_full) {
          auto p = prefix;
          p.push_back(bytes(ByteSet::range(first_full, last_full)));
          cont_bytes(d + 1, lo_min, hi_max, p);
          out.push_back(seq(std::move(p)));
        }
        if (!y_tail_max) {
          uint8_t ymin[4];
          std::copy(y, y + 4, ymin);
          for (int k = d + 1; k < n; ++k) ymin[k] = 0x80;
          auto p = prefix;
          p.push_back(byte(y[d]));
          split(d + 1, ymin, y, std::move(p));
        }
      };
  split(0, a, b, {});
}

ExprId GrammarBuilder::codepoints(uint32_t lo, uint32_t hi) {
  hi = std::min<uint32_t>(hi, 0x10FFFF);
  std::vector<ExprId> out;
  // Split at the encoded-length boundaries and around the surrogates.
  const uint32_t bounds[][2] = {{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
  for (const auto& bd : bounds) {
    const uint32_t a = std::max(lo, bd[0]), b = std::min(hi, bd[1]);
    if (a > b) continue;
    if (bd[1] == 0x7F) {
      out.push_back(bytes(ByteSet::range(static_cast<uint8_t>(a), static_cast<uint8_t>(b))));
      continue;
    }
    utf8_ranges(a, b, out);
  }
  return alt(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// Lowering

namespace {

struct TmpNode {
  std::vector<int32_t> eps;
  std::vector<Grammar::Edge> edges;
  std::vector<Grammar::Call> calls;
};

class Lowerer {
 public:
  Lowerer(const GrammarBuilder& b, size_t max_nodes) : b_(b), max_nodes_(max_nodes) {}

  int32_t node() {
    if (tmp_.size() >= max_nodes_ * 4)
      throw GrammarError(fmt::format("the grammar is too large (more than {} states)", max_nodes_));
    tmp_.emplace_back();
    return static_cast<int32_t>(tmp_.size() - 1);
  }

  // Thompson construction: returns the end node of `e` started at `from`.
  int32_t build(ExprId e, int32_t from) {
    const auto& x = b_.expr(e);
    using K = GrammarBuilder::Expr::Kind;
    switch (x.kind) {
      case K::Empty: return from;
      case K::Bytes: {
        const int32_t t = node();
        if (!x.set.empty()) tmp_[static_cast<size_t>(from)].edges.push_back({x.set, t});
        return t;
      }
      case K::Seq: {
        int32_t cur = from;
        for (ExprId k : x.kids) cur = build(k, cur);
        return cur;
      }
      case K::Alt: {
        const int32_t end = node();
        for (ExprId k : x.kids) {
          const int32_t s = node();
          tmp_[static_cast<size_t>(from)].eps.push_back(s);
          const int32_t ke = build(k, s);
          tmp_[static_cast<size_t>(ke)].eps.push_back(end);
        }
        return end;
      }
      case K::Repeat: {
        int32_t cur = from;
        for (int32_t i = 0; i < x.min; ++i) {
          const int32_t s = node();
          tmp_[static_cast<size_t>(cur)].eps.push_back(s);
          cur = build(x.kids[0], s);
        }
        if (x.max == kUnbounded) {
          const int32_t s = node();
          tmp_[static_cast<size_t>(cur)].eps.push_back(s);
          const int32_t body_start = node();
          tmp_[static_cast<size_t>(s)].eps.push_back(body_start);
          const int32_t be = build(x.kids[0], body_start);
          tmp_[static_cast<size_t>(be)].eps.push_back(s);
          return s;
        }
        const int32_t end = node();
        for (int32_t i = x.min; i < x.max; ++i) {
          tmp_[static_cast<size_t>(cur)].eps.push_back(end);
          const int32_t s = node();
          tmp_[static_cast<size_t>(cur)].eps.push_back(s);
          cur = build(x.kids[0], s);
        }
        tmp_[static_cast<size_t>(cur)].eps.push_back(end);
        return end;
      }
      case K::Ref: {
        if (x.rule < 0 || static_cast<size_t>(x.rule) >= b_.n_rules() || !b_.defined(x.rule))
          throw GrammarError(
              fmt::format("rule '{}' is used but not defined",
                          x.rule >= 0 && static_cast<size_t>(x.rule) < b_.n_rules() ? b_.rule_name(x.rule) : "?"));
        const int32_t t = node();
        tmp_[static_cast<size_t>(from)].calls.push_back({x.rule, t});
        return t;
      }
    }
    return from;
  }

  // Lowers rule r into g (global nodes); returns its start node.
  int32_t lower_rule(int32_t r, Grammar& g) {
    tmp_.clear();
    const int32_t start = node();
    const int32_t end = build(b_.body(r), start);
    // Epsilon closures.
    const size_t n = tmp_.size();
    std::vector<int32_t> gid(n, -1);
    std::vector<int32_t> order;
    auto closure = [&](int32_t s, std::vector<int32_t>& out) {
      std::vector<char> seen(n, 0);
      std::vector<int32_t> st{s};
      seen[static_cast<size_t>(s)] = 1;
      while (!st.empty()) {
        const int32_t x = st.back();
        st.pop_back();
        out.push_back(x);
        for (int32_t y : tmp_[static_cast<size_t>(x)].eps)
          if (!seen[static_cast<size_t>(y)]) {
            seen[static_cast<size_t>(y)] = 1;
            st.push_back(y);
          }
      }
    };
    std::vector<int32_t> work{start};
    gid[static_cast<size_t>(start)] = static_cast<int32_t>(g.nodes.size());
    g.nodes.emplace_back();
    std::vector<int32_t> cl;
    while (!work.empty()) {
      const int32_t t = work.back();
      work.pop_back();
      cl.clear();
      closure(t, cl);
      Grammar::Node out;
      out.rule = r;
      std::map<int32_t, ByteSet> by_target;
      std::vector<Grammar::Call> calls;
      for (int32_t x : cl) {
        if (x == end) out.final = true;
        for (const auto& e : tmp_[static_cast<size_t>(x)].edges) by_target[e.to] = by_target[e.to] | e.set;
        for (const auto& c : tmp_[static_cast<size_t>(x)].calls) calls.push_back(c);
      }
      auto target = [&](int32_t y) {
        if (gid[static_cast<size_t>(y)] < 0) {
          gid[static_cast<size_t>(y)] = static_cast<int32_t>(g.nodes.size());
          g.nodes.emplace_back();
          work.push_back(y);
          if (g.nodes.size() > max_nodes_)
            throw GrammarError(fmt::format("the grammar is too large (more than {} states)", max_nodes_));
        }
        return gid[static_cast<size_t>(y)];
      };
      for (auto& [to, set] : by_target) out.edges.push_back({set, target(to)});
      for (auto& c : calls) {
        const Grammar::Call gc{c.rule, target(c.ret)};
        if (std::find_if(out.calls.begin(), out.calls.end(), [&](const Grammar::Call& o) {
              return o.rule == gc.rule && o.ret == gc.ret;
            }) == out.calls.end())
          out.calls.push_back(gc);
      }
      g.nodes[static_cast<size_t>(gid[static_cast<size_t>(t)])] = std::move(out);
    }
    return gid[static_cast<size_t>(start)];
  }

 private:
  const GrammarBuilder& b_;
  size_t max_nodes_;
  std::vector<TmpNode> tmp_;
};

}  // namespace

std::shared_ptr<const Grammar> compile(const GrammarBuilder& b, int32_t root, size_t max_nodes) {
  if (root < 0 || static_cast<size_t>(root) >= b.n_rules() || !b.defined(root))
    throw GrammarError("the grammar has no root rule");
  auto g = std::make_shared<Grammar>();
  static std::atomic<uint64_t> next_uid{1};
  g->uid = next_uid.fetch_add(1);
  const size_t R = b.n_rules();
  g->rule_start.assign(R, -1);
  for (size_t r = 0; r < R; ++r) g->rule_names.push_back(b.rule_name(static_cast<int32_t>(r)));
  Lowerer low(b, max_nodes);
  // Lower the rules reachable from the root.
  std::vector<int32_t> todo{root};
  std::vector<char> queued(R, 0);
  queued[static_cast<size_t>(root)] = 1;
  while (!todo.empty()) {
    const int32_t r = todo.back();
    todo.pop_back();
    const size_t first = g->nodes.size();
    g->rule_start[static_cast<size_t>(r)] = low.lower_rule(r, *g);
    for (size_t i = first; i < g->nodes.size(); ++i)
      for (const auto& c : g->nodes[i].calls)
        if (!queued[static_cast<size_t>(c.rule)]) {
          queued[static_cast<size_t>(c.rule)] = 1;
          todo.push_back(c.rule);
        }
  }
  g->root = root;
  auto& nodes = g->nodes;
  const size_t N = nodes.size();

  // Productive rules and live nodes (those that can still reach their rule's end): fixpoint.
  std::vector<char> productive(R, 0), live(N, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < N; ++i) {
      if (live[i]) continue;
      const auto& nd = nodes[i];
      bool l = nd.final;
      for (const auto& e : nd.edges) l = l || live[static_cast<size_t>(e.to)];
      for (const auto& c : nd.calls)
        l = l || (productive[static_cast<size_t>(c.rule)] && live[static_cast<size_t>(c.ret)]);
      if (l) {
        live[i] = 1;
        changed = true;
      }
    }
    for (size_t r = 0; r < R; ++r)
      if (g->rule_start[r] >= 0 && !productive[r] && live[static_cast<size_t>(g->rule_start[r])]) {
        productive[r] = 1;
        changed = true;
      }
  }
  if (!productive[static_cast<size_t>(root)]) throw GrammarError("the grammar matches no string");
  for (auto& nd : nodes) {
    std::erase_if(nd.edges, [&](const Grammar::Edge& e) { return !live[static_cast<size_t>(e.to)]; });
    std::erase_if(nd.calls, [&](const Grammar::Call& c) {
      return !productive[static_cast<size_t>(c.rule)] || !live[static_cast<size_t>(c.ret)];
    });
  }
  // Nullable rules: can complete without consuming a byte.
  std::vector<char> nullable(R, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < R; ++r) {
      if (g->rule_start[r] < 0 || nullable[r]) continue;
      std::vector<int32_t> st{g->rule_start[r]};
      std::vector<char> seen(N, 0);
      bool ok = false;
      while (!st.empty() && !ok) {
        const int32_t x = st.back();
        st.pop_back();
        if (seen[static_cast<size_t>(x)]) continue;
        seen[static_cast<size_t>(x)] = 1;
        if (nodes[static_cast<size_t>(x)].final) ok = true;
        for (const auto& c : nodes[static_cast<size_t>(x)].calls)
          if (nullable[static_cast<size_t>(c.rule)]) st.push_back(c.ret);
      }
      if (ok) {
        nullable[r] = 1;
        changed = true;
      }
    }
  }
  // Left recursion: rule r calls r2 before consuming a byte; a cycle cannot be run top-down.
  std::vector<std::vector<int32_t>> left(R);
  for (size_t r = 0; r < R; ++r) {
    if (g->rule_start[r] < 0) continue;
    std::vector<int32_t> st{g->rule_start[r]};
    std::vector<char> seen(N, 0);
    while (!st.empty()) {
      const int32_t x = st.back();
      st.pop_back();
      if (seen[static_cast<size_t>(x)]) continue;
      seen[static_cast<size_t>(x)] = 1;
      for (const auto& c : nodes[static_cast<size_t>(x)].calls) {
        left[r].push_back(c.rule);
        if (nullable[static_cast<size_t>(c.rule)]) st.push_back(c.ret);
      }
    }
  }
  std::vector<int> color(R, 0);
  std::function<void(int32_t)> dfs = [&](int32_t r) {
    color[static_cast<size_t>(r)] = 1;
    for (int32_t s : left[static_cast<size_t>(r)]) {
      if (color[static_cast<size_t>(s)] == 1)
        throw GrammarError(
            fmt::format("the grammar is left-recursive through rule '{}'", g->rule_names[static_cast<size_t>(s)]));
      if (color[static_cast<size_t>(s)] == 0) dfs(s);
    }
    color[static_cast<size_t>(r)] = 2;
  };
  for (size_t r = 0; r < R; ++r)
    if (g->rule_start[r] >= 0 && color[r] == 0) dfs(static_cast<int32_t>(r));
  return g;
}

}  // namespace latent::structured
