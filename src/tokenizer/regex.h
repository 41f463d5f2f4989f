// Regex for pre-tokenizers: patterns written for Oniguruma (Ruby syntax, as HF `tokenizers` compiles them) are
// translated to PCRE2 and compiled with UTF, UCP and JIT.
//
// Translation (translate_oniguruma):
//  - \p{..}, \P{..}, \p{^..}, \s \S \w \W \d \D and every character class are evaluated into explicit code-point
//    ranges from the tables of the reference build (unicode.h), so the system PCRE2's Unicode version does not
//    matter. Class union ([a[b]]), intersection ([a&&[^b]]) and negation are evaluated here (PCRE2 10.42 has no
//    class set operations). Properties without a generated table are probed once through PCRE2 itself.
//  - Ruby meanings: \h / \H are hex digits, \v is U+000B, \uHHHH is a code point, (?m) is dot-all, ^ and $ are
//    line anchors.
// Matching follows the onig crate's find_iter: leftmost-first, non-overlapping, and an empty match right after
// the previous match is skipped.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace latent {

// Translates an Oniguruma (Ruby syntax) pattern into an equivalent PCRE2 pattern. Throws latent::Error for
// constructs it cannot translate.
std::string translate_oniguruma(std::string_view pattern);

class Regex {
 public:
  // `pattern` is Oniguruma syntax (the tokenizer.json "Regex" string). Throws latent::Error naming the pattern.
  explicit Regex(std::string_view pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the byte ranges [begin, end) of all matches in `text` (valid UTF-8). Thread-safe.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }
  const std::string& translated() const { return translated_; }
  bool jit() const { return jit_; }

 private:
  std::string pattern_, translated_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace latent
