// Request validation of POST /v1/completions (docs/api.md §completions), POST /tokenize and /detokenize
// (docs/api.md §tokenize).
#include <fmt/format.h>

#include "server/json_fields.h"
#include "server/request_common.h"

namespace latent::server {

using namespace fields;

namespace {

std::vector<int32_t> parse_ids(const ojson& a, const std::string& p, const ValidationContext& ctx, bool allow_empty) {
  if (!a.is_array()) invalid_type(p, "an array of token ids");
  if (a.empty() && !allow_empty) invalid_value(p, fmt::format("'{}' must not be empty.", p));
  std::vector<int32_t> ids;
  ids.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string ip = index(p, i);
    const int64_t id = as_int(a[i], ip);
    if (id < 0 || id >= ctx.vocab_size)
      invalid_value(ip, fmt::format("'{}' = {} is not a token id in [0, {}).", ip, id, ctx.vocab_size));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

void parse_prompt(const ojson& b, CompletionRequest& r, const ValidationContext& ctx) {
  const ojson* p = get(b, "prompt");
  if (!p) missing_param("prompt");
  auto check_count = [](size_t n) {
    if (n > 64) invalid_value("prompt", fmt::format("'prompt' holds {} prompts; at most 64 are allowed.", n));
  };
  if (p->is_string()) {
    if (p->get<std::string>().empty()) invalid_value("prompt", "'prompt' must not be empty.");
    r.prompt_texts.push_back(p->get<std::string>());
    return;
  }
  if (!p->is_array()) invalid_type("prompt", "a string, an array of strings, or token ids");
  if (p->empty()) invalid_value("prompt", "'prompt' must not be empty.");
  const ojson& first = (*p)[0];
  if (first.is_string()) {
    check_count(p->size());
    for (size_t i = 0; i < p->size(); ++i) {
      const ojson& s = (*p)[i];
      if (!s.is_string()) invalid_type(index("prompt", i), "a string");
      if (s.get<std::string>().empty())
        invalid_value(index("prompt", i), fmt::format("'prompt[{}]' must not be empty.", i));
      r.prompt_texts.push_back(s.get<std::string>());
    }
  } else if (first.is_array()) {
    check_count(p->size());
    r.prompt_is_tokens = true;
    for (size_t i = 0; i < p->size(); ++i)
      r.prompt_tokens.push_back(parse_ids((*p)[i], index("prompt", i), ctx, false));
  } else if (first.is_number() && !first.is_number_float()) {
    r.prompt_is_tokens = true;
    r.prompt_tokens.push_back(parse_ids(*p, "prompt", ctx, false));
  } else {
    invalid_type("prompt", "a string, an array of strings, or token ids");
  }
}

}  // namespace

CompletionRequest parse_completion_request(const ojson& b, const ValidationContext& ctx) {
  using namespace detail;
  CompletionRequest r;
  CommonParams& c = r.c;
  parse_prompt(b, r, ctx);
  parse_model_field(b, c);
  parse_stream_fields(b, c);
  {
    const ojson* e = get(b, "echo");
    r.echo = e && e->is_boolean() && e->get<bool>();
  }
  parse_max_tokens(b, c, /*chat=*/false, /*allow_zero=*/r.echo);
  parse_sampling_fields(b, c, ctx);
  parse_n(b, c, ctx);
  parse_stop_fields(b, c, ctx);
  if (auto lp = opt_int(b, "logprobs", "logprobs")) {
    if (*lp < 0 || *lp > 5) invalid_value("logprobs", fmt::format("'logprobs' must be in 0..5 (got {}).", *lp));
    r.logprobs = static_cast<int>(*lp);
  }
  if (const ojson* e = get(b, "echo")) {
    if (!e->is_boolean()) invalid_type("echo", "a boolean");
  }
  if (get(b, "suffix")) unsupported("suffix", "'suffix' is not supported.");
  if (auto bo = opt_int(b, "best_of", "best_of"); bo && *bo != c.n)
    unsupported("best_of", "'best_of' is supported only when equal to 'n'.");
  r.add_special_tokens = opt_bool(b, "add_special_tokens", "add_special_tokens").value_or(true);
  parse_structured(b, r.structured);
  c.skip_special_tokens = opt_bool(b, "skip_special_tokens", "skip_special_tokens").value_or(true);
  if (get(b, "stream_options") && !c.stream)
    invalid_value("stream_options", "'stream_options' is only allowed when 'stream' is true.");
  count_unknown(b, c,
                {"prompt",
                 "model",
                 "stream",
                 "stream_options",
                 "max_tokens",
                 "temperature",
                 "top_p",
                 "top_k",
                 "min_p",
                 "presence_penalty",
                 "frequency_penalty",
                 "repetition_penalty",
                 "logit_bias",
                 "n",
                 "seed",
                 "stop",
                 "stop_token_ids",
                 "ignore_eos",
                 "logprobs",
                 "echo",
                 "suffix",
                 "best_of",
                 "add_special_tokens",
                 "skip_special_tokens",
                 "user",
                 "response_format",
                 "guided_json",
                 "guided_regex",
                 "guided_choice",
                 "guided_grammar",
                 "structured_outputs"});
  c.model = resolve_model(c.model, c.model_given, ctx);
  return r;
}

TokenizeRequest parse_tokenize_request(const ojson& b, const ValidationContext& ctx) {
  TokenizeRequest r;
  const bool has_prompt = get(b, "prompt") != nullptr, has_messages = get(b, "messages") != nullptr;
  if (has_prompt == has_messages)
    invalid_value(has_prompt ? "messages" : "prompt", "Give exactly one of 'prompt' and 'messages'.");
  auto model = opt_string(b, "model", "model");
  if (has_prompt) {
    r.prompt = opt_string(b, "prompt", "prompt");
    r.add_special_tokens = opt_bool(b, "add_special_tokens", "add_special_tokens").value_or(true);
  } else {
    // The messages form renders exactly like a chat request: reuse its parser on the relevant fields.
    ojson sub = ojson::object();
    for (const char* k : {"messages", "tools", "tool_choice", "chat_template_kwargs", "reasoning_effort", "thinking",
                          "add_generation_prompt", "continue_final_message", "chat_template"})
      if (b.contains(k)) sub[k] = b[k];
    r.chat = parse_chat_request(sub, ctx);
  }
  r.return_token_strs = opt_bool(b, "return_token_strs", "return_token_strs").value_or(false);
  r.model = resolve_model(model.value_or(""), model.has_value(), ctx);
  return r;
}

DetokenizeRequest parse_detokenize_request(const ojson& b, const ValidationContext& ctx) {
  DetokenizeRequest r;
  const ojson* t = get(b, "tokens");
  if (!t) missing_param("tokens");
  r.tokens = parse_ids(*t, "tokens", ctx, /*allow_empty=*/true);
  auto model = opt_string(b, "model", "model");
  r.model = resolve_model(model.value_or(""), model.has_value(), ctx);
  return r;
}

}  // namespace latent::server
