// POST /v1/chat/completions request validation (docs/api.md §chat-request, §messages, §reasoning, §tools).
#include <fmt/format.h>

#include <algorithm>
#include <regex>
#include <set>

#include "server/json_fields.h"
#include "server/request_common.h"
#include "server/schema_check.h"

namespace latent::server {

using namespace fields;

namespace {

// Content: string, or an array of {"type":"text","text":...} parts (joined without separator).
std::optional<std::string> parse_content(const ojson& m, const std::string& base) {
  const ojson* c = get(m, "content");
  const std::string p = path(base, "content");
  if (!c) return std::nullopt;
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) invalid_type(p, "a string or an array of content parts");
  std::string out;
  for (size_t j = 0; j < c->size(); ++j) {
    const ojson& part = (*c)[j];
    const std::string pp = index(p, j);
    if (!part.is_object()) invalid_type(pp, "a content part object");
    const ojson* t = get(part, "type");
    if (!t) missing_param(path(pp, "type"));
    if (!t->is_string()) invalid_type(path(pp, "type"), "a string");
    const std::string type = t->get<std::string>();
    if (type != "text")
      unsupported(path(pp, "type"),
                  fmt::format("Content part type '{}' is not supported; only 'text' parts are.", type));
    const ojson* tx = get(part, "text");
    if (!tx) missing_param(path(pp, "text"));
    if (!tx->is_string()) invalid_type(path(pp, "text"), "a string");
    out += tx->get<std::string>();
  }
  return out;
}

ojson parse_tool_calls(const ojson& tc, const std::string& base) {
  if (!tc.is_array()) invalid_type(base, "an array");
  ojson out = ojson::array();
  for (size_t k = 0; k < tc.size(); ++k) {
    const std::string p = index(base, k);
    const ojson& call = tc[k];
    if (!call.is_object()) invalid_type(p, "a tool call object");
    ojson o = ojson::object();
    if (auto id = opt_string(call, "id", path(p, "id")))
      o["id"] = *id;
    else
      o["id"] = fmt::format("call_{}", k);
    if (auto type = opt_string(call, "type", path(p, "type")); type && *type != "function")
      invalid_value(path(p, "type"), fmt::format("Tool call type '{}' is not supported; use 'function'.", *type));
    o["type"] = "function";
    const ojson* f = get(call, "function");
    if (!f) missing_param(path(p, "function"));
    if (!f->is_object()) invalid_type(path(p, "function"), "an object");
    const std::string fp = path(p, "function");
    auto name = opt_string(*f, "name", path(fp, "name"));
    if (!name) missing_param(path(fp, "name"));
    const ojson* a = get(*f, "arguments");
    const std::string ap = path(fp, "arguments");
    ojson args;
    if (!a) {
      args = ojson::object();
    } else if (a->is_object()) {
      args = *a;
    } else if (a->is_string()) {
      try {
        args = ojson::parse(a->get<std::string>());
      } catch (const nlohmann::json::exception&) {
        invalid_value(ap, fmt::format("'{}' is not valid JSON.", ap));
      }
      if (!args.is_object()) invalid_value(ap, fmt::format("'{}' must encode a JSON object.", ap));
    } else {
      invalid_type(ap, "a JSON string");
    }
    o["function"] = ojson{{"name", *name}, {"arguments", std::move(args)}};
    out.push_back(std::move(o));
  }
  return out;
}

ojson parse_messages(const ojson& b) {
  const ojson* ms = get(b, "messages");
  if (!ms) missing_param("messages");
  if (!ms->is_array()) invalid_type("messages", "an array of message objects");
  if (ms->empty()) invalid_value("messages", "'messages' must contain at least one message.");
  if (ms->size() > 4096)
    invalid_value("messages", fmt::format("'messages' has {} items; at most 4096 are allowed.", ms->size()));
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
  ojson out = ojson::array();
  for (size_t i = 0; i < ms->size(); ++i) {
    const std::string p = index("messages", i);
    const ojson& m = (*ms)[i];
    if (!m.is_object()) invalid_type(p, "a message object");
    const ojson* r = get(m, "role");
    if (!r) missing_param(path(p, "role"));
    if (!r->is_string()) invalid_type(path(p, "role"), "a string");
    std::string role = r->get<std::string>();
    if (!kRoles.count(role))
      invalid_value(path(p, "role"),
                    fmt::format("Invalid role '{}'; expected one of system, developer, user, assistant, tool.", role));
    if (role == "developer") role = "system";
    ojson o = ojson::object();
    o["role"] = role;
    std::optional<std::string> content = parse_content(m, p);
    ojson tool_calls;
    if (role == "assistant") {
      if (const ojson* tc = get(m, "tool_calls")) tool_calls = parse_tool_calls(*tc, path(p, "tool_calls"));
      if (!content && (tool_calls.is_null() || tool_calls.empty())) missing_param(path(p, "content"));
    } else if (!content) {
      missing_param(path(p, "content"));
    }
    o["content"] = content ? ojson(*content) : ojson(nullptr);
    if (role == "assistant") {
      auto rc = opt_string(m, "reasoning_content", path(p, "reasoning_content"));
      auto rs = opt_string(m, "reasoning", path(p, "reasoning"));
      if (rc)
        o["reasoning_content"] = *rc;
      else if (rs)
        o["reasoning_content"] = *rs;
      if (!tool_calls.is_null() && !tool_calls.empty()) o["tool_calls"] = std::move(tool_calls);
    }
    if (role == "tool") {
      auto id = opt_string(m, "tool_call_id", path(p, "tool_call_id"));
      if (!id) missing_param(path(p, "tool_call_id"));
      o["tool_call_id"] = *id;
    }
    if (auto name = get(m, "name"); name && name->is_string()) o["name"] = *name;
    out.push_back(std::move(o));
  }
  return out;
}

ojson parse_tools(const ojson& b) {
  const ojson* ts = get(b, "tools");
  if (!ts) return nullptr;
  if (!ts->is_array()) invalid_type("tools", "an array of tool objects");
  if (ts->empty()) invalid_value("tools", "'tools' must not be empty; omit it when there are no tools.");
  if (ts->size() > 128)
    invalid_value("tools", fmt::format("'tools' has {} items; at most 128 are allowed.", ts->size()));
  static const std::regex kName("^[A-Za-z0-9_-]{1,64}$");
  std::set<std::string> names;
  ojson out = ojson::array();
  for (size_t i = 0; i < ts->size(); ++i) {
    const std::string p = index("tools", i);
    const ojson& t = (*ts)[i];
    if (!t.is_object()) invalid_type(p, "a tool object");
    auto type = opt_string(t, "type", path(p, "type"));
    if (!type) missing_param(path(p, "type"));
    if (*type != "function")
      unsupported(path(p, "type"), fmt::format("Tool type '{}' is not supported; use 'function'.", *type));
    const ojson* f = get(t, "function");
    if (!f) missing_param(path(p, "function"));
    const std::string fp = path(p, "function");
    if (!f->is_object()) invalid_type(fp, "an object");
    auto name = opt_string(*f, "name", path(fp, "name"));
    if (!name) missing_param(path(fp, "name"));
    if (!std::regex_match(*name, kName))
      invalid_value(path(fp, "name"), fmt::format("Tool name '{}' must match ^[A-Za-z0-9_-]{{1,64}}$.", *name));
    if (!names.insert(*name).second)
      invalid_value(path(fp, "name"), fmt::format("Tool name '{}' is not unique.", *name));
    opt_string(*f, "description", path(fp, "description"));
    if (const ojson* params = get(*f, "parameters")) {
      if (!params->is_object()) invalid_type(path(fp, "parameters"), "a JSON Schema object");
      // Every tool's schema, whatever tool_choice is: a malformed one is refused even when no call is forced.
      if (const std::string problem = json_schema_problem(*params); !problem.empty())
        invalid_value(path(fp, "parameters"), fmt::format("Invalid schema for function '{}': {}.", *name, problem));
      if (const ojson* pt = get(*params, "type");
          pt && !(pt->is_string() ? *pt == "object" : std::find(pt->begin(), pt->end(), ojson("object")) != pt->end()))
        invalid_value(path(fp, "parameters"),
                      fmt::format("Invalid schema for function '{}': the parameters must describe a JSON object "
                                  "(type 'object'), got type {}.",
                                  *name, pt->dump()));
    }
    opt_bool(*f, "strict", path(fp, "strict"));
    ojson tool = ojson::object();
    tool["type"] = "function";
    tool["function"] = *f;
    out.push_back(std::move(tool));
  }
  return out;
}

struct ToolChoiceIn {
  std::string mode;  // none | auto | required | named
  std::string name;
};

std::optional<ToolChoiceIn> parse_tool_choice(const ojson& b) {
  const ojson* tc = get(b, "tool_choice");
  if (!tc) return std::nullopt;
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s != "none" && s != "auto" && s != "required")
      invalid_value("tool_choice",
                    fmt::format("Invalid 'tool_choice' '{}'; expected none, auto, required or a function.", s));
    return ToolChoiceIn{s, ""};
  }
  if (!tc->is_object()) invalid_type("tool_choice", "a string or an object");
  auto type = opt_string(*tc, "type", "tool_choice.type");
  if (!type) missing_param("tool_choice.type");
  if (*type != "function")
    invalid_value("tool_choice.type", fmt::format("Invalid 'tool_choice.type' '{}'; expected 'function'.", *type));
  const ojson* f = get(*tc, "function");
  if (!f) missing_param("tool_choice.function");
  if (!f->is_object()) invalid_type("tool_choice.function", "an object");
  auto name = opt_string(*f, "name", "tool_choice.function.name");
  if (!name) missing_param("tool_choice.function.name");
  return ToolChoiceIn{"named", *name};
}

}  // namespace

ChatRequest parse_chat_request(const ojson& b, const ValidationContext& ctx) {
  using namespace detail;
  ChatRequest r;
  CommonParams& c = r.c;
  r.messages = parse_messages(b);
  parse_model_field(b, c);
  parse_stream_fields(b, c);
  parse_max_tokens(b, c, /*chat=*/true);
  parse_sampling_fields(b, c, ctx);
  parse_n(b, c, ctx);
  parse_stop_fields(b, c, ctx);
  r.logprobs = opt_bool(b, "logprobs", "logprobs").value_or(false);
  if (auto tl = opt_int(b, "top_logprobs", "top_logprobs")) {
    if (*tl < 0 || *tl > 20)
      invalid_value("top_logprobs", fmt::format("'top_logprobs' must be in 0..20 (got {}).", *tl));
    r.top_logprobs = static_cast<int>(*tl);
  }
  r.tools = parse_tools(b);
  const auto tool_choice = parse_tool_choice(b);
  r.parallel_tool_calls = opt_bool(b, "parallel_tool_calls", "parallel_tool_calls").value_or(true);
  parse_structured(b, r.structured);
  if (auto e = opt_string(b, "reasoning_effort", "reasoning_effort")) {
    static const std::set<std::string> kEfforts = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
    if (!kEfforts.count(*e))
      invalid_value(
          "reasoning_effort",
          fmt::format("Invalid 'reasoning_effort' '{}'; expected one of none, minimal, low, medium, high, xhigh, max.",
                      *e));
    r.reasoning_effort = *e;
  }
  if (const ojson* k = get(b, "chat_template_kwargs")) {
    if (!k->is_object()) invalid_type("chat_template_kwargs", "an object");
    if (k->contains("chat_template"))
      invalid_value("chat_template_kwargs.chat_template", "'chat_template_kwargs' must not contain 'chat_template'.");
    for (const char* key : {"enable_thinking", "thinking"})
      if (auto it = k->find(key); it != k->end() && !it->is_null() && !it->is_boolean())
        invalid_type(std::string("chat_template_kwargs.") + key, "a boolean");
    for (auto it = k->begin(); it != k->end(); ++it)
      if (!it->is_null()) r.chat_template_kwargs[it.key()] = *it;  // null = absent (docs/api.md §transport)
  }
  if (const ojson* th = get(b, "thinking")) {
    const ojson* t = th->is_object() ? get(*th, "type") : nullptr;
    if (!t || !t->is_string() || (t->get<std::string>() != "enabled" && t->get<std::string>() != "disabled"))
      invalid_value("thinking", "'thinking' must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}.");
    r.thinking = t->get<std::string>() == "enabled";
  }
  r.include_reasoning = opt_bool(b, "include_reasoning", "include_reasoning").value_or(true);
  if (auto ct = opt_string(b, "chat_template", "chat_template")) {
    if (!ctx.trust_request_chat_template)
      invalid_value("chat_template",
                    "'chat_template' in a request is not allowed (server flag --trust-request-chat-template).");
    r.chat_template = *ct;
  }
  r.add_generation_prompt = opt_bool(b, "add_generation_prompt", "add_generation_prompt").value_or(true);
  r.continue_final_message = opt_bool(b, "continue_final_message", "continue_final_message").value_or(false);
  c.skip_special_tokens = opt_bool(b, "skip_special_tokens", "skip_special_tokens").value_or(true);
  if (const ojson* mo = get(b, "modalities")) {
    if (!(mo->is_array() && mo->size() == 1 && (*mo)[0] == "text"))
      unsupported("modalities", "Only 'modalities': ['text'] is supported.");
  }
  for (const char* k : {"audio", "prediction", "web_search_options", "functions", "function_call"})
    if (get(b, k)) unsupported(k, fmt::format("'{}' is not supported by this server.", k));
  reject_set(b, "thinking_token_budget", " (planned for v2)");
  reject_set(b, "include_stop_str_in_output", " (planned for v2)");
  reject_set(b, "echo", " for chat completions");

  // Cross-field checks (docs/api.md §validation-order), in order.
  if (get(b, "stream_options") && !c.stream)
    invalid_value("stream_options", "'stream_options' is only allowed when 'stream' is true.");
  if (r.top_logprobs > 0 && !r.logprobs) invalid_value("top_logprobs", "'top_logprobs' requires 'logprobs': true.");
  if (tool_choice && tool_choice->mode != "none" && r.tools.is_null())
    invalid_value("tool_choice", "'tool_choice' requires 'tools'.");
  if (tool_choice && tool_choice->mode == "named") {
    bool found = false;
    for (const auto& t : r.tools)
      if (t["function"]["name"] == tool_choice->name) found = true;
    if (!found)
      invalid_value("tool_choice.function.name",
                    fmt::format("Tool '{}' named in 'tool_choice' is not in 'tools'.", tool_choice->name));
  }
  if (r.continue_final_message && r.add_generation_prompt && get(b, "add_generation_prompt"))
    invalid_value("continue_final_message",
                  "'continue_final_message' and 'add_generation_prompt' cannot both be true.");
  if (r.continue_final_message) {
    r.add_generation_prompt = false;
    if (r.messages.back()["role"] != "assistant")
      invalid_value("continue_final_message",
                    "'continue_final_message' requires the last message to be from the assistant.");
  }
  r.tool_choice = r.tools.is_null()                             ? ToolChoice::None
                  : !tool_choice || tool_choice->mode == "auto" ? ToolChoice::Auto
                  : tool_choice->mode == "none"                 ? ToolChoice::None
                  : tool_choice->mode == "required"             ? ToolChoice::Required
                                                                : ToolChoice::Named;
  if (r.tool_choice == ToolChoice::Named) r.tool_choice_name = tool_choice->name;
  if ((r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named) &&
      r.structured.kind != StructuredSpec::Kind::None)
    invalid_value(r.structured.param,
                  fmt::format("'{}' cannot be combined with 'tool_choice' {}.", r.structured.param,
                              r.tool_choice == ToolChoice::Required ? "'required'" : "naming a function"));

  count_unknown(b, c,
                {"messages",
                 "model",
                 "stream",
                 "stream_options",
                 "max_completion_tokens",
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
                 "top_logprobs",
                 "tools",
                 "tool_choice",
                 "parallel_tool_calls",
                 "response_format",
                 "reasoning_effort",
                 "chat_template_kwargs",
                 "thinking",
                 "include_reasoning",
                 "chat_template",
                 "add_generation_prompt",
                 "continue_final_message",
                 "skip_special_tokens",
                 "user",
                 "metadata",
                 "store",
                 "service_tier",
                 "safety_identifier",
                 "prompt_cache_key",
                 "modalities",
                 "audio",
                 "prediction",
                 "web_search_options",
                 "functions",
                 "function_call",
                 "thinking_token_budget",
                 "include_stop_str_in_output",
                 "echo",
                 "guided_json",
                 "guided_regex",
                 "guided_choice",
                 "guided_grammar",
                 "structured_outputs"});
  c.model = resolve_model(c.model, c.model_given, ctx);
  return r;
}

ojson chat_template_variables(const ChatRequest& r) {
  ojson v = r.chat_template_kwargs;
  std::optional<bool> think;
  if (v.contains("enable_thinking"))
    think = v["enable_thinking"].get<bool>();
  else if (v.contains("thinking") && v["thinking"].is_boolean())
    think = v["thinking"].get<bool>();
  else if (r.thinking)
    think = *r.thinking;
  else if (r.reasoning_effort)
    think = *r.reasoning_effort != "none";
  if (think) {
    v["enable_thinking"] = *think;
    v["thinking"] = *think;
  }
  if (r.reasoning_effort) v["reasoning_effort"] = *r.reasoning_effort;
  return v;
}

}  // namespace latent::server
