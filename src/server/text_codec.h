// TextCodec: what the server needs from a model's tokenizer and chat template. The real implementation
// (hf_codec.h) wraps latent::Tokenizer + latent::ChatTemplate; tests use a small fake.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace latent::server {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special) const = 0;
  // Byte-level tokenizers: decode(ids) == lossy_utf8(concat(token_bytes(id))) (special ones included when not
  // skipped). byte_level() false: token_bytes is not used and streaming re-decodes a window of ids.
  virtual bool byte_level() const = 0;
  virtual std::string token_bytes(int32_t id) const = 0;
  // The vocabulary string of an id ("Ġthe", "<|user|>"); "" for ids without a token.
  virtual std::string token_str(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual std::optional<int32_t> token_id(std::string_view token) const = 0;
  // One past the largest id with a token.
  virtual int64_t id_limit() const = 0;

  virtual bool has_chat_template() const = 0;
  // apply_chat_template(tokenize=False): messages / tools as OpenAI JSON (tools null when absent), vars merged as
  // top-level template variables. override_source: a request-supplied template (--trust-request-chat-template).
  // Throws latent::Error with the template's error text.
  virtual std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                  bool add_generation_prompt, const nlohmann::ordered_json& vars,
                                  const std::string* override_source = nullptr) const = 0;
};

}  // namespace latent::server
