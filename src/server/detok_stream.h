// Streaming detokenization (docs/tokenizer.md §decoding). For byte-level tokenizers each id appends fixed bytes:
// the longest valid UTF-8 prefix is emitted, a valid-but-incomplete code point (<= 3 bytes) is held back, bytes that
// can never complete become U+FFFD at once (one per maximal invalid subsequence, as Rust from_utf8_lossy / Python
// errors="replace"). Chunks concatenate to decode(all ids). Other tokenizers re-decode a window of ids and emit the
// growth when it does not end in U+FFFD (HF DecodeStream).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/text_codec.h"

namespace latent::server {

class Utf8Assembler {
 public:
  // Appends bytes; returns the text that can be emitted now.
  std::string push(std::string_view bytes);
  // Pending incomplete bytes as U+FFFD (end of stream).
  std::string flush();
  bool empty() const { return pending_.empty(); }

 private:
  std::string pending_;
};

// Lossy UTF-8 of a whole byte string.
std::string lossy_utf8(std::string_view bytes);

class DetokStream {
 public:
  explicit DetokStream(const TextCodec* codec) : codec_(codec) {}
  // Text contributed by one more id (skipped ids contribute nothing: the caller decides what to skip).
  std::string push(int32_t id);
  std::string flush();

 private:
  const TextCodec* codec_;
  Utf8Assembler utf8_;
  std::vector<int32_t> window_;  // non-byte-level mode
  size_t emitted_ = 0;           // bytes of decode(window_) already emitted
};

}  // namespace latent::server
