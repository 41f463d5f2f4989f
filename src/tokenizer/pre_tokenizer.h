// tokenizer.json "pre_tokenizer": Sequence, Split (Regex via PCRE2 or String; all five behaviors; invert),
// ByteLevel (add_prefix_space, use_regex), Digits, Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer,
// CharDelimiterSplit. Sequences are flattened. ByteLevel's byte-to-character mapping is not materialized: the
// pipeline reports byte_level() and the BPE model works on raw bytes (equivalent, and faster).
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace latent {

// Per-call scratch space (pieces may point into `arena` when a step had to build new text).
struct PreTokScratch {
  std::vector<std::string_view> a, b;
  std::vector<std::pair<size_t, size_t>> matches;
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> parts;
  std::deque<std::string> arena;
  void clear() {
    a.clear();
    b.clear();
    arena.clear();
  }
};

class PreTokenizerStep {
 public:
  virtual ~PreTokenizerStep() = default;
  // Appends the sub-pieces of `piece` (non-empty) to `out`.
  virtual void split(std::string_view piece, std::vector<std::string_view>& out, PreTokScratch& s) const = 0;
};

class PreTokenizer {
 public:
  // JSON null gives the identity (one piece per input).
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& file);

  // Splits `text` into non-empty pieces, appended to `out`. The views stay valid while `text` and `s` live.
  void run(std::string_view text, std::vector<std::string_view>& out, PreTokScratch& s) const;

  // Pieces must be mapped through the ByteLevel alphabet before the model sees them.
  bool byte_level() const { return byte_level_; }

 private:
  std::vector<std::shared_ptr<const PreTokenizerStep>> steps_;
  bool byte_level_ = false;
};

}  // namespace latent
