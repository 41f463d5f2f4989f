// HfCodec: TextCodec over a Hugging Face tokenizer (tokenizer/tokenizer.h) and the model's chat template
// (jinja/chat_template.h).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "jinja/chat_template.h"
#include "server/text_codec.h"
#include "tokenizer/tokenizer.h"

namespace latent::server {

class HfCodec : public TextCodec {
 public:
  // template_file: --chat-template FILE (wins over the model's own); empty = the model's, if it has one.
  static std::unique_ptr<HfCodec> load(const std::string& model_dir, const std::string& template_file = "");

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  bool byte_level() const override { return tok_.byte_level_decoder(); }
  std::string token_bytes(int32_t id) const override { return std::string(tok_.token_bytes(id)); }
  std::string token_str(int32_t id) const override { return tok_.id_to_token(id).value_or(""); }
  bool is_special(int32_t id) const override { return tok_.is_special(id); }
  std::optional<int32_t> token_id(std::string_view token) const override { return tok_.token_to_id(token); }
  int64_t id_limit() const override { return static_cast<int64_t>(tok_.id_limit()); }
  bool has_chat_template() const override { return tmpl_ != nullptr; }
  std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                          bool add_generation_prompt, const nlohmann::ordered_json& vars,
                          const std::string* override_source) const override;

  const Tokenizer& tokenizer() const { return tok_; }
  const std::string& template_origin() const { return origin_; }

 private:
  HfCodec(Tokenizer tok) : tok_(std::move(tok)) {}
  Tokenizer tok_;
  std::unique_ptr<ChatTemplate> tmpl_;
  std::string origin_;
};

}  // namespace latent::server
