// latent::ChatTemplate — a model's chat template, rendered as transformers' apply_chat_template(tokenize=False)
// renders it: context = tokenizer special-token strings (bos_token, eos_token, ...) + caller kwargs + messages,
// tools (None when absent), documents (None), add_generation_prompt. Kwargs the caller did not send stay
// undefined (never null). Thread-safe after construction.
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>

#include "jinja/template.h"

namespace latent {

// What a template expects in assistant tool_calls[].function.arguments (minja calls this
// requires_object_arguments): GLM iterates a mapping, DeepSeek V3/R1/V3.1 concatenate a JSON string.
enum class ToolArgumentStyle { AsGiven, Object, String };
const char* tool_argument_style_name(ToolArgumentStyle s);

struct ChatRenderOptions {
  // Convert tool_calls[].function.arguments to the template's style (JSON string <-> object) before rendering.
  // Off = hand the messages to the template exactly as given (transformers' behaviour).
  bool normalize_tool_arguments = true;
  jinja::RenderOptions render;  // limits, clock for strftime_now
};

class ChatTemplate {
 public:
  // Reads DIR/chat_template.jinja, else DIR/tokenizer_config.json "chat_template" (a string, or a list of
  // {name, template}: "default", or "tool_use" when tools are passed), and the special tokens from
  // tokenizer_config.json. Throws latent::Error ("DIR: model has no chat template (...)") when there is none, and
  // jinja::TemplateError when the template does not parse.
  static ChatTemplate load(const std::string& model_dir);
  // A template from text. special_tokens: {"bos_token": "<s>", ...} (strings; becomes template variables).
  static ChatTemplate from_string(const std::string& source, const nlohmann::ordered_json& special_tokens = {},
                                  const std::string& origin = "chat_template");

  // messages: JSON array of OpenAI-shaped messages; tools: JSON array or null (→ None in the template);
  // kwargs: JSON object merged as top-level variables (chat_template_kwargs). Throws jinja::TemplateError when the
  // template fails (raise_exception, undefined values, type errors, limits), latent::Error for bad arguments.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt,
                     const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object(),
                     const ChatRenderOptions& opt = {}) const;
  // Same with nlohmann::json (its objects are key-sorted, so tojson(tools) loses the request's key order).
  std::string render(const nlohmann::json& messages, const nlohmann::json& tools, bool add_generation_prompt,
                     const nlohmann::json& kwargs = nlohmann::json::object(), const ChatRenderOptions& opt = {}) const;

  ToolArgumentStyle tool_argument_style() const { return style_; }
  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }  // file it came from (for messages)
  const nlohmann::ordered_json& special_tokens() const { return special_; }

 private:
  ChatTemplate() = default;
  void init(const std::string& origin);
  const jinja::Template& pick(bool has_tools) const;

  std::string source_;
  std::string origin_;
  nlohmann::ordered_json special_ = nlohmann::ordered_json::object();
  std::shared_ptr<const jinja::Template> tmpl_;
  std::shared_ptr<const jinja::Template> tool_use_;  // tokenizer_config "tool_use" template, if any
  ToolArgumentStyle style_ = ToolArgumentStyle::AsGiven;
};

}  // namespace latent
