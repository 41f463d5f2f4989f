#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace latent {

namespace {
inline uint64_t mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xFF51AFD7ED558CCDull;
  k ^= k >> 33;
  k *= 0xC4CEB9FE1A85EC53ull;
  k ^= k >> 33;
  return k;
}
}  // namespace

const BpeModel::Merge* BpeModel::find_merge(TokenId a, TokenId b) const {
  if (merges_.empty()) return nullptr;
  const uint64_t key = pair_key(a, b);
  const size_t mask = merges_.size() - 1;
  for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
    const MergeSlot& s = merges_[i];
    if (s.m.rank == UINT32_MAX) return nullptr;
    if (s.key == key) return &s.m;
  }
}

void BpeModel::add_merge(TokenId a, TokenId b, Merge m) {
  const uint64_t key = pair_key(a, b);
  const size_t mask = merges_.size() - 1;
  for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
    MergeSlot& s = merges_[i];
    if (s.m.rank == UINT32_MAX) {
      s.key = key;
      s.m = m;
      ++n_merges_;
      return;
    }
    if (s.key == key) {  // a duplicated pair keeps the later rank
      s.m = m;
      return;
    }
  }
}

std::unique_ptr<BpeModel> BpeModel::from_json(const nlohmann::json& j, const std::string& file) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  const auto& vocab = json_field(j, "vocab", "model", file);
  if (!vocab.is_object()) fail("{}: model.vocab is not an object", file);
  m->vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto& v = it.value();
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail("{}: model.vocab[{:?}] is not a token id (a non-negative integer): {}", file, it.key(), v.dump());
    const auto id = static_cast<TokenId>(v.get<int64_t>());
    m->vocab_.insert(it.key(), id);
    m->max_id_ = std::max(m->max_id_, id);
  }
  if (m->max_id_ >= static_cast<TokenId>(4 * vocab.size() + 1024))
    fail("{}: model.vocab ids are too sparse (max id {} for {} entries)", file, m->max_id_, vocab.size());
  m->id_to_token_.assign(static_cast<size_t>(m->max_id_ + 1), std::string());
  m->has_id_.assign(static_cast<size_t>(m->max_id_ + 1), 0);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto id = static_cast<size_t>(it.value().get<int64_t>());
    m->id_to_token_[id] = it.key();
    m->has_id_[id] = 1;
  }

  const char* what = "model (BPE)";
  if (j.contains("dropout") && !j["dropout"].is_null()) {
    if (!j["dropout"].is_number()) fail("{}: model.dropout is not a number", file);
    if (j["dropout"].get<double>() != 0.0)
      fail("{}: model.dropout = {} is not supported (tokenization would be random)", file, j["dropout"].dump());
  }
  if (auto u = json_opt_string(j, "unk_token", what, file); !u.empty()) {
    if (!m->vocab_.find(u)) fail("{}: model.unk_token {:?} is not in the vocab", file, u);
    m->unk_token_ = u;
  }
  m->prefix_ = json_opt_string(j, "continuing_subword_prefix", what, file);
  m->suffix_ = json_opt_string(j, "end_of_word_suffix", what, file);
  m->fuse_unk_ = json_bool(j, "fuse_unk", false, what, file);
  m->byte_fallback_ = json_bool(j, "byte_fallback", false, what, file);
  m->ignore_merges_ = json_bool(j, "ignore_merges", false, what, file);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const TokenId* id = m->vocab_.find(std::string_view(name));
    m->byte_fallback_ids_[b] = id ? *id : -1;
  }

  // Merges: "a b" strings (ranks skip "#version" lines) or [a, b] pairs; list index = rank; a duplicated pair
  // keeps the later rank.
  if (j.contains("merges") && !j["merges"].is_null()) {
    const auto& merges = j["merges"];
    if (!merges.is_array()) fail("{}: model.merges is not an array", file);
    size_t cap = 16;
    while (cap < 2 * merges.size()) cap *= 2;
    m->merges_.assign(cap, MergeSlot{});
    uint32_t rank = 0;
    std::string a, b;
    for (size_t i = 0; i < merges.size(); ++i) {
      const auto& e = merges[i];
      if (e.is_string()) {
        const std::string& line = e.get_ref<const std::string&>();
        if (line.rfind("#version", 0) == 0) continue;
        const size_t sp = line.find(' ');
        if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
          fail("{}: model.merges[{}] = {:?} is not two tokens separated by one space", file, i, line);
        a = line.substr(0, sp);
        b = line.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        fail("{}: model.merges[{}] = {} is neither \"a b\" nor [\"a\", \"b\"]", file, i, e.dump());
      }
      const TokenId* ia = m->vocab_.find(a);
      if (!ia) fail("{}: model.merges[{}]: token {:?} is not in the vocab", file, i, a);
      const TokenId* ib = m->vocab_.find(b);
      if (!ib) fail("{}: model.merges[{}]: token {:?} is not in the vocab", file, i, b);
      std::string merged = a;
      if (!m->prefix_.empty() && b.rfind(m->prefix_, 0) == 0)
        merged += b.substr(m->prefix_.size());
      else
        merged += b;
      const TokenId* im = m->vocab_.find(merged);
      if (!im) fail("{}: model.merges[{}]: merged token {:?} is not in the vocab", file, i, merged);
      m->add_merge(*ia, *ib, Merge{rank, *im});
      ++rank;
    }
  }
  return m;
}

void BpeModel::enable_byte_level() {
  raw_ok_ = prefix_.empty() && suffix_.empty();
  for (int b = 0; b < 256 && raw_ok_; ++b) {
    std::string ch;
    unicode::append_utf8(ch, byte_level::byte_to_cp(static_cast<uint8_t>(b)));
    const TokenId* id = vocab_.find(ch);
    if (!id) {
      raw_ok_ = false;  // unk / byte-fallback handling needed: use the general path
      break;
    }
    byte_ids_[b] = *id;
  }
  if (raw_ok_ && ignore_merges_) {
    raw_vocab_.reserve(vocab_.size());
    for (size_t id = 0; id < id_to_token_.size(); ++id)
      if (has_id_[id])
        if (auto raw = byte_level::decode(id_to_token_[id])) raw_vocab_.insert(*raw, static_cast<TokenId>(id));
  }
}

std::optional<TokenId> BpeModel::token_to_id(std::string_view token) const {
  const TokenId* id = vocab_.find(token);
  if (!id) return std::nullopt;
  return *id;
}

const std::string* BpeModel::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[static_cast<size_t>(id)]) return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

namespace {

struct Sym {
  TokenId id;
  int prev, next;
};

struct Cand {
  uint32_t rank;
  int pos;
  TokenId left, right, merged;
  bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

struct MergeScratch {
  std::vector<Sym> syms;
  std::vector<Cand> heap;
  std::vector<TokenId> ids;
  std::string mapped;
  // After a huge word, a thread keeps at most ~1 MiB per buffer (its memory goes back to the allocator).
  template <class V>
  static void shrink(V& v) {
    if (v.capacity() * sizeof(v[0]) > (size_t{1} << 20)) V().swap(v);
  }
};

MergeScratch& merge_scratch() {
  thread_local MergeScratch s;
  return s;
}

}  // namespace

// Repeatedly merges the adjacent pair with the lowest rank (ties: leftmost), as Word::merge_all does.
void BpeModel::merge_word(std::vector<TokenId>& ids, std::vector<TokenId>& out) const {
  const int n = static_cast<int>(ids.size());
  if (n <= 1 || n_merges_ == 0) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  MergeScratch& s = merge_scratch();
  auto& syms = s.syms;
  auto& heap = s.heap;
  syms.resize(static_cast<size_t>(n));
  heap.clear();
  const auto cmp = std::greater<Cand>();
  for (int i = 0; i < n; ++i)
    syms[static_cast<size_t>(i)] = Sym{ids[static_cast<size_t>(i)], i - 1, i + 1 < n ? i + 1 : -1};
  auto consider = [&](int pos) {
    const Sym& a = syms[static_cast<size_t>(pos)];
    if (a.next < 0) return;
    const TokenId r = syms[static_cast<size_t>(a.next)].id;
    const Merge* mg = find_merge(a.id, r);
    if (!mg) return;
    heap.push_back(Cand{mg->rank, pos, a.id, r, mg->id});
    std::push_heap(heap.begin(), heap.end(), cmp);
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const Cand c = heap.back();
    heap.pop_back();
    Sym& a = syms[static_cast<size_t>(c.pos)];
    if (a.id != c.left || a.next < 0) continue;
    Sym& b = syms[static_cast<size_t>(a.next)];
    if (b.id != c.right) continue;
    a.id = c.merged;
    b.id = -1;
    a.next = b.next;
    if (a.next >= 0) syms[static_cast<size_t>(a.next)].prev = c.pos;
    if (a.prev >= 0) consider(a.prev);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) out.push_back(syms[static_cast<size_t>(i)].id);
  MergeScratch::shrink(syms);
  MergeScratch::shrink(heap);
}

void BpeModel::tokenize_raw_bytes(std::string_view word, std::vector<TokenId>& out) const {
  auto& ids = merge_scratch().ids;
  ids.clear();
  for (char c : word) ids.push_back(byte_ids_[static_cast<uint8_t>(c)]);
  merge_word(ids, out);
  MergeScratch::shrink(ids);
}

// The general path: one initial symbol per character (with prefix / suffix), then byte fallback or unk.
void BpeModel::tokenize_chars(std::string_view w, std::vector<TokenId>& out) const {
  if (ignore_merges_) {
    if (const TokenId* id = vocab_.find(w)) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<TokenId> ids;
  std::optional<TokenId> unk;  // pending (possibly fused) unk
  std::string s;
  size_t i = 0;
  while (i < w.size()) {
    const size_t len = unicode::utf8_len(static_cast<unsigned char>(w[i]));
    const bool first = i == 0, last = i + len >= w.size();
    s.assign(w.substr(i, len));
    if (!first && !prefix_.empty()) s.insert(0, prefix_);
    if (last && !suffix_.empty()) s += suffix_;
    i += len;
    if (const TokenId* id = vocab_.find(s)) {
      if (unk) {
        ids.push_back(*unk);
        unk.reset();
      }
      ids.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : s)
        if (byte_fallback_ids_[static_cast<uint8_t>(c)] < 0) all = false;
      if (all) {
        for (char c : s) ids.push_back(byte_fallback_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_token_) {
      const TokenId unk_id = *vocab_.find(*unk_token_);
      if (unk && !fuse_unk_) ids.push_back(*unk);
      unk = unk_id;
    }
  }
  if (unk) ids.push_back(*unk);
  merge_word(ids, out);
}

void BpeModel::tokenize(std::string_view word, bool byte_level, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  const bool raw = byte_level && raw_ok_;
  const uint64_t h = hash_bytes(word);
  if (raw && ignore_merges_) {  // a whole-word vocab hit needs neither the cache nor merges
    if (const TokenId* id = raw_vocab_.find(word, h)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedLen;
  Shard* shard = nullptr;
  if (cacheable) {
    shard = &cache_[(h >> 40) % kShards];
    std::lock_guard<std::mutex> lock(shard->mu);
    if (const CacheEntry* e = shard->map.find(word, h)) {
      out.insert(out.end(), shard->ids.begin() + e->off, shard->ids.begin() + e->off + e->n);
      return;
    }
  }
  const size_t start = out.size();
  if (raw) {
    tokenize_raw_bytes(word, out);
  } else if (byte_level) {
    std::string mapped;
    byte_level::encode(word, mapped);
    tokenize_chars(mapped, out);
  } else {
    tokenize_chars(word, out);
  }
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mu);
    const size_t n = out.size() - start;
    if (shard->map.size() < kShardCapacity && shard->ids.size() + n <= kShardIds && !shard->map.find(word, h)) {
      shard->map.insert(word, h, CacheEntry{static_cast<uint32_t>(shard->ids.size()), static_cast<uint32_t>(n)});
      shard->ids.insert(shard->ids.end(), out.begin() + static_cast<long>(start), out.end());
    }
  }
}

}  // namespace latent
