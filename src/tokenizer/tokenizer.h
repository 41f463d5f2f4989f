// Tokenizer: a Hugging Face tokenizer.json (BPE family: GLM-4.5 ... GLM-5, DeepSeek-V3 / R1 / V3.1 / V3.2,
// Kimi-K2 conversions) plus tokenizer_config.json, reproducing PyPI `tokenizers` token for token
// (docs/tokenizer.md).
//
// encode: added tokens are split out first (non-normalized ones from the raw text, normalized ones from the
// normalized gaps), then normalizer -> pre-tokenizer -> BPE on each gap, then the post-processor when
// add_special_tokens. decode: id -> token (added tokens first; unknown ids dropped; special ones dropped when
// skipping), then the decoder, then lossy UTF-8.
//
// A Tokenizer is immutable after loading and safe to use from several threads (the BPE word cache is locked).
// Copies share the loaded state.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/added_tokens.h"

namespace latent {

using TokenId = int32_t;

// What tokenizer_config.json (and chat_template.jinja) say; every field optional.
struct TokenizerConfig {
  std::string tokenizer_class;
  std::string bos_token, eos_token, pad_token, unk_token;  // content strings ("" when absent / null)
  std::optional<bool> add_bos_token, add_eos_token;
  bool clean_up_tokenization_spaces = false;
  // chat_template.jinja when present, else tokenizer_config "chat_template" (string, or the "default" entry of a
  // list of {name, template}). Empty when none.
  std::string chat_template;
};

struct EncodeOptions {
  bool add_special_tokens = true;  // apply the post-processor (BOS / EOS as the files ask)
  // transformers split_special_tokens / tokenizers encode_special_tokens: special added tokens are not
  // extracted (their text is tokenized like any other); non-special added tokens still are.
  bool split_special_tokens = false;
};

class Tokenizer {
 public:
  // `path`: a model directory (reads tokenizer.json, tokenizer_config.json and chat_template.jinja when present)
  // or a tokenizer.json file (its directory's tokenizer_config.json is read too). Throws latent::Error with the
  // file name for anything missing, malformed or unsupported.
  static Tokenizer from_file(const std::string& path);
  // From JSON text; `name` is used in error messages. config_json may be empty (no tokenizer_config.json).
  static Tokenizer from_json(std::string_view tokenizer_json, const std::string& name,
                             std::string_view config_json = {});
  // From already parsed JSON.
  static Tokenizer from_parsed(const nlohmann::json& tokenizer_json, const std::string& name,
                               const nlohmann::json* config_json = nullptr);

  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = true) const;
  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opts) const;
  // Invalid UTF-8 in `text` is first replaced (U+FFFD per maximal invalid subsequence).

  // Text of the ids: valid UTF-8 (invalid byte sequences -> U+FFFD, as Python errors="replace").
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;

  std::optional<std::string> id_to_token(TokenId id) const;  // added tokens first, then the vocab
  std::optional<TokenId> token_to_id(std::string_view token) const;

  // Distinct ids with a token (vocab plus added tokens), HF get_vocab_size(with_added_tokens=True).
  size_t vocab_size() const;
  // One past the largest id that has a token. A model's embedding may be larger (config.json vocab_size):
  // ids in between have no text and decode to nothing.
  size_t id_limit() const;

  bool is_special(TokenId id) const;  // a special added token
  bool is_added(TokenId id) const;
  const std::vector<AddedToken>& added_tokens() const;
  const TokenizerConfig& config() const;

  // Ids of tokenizer_config's bos / eos / pad token strings, when they are tokens.
  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  std::optional<TokenId> pad_id() const;
  // Ids the post-processor puts before / after the text with add_special_tokens (e.g. DeepSeek's BOS).
  const std::vector<TokenId>& prefix_ids() const;
  const std::vector<TokenId>& suffix_ids() const;

  // Streaming support (see detokenizer.h): true when each id contributes fixed bytes to decode's output (a
  // ByteLevel decoder), so that decode(ids) == lossy_utf8(concat(token_bytes(id))).
  bool byte_level_decoder() const;
  // The bytes one id contributes under a ByteLevel decoder; empty for unknown ids.
  std::string_view token_bytes(TokenId id) const;

  const std::string& source() const;  // the file it was loaded from

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace latent
