#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace latent {

void AddedTokenMatcher::build(const std::vector<std::string>& patterns, const std::vector<const AddedToken*>& tokens) {
  nodes_.assign(1, Node{});
  patterns_ = patterns;
  tokens_ = tokens;
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (size_t p = 0; p < patterns_.size(); ++p) {
    const std::string& s = patterns_[p];
    if (s.empty()) continue;  // HF never adds empty contents
    first_byte_[static_cast<uint8_t>(s[0])] = true;
    int32_t node = 0;
    for (char ch : s) {
      const auto b = static_cast<uint8_t>(ch);
      int32_t c = child(node, b);
      if (c < 0) {
        c = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        auto& nx = nodes_[static_cast<size_t>(node)].next;
        nx.insert(std::lower_bound(nx.begin(), nx.end(), std::make_pair(b, int32_t{-1}),
                                   [](const auto& x, const auto& y) { return x.first < y.first; }),
                  {b, c});
      }
      node = c;
    }
    // Equal patterns: the first one registered wins.
    if (nodes_[static_cast<size_t>(node)].pattern < 0)
      nodes_[static_cast<size_t>(node)].pattern = static_cast<int32_t>(p);
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t b) const {
  const auto& nx = nodes_[static_cast<size_t>(node)].next;
  if (nx.size() <= 8) {
    for (const auto& [k, v] : nx)
      if (k == b) return v;
    return -1;
  }
  auto it = std::lower_bound(nx.begin(), nx.end(), std::make_pair(b, int32_t{-1}),
                             [](const auto& x, const auto& y) { return x.first < y.first; });
  return it != nx.end() && it->first == b ? it->second : -1;
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t i, size_t& len) const {
  int32_t node = 0, best = -1;
  for (size_t k = i; k < text.size(); ++k) {
    node = child(node, static_cast<uint8_t>(text[k]));
    if (node < 0) break;
    if (nodes_[static_cast<size_t>(node)].pattern >= 0) {
      best = nodes_[static_cast<size_t>(node)].pattern;
      len = k + 1 - i;
    }
  }
  return best;
}

namespace {

bool ends_with_word(std::string_view s) { return !s.empty() && unicode::is_word_char(unicode::last_code_point(s)); }

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  uint32_t cp = 0;
  unicode::decode_valid(s, 0, cp);
  return unicode::is_word_char(cp);
}

}  // namespace

void AddedTokenMatcher::find(std::string_view text, bool skip_special, std::vector<Segment>& out) const {
  const size_t n = text.size();
  size_t start_offset = 0;
  if (!patterns_.empty()) {
    size_t pos = 0;
    while (pos < n) {
      // Leftmost match at or after pos, longest among those starting there.
      size_t s = pos, len = 0;
      int32_t p = -1;
      for (; s < n; ++s) {
        if (!first_byte_[static_cast<uint8_t>(text[s])]) continue;
        p = longest_at(text, s, len);
        if (p >= 0) break;
      }
      if (p < 0) break;
      const size_t e = s + len;
      pos = e;  // the search resumes after the match, whether it is kept or not
      const AddedToken& tok = *tokens_[static_cast<size_t>(p)];
      if (skip_special && tok.special) continue;
      if (tok.single_word) {
        const bool start_space = s == 0 || !ends_with_word(text.substr(0, s));
        const bool stop_space = e == n || !starts_with_word(text.substr(e));
        if (!start_space || !stop_space) continue;
      }
      size_t start = s, stop = e;
      if (tok.lstrip) {
        size_t k = s;
        while (k > 0) {
          size_t j = k - 1;
          while (j > 0 && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80) --j;
          uint32_t cp = 0;
          unicode::decode_valid(text, j, cp);
          if (!unicode::is_whitespace(cp)) break;
          k = j;
        }
        start = std::max(k, start_offset);
      }
      if (tok.rstrip) {
        while (stop < n) {
          uint32_t cp = 0;
          const size_t m = unicode::decode_valid(text, stop, cp);
          if (!unicode::is_whitespace(cp)) break;
          stop += m;
        }
      }
      if (start_offset < start) out.push_back({start_offset, start, -1});
      out.push_back({start, stop, tok.id});
      start_offset = stop;
    }
  }
  if (start_offset < n) out.push_back({start_offset, n, -1});
}

}  // namespace latent
