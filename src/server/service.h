// Service: the model-facing half of the server. Turns validated requests into prompts (chat template + tokenizer),
// applies the context-length rules (docs/api.md §context-length) and sampling defaults (docs/api.md §sampling), submits
// sequences to the scheduler and hands back a job whose RequestState streams the output. No HTTP here.
#pragma once
#include <nlohmann/json.hpp>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/metrics.h"
#include "runtime/scheduler.h"
#include "server/api_error.h"
#include "server/reasoning.h"
#include "server/request_schema.h"
#include "server/request_state.h"
#include "server/text_codec.h"
#include "server/tool_parser.h"
#include "structured/matcher.h"

namespace latent::server {

// Optional sampling defaults (generation_config.json, --default-sampling-params).
struct SamplingDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
  std::optional<int64_t> top_k;
  static SamplingDefaults from_json(const nlohmann::json& j, const std::string& what);  // throws latent::Error
  // --default-sampling-params: the request fields' rules (ranges, types); an unknown key is an error naming the
  // nearest known one. Throws latent::Error "<what>: ...".
  static SamplingDefaults from_flag(const std::string& json_text, const std::string& what);
};

struct ModelInfo {
  std::vector<std::string> served_names;  // primary first
  int64_t max_model_len = 4096;           // C
  int64_t vocab_size = 0;                 // logits width (config.json)
  std::vector<int32_t> eos_ids;           // generation_config eos_token_id (all are stops)
  SamplingDefaults generation_defaults;
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();  // /v1/models "meta"
  int64_t created = 0;
  std::string fingerprint;  // system_fingerprint
};

struct ServiceOptions {
  int max_n = 16;
  bool clamp_max_tokens = false;
  std::optional<int64_t> max_output_tokens;
  bool trust_request_chat_template = false;
  std::string reasoning_parser = "auto";  // auto | none | glm45 | deepseek_r1
  std::string tool_parser = "auto";       // auto | none | glm47 | deepseek
  SamplingDefaults default_sampling;
};

struct GenerationJob {
  std::shared_ptr<RequestState> state;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  int64_t prompt_tokens = 0;  // summed over prompts, once per prompt
  int n_choices = 0;
  std::string model;
  void cancel() const {
    for (const auto& h : handles) h->cancel();
  }
};

// Tokenization that stops as soon as the text is known to exceed `limit` tokens (a 31 MB prompt for a 4k context is
// not tokenized whole): then `over` is set, `at_least` is a count of tokens the text is known to exceed, and `ids`
// holds the tokens of a prefix (more than limit of them), or nothing when the length alone decided.
// max_token_bytes (byte-level vocabularies; 0 = unknown): no token covers more bytes, so a text of more than
// 4 x max_token_bytes x (limit + 8) bytes is over without being tokenized (4: margin for a normalizer that
// shortens the text, as NFC composition does by up to 3x).
struct BudgetedIds {
  std::vector<int32_t> ids;
  bool over = false;
  int64_t at_least = 0;
};
BudgetedIds encode_with_budget(const TextCodec& codec, std::string_view text, bool add_special, int64_t limit,
                               size_t max_token_bytes = 0);
// The longest token of a byte-level vocabulary in bytes (specials included); 0 when the codec is not byte level.
size_t max_token_bytes(const TextCodec& codec);

class Service {
 public:
  Service(ModelInfo info, ServiceOptions opt, const TextCodec& codec, Scheduler& scheduler, Metrics& metrics);

  const ModelInfo& info() const { return info_; }
  const ServiceOptions& options() const { return opt_; }
  const TextCodec& codec() const { return codec_; }
  Scheduler& scheduler() { return scheduler_; }
  Metrics& metrics() { return metrics_; }
  ValidationContext validation() const;
  const ReasoningTokens& reasoning_tokens() const { return rt_; }
  ToolFormat tool_format() const { return tool_format_; }
  bool reasoning_enabled() const { return reasoning_enabled_; }

  // Chat template rendering (docs/api.md §prompt, §reasoning): 400 invalid_value param messages on a template error.
  std::string render_chat(const ChatRequest& r) const;
  std::vector<int32_t> chat_prompt_ids(const ChatRequest& r) const;

  GenerationJob start_chat(const ChatRequest& r);
  GenerationJob start_completion(const CompletionRequest& r);

 private:
  // encode_with_budget against the context; over it -> 400 context_length_exceeded with `param`.
  std::vector<int32_t> budgeted(std::string_view text, bool add_special, const std::string& param) const;
  int64_t resolve_max_tokens(const CommonParams& c, int64_t P, const std::string& prompt_param, bool chat) const;
  SamplingParams sampling(const CommonParams& c) const;
  std::vector<int32_t> stop_ids(const CommonParams& c) const;
  // prompt_logprobs >= 0: the scheduler reports the prompt tokens' logprobs (GenerationRequest::prompt_logprobs).
  GenerationJob submit(std::vector<std::vector<int32_t>> prompts, const CommonParams& c,
                       const std::vector<int64_t>& max_tokens, std::vector<OutputConfig> configs,
                       const SamplingParams& sp, LogitConstraintFactory constraint = {}, int prompt_logprobs = -1);
  // Constrained decoding: the compiled grammar for a request (cached by its text), or 400 naming `param` when it
  // cannot be compiled. start_after: the constraint begins after this token (the reasoning end), -1 = at once.
  LogitConstraintFactory structured_constraint(const StructuredSpec& s, int32_t start_after);
  LogitConstraintFactory tool_constraint(const ChatRequest& r, int32_t start_after);
  std::shared_ptr<const structured::CompiledGrammar> compiled(
      const std::string& key, const std::function<std::shared_ptr<const structured::Grammar>()>& make,
      const std::string& param);
  std::shared_ptr<const structured::TokenVocab> structured_vocab();  // under structured_mu_

  ModelInfo info_;
  ServiceOptions opt_;
  const TextCodec& codec_;
  Scheduler& scheduler_;
  Metrics& metrics_;
  ReasoningTokens rt_;
  bool reasoning_enabled_ = false;
  ToolFormat tool_format_ = ToolFormat::None;
  std::vector<int32_t> keep_ids_;  // tool-call marker ids shown even when special
  size_t max_token_bytes_ = 0;     // max_token_bytes(codec_): the length bound of encode_with_budget
  std::mutex structured_mu_;       // guards vocab_, grammars_, grammar_order_
  std::shared_ptr<const structured::TokenVocab> vocab_;
  std::map<std::string, std::shared_ptr<const structured::CompiledGrammar>> grammars_;
  std::deque<std::string> grammar_order_;  // oldest first (the cache keeps 64)
};

// Maps a scheduler refusal to its error (docs/api.md §errors: 503 overloaded / draining / engine_dead, 400 too large).
ApiError rejection_error(const SchedulerRejected& r);

}  // namespace latent::server
