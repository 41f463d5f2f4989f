// Incremental grammar matcher over a byte-level vocabulary.
//
// TokenVocab: the raw bytes of every token id (byte-level BPE tokens decoded to bytes; added tokens by their
// content) in a trie laid out in pre-order, plus the stop ids (EOS), which a grammar allows only where it can end.
// Ids with no bytes (special tokens the caller excludes, padding) are never allowed.
//
// Matcher: the state of one generation is a set of stacks of NFA nodes (grammar.h): the top is the position in
// the current rule, the nodes below are where the callers continue. Stacks are hash-consed and state sets
// interned, and transitions between interned states are memoized per byte, so the matcher is a lazily built DFA
// over the pushdown configurations. The mask of a state is the union over its stacks; for a stack with top node n
// the tokens split (as in xgrammar's adaptive token mask cache) into those decided inside n's rule - accepted or
// rejected whatever the callers are - and the few that run past the end of the rule and need the callers. The
// first set is computed once per structurally distinct node and vocabulary and shared between requests
// (NodeMaskCache); the second is
// checked per state against the real stacks, and a whole-trie walk is used when it is large. Masks are cached per
// state.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "structured/grammar.h"

namespace latent::structured {

// The context-independent part of a node's mask, per vocabulary. Keyed by the node's canonical form (the
// sub-grammar reachable from it, numbered in discovery order), so that structurally equal nodes share one entry
// across rules, grammars and requests (every JSON string, number or tool-argument rule is computed once per
// process). Thread-safe; bounded (cleared when it exceeds its capacity).
class NodeMaskCache {
 public:
  struct Entry {
    std::vector<uint64_t> accepted;  // decided inside the rule: allowed whatever the callers are
    std::vector<int32_t> uncertain;  // need the callers (run past the rule's end)
    bool full_walk = false;          // `uncertain` too large: walk the trie with the real state instead
  };
  explicit NodeMaskCache(size_t capacity = 2048) : capacity_(capacity) {}
  std::shared_ptr<const Entry> get(const std::string& key) const;
  void put(const std::string& key, std::shared_ptr<const Entry> e);
  void clear();
  size_t size() const;

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  std::unordered_map<std::string, std::shared_ptr<const Entry>> map_;
};

class TokenVocab {
 public:
  // bytes[id]: the token's bytes ("" = never allowed). stop_ids: allowed only where the grammar can end.
  TokenVocab(std::vector<std::string> bytes, std::vector<int32_t> stop_ids);
  size_t size() const { return bytes_.size(); }
  size_t mask_words() const { return (bytes_.size() + 63) / 64; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  bool is_stop(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < is_stop_.size() && is_stop_[static_cast<size_t>(id)];
  }
  size_t trie_nodes() const { return byte_.size(); }
  NodeMaskCache& cache() const { return cache_; }

  // Pre-order trie (the root is implicit): node i consumes byte_[i] at depth_[i] (>= 1); its subtree ends at
  // end_[i]; the ids whose bytes end exactly here are ids_[tok_lo_[i] .. tok_lo_[i + 1]), and the ids of the
  // whole subtree ids_[tok_lo_[i] .. tok_lo_[end_[i]]).
  std::vector<uint8_t> byte_;
  std::vector<uint16_t> depth_;
  std::vector<int32_t> end_;
  std::vector<int32_t> tok_lo_;  // size trie_nodes() + 1
  std::vector<int32_t> ids_;
  uint16_t max_depth_ = 0;
  // Byte classes (letters, digits, each ASCII punctuation, UTF-8 lead / continuation ranges, ...): desc_[i] has the
  // bit of every class that occurs strictly below node i, so a walk can accept a whole subtree at once when its
  // state loops on all of them.
  static int byte_class(uint8_t b);
  std::vector<uint64_t> desc_;

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> stop_ids_;
  std::vector<bool> is_stop_;
  mutable NodeMaskCache cache_;
};

// A grammar bound to a vocabulary: what a request compiles once and every choice's Matcher shares.
struct CompiledGrammar {
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const TokenVocab> vocab;
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> g);

  // Allowed ids as bits (id i -> bit i % 64 of word i / 64), mask_words() words.
  void fill_mask(uint64_t* mask);
  // Advances by one token; false (state unchanged) when the token is not allowed. A stop id is accepted only
  // where the grammar can end, and ends the match.
  bool accept_token(int32_t id);
  // Advances by raw bytes (tests, prefilled text); false (state unchanged) when they leave the grammar.
  bool accept_bytes(std::string_view bytes);
  // The text so far is a complete match (a stop id would be allowed).
  bool can_end() const;
  // Complete and nothing may follow (or a stop id was accepted).
  bool is_complete() const;
  // Brute-force check used by tests: would `bytes` keep the current prefix viable?
  bool viable(std::string_view bytes);

  size_t states() const { return states_.size(); }
  // Masks computed by a whole-trie walk (the per-node cache could not decide them).
  size_t full_walks() const { return full_walks_; }
  const TokenVocab& vocab() const { return *cg_->vocab; }

 private:
  static constexpr int32_t kEmpty = 0, kMarker = 1;  // stack ids: the empty stack, the context marker
  static constexpr uint8_t kLive = 1, kCanEnd = 2, kPopped = 4;
  struct State {
    std::vector<int32_t> stacks;      // sorted, each with a byte-consuming top
    std::unique_ptr<int32_t[]> next;  // [256] memoized transitions, -1 unknown
  };
  int32_t stack(int32_t node, int32_t parent);
  int32_t intern(std::vector<int32_t>& stacks, uint8_t flags);
  void closure(std::vector<int32_t>& work, std::vector<int32_t>& out, uint8_t& flags);
  int32_t step(int32_t s, uint8_t b);
  uint64_t loop_classes(int32_t s);  // byte classes on which state s goes back to s
  int32_t run(int32_t s, std::string_view bytes);
  std::shared_ptr<const NodeMaskCache::Entry> node_entry(int32_t node);
  const std::string& node_key(int32_t node);
  void walk(int32_t start, uint64_t* mask);
  void compute_mask(int32_t s, uint64_t* mask);

  std::shared_ptr<const CompiledGrammar> cg_;
  const Grammar& g_;
  std::vector<std::pair<int32_t, int32_t>> stack_nodes_;
  std::unordered_map<uint64_t, int32_t> stack_ids_;
  std::vector<State> states_;
  std::vector<uint8_t> flags_;
  std::vector<uint64_t> loops_;  // per state: loop_classes, bit 63 = computed
  std::unordered_map<std::string, int32_t> state_ids_;
  std::vector<int32_t> walk_states_;
  std::vector<uint8_t> walk_maybe_;
  std::unordered_map<int32_t, std::vector<uint64_t>> mask_cache_;
  std::unordered_map<int32_t, std::string> node_keys_;
  std::unordered_map<int32_t, std::shared_ptr<const NodeMaskCache::Entry>> entries_;
  int32_t cur_ = 0;
  bool stopped_ = false;
  size_t full_walks_ = 0;
  // scratch
  std::vector<int32_t> work_, out_;
  std::vector<int32_t> seen_;
  uint32_t seen_gen_ = 0;
  std::vector<uint32_t> seen_mark_;
};

}  // namespace latent::structured
