// The output pipeline of one choice (docs/api.md §reasoning, §tools, §stop, §usage, §logprobs): sampled ids ->
// reasoning split -> streaming detokenization per channel -> stop strings (content channel) -> tool-call parser ->
// deltas. Streaming and non-streaming responses are both built from these deltas, so they agree by construction.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/stop_strings.h"
#include "server/detok_stream.h"
#include "server/reasoning.h"
#include "server/text_codec.h"
#include "server/tool_parser.h"

namespace latent::server {

struct LogprobEntry {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
  bool null_logprob = false;  // the first echoed prompt token: no logprob (null in the response)
};

struct ToolCallDelta {
  int index = 0;
  std::string id;         // set on the first delta of a call
  std::string name;       // idem
  std::string arguments;  // fragment
  bool first = false;
};

struct ChoiceDelta {
  std::string reasoning, content;
  std::vector<ToolCallDelta> tool_calls;
  std::vector<LogprobEntry> logprobs;
  bool has_output() const { return !reasoning.empty() || !content.empty() || !tool_calls.empty(); }
};

struct OutputConfig {
  const TextCodec* codec = nullptr;
  const ReasoningTokens* reasoning_tokens = nullptr;
  bool reasoning_enabled = false;
  Channel initial = Channel::Content;
  ToolFormat tool_format = ToolFormat::None;
  nlohmann::ordered_json tools;  // for value typing
  bool parallel_tool_calls = true;
  std::vector<std::string> stop;
  bool skip_special = true;
  std::vector<int32_t> keep_ids;  // ids shown even when special and skipping (tool-call markers)
  bool logprobs = false;
  // /v1/completions echo: the prompt text comes first in the content, and with logprobs its tokens' entries
  // (echo_first_token with a null logprob, then those of ChoiceOutput::echo's entries).
  bool echo = false;
  std::string echo_text;
  int32_t echo_first_token = -1;
};

class ChoiceOutput {
 public:
  explicit ChoiceOutput(OutputConfig cfg);
  // One sampled token; stop_token: EOS / stop id (counted, never shown). Returns true when a stop string matched.
  bool push(const SampleResult& s, bool stop_token, ChoiceDelta& out);
  // The echoed prompt (cfg.echo), before the first token: entries are the prompt tokens 1.. with their logprobs.
  void echo(const std::vector<SampleResult>& entries, ChoiceDelta& out);
  // End of the choice: flushes held-back text. Returns the finish_reason: stop / length / tool_calls.
  std::string finish(FinishReason r, ChoiceDelta& out);

  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  bool produced_reasoning() const { return produced_reasoning_; }
  const std::vector<ToolCall>& calls() const { return calls_; }
  const std::vector<std::string>& call_ids() const { return call_ids_; }
  const std::vector<LogprobEntry>& all_logprobs() const { return all_logprobs_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  bool finished() const { return finished_; }
  const std::string& finish_reason() const { return finish_reason_; }

 private:
  void content_text(const std::string& text, ChoiceDelta& out);
  void emit_content(const std::string& text, ChoiceDelta& out);
  void add_calls(std::vector<ToolCall>& calls, ChoiceDelta& out);
  void move_logprobs(ChoiceDelta& out, bool force);

  OutputConfig cfg_;
  ReasoningSplitter splitter_;
  DetokStream reasoning_detok_, content_detok_;
  StopStringMatcher stop_;
  std::unique_ptr<ToolParser> tools_;
  Channel last_channel_ = Channel::Content;
  std::string reasoning_, content_;
  std::string ws_hold_;  // leading whitespace-only content, held until real content (dropped if only tool calls)
  bool produced_reasoning_ = false;
  bool stopped_ = false, finished_ = false;
  std::vector<ToolCall> calls_;
  std::vector<std::string> call_ids_;
  std::vector<LogprobEntry> pending_logprobs_, all_logprobs_;
  int64_t completion_tokens_ = 0, reasoning_tokens_ = 0;
  std::string finish_reason_;
};

// "call_" + 24 [A-Za-z0-9]; "chatcmpl-"/"cmpl-" + 32 lowercase hex (docs/api.md §transport).
std::string random_call_id();
std::string random_hex(size_t n);

}  // namespace latent::server
