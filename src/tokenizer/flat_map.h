// FlatStringMap: an open-addressing string -> value map for the tokenizer's hot lookups (vocab, word cache).
// Keys are copied into one arena; slots keep the full hash, so probing compares hashes before bytes.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace latent {

inline uint64_t hash_bytes(std::string_view s) {
  const char* p = s.data();
  size_t n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(n) * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0x9FB21C651E98DF25ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t v = 0;
    std::memcpy(&v, p, n);
    h = (h ^ v) * 0x9FB21C651E98DF25ull;
    h ^= h >> 29;
  }
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h | 1;  // 0 marks an empty slot
}

template <class V>
class FlatStringMap {
 public:
  size_t size() const { return size_; }

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    if (cap > slots_.size()) rehash(cap);
  }

  const V* find(std::string_view key) const { return find(key, hash_bytes(key)); }
  const V* find(std::string_view key, uint64_t h) const {
    if (slots_.empty()) return nullptr;
    const size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return nullptr;
      if (s.hash == h && s.len == key.size() && std::memcmp(keys_.data() + s.off, key.data(), key.size()) == 0)
        return &s.value;
    }
  }

  // Inserts or overwrites.
  void insert(std::string_view key, const V& value) { insert(key, hash_bytes(key), value); }
  void insert(std::string_view key, uint64_t h, const V& value) {
    if (2 * (size_ + 1) > slots_.size()) rehash(slots_.empty() ? 16 : 2 * slots_.size());
    const size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.hash == 0) {
        s.hash = h;
        s.off = static_cast<uint32_t>(keys_.size());
        s.len = static_cast<uint32_t>(key.size());
        s.value = value;
        keys_.append(key);
        ++size_;
        return;
      }
      if (s.hash == h && s.len == key.size() && std::memcmp(keys_.data() + s.off, key.data(), key.size()) == 0) {
        s.value = value;
        return;
      }
    }
  }

  void clear() {
    slots_.clear();
    keys_.clear();
    size_ = 0;
  }
  size_t key_bytes() const { return keys_.size(); }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0, len = 0;
    V value{};
  };
  void rehash(size_t cap) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(cap, Slot{});
    const size_t mask = cap - 1;
    for (const Slot& s : old) {
      if (s.hash == 0) continue;
      size_t i = s.hash & mask;
      while (slots_[i].hash != 0) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  std::string keys_;
  size_t size_ = 0;
};

}  // namespace latent
