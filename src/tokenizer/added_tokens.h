// Added tokens (docs/tokenizer.md §added-tokens; huggingface/tokenizers tokenizer/added_vocabulary.rs):
// leftmost-longest matching over all contents, then per match single_word (drop when a word character touches it),
// lstrip / rstrip (widen over adjacent whitespace, which then yields no ids). Two matchers: non-normalized tokens
// against the raw text, normalized ones (contents passed through the normalizer) against the normalized gaps.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace latent {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = true;
};

class AddedTokenMatcher {
 public:
  struct Segment {
    size_t begin, end;  // byte range in the input
    int32_t id;         // -1: a gap (text to tokenize), else the added token's id
  };

  // patterns[i] is what to look for (content, or its normalized form); tokens[i] gives id and flags.
  void build(const std::vector<std::string>& patterns, const std::vector<const AddedToken*>& tokens);
  bool empty() const { return patterns_.empty(); }

  // Splits `text` into gaps and added-token matches, covering it completely and in order. With
  // skip_special, special tokens are not extracted (their matches are dropped, like encode_special_tokens).
  void find(std::string_view text, bool skip_special, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t pattern = -1;                           // pattern index ending here
  };
  int32_t child(int32_t node, uint8_t b) const;
  // Longest pattern starting at text[i]: its index, or -1.
  int32_t longest_at(std::string_view text, size_t i, size_t& len) const;

  std::vector<Node> nodes_;
  std::vector<std::string> patterns_;
  std::vector<const AddedToken*> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace latent
