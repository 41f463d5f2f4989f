// IncrementalDetokenizer: text for a stream of generated ids (docs/tokenizer.md §decoding).
//
// With a ByteLevel decoder (GLM, DeepSeek, Kimi) each id contributes fixed bytes; pending bytes are emitted as
// soon as they are valid UTF-8. Only a valid-but-incomplete code-point prefix at the end (at most 3 bytes) is
// held back; bytes that can never complete become U+FFFD at once (one per maximal invalid subsequence). So
// pieces never end inside a character, and for any split of the ids the concatenation of push() results plus
// finish() equals Tokenizer::decode(all ids, skip_special_tokens).
//
// Other decoders use HF DecodeStream's method: re-decode a window of ids and emit the new text once it grew and
// does not end in U+FFFD, holding back while a run of ByteFallback <0xNN> tokens may continue (such a run is
// decoded as a whole). The concatenation property then holds for ByteFallback + Fuse (+ Strip) chains.
#pragma once
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace latent {

class IncrementalDetokenizer {
 public:
  // `tok` must outlive this object.
  explicit IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens = false);

  // Text made complete by this id (often empty).
  std::string push(TokenId id);
  // Everything still held back (an incomplete character becomes U+FFFD). The detokenizer can be reused after.
  std::string finish();
  void reset();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  bool byte_mode_;
  std::string pending_;  // byte mode: bytes not yet emitted
  // window mode (HF DecodeStream)
  std::vector<TokenId> ids_;
  size_t prefix_index_ = 0;  // ids_[prefix_index_, read_index_) were decoded already
  size_t read_index_ = 0;
};

}  // namespace latent
