#include "server/hf_codec.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "jinja/error.h"

namespace latent::server {

namespace fs = std::filesystem;

std::unique_ptr<HfCodec> HfCodec::load(const std::string& model_dir, const std::string& template_file) {
  std::unique_ptr<HfCodec> c(new HfCodec(Tokenizer::from_file(model_dir)));
  if (!template_file.empty()) {
    std::ifstream f(template_file, std::ios::binary);
    if (!f) fail("--chat-template {}: cannot open", template_file);
    std::stringstream ss;
    ss << f.rdbuf();
    nlohmann::ordered_json special = nlohmann::ordered_json::object();
    try {
      special = ChatTemplate::load(model_dir).special_tokens();
    } catch (const latent::Error&) {
    }
    c->tmpl_ = std::make_unique<ChatTemplate>(ChatTemplate::from_string(ss.str(), special, template_file));
    c->origin_ = template_file;
    return c;
  }
  const bool has = fs::exists(fs::path(model_dir) / "chat_template.jinja") || !c->tok_.config().chat_template.empty();
  if (has) {
    c->tmpl_ = std::make_unique<ChatTemplate>(ChatTemplate::load(model_dir));
    c->origin_ = c->tmpl_->origin();
  } else {
    log::warn("{}: the model has no chat template; /v1/chat/completions is unavailable (use --chat-template FILE)",
              model_dir);
  }
  return c;
}

std::vector<int32_t> HfCodec::encode(std::string_view text, bool add_special_tokens) const {
  return tok_.encode(text, add_special_tokens);
}

std::string HfCodec::decode(std::span<const int32_t> ids, bool skip_special) const {
  return tok_.decode(ids, skip_special);
}

std::string HfCodec::render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& vars,
                                 const std::string* override_source) const {
  // Template errors are reported without the template's file path (docs/api.md §prompt).
  try {
    if (override_source) {
      const ChatTemplate t = ChatTemplate::from_string(
          *override_source, tmpl_ ? tmpl_->special_tokens() : nlohmann::ordered_json::object(), "chat_template");
      return t.render(messages, tools, add_generation_prompt, vars);
    }
    if (!tmpl_) fail("the model has no chat template");
    return tmpl_->render(messages, tools, add_generation_prompt, vars);
  } catch (const jinja::TemplateError& e) {
    if (e.has_position())
      fail("{}: {} (template line {}, column {})", jinja::error_kind_name(e.kind()), e.message(), e.line(), e.col());
    fail("{}: {}", jinja::error_kind_name(e.kind()), e.message());
  }
}

}  // namespace latent::server
