#include "tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace latent {

namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& s, const std::string& file) {
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  fail("{}: unknown split behavior '{}'", file, s);
}

using Parts = std::vector<std::pair<std::pair<size_t, size_t>, bool>>;

// matches: sorted, non-overlapping byte ranges inside `piece`. Produces the pieces HF's
// NormalizedString::split(pattern, behavior) would, dropping empty ones (tokenizers/src/tokenizer/normalizer.rs).
void split_by(std::string_view piece, const std::vector<std::pair<size_t, size_t>>& matches, bool invert,
              Behavior behavior, std::vector<std::string_view>& out, Parts& parts) {
  parts.clear();
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) parts.push_back({{prev, b}, invert});
    parts.push_back({{b, e}, !invert});
    prev = e;
  }
  if (prev != piece.size()) parts.push_back({{prev, piece.size()}, invert});
  if (piece.empty()) return;

  auto emit = [&](size_t b, size_t e) {
    if (e > b) out.push_back(piece.substr(b, e - b));
  };
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& [r, m] : parts) emit(r.first, r.second);
      break;
    case Behavior::kRemoved:
      for (const auto& [r, m] : parts)
        if (!m) emit(r.first, r.second);
      break;
    case Behavior::kMergedWithPrevious: {
      Parts acc;
      bool prev_match = false;
      for (const auto& p : parts) {
        if (p.second && !prev_match && !acc.empty())
          acc.back().first.second = p.first.second;
        else
          acc.push_back(p);
        prev_match = p.second;
      }
      for (const auto& [r, m] : acc) emit(r.first, r.second);
      break;
    }
    case Behavior::kMergedWithNext: {
      Parts acc;
      bool prev_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->second && !prev_match && !acc.empty())
          acc.back().first.first = it->first.first;
        else
          acc.push_back(*it);
        prev_match = it->second;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) emit(it->first.first, it->first.second);
      break;
    }
    case Behavior::kContiguous: {
      Parts acc;
      bool prev_match = false;
      for (const auto& p : parts) {
        if (p.second == prev_match && !acc.empty())
          acc.back().first.second = p.first.second;
        else
          acc.push_back(p);
        prev_match = p.second;
      }
      for (const auto& [r, m] : acc) emit(r.first, r.second);
      break;
    }
  }
}

// Each character satisfying pred is a match of its own.
template <class Pred>
void char_matches(std::string_view piece, Pred pred, std::vector<std::pair<size_t, size_t>>& m) {
  m.clear();
  size_t i = 0;
  while (i < piece.size()) {
    uint32_t cp = 0;
    const size_t n = unicode::decode_valid(piece, i, cp);
    if (pred(cp)) m.emplace_back(i, i + n);
    i += n;
  }
}

class SplitStep final : public PreTokenizerStep {
 public:
  SplitStep(std::unique_ptr<Regex> re, std::string literal, Behavior b, bool invert)
      : re_(std::move(re)), literal_(std::move(literal)), behavior_(b), invert_(invert) {}
  void split(std::string_view piece, std::vector<std::string_view>& out, PreTokScratch& s) const override {
    s.matches.clear();
    if (re_) {
      re_->find_all(piece, s.matches);
    } else if (!literal_.empty()) {
      size_t pos = 0;
      while ((pos = piece.find(literal_, pos)) != std::string_view::npos) {
        s.matches.emplace_back(pos, pos + literal_.size());
        pos += literal_.size();
      }
    }
    split_by(piece, s.matches, invert_, behavior_, out, s.parts);
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string literal_;
  Behavior behavior_;
  bool invert_;
};

class DigitsStep final : public PreTokenizerStep {
 public:
  explicit DigitsStep(bool individual) : individual_(individual) {}
  void split(std::string_view piece, std::vector<std::string_view>& out, PreTokScratch& s) const override {
    char_matches(piece, unicode::is_numeric, s.matches);
    split_by(piece, s.matches, false, individual_ ? Behavior::kIsolated : Behavior::kContiguous, out, s.parts);
  }

 private:
  bool individual_;
};

class PunctuationStep final : public PreTokenizerStep {
 public:
  explicit PunctuationStep(Behavior b) : behavior_(b) {}
  void split(std::string_view piece, std::vector<std::string_view>& out, PreTokScratch& s) const override {
    char_matches(piece, unicode::is_punctuation, s.matches);
    split_by(piece, s.matches, false, behavior_, out, s.parts);
  }

 private:
  Behavior behavior_;
};

// Whitespace: \w+|[^\w\s]+ kept, whitespace dropped (regex crate classes).
class WhitespaceStep final : public PreTokenizerStep {
 public:
  void split(std::string_view piece, std::vector<std::string_view>& out, PreTokScratch&) const override {
    size_t i = 0, start = 0;
    int cur = -1;  // 0 word, 1 other, 2 space
    while (i < piece.size()) {
      uint32_t cp = 0;
      const size_t n = unicode::decode_valid(piece, i, cp);
      const int k = unicode::is_word_char(cp) ? 0 : unicode::is_whitespace(cp) ? 2 : 1;
      if (k != cur) {
        if (cur == 0 || cur == 1) out.push_back(piece.substr(start, i - start));
        start = i;
        cur = k;
      }
      i += n;
    }
    if ((cur == 0 || cur == 1) && i > start) out.push_back(piece.substr(start, i - start));
  }
};

class WhitespaceSplitStep final : public PreTokenizerStep {
 public:
  void split(std::string_view piece, std::vector<std::string_view>& out, PreTokScratch& s) const override {
    char_matches(piece, unicode::is_whitespace, s.matches);
    split_by(piece, s.matches, false, Behavior::kRemoved, out, s.parts);
  }
};

class BertStep final : public PreTokenizerStep {
 public:
  void split(std::string_view piece, std::vector<std::string_view>& out, PreTokScratch& s) const override {
    std::vector<std::string_view> words;
    char_matches(piece, unicode::is_whitespace, s.matches);
    split_by(piece, s.matches, false, Behavior::kRemoved, words, s.parts);
    for (auto w : words) {
      char_matches(w, unicode::is_punctuation, s.matches);
      split_by(w, s.matches, false, Behavior::kIsolated, out, s.parts);
    }
  }
};

class CharDelimiterStep final : public PreTokenizerStep {
 public:
  explicit CharDelimiterStep(uint32_t d) : delim_(d) {}
  void split(std::string_view piece, std::vector<std::string_view>& out, PreTokScratch& s) const override {
    char_matches(
        piece, [this](uint32_t cp) { return cp == delim_; }, s.matches);
    split_by(piece, s.matches, false, Behavior::kRemoved, out, s.parts);
  }

 private:
  uint32_t delim_;
};

// ByteLevel's splitting part: optional prefix space, optional GPT-2 regex. The byte mapping itself is deferred.
class ByteLevelSplitStep final : public PreTokenizerStep {
 public:
  ByteLevelSplitStep(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex)
      re_ = std::make_unique<Regex>(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  }
  void split(std::string_view piece, std::vector<std::string_view>& out, PreTokScratch& s) const override {
    if (add_prefix_space_ && (piece.empty() || piece[0] != ' ')) {
      s.arena.push_back(" " + std::string(piece));
      piece = s.arena.back();
    }
    if (!re_) {
      if (!piece.empty()) out.push_back(piece);
      return;
    }
    s.matches.clear();
    re_->find_all(piece, s.matches);
    split_by(piece, s.matches, false, Behavior::kIsolated, out, s.parts);
  }
  bool trivial() const { return !add_prefix_space_ && !re_; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

void build(const nlohmann::json& j, const std::string& file,
           std::vector<std::shared_ptr<const PreTokenizerStep>>& steps, bool& byte_level) {
  if (j.is_null()) return;
  const std::string type = json_type_field(j, "pre_tokenizer", file);
  if (type == "Sequence") {
    const auto& arr = json_field(j, "pretokenizers", "pre_tokenizer Sequence", file);
    if (!arr.is_array()) fail("{}: pre_tokenizer Sequence: \"pretokenizers\" is not an array", file);
    for (const auto& c : arr) build(c, file, steps, byte_level);
    return;
  }
  if (byte_level)
    fail("{}: pre_tokenizer '{}' after ByteLevel is not supported (ByteLevel must be the last step)", file, type);
  if (type == "Split") {
    const auto& pat = json_field(j, "pattern", "pre_tokenizer Split", file);
    const Behavior b = parse_behavior(json_string(j, "behavior", "pre_tokenizer Split", file), file);
    const bool invert = json_bool(j, "invert", false, "pre_tokenizer Split", file);
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      std::unique_ptr<Regex> re;
      try {
        re = std::make_unique<Regex>(pat["Regex"].get<std::string>());
      } catch (const Error& e) {
        fail("{}: pre_tokenizer Split: {}", file, e.what());
      }
      steps.push_back(std::make_shared<SplitStep>(std::move(re), "", b, invert));
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      steps.push_back(std::make_shared<SplitStep>(nullptr, pat["String"].get<std::string>(), b, invert));
    } else {
      fail("{}: pre_tokenizer Split: \"pattern\" must be {{\"Regex\": ...}} or {{\"String\": ...}}", file);
    }
    return;
  }
  if (type == "ByteLevel") {
    auto step = std::make_shared<ByteLevelSplitStep>(json_bool(j, "add_prefix_space", true, "ByteLevel", file),
                                                     json_bool(j, "use_regex", true, "ByteLevel", file));
    if (!step->trivial()) steps.push_back(std::move(step));
    byte_level = true;
    return;
  }
  if (type == "Digits") {
    steps.push_back(std::make_shared<DigitsStep>(json_bool(j, "individual_digits", false, "Digits", file)));
    return;
  }
  if (type == "Whitespace") {
    steps.push_back(std::make_shared<WhitespaceStep>());
    return;
  }
  if (type == "WhitespaceSplit") {
    steps.push_back(std::make_shared<WhitespaceSplitStep>());
    return;
  }
  if (type == "Punctuation") {
    const std::string b = json_opt_string(j, "behavior", "Punctuation", file);
    steps.push_back(std::make_shared<PunctuationStep>(b.empty() ? Behavior::kIsolated : parse_behavior(b, file)));
    return;
  }
  if (type == "BertPreTokenizer") {
    steps.push_back(std::make_shared<BertStep>());
    return;
  }
  if (type == "CharDelimiterSplit") {
    const std::string d = json_string(j, "delimiter", "CharDelimiterSplit", file);
    if (d.empty() || !unicode::is_valid_utf8(d)) fail("{}: CharDelimiterSplit: bad delimiter", file);
    uint32_t cp = 0;
    if (unicode::decode_valid(d, 0, cp) != d.size())
      fail("{}: CharDelimiterSplit: delimiter must be one character", file);
    steps.push_back(std::make_shared<CharDelimiterStep>(cp));
    return;
  }
  static const char* kKnownUnsupported[] = {"Metaspace", "UnicodeScripts", "FixedLength"};
  for (const char* k : kKnownUnsupported)
    if (type == k) fail("{}: pre_tokenizer type '{}' is not supported", file, type);
  fail("{}: unknown pre_tokenizer type '{}'", file, type);
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, const std::string& file) {
  PreTokenizer p;
  build(j, file, p.steps_, p.byte_level_);
  return p;
}

void PreTokenizer::run(std::string_view text, std::vector<std::string_view>& out, PreTokScratch& s) const {
  if (text.empty()) return;
  if (steps_.empty()) {
    out.push_back(text);
    return;
  }
  if (steps_.size() == 1) {
    steps_[0]->split(text, out, s);
    return;
  }
  s.a.clear();
  s.a.push_back(text);
  for (size_t k = 0; k < steps_.size(); ++k) {
    const bool last = k + 1 == steps_.size();
    std::vector<std::string_view>& dst = last ? out : s.b;
    if (!last) s.b.clear();
    for (auto piece : s.a) steps_[k]->split(piece, dst, s);
    if (!last) s.a.swap(s.b);
  }
}

}  // namespace latent
