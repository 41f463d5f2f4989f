// The BPE model of tokenizer.json (docs/tokenizer.md §BPE; huggingface/tokenizers models/bpe): vocab, merge ranks over
// (left id, right id) pairs, ignore_merges, byte_fallback, unk_token / fuse_unk, continuing_subword_prefix,
// end_of_word_suffix; a sharded per-word cache. dropout must be null or 0.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/flat_map.h"

namespace latent {

using TokenId = int32_t;

class BpeModel {
 public:
  // `j` is the "model" object. Throws latent::Error (naming `file`) for malformed vocab / merges.
  static std::unique_ptr<BpeModel> from_json(const nlohmann::json& j, const std::string& file);

  // Prepares the raw-byte fast path used when the pre-tokenizer ends with ByteLevel.
  void enable_byte_level();

  // Appends the ids of one pre-token. With byte_level, `word` holds raw bytes (the ByteLevel mapping is implied);
  // otherwise it is the pre-token text itself.
  void tokenize(std::string_view word, bool byte_level, std::vector<TokenId>& out) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  const std::string* id_to_token(TokenId id) const;  // nullptr when the id has no vocab entry
  size_t vocab_size() const { return vocab_.size(); }
  TokenId max_id() const { return max_id_; }

 private:
  BpeModel() = default;
  void merge_word(std::vector<TokenId>& syms, std::vector<TokenId>& out) const;
  void tokenize_chars(std::string_view word, std::vector<TokenId>& out) const;
  void tokenize_raw_bytes(std::string_view word, std::vector<TokenId>& out) const;

  struct Merge {
    uint32_t rank;
    TokenId id;
  };
  static uint64_t pair_key(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // (left, right) -> merge: open addressing over 64-bit keys.
  struct MergeSlot {
    uint64_t key = 0;
    Merge m{UINT32_MAX, -1};  // rank UINT32_MAX: empty slot
  };
  const Merge* find_merge(TokenId a, TokenId b) const;
  void add_merge(TokenId a, TokenId b, Merge m);

  FlatStringMap<TokenId> vocab_;
  std::vector<std::string> id_to_token_;  // index = id
  std::vector<uint8_t> has_id_;
  TokenId max_id_ = -1;
  std::vector<MergeSlot> merges_;
  size_t n_merges_ = 0;
  std::optional<std::string> unk_token_;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<TokenId, 256> byte_fallback_ids_{};  // <0xNN>, -1 if absent

  // Raw-byte fast path (ByteLevel): byte -> id of its mapped character, and vocab keyed by raw bytes.
  bool raw_ok_ = false;
  std::array<TokenId, 256> byte_ids_{};
  FlatStringMap<TokenId> raw_vocab_;

  // Word cache: sharded, bounded (full shards stop inserting, as HF's cache does); words up to kMaxCachedLen bytes.
  static constexpr size_t kShards = 32, kShardCapacity = 8192, kShardIds = 1 << 18, kMaxCachedLen = 256;
  struct CacheEntry {
    uint32_t off = 0, n = 0;
  };
  struct Shard {
    std::mutex mu;
    FlatStringMap<CacheEntry> map;
    std::vector<TokenId> ids;
  };
  mutable std::unique_ptr<Shard[]> cache_ = std::make_unique<Shard[]>(kShards);
};

}  // namespace latent
