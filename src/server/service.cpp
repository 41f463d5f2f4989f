#include "server/service.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "server/api_error.h"
#include "server/request_common.h"
#include "structured/compilers.h"
#include "structured/constraint.h"

namespace latent::server {

SamplingDefaults SamplingDefaults::from_json(const nlohmann::json& j, const std::string& what) {
  SamplingDefaults d;
  if (j.is_null()) return d;
  if (!j.is_object()) fail("{}: expected a JSON object", what);
  auto num = [&](const char* k, std::optional<double>& out) {
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) return;
    if (!it->is_number()) fail("{}: \"{}\" is not a number", what, k);
    out = it->get<double>();
  };
  num("temperature", d.temperature);
  num("top_p", d.top_p);
  num("min_p", d.min_p);
  num("repetition_penalty", d.repetition_penalty);
  num("presence_penalty", d.presence_penalty);
  num("frequency_penalty", d.frequency_penalty);
  if (auto it = j.find("top_k"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) fail("{}: \"top_k\" is not an integer", what);
    d.top_k = it->get<int64_t>();
  }
  return d;
}

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

SamplingDefaults SamplingDefaults::from_flag(const std::string& json_text, const std::string& what) {
  static const char* const kKeys[] = {
      "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"};
  ojson b;
  try {
    b = parse_json_body(json_text);
  } catch (const ApiError& e) {
    fail("{}: {}", what, e.message);
  }
  for (auto it = b.begin(); it != b.end(); ++it) {
    const std::string& k = it.key();
    const char* best = kKeys[0];
    size_t best_d = SIZE_MAX, found = 0;
    for (const char* c : kKeys) {
      const size_t d = edit_distance(k, c);
      if (d == 0) found = 1;
      if (d < best_d) {
        best_d = d;
        best = c;
      }
    }
    if (!found)
      fail(
          "{}: unknown field '{}' (did you mean '{}'? allowed: temperature, top_p, top_k, min_p, presence_penalty, "
          "frequency_penalty, repetition_penalty)",
          what, k, best);
  }
  CommonParams c;
  try {
    detail::parse_sampling_fields(b, c, ValidationContext{});
  } catch (const ApiError& e) {
    fail("{}: {}", what, e.message);
  }
  SamplingDefaults d;
  d.temperature = c.temperature;
  d.top_p = c.top_p;
  d.top_k = c.top_k;
  d.min_p = c.min_p;
  d.presence_penalty = c.presence_penalty;
  d.frequency_penalty = c.frequency_penalty;
  d.repetition_penalty = c.repetition_penalty;
  return d;
}

Service::Service(ModelInfo info, ServiceOptions opt, const TextCodec& codec, Scheduler& scheduler, Metrics& metrics)
    : info_(std::move(info)), opt_(std::move(opt)), codec_(codec), scheduler_(scheduler), metrics_(metrics) {
  auto id = [&](std::string_view s) { return codec_.token_id(s).value_or(-1); };
  rt_.think_start = id("<think>");
  rt_.think_end = id("</think>");
  for (const char* a : {"<|assistant|>", "<｜Assistant｜>"})
    if (auto t = codec_.token_id(a)) rt_.assistant.push_back(*t);
  const bool glm = codec_.token_id("<tool_call>").has_value();
  const bool deepseek = codec_.token_id("<｜tool▁calls▁begin｜>").has_value();
  if (opt_.tool_parser == "glm47" || (opt_.tool_parser == "auto" && glm))
    tool_format_ = ToolFormat::Glm47;
  else if (opt_.tool_parser == "deepseek" || (opt_.tool_parser == "auto" && deepseek))
    tool_format_ = ToolFormat::DeepSeek;
  if (tool_format_ == ToolFormat::Glm47) {
    if (auto t = codec_.token_id("<tool_call>")) rt_.tool_start.push_back(*t);
  } else if (tool_format_ == ToolFormat::DeepSeek) {
    for (const char* m : {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                          "<｜tool▁calls▁end｜>"})
      if (auto t = codec_.token_id(m)) keep_ids_.push_back(*t);
    if (!keep_ids_.empty()) rt_.tool_start.push_back(keep_ids_.front());
  }
  reasoning_enabled_ = opt_.reasoning_parser != "none" && rt_.usable();
  max_token_bytes_ = max_token_bytes(codec_);
}

ValidationContext Service::validation() const {
  ValidationContext v;
  v.served_names = info_.served_names;
  v.vocab_size = info_.vocab_size;
  v.max_n = opt_.max_n;
  v.trust_request_chat_template = opt_.trust_request_chat_template;
  return v;
}

namespace {

// continue_final_message: cut the rendering right after the final assistant message's content.
std::string cut_after_final(const std::string& rendered, const ojson& last) {
  const std::string content =
      last.value("content", ojson(nullptr)).is_string() ? last["content"].get<std::string>() : "";
  std::string_view c = content;
  while (!c.empty() && (c.back() == ' ' || c.back() == '\n' || c.back() == '\t')) c.remove_suffix(1);
  if (c.empty()) return rendered;
  const size_t p = rendered.rfind(c);
  if (p == std::string::npos)
    invalid_value("messages", "The final assistant message could not be located in the rendered prompt.");
  return rendered.substr(0, p + c.size());
}

}  // namespace

std::string Service::render_chat(const ChatRequest& r) const {
  if (!codec_.has_chat_template())
    invalid_value("messages",
                  "This model has no chat template; use /v1/completions or start the server with --chat-template.");
  const ojson vars = chat_template_variables(r);
  const ojson tools = r.tool_choice == ToolChoice::None ? ojson(nullptr) : r.tools;  // none: not rendered (docs/api.md)
  std::string text;
  try {
    text = codec_.render_chat(r.messages, tools, r.add_generation_prompt, vars,
                              r.chat_template ? &*r.chat_template : nullptr);
  } catch (const latent::Error& e) {
    std::string msg = e.what();
    invalid_value("messages", fmt::format("The chat template failed: {}", msg));
  }
  if (r.continue_final_message) text = cut_after_final(text, r.messages.back());
  return text;
}

std::vector<int32_t> Service::chat_prompt_ids(const ChatRequest& r) const {
  return codec_.encode(render_chat(r), /*add_special_tokens=*/false);  // the template writes them (docs/api.md §prompt)
}

size_t max_token_bytes(const TextCodec& codec) {
  if (!codec.byte_level()) return 0;
  size_t m = 0;
  for (int32_t id = 0; id < static_cast<int32_t>(codec.id_limit()); ++id) m = std::max(m, codec.token_bytes(id).size());
  return m;
}

BudgetedIds encode_with_budget(const TextCodec& codec, std::string_view text, bool add_special, int64_t limit,
                               size_t max_token_bytes) {
  BudgetedIds out;
  if (max_token_bytes > 0) {
    // Every token covers at most max_token_bytes of the (normalized) text: this many bytes cannot fit.
    const double per = 4.0 * static_cast<double>(max_token_bytes);
    if (static_cast<double>(text.size()) > per * static_cast<double>(std::max<int64_t>(limit, 0) + 8)) {
      out.over = true;
      out.at_least = static_cast<int64_t>(static_cast<double>(text.size()) / per);
      return out;
    }
  }
  // No token covers more than a few hundred bytes; a short text cannot be over the limit by much: encode it whole.
  size_t cut = static_cast<size_t>(std::max<int64_t>(limit, 1)) * 8;
  while (cut < text.size()) {
    // Cut right before a whitespace byte, so every pre-token of the prefix is one of the whole text's: the whole
    // text has at least as many tokens as the prefix (a few of margin for added-token matching).
    size_t c = cut;
    while (c > cut / 2 && !(text[c] == ' ' || text[c] == '\n' || text[c] == '\t' || text[c] == '\r')) --c;
    if (c <= cut / 2) break;  // no whitespace near the cut: encode the whole text
    std::vector<int32_t> ids = codec.encode(text.substr(0, c), add_special);
    if (static_cast<int64_t>(ids.size()) > limit + 8) {
      out.ids = std::move(ids);
      out.over = true;
      out.at_least = static_cast<int64_t>(out.ids.size());
      return out;
    }
    cut *= 4;
  }
  out.ids = codec.encode(text, add_special);
  out.at_least = static_cast<int64_t>(out.ids.size());
  return out;
}

std::vector<int32_t> Service::budgeted(std::string_view text, bool add_special, const std::string& param) const {
  BudgetedIds b = encode_with_budget(codec_, text, add_special, info_.max_model_len, max_token_bytes_);
  if (b.over) {
    metrics_.requests_rejected.inc("context_length");
    const char* what = param == "messages" ? "messages" : "prompt";
    bad_request("context_length_exceeded", param,
                fmt::format("This model's maximum context length is {} tokens. However, your {} resulted in more "
                            "than {} tokens. Please reduce the length of the {}.",
                            info_.max_model_len, what, b.at_least, what));
  }
  return std::move(b.ids);
}

int64_t Service::resolve_max_tokens(const CommonParams& c, int64_t P, const std::string& prompt_param,
                                    bool chat) const {
  const int64_t C = info_.max_model_len;
  if (P >= C) {
    metrics_.requests_rejected.inc("context_length");
    bad_request("context_length_exceeded", prompt_param,
                fmt::format("This model's maximum context length is {} tokens. However, your {} resulted in {} tokens. "
                            "Please reduce the length of the {}.",
                            C, prompt_param == "messages" ? "messages" : "prompt", P,
                            prompt_param == "messages" ? "messages" : "prompt"));
  }
  if (c.max_tokens) {
    const int64_t M = *c.max_tokens;
    if (P + M > C) {
      if (opt_.clamp_max_tokens) return C - P;
      metrics_.requests_rejected.inc("context_length");
      bad_request(
          "context_length_exceeded", c.max_tokens_param,
          fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} in "
                      "the {}, {} in the completion). Please reduce the length of the {} or completion.",
                      C, P + M, P, chat ? "messages" : "prompt", M, chat ? "messages" : "prompt"));
    }
    return M;
  }
  int64_t M = C - P;
  if (!chat) M = std::min<int64_t>(M, 16);  // legacy completions default (docs/api.md §completions)
  if (opt_.max_output_tokens) M = std::min(M, *opt_.max_output_tokens);
  return std::max<int64_t>(M, 1);
}

SamplingParams Service::sampling(const CommonParams& c) const {
  const SamplingDefaults& s = opt_.default_sampling;
  const SamplingDefaults& g = info_.generation_defaults;
  auto pick = [](std::optional<double> req, std::optional<double> srv, std::optional<double> gen, double dflt) {
    return static_cast<float>(req ? *req : srv ? *srv : gen ? *gen : dflt);
  };
  SamplingParams p;
  p.temperature = pick(c.temperature, s.temperature, g.temperature, 1.0);
  p.top_p = pick(c.top_p, s.top_p, g.top_p, 1.0);
  p.min_p = pick(c.min_p, s.min_p, g.min_p, 0.0);
  p.presence_penalty = pick(c.presence_penalty, s.presence_penalty, g.presence_penalty, 0.0);
  p.frequency_penalty = pick(c.frequency_penalty, s.frequency_penalty, g.frequency_penalty, 0.0);
  p.repetition_penalty = pick(c.repetition_penalty, s.repetition_penalty, g.repetition_penalty, 1.0);
  p.top_k = c.top_k ? *c.top_k : s.top_k ? *s.top_k : g.top_k ? *g.top_k : 0;
  if (p.top_k < 0) p.top_k = 0;
  p.logit_bias = c.logit_bias;
  p.seed = c.seed;
  return p;
}

std::vector<int32_t> Service::stop_ids(const CommonParams& c) const {
  std::vector<int32_t> ids = c.ignore_eos ? std::vector<int32_t>{} : info_.eos_ids;
  ids.insert(ids.end(), c.stop_token_ids.begin(), c.stop_token_ids.end());
  return ids;
}

ApiError rejection_error(const SchedulerRejected& r) {
  using K = SchedulerRejected::Kind;
  switch (r.kind) {
    case K::Overloaded: return overloaded_error(fmt::format("The server is overloaded: {}. Retry later.", r.what()));
    case K::Draining: return server_error(503, "draining", "The server is shutting down.");
    case K::Dead: return server_error(503, "engine_dead", "The engine loop failed; the server must be restarted.");
    case K::TooLarge: break;
  }
  return ApiError(400, "invalid_request_error", "invalid_value", std::string("n"),
                  fmt::format("The request cannot be served: {}.", r.what()));
}

GenerationJob Service::submit(std::vector<std::vector<int32_t>> prompts, const CommonParams& c,
                              const std::vector<int64_t>& max_tokens, std::vector<OutputConfig> configs,
                              const SamplingParams& sp, LogitConstraintFactory constraint, int prompt_logprobs) {
  GenerationJob job;
  job.model = c.model;
  job.n_choices = static_cast<int>(configs.size());
  job.state = std::make_shared<RequestState>(std::move(configs));
  const auto ids = stop_ids(c);
  const auto arrival = Clock::now();
  try {
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest g;
      job.prompt_tokens += static_cast<int64_t>(prompts[i].size());
      g.prompt = std::move(prompts[i]);
      g.n = c.n;
      g.choice_offset = static_cast<int>(i) * c.n;
      g.sampling = sp;
      g.max_tokens = max_tokens[i];
      g.stop_ids = ids;
      g.ignore_eos = c.ignore_eos;
      g.sink = job.state;
      g.arrival = arrival;
      g.constraint = constraint;
      g.prompt_logprobs = prompt_logprobs;
      // Echo without prompt logprobs: the prompt text goes out now and the engine computes only the last row
      // (with them, the scheduler delivers text and logprobs together). A no-op for choices without echo.
      if (prompt_logprobs < 0) job.state->on_prompt_logprobs(g.choice_offset, g.n, {});
      job.handles.push_back(scheduler_.submit(std::move(g)));
    }
  } catch (const SchedulerRejected& r) {
    job.cancel();
    if (r.kind == SchedulerRejected::Kind::Overloaded) metrics_.requests_rejected.inc("overloaded");
    throw rejection_error(r);
  }
  return job;
}

std::shared_ptr<const structured::TokenVocab> Service::structured_vocab() {
  if (vocab_) return vocab_;
  if (!codec_.byte_level())
    unsupported("response_format",
                "Constrained decoding needs a byte-level BPE tokenizer; this model's tokenizer is not one.");
  std::vector<std::string> bytes(static_cast<size_t>(codec_.id_limit()));
  for (int32_t id = 0; id < static_cast<int32_t>(bytes.size()); ++id) {
    // Reasoning markers never appear in constrained output; special tokens only where a tool syntax needs them.
    if (id == rt_.think_start || id == rt_.think_end) continue;
    if (codec_.is_special(id) && std::find(keep_ids_.begin(), keep_ids_.end(), id) == keep_ids_.end()) continue;
    bytes[static_cast<size_t>(id)] = codec_.token_bytes(id);
  }
  vocab_ = std::make_shared<structured::TokenVocab>(std::move(bytes), info_.eos_ids);
  return vocab_;
}

std::shared_ptr<const structured::CompiledGrammar> Service::compiled(
    const std::string& key, const std::function<std::shared_ptr<const structured::Grammar>()>& make,
    const std::string& param) {
  std::lock_guard lk(structured_mu_);
  if (auto it = grammars_.find(key); it != grammars_.end()) return it->second;
  auto cg = std::make_shared<structured::CompiledGrammar>();
  try {
    cg->grammar = make();
  } catch (const structured::GrammarError& e) {
    const std::string msg = fmt::format("'{}' cannot be used for constrained decoding: {}.", param, e.what());
    if (!e.keyword().empty()) unsupported(param, msg);
    invalid_value(param, msg);
  }
  cg->vocab = structured_vocab();
  grammars_[key] = cg;
  grammar_order_.push_back(key);
  if (grammar_order_.size() > 64) {
    grammars_.erase(grammar_order_.front());
    grammar_order_.pop_front();
  }
  return cg;
}

LogitConstraintFactory Service::structured_constraint(const StructuredSpec& s, int32_t start_after) {
  using K = StructuredSpec::Kind;
  std::shared_ptr<const structured::CompiledGrammar> cg;
  switch (s.kind) {
    case K::None: return {};
    case K::JsonObject:
      cg = compiled(
          "json_object", [] { return structured::json_object_grammar(); }, s.param);
      break;
    case K::JsonSchema:
      cg = compiled(
          "schema:" + s.schema.dump(), [&] { return structured::json_schema_grammar(s.schema); }, s.param);
      break;
    case K::Regex:
      cg = compiled(
          "regex:" + s.text, [&] { return structured::regex_grammar(s.text); }, s.param);
      break;
    case K::Choice:
      cg = compiled(
          "choice:" + ojson(s.choices).dump(), [&] { return structured::choice_grammar(s.choices); }, s.param);
      break;
    case K::Grammar:
      cg = compiled(
          "gbnf:" + s.text, [&] { return structured::gbnf_grammar(s.text); }, s.param);
      break;
  }
  return structured::constraint_factory(cg, start_after);
}

LogitConstraintFactory Service::tool_constraint(const ChatRequest& r, int32_t start_after) {
  const std::string param = r.tool_choice == ToolChoice::Named ? "tool_choice.function.name" : "tool_choice";
  if (tool_format_ == ToolFormat::None)
    unsupported(param, "This model has no tool-call format, so 'tool_choice' cannot require a call.");
  structured::ToolSyntax syntax = structured::ToolSyntax::Glm;
  if (tool_format_ == ToolFormat::DeepSeek) {
    // V3 / R1 write "function<｜tool▁sep｜>NAME```json", V3.1 "NAME<｜tool▁sep｜>ARGS": ask the template.
    syntax = structured::ToolSyntax::DeepSeekV3;
    try {
      ojson msgs = ojson::array(
          {ojson{{"role", "user"}, {"content", "x"}},
           ojson{{"role", "assistant"},
                 {"content", ""},
                 {"tool_calls", ojson::array({ojson{{"id", "call_0"},
                                                    {"type", "function"},
                                                    {"function", {{"name", "probe_tool"}, {"arguments", "{}"}}}}})}}});
      const std::string text = codec_.render_chat(msgs, nullptr, false, ojson::object());
      if (text.find("probe_tool<｜tool▁sep｜>") != std::string::npos) syntax = structured::ToolSyntax::DeepSeekV31;
    } catch (const std::exception&) {
    }
  }
  const bool parallel = r.parallel_tool_calls && r.tool_choice == ToolChoice::Required;
  const std::string key =
      fmt::format("tools:{}:{}:{}:{}", static_cast<int>(syntax), r.tool_choice_name, parallel, r.tools.dump());
  auto cg = compiled(
      key, [&] { return structured::tool_call_grammar(syntax, r.tools, r.tool_choice_name, parallel); }, "tools");
  return structured::constraint_factory(cg, start_after);
}

GenerationJob Service::start_chat(const ChatRequest& r) {
  std::vector<int32_t> prompt = budgeted(render_chat(r), /*add_special=*/false, "messages");
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t M = resolve_max_tokens(r.c, P, "messages", /*chat=*/true);
  SamplingParams sp = sampling(r.c);
  sp.logprobs = r.logprobs;
  sp.top_logprobs = r.top_logprobs;
  // tool_choice "none" with tools given: the model may not start a call (its tool-call start token is masked), so
  // it answers in text instead of writing call markup into the content.
  if (r.tool_choice == ToolChoice::None && r.tools.is_array() && !r.tools.empty())
    for (int32_t id : rt_.tool_start) sp.logit_bias.emplace_back(id, -std::numeric_limits<float>::infinity());
  OutputConfig oc;
  oc.codec = &codec_;
  oc.reasoning_tokens = &rt_;
  oc.reasoning_enabled = reasoning_enabled_;
  oc.initial = initial_channel(prompt, rt_);
  const bool tools_forced = r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named;
  oc.tool_format = r.tool_choice == ToolChoice::Auto || tools_forced ? tool_format_ : ToolFormat::None;
  // Reasoning stays free: the constraint starts after </think> when the prompt leaves the model thinking.
  const int32_t start_after = reasoning_enabled_ && oc.initial == Channel::Reasoning ? rt_.think_end : -1;
  LogitConstraintFactory constraint =
      tools_forced ? tool_constraint(r, start_after) : structured_constraint(r.structured, start_after);
  oc.tools = r.tools;
  oc.parallel_tool_calls = r.parallel_tool_calls;
  oc.stop = r.c.stop;
  oc.skip_special = r.c.skip_special_tokens;
  if (oc.tool_format != ToolFormat::None) oc.keep_ids = keep_ids_;
  oc.logprobs = r.logprobs;
  std::vector<OutputConfig> configs(static_cast<size_t>(r.c.n), oc);
  std::vector<std::vector<int32_t>> prompts;
  prompts.push_back(std::move(prompt));
  return submit(std::move(prompts), r.c, {M}, std::move(configs), sp, std::move(constraint));
}

GenerationJob Service::start_completion(const CompletionRequest& r) {
  std::vector<std::vector<int32_t>> prompts;
  if (r.prompt_is_tokens) {
    prompts = r.prompt_tokens;
  } else {
    for (size_t i = 0; i < r.prompt_texts.size(); ++i)
      prompts.push_back(budgeted(r.prompt_texts[i], r.add_special_tokens,
                                 r.prompt_texts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", i)));
  }
  std::vector<int64_t> M;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string param = prompts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", i);
    if (prompts[i].empty()) invalid_value(param, fmt::format("'{}' produced no tokens.", param));
    M.push_back(resolve_max_tokens(r.c, static_cast<int64_t>(prompts[i].size()), param, /*chat=*/false));
  }
  SamplingParams sp = sampling(r.c);
  sp.logprobs = r.logprobs.has_value();
  sp.top_logprobs = r.logprobs.value_or(0);
  OutputConfig oc;
  oc.codec = &codec_;
  oc.stop = r.c.stop;
  oc.skip_special = r.c.skip_special_tokens;
  oc.logprobs = r.logprobs.has_value();
  std::vector<OutputConfig> configs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    OutputConfig pc = oc;
    if (r.echo) {
      // The prompt as the client gave it (token prompts: their text); its tokens' logprobs come from the engine.
      pc.echo = true;
      pc.echo_text = r.prompt_is_tokens ? codec_.decode(prompts[i], false) : r.prompt_texts[i];
      pc.echo_first_token = prompts[i].front();
    }
    for (int j = 0; j < r.c.n; ++j) configs.push_back(pc);
  }
  // Prompt rows are computed only when their logprobs are asked for (echo alone needs no logits row).
  const int prompt_lp = r.echo && r.logprobs ? *r.logprobs : -1;
  return submit(std::move(prompts), r.c, M, std::move(configs), sp, structured_constraint(r.structured, -1), prompt_lp);
}

}  // namespace latent::server
