// Request schemas of the OpenAI endpoints (docs/api.md §chat-request, §messages, §tools, §completions, §tokenize) and
// their validation: pure functions from a parsed JSON body to a typed request, throwing ApiError with the contract's
// status, code and param. Checks run in the order of docs/api.md §validation-order: per-field type / range checks in
// the order the fields are listed in the field tables, then the cross-field checks, then the model lookup. Later stages
// (template rendering, context length, admission) are the handler's.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace latent::server {

using ojson = nlohmann::ordered_json;

struct ValidationContext {
  std::vector<std::string> served_names;  // first = primary; `model` must be one of them
  int64_t vocab_size = 0;                 // ids in [0, vocab_size): logit_bias keys, stop_token_ids, prompt ids
  int max_n = 16;
  bool trust_request_chat_template = false;
};

// Fields shared by chat and completions.
struct CommonParams {
  std::string model;  // resolved served name ("" never after validation)
  bool model_given = false;
  bool stream = false;
  bool include_usage = false;
  std::optional<int64_t> max_tokens;  // M (docs/api.md §context-length)
  std::string max_tokens_param;       // the field the client used for M
  std::optional<double> temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int64_t> top_k;
  std::vector<std::pair<int32_t, float>> logit_bias;
  int n = 1;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  int unknown_fields = 0;
};

enum class ToolChoice { None, Auto, Required, Named };

// Constrained decoding requested by response_format (json_object / json_schema), vLLM's guided_json /
// guided_regex / guided_choice / guided_grammar or structured_outputs {json, regex, choice, grammar}.
struct StructuredSpec {
  enum class Kind { None, JsonObject, JsonSchema, Regex, Choice, Grammar };
  Kind kind = Kind::None;
  ojson schema;                      // JsonSchema
  std::string text;                  // Regex, Grammar
  std::vector<std::string> choices;  // Choice
  std::string param;                 // the request field it came from (errors name it)
};

struct ChatRequest {
  CommonParams c;
  ojson messages = ojson::array();  // normalized: developer -> system, content parts joined, reasoning ->
                                    // reasoning_content, tool-call arguments parsed to objects
  bool logprobs = false;
  int top_logprobs = 0;
  ojson tools = nullptr;  // array of {type:"function", function:{...}} or null
  ToolChoice tool_choice = ToolChoice::None;
  std::string tool_choice_name;  // ToolChoice::Named
  bool parallel_tool_calls = true;
  StructuredSpec structured;
  std::optional<std::string> reasoning_effort;
  ojson chat_template_kwargs = ojson::object();
  std::optional<bool> thinking;  // from "thinking": {"type": "enabled"|"disabled"}
  bool include_reasoning = true;
  std::optional<std::string> chat_template;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

struct CompletionRequest {
  CommonParams c;
  bool prompt_is_tokens = false;
  std::vector<std::string> prompt_texts;            // when !prompt_is_tokens
  std::vector<std::vector<int32_t>> prompt_tokens;  // when prompt_is_tokens
  std::optional<int> logprobs;                      // legacy 0..5
  bool echo = false;                                // the prompt comes first in each choice (with logprobs: its
                                                    // tokens' logprobs, the first null)
  bool add_special_tokens = true;
  StructuredSpec structured;
  size_t n_prompts() const { return prompt_is_tokens ? prompt_tokens.size() : prompt_texts.size(); }
};

struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;
  ChatRequest chat;  // messages form: messages, tools, chat_template_kwargs, reasoning_effort, add_generation_prompt
  bool add_special_tokens = true;
  bool return_token_strs = false;
};

struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};

// Body -> JSON object, or ApiError 400 invalid_json (bad UTF-8, bad JSON, not an object).
ojson parse_json_body(std::string_view body);

ChatRequest parse_chat_request(const ojson& body, const ValidationContext& ctx);
CompletionRequest parse_completion_request(const ojson& body, const ValidationContext& ctx);
TokenizeRequest parse_tokenize_request(const ojson& body, const ValidationContext& ctx);
DetokenizeRequest parse_detokenize_request(const ojson& body, const ValidationContext& ctx);

// Template variables derived from the request (docs/api.md §prompt, §reasoning): chat_template_kwargs plus
// enable_thinking / thinking and reasoning_effort. Keys the client did not set stay absent.
ojson chat_template_variables(const ChatRequest& r);

// Model lookup (docs/api.md §validation-order): "" -> primary; unknown -> 404 model_not_found.
std::string resolve_model(const std::string& model, bool given, const ValidationContext& ctx);

}  // namespace latent::server
