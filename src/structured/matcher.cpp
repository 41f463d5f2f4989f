#include "structured/matcher.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace latent::structured {

TokenVocab::TokenVocab(std::vector<std::string> bytes, std::vector<int32_t> stop_ids)
    : bytes_(std::move(bytes)), stop_ids_(std::move(stop_ids)), is_stop_(bytes_.size(), false) {
  for (int32_t s : stop_ids_)
    if (s >= 0 && static_cast<size_t>(s) < bytes_.size()) is_stop_[static_cast<size_t>(s)] = true;
  std::vector<int32_t> order;
  for (size_t i = 0; i < bytes_.size(); ++i)
    if (!bytes_[i].empty() && !is_stop_[i]) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const int c = bytes_[static_cast<size_t>(a)].compare(bytes_[static_cast<size_t>(b)]);
    return c < 0 || (c == 0 && a < b);
  });
  std::vector<int32_t> path;
  std::string_view prev;
  for (int32_t id : order) {
    std::string_view s = bytes_[static_cast<size_t>(id)];
    if (s.size() > 65535) s = s.substr(0, 65535);
    size_t lcp = 0;
    while (lcp < s.size() && lcp < prev.size() && s[lcp] == prev[lcp]) ++lcp;
    while (path.size() > lcp) {
      end_[static_cast<size_t>(path.back())] = static_cast<int32_t>(byte_.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(static_cast<int32_t>(byte_.size()));
      byte_.push_back(static_cast<uint8_t>(s[d]));
      depth_.push_back(static_cast<uint16_t>(d + 1));
      end_.push_back(0);
      tok_lo_.push_back(static_cast<int32_t>(ids_.size()));
      max_depth_ = std::max<uint16_t>(max_depth_, static_cast<uint16_t>(d + 1));
    }
    ids_.push_back(id);
    prev = s;
  }
  while (!path.empty()) {
    end_[static_cast<size_t>(path.back())] = static_cast<int32_t>(byte_.size());
    path.pop_back();
  }
  tok_lo_.push_back(static_cast<int32_t>(ids_.size()));
  // Subtree class summaries, children before parents (reverse pre-order).
  const size_t N = byte_.size();
  desc_.assign(N, 0);
  std::vector<int32_t> parent(N, -1), open;
  for (size_t i = 0; i < N; ++i) {
    while (open.size() >= depth_[i]) open.pop_back();
    if (!open.empty()) parent[i] = open.back();
    open.push_back(static_cast<int32_t>(i));
  }
  for (size_t i = N; i-- > 0;)
    if (parent[i] >= 0) desc_[static_cast<size_t>(parent[i])] |= desc_[i] | (uint64_t{1} << byte_class(byte_[i]));
}

int TokenVocab::byte_class(uint8_t b) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t{};
    int next = 0;
    const int lower = next++, upper = next++, digit = next++, space = next++, nl = next++, tab = next++, ctl = next++,
              del = next++, cont = next++, lead2 = next++, lead3 = next++, lead4 = next++;
    for (int c = 0; c < 256; ++c) {
      if (c >= 'a' && c <= 'z')
        t[c] = static_cast<int8_t>(lower);
      else if (c >= 'A' && c <= 'Z')
        t[c] = static_cast<int8_t>(upper);
      else if (c >= '0' && c <= '9')
        t[c] = static_cast<int8_t>(digit);
      else if (c == ' ')
        t[c] = static_cast<int8_t>(space);
      else if (c == '\n')
        t[c] = static_cast<int8_t>(nl);
      else if (c == '\t')
        t[c] = static_cast<int8_t>(tab);
      else if (c < 0x20)
        t[c] = static_cast<int8_t>(ctl);
      else if (c == 0x7F)
        t[c] = static_cast<int8_t>(del);
      else if (c >= 0x80 && c < 0xC0)
        t[c] = static_cast<int8_t>(cont);
      else if (c >= 0xC0 && c < 0xE0)
        t[c] = static_cast<int8_t>(lead2);
      else if (c >= 0xE0 && c < 0xF0)
        t[c] = static_cast<int8_t>(lead3);
      else if (c >= 0xF0)
        t[c] = static_cast<int8_t>(lead4);
      else
        t[c] = static_cast<int8_t>(next++);  // each ASCII punctuation character on its own (32 of them)
    }
    return t;
  }();
  return table[b];
}

std::shared_ptr<const NodeMaskCache::Entry> NodeMaskCache::get(const std::string& key) const {
  std::lock_guard lk(mu_);
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : it->second;
}

void NodeMaskCache::put(const std::string& key, std::shared_ptr<const Entry> e) {
  std::lock_guard lk(mu_);
  if (map_.size() >= capacity_) map_.clear();
  map_.emplace(key, std::move(e));
}

void NodeMaskCache::clear() {
  std::lock_guard lk(mu_);
  map_.clear();
}

size_t NodeMaskCache::size() const {
  std::lock_guard lk(mu_);
  return map_.size();
}

namespace {
constexpr int32_t kBulkMin = 16;  // subtrees at least this large are tried for a bulk accept
inline void set_bit(uint64_t* m, int32_t id) { m[id >> 6] |= uint64_t{1} << (id & 63); }
inline bool get_bit(const uint64_t* m, int32_t id) { return (m[id >> 6] >> (id & 63)) & 1u; }
}  // namespace

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> g) : cg_(std::move(g)), g_(*cg_->grammar) {
  stack_nodes_ = {{-1, -1}, {-1, -1}};  // kEmpty, kMarker
  states_.emplace_back();               // state 0: dead
  flags_.push_back(0);
  loops_.push_back(0);
  walk_states_.assign(static_cast<size_t>(cg_->vocab->max_depth_) + 1, 0);
  walk_maybe_.assign(walk_states_.size(), 0);
  work_ = {stack(g_.rule_start[static_cast<size_t>(g_.root)], kEmpty)};
  out_.clear();
  uint8_t flags = 0;
  closure(work_, out_, flags);
  cur_ = intern(out_, flags);
}

int32_t Matcher::stack(int32_t node, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) | static_cast<uint32_t>(parent);
  auto [it, fresh] = stack_ids_.try_emplace(key, static_cast<int32_t>(stack_nodes_.size()));
  if (fresh) stack_nodes_.emplace_back(node, parent);
  return it->second;
}

int32_t Matcher::intern(std::vector<int32_t>& stacks, uint8_t flags) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (!stacks.empty()) flags |= kLive;
  if (!flags) return 0;
  std::string key(stacks.size() * sizeof(int32_t) + 1, '\0');
  if (!stacks.empty()) std::memcpy(key.data(), stacks.data(), stacks.size() * sizeof(int32_t));
  key.back() = static_cast<char>(flags);
  auto [it, fresh] = state_ids_.try_emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (fresh) {
    states_.emplace_back();
    states_.back().stacks = stacks;
    flags_.push_back(flags);
    loops_.push_back(0);
  }
  return it->second;
}

void Matcher::closure(std::vector<int32_t>& work, std::vector<int32_t>& out, uint8_t& flags) {
  ++seen_gen_;
  while (!work.empty()) {
    const int32_t y = work.back();
    work.pop_back();
    if (y == kEmpty) {
      flags |= kCanEnd;
      continue;
    }
    if (y == kMarker) {
      flags |= kPopped;
      continue;
    }
    if (static_cast<size_t>(y) >= seen_mark_.size()) seen_mark_.resize(static_cast<size_t>(y) * 2 + 16, 0);
    if (seen_mark_[static_cast<size_t>(y)] == seen_gen_) continue;
    seen_mark_[static_cast<size_t>(y)] = seen_gen_;
    const auto [n, p] = stack_nodes_[static_cast<size_t>(y)];
    const Grammar::Node& nd = g_.nodes[static_cast<size_t>(n)];
    if (!nd.edges.empty()) out.push_back(y);
    for (const auto& c : nd.calls) work.push_back(stack(g_.rule_start[static_cast<size_t>(c.rule)], stack(c.ret, p)));
    if (nd.final) work.push_back(p);
  }
}

int32_t Matcher::step(int32_t s, uint8_t b) {
  if (s == 0) return 0;
  {
    const int32_t* nx = states_[static_cast<size_t>(s)].next.get();
    if (nx && nx[b] >= 0) return nx[b];
  }
  std::vector<int32_t> stacks = states_[static_cast<size_t>(s)].stacks;
  std::vector<int32_t> work, out;
  for (int32_t y : stacks) {
    const auto [n, p] = stack_nodes_[static_cast<size_t>(y)];
    for (const auto& e : g_.nodes[static_cast<size_t>(n)].edges)
      if (e.set.test(b)) work.push_back(stack(e.to, p));
  }
  uint8_t flags = 0;
  closure(work, out, flags);
  const int32_t t = intern(out, flags);
  State& st = states_[static_cast<size_t>(s)];
  if (!st.next) {
    st.next = std::make_unique<int32_t[]>(256);
    std::fill(st.next.get(), st.next.get() + 256, -1);
  }
  st.next[b] = t;
  return t;
}

uint64_t Matcher::loop_classes(int32_t s) {
  constexpr uint64_t kKnown = uint64_t{1} << 63;
  if (loops_[static_cast<size_t>(s)] & kKnown) return loops_[static_cast<size_t>(s)] & ~kKnown;
  uint64_t ok = ~uint64_t{0} & ~kKnown, seen = 0;
  for (int b = 0; b < 256; ++b) {
    const uint64_t bit = uint64_t{1} << TokenVocab::byte_class(static_cast<uint8_t>(b));
    seen |= bit;
    if ((ok & bit) && step(s, static_cast<uint8_t>(b)) != s) ok &= ~bit;
  }
  ok &= seen;
  loops_[static_cast<size_t>(s)] = ok | kKnown;
  return ok;
}

int32_t Matcher::run(int32_t s, std::string_view bytes) {
  for (unsigned char c : bytes) {
    s = step(s, c);
    if (s == 0) return 0;
  }
  return s;
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (stopped_) return false;
  const int32_t t = run(cur_, bytes);
  if (t == 0) return false;
  cur_ = t;
  return true;
}

bool Matcher::viable(std::string_view bytes) {
  if (stopped_) return false;
  return run(cur_, bytes) != 0;
}

bool Matcher::accept_token(int32_t id) {
  if (stopped_ || id < 0 || static_cast<size_t>(id) >= cg_->vocab->size()) return false;
  if (cg_->vocab->is_stop(id)) {
    if (!can_end()) return false;
    stopped_ = true;
    return true;
  }
  const std::string& b = cg_->vocab->bytes(id);
  if (b.empty()) return false;
  return accept_bytes(b);
}

bool Matcher::can_end() const { return !stopped_ && (flags_[static_cast<size_t>(cur_)] & kCanEnd); }

bool Matcher::is_complete() const { return stopped_ || flags_[static_cast<size_t>(cur_)] == kCanEnd; }

void Matcher::walk(int32_t start, uint64_t* mask) {
  const TokenVocab& v = *cg_->vocab;
  const int32_t N = static_cast<int32_t>(v.trie_nodes());
  walk_states_[0] = start;
  int32_t i = 0;
  while (i < N) {
    const size_t d = v.depth_[static_cast<size_t>(i)];
    const int32_t p = walk_states_[d - 1];
    const uint8_t b = v.byte_[static_cast<size_t>(i)];
    const int32_t* nx = states_[static_cast<size_t>(p)].next.get();
    const int32_t t = nx && nx[b] >= 0 ? nx[b] : step(p, b);
    const uint8_t fl = flags_[static_cast<size_t>(t)];
    if (!fl) {
      i = v.end_[static_cast<size_t>(i)];
      continue;
    }
    if ((fl & kLive) && v.end_[static_cast<size_t>(i)] - i > kBulkMin &&
        (v.desc_[static_cast<size_t>(i)] & ~loop_classes(t)) == 0) {
      // Every byte below keeps the state at t (live): the whole subtree is allowed.
      for (int32_t k = v.tok_lo_[static_cast<size_t>(i)];
           k < v.tok_lo_[static_cast<size_t>(v.end_[static_cast<size_t>(i)])]; ++k)
        set_bit(mask, v.ids_[static_cast<size_t>(k)]);
      i = v.end_[static_cast<size_t>(i)];
      continue;
    }
    for (int32_t k = v.tok_lo_[static_cast<size_t>(i)]; k < v.tok_lo_[static_cast<size_t>(i) + 1]; ++k)
      set_bit(mask, v.ids_[static_cast<size_t>(k)]);
    if (fl & kLive) {
      walk_states_[d] = t;
      ++i;
    } else {
      i = v.end_[static_cast<size_t>(i)];
    }
  }
}

// The sub-grammar reachable from `node` (byte edges, calls into callee rules and the return points), numbered in
// discovery order: equal strings mean equal behaviour from that node whatever the callers are.
const std::string& Matcher::node_key(int32_t node) {
  auto it = node_keys_.find(node);
  if (it != node_keys_.end()) return it->second;
  std::unordered_map<int32_t, int32_t> local;
  std::vector<int32_t> order{node};
  local.emplace(node, 0);
  std::string key;
  auto id = [&](int32_t n) {
    auto [jt, fresh] = local.try_emplace(n, static_cast<int32_t>(order.size()));
    if (fresh) order.push_back(n);
    return jt->second;
  };
  auto put = [&](uint64_t x) { key.append(reinterpret_cast<const char*>(&x), sizeof x); };
  constexpr size_t kMaxShared = 512;  // larger sub-grammars are keyed by (grammar, node): no sharing, bounded keys
  for (size_t i = 0; i < order.size(); ++i) {
    if (order.size() > kMaxShared) {
      key = "g";
      put(g_.uid);
      put(static_cast<uint64_t>(node));
      break;
    }
    const Grammar::Node& nd = g_.nodes[static_cast<size_t>(order[i])];
    put(nd.final ? 1 : 0);
    put(nd.edges.size() | (nd.calls.size() << 32));
    for (const auto& e : nd.edges) {
      for (uint64_t w : e.set.w) put(w);
      put(static_cast<uint64_t>(id(e.to)));
    }
    for (const auto& c : nd.calls) {
      put(static_cast<uint64_t>(id(g_.rule_start[static_cast<size_t>(c.rule)])));
      put(static_cast<uint64_t>(id(c.ret)));
    }
  }
  return node_keys_.emplace(node, std::move(key)).first->second;
}

std::shared_ptr<const NodeMaskCache::Entry> Matcher::node_entry(int32_t node) {
  if (auto it = entries_.find(node); it != entries_.end()) return it->second;
  const std::string& key = node_key(node);
  if (auto e = cg_->vocab->cache().get(key)) return entries_[node] = e;
  const TokenVocab& v = *cg_->vocab;
  auto e = std::make_shared<NodeMaskCache::Entry>();
  e->accepted.assign(v.mask_words(), 0);
  std::vector<int32_t> s0{stack(node, kMarker)};
  walk_states_[0] = intern(s0, kLive);
  walk_maybe_[0] = 0;
  const int32_t N = static_cast<int32_t>(v.trie_nodes());
  const size_t limit = std::max<size_t>(v.size() / 16, 256);
  bool overflow = false;
  auto add_uncertain = [&](int32_t lo, int32_t hi) {
    if (overflow) return;
    for (int32_t k = lo; k < hi; ++k) e->uncertain.push_back(v.ids_[static_cast<size_t>(k)]);
    if (e->uncertain.size() > limit) overflow = true;
  };
  int32_t i = 0;
  while (i < N) {
    const size_t d = v.depth_[static_cast<size_t>(i)];
    const int32_t p = walk_states_[d - 1];
    const uint8_t m = walk_maybe_[d - 1];
    const int32_t t = step(p, v.byte_[static_cast<size_t>(i)]);
    const uint8_t fl = flags_[static_cast<size_t>(t)];
    const int32_t lo = v.tok_lo_[static_cast<size_t>(i)], own_hi = v.tok_lo_[static_cast<size_t>(i) + 1];
    const int32_t sub_hi = v.tok_lo_[static_cast<size_t>(v.end_[static_cast<size_t>(i)])];
    if (!fl) {
      if (m) add_uncertain(lo, sub_hi);
      i = v.end_[static_cast<size_t>(i)];
      continue;
    }
    if ((fl & kLive) && v.end_[static_cast<size_t>(i)] - i > kBulkMin &&
        (v.desc_[static_cast<size_t>(i)] & ~loop_classes(t)) == 0) {
      // Every byte below keeps the state at t (live, no further pop): the whole subtree is accepted.
      for (int32_t k = lo; k < sub_hi; ++k) set_bit(e->accepted.data(), v.ids_[static_cast<size_t>(k)]);
      i = v.end_[static_cast<size_t>(i)];
      continue;
    }
    if (fl & (kLive | kPopped)) {
      for (int32_t k = lo; k < own_hi; ++k) set_bit(e->accepted.data(), v.ids_[static_cast<size_t>(k)]);
    } else if (m) {
      add_uncertain(lo, own_hi);
    }
    const uint8_t mm = m | ((fl & kPopped) ? 1 : 0);
    if (fl & kLive) {
      walk_states_[d] = t;
      walk_maybe_[d] = mm;
      ++i;
    } else {
      if (mm) add_uncertain(own_hi, sub_hi);
      i = v.end_[static_cast<size_t>(i)];
    }
  }
  if (overflow) {
    e->full_walk = true;
    e->uncertain.clear();
    e->uncertain.shrink_to_fit();
  }
  cg_->vocab->cache().put(key, e);
  entries_[node] = e;
  return e;
}

void Matcher::compute_mask(int32_t s, uint64_t* mask) {
  const TokenVocab& v = *cg_->vocab;
  const size_t W = v.mask_words();
  std::fill(mask, mask + W, 0);
  if (s == 0) return;
  const std::vector<int32_t> stacks = states_[static_cast<size_t>(s)].stacks;
  bool full = false;
  std::vector<std::pair<std::shared_ptr<const NodeMaskCache::Entry>, bool>> entries;  // (entry, needs callers)
  for (int32_t y : stacks) {
    const auto [n, p] = stack_nodes_[static_cast<size_t>(y)];
    auto e = node_entry(n);
    // In the root rule nothing follows its end: a token that runs past it is rejected, so the accepted set is the
    // stack's whole mask.
    const bool callers = p != kEmpty;
    if (callers && e->full_walk) {
      full = true;
      break;
    }
    entries.emplace_back(std::move(e), callers);
  }
  if (full) {
    ++full_walks_;
    walk(s, mask);
  } else {
    for (const auto& [e, callers] : entries)
      for (size_t w = 0; w < W; ++w) mask[w] |= e->accepted[w];
    for (const auto& [e, callers] : entries)
      if (callers)
        for (int32_t id : e->uncertain)
          if (!get_bit(mask, id) && run(s, v.bytes(id)) != 0) set_bit(mask, id);
  }
  if (flags_[static_cast<size_t>(s)] & kCanEnd)
    for (int32_t id : v.stop_ids())
      if (id >= 0 && static_cast<size_t>(id) < v.size()) set_bit(mask, id);
}

void Matcher::fill_mask(uint64_t* mask) {
  const size_t W = cg_->vocab->mask_words();
  if (stopped_) {
    std::fill(mask, mask + W, 0);
    return;
  }
  auto it = mask_cache_.find(cur_);
  if (it == mask_cache_.end()) {
    if (mask_cache_.size() >= 64) mask_cache_.clear();
    std::vector<uint64_t> m(W);
    compute_mask(cur_, m.data());
    it = mask_cache_.emplace(cur_, std::move(m)).first;
  }
  std::copy(it->second.begin(), it->second.end(), mask);
}

}  // namespace latent::structured
