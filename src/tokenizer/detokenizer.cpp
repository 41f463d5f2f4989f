#include "tokenizer/detokenizer.h"

#include <cctype>
#include <optional>

#include "tokenizer/unicode.h"

namespace latent {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && std::string_view(s).substr(s.size() - 3) == kReplacement;
}

// A ByteFallback byte token "<0xNN>": a run of them is decoded as a whole (one U+FFFD per byte when the run is
// not valid UTF-8), so text is held back while a run may still continue.
bool is_byte_token(const std::optional<std::string>& t) {
  return t && t->size() == 6 && t->compare(0, 3, "<0x") == 0 && (*t)[5] == '>' &&
         std::isxdigit(static_cast<unsigned char>((*t)[3])) && std::isxdigit(static_cast<unsigned char>((*t)[4]));
}
}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_(skip_special_tokens), byte_mode_(tok.byte_level_decoder()) {}

void IncrementalDetokenizer::reset() {
  pending_.clear();
  ids_.clear();
  prefix_index_ = read_index_ = 0;
}

std::string IncrementalDetokenizer::push(TokenId id) {
  if (skip_special_ && tok_->is_special(id)) return {};
  if (byte_mode_) {
    pending_ += tok_->token_bytes(id);
    const size_t hold = unicode::incomplete_utf8_tail(pending_);
    if (hold == pending_.size()) return {};
    std::string out = unicode::utf8_lossy(std::string_view(pending_).substr(0, pending_.size() - hold));
    pending_.erase(0, pending_.size() - hold);
    return out;
  }
  // Window mode, as HF DecodeStream::step. Ids without a token are invisible to decode: leave them out, so that
  // they do not close a run of byte tokens either.
  const std::optional<std::string> token = tok_->id_to_token(id);
  if (!token) return {};
  ids_.push_back(id);
  if (is_byte_token(token)) return {};
  const std::span<const TokenId> all(ids_);
  const std::string prefix_text = tok_->decode(all.subspan(prefix_index_, read_index_ - prefix_index_), skip_special_);
  const std::string new_text = tok_->decode(all.subspan(prefix_index_), skip_special_);
  if (new_text.size() > prefix_text.size() && !ends_with_replacement(new_text) &&
      new_text.compare(0, prefix_text.size(), prefix_text) == 0) {
    std::string out = new_text.substr(prefix_text.size());
    prefix_index_ = read_index_;
    read_index_ = ids_.size();
    // Keep only the window that is still needed.
    if (prefix_index_ > 0) {
      ids_.erase(ids_.begin(), ids_.begin() + static_cast<long>(prefix_index_));
      read_index_ -= prefix_index_;
      prefix_index_ = 0;
    }
    return out;
  }
  return {};
}

std::string IncrementalDetokenizer::finish() {
  std::string out;
  if (byte_mode_) {
    out = unicode::utf8_lossy(pending_);
  } else if (read_index_ < ids_.size()) {
    const std::span<const TokenId> all(ids_);
    const std::string prefix_text =
        tok_->decode(all.subspan(prefix_index_, read_index_ - prefix_index_), skip_special_);
    const std::string new_text = tok_->decode(all.subspan(prefix_index_), skip_special_);
    if (new_text.compare(0, prefix_text.size(), prefix_text) == 0)
      out = new_text.substr(prefix_text.size());
    else
      out = new_text;  // the decoder rewrote earlier text; best effort
  }
  reset();
  return out;
}

}  // namespace latent
