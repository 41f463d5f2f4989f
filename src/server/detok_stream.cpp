#include "server/detok_stream.h"

namespace latent::server {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Examines the sequence starting at s[i]. Returns the byte length of a complete valid code point (> 0), 0 when the
// bytes so far are a valid but incomplete prefix (end of input reached), or -(n) for an invalid maximal subpart of
// n bytes.
int classify(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + static_cast<size_t>(k) >= s.size()) return 0;
    const auto b = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return -k;
  }
  return need + 1;
}

}  // namespace

std::string Utf8Assembler::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const int c = classify(pending_, i);
    if (c > 0) {
      out.append(pending_, i, static_cast<size_t>(c));
      i += static_cast<size_t>(c);
    } else if (c == 0) {
      break;
    } else {
      out.append(kReplacement);
      i += static_cast<size_t>(-c);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Assembler::flush() {
  std::string out;
  if (!pending_.empty()) out.append(kReplacement);  // an incomplete prefix is one maximal subpart
  pending_.clear();
  return out;
}

std::string lossy_utf8(std::string_view bytes) {
  Utf8Assembler a;
  std::string s = a.push(bytes);
  return s + a.flush();
}

std::string DetokStream::push(int32_t id) {
  if (codec_->byte_level()) return utf8_.push(codec_->token_bytes(id));
  window_.push_back(id);
  const std::string text = codec_->decode(window_, false);
  if (text.size() >= kReplacement.size() && text.compare(text.size() - 3, 3, kReplacement) == 0) return {};
  if (text.size() <= emitted_) return {};
  std::string out = text.substr(emitted_);
  // Keep the last id as context for the next one (spacing rules of non-byte-level decoders), drop the rest.
  if (window_.size() > 1) {
    const int32_t last = window_.back();
    window_.assign(1, last);
    emitted_ = codec_->decode(window_, false).size();
  } else {
    emitted_ = text.size();
  }
  return out;
}

std::string DetokStream::flush() {
  if (codec_->byte_level()) return utf8_.flush();
  if (window_.empty()) return {};
  const std::string text = codec_->decode(window_, false);
  std::string out = text.size() > emitted_ ? text.substr(emitted_) : std::string();
  window_.clear();
  emitted_ = 0;
  return out;
}

}  // namespace latent::server
