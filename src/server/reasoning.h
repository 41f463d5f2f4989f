// Reasoning / content split for `<think>` models (docs/api.md §reasoning), on token ids:
//  - the initial state comes from the rendered prompt: scanning back to the last assistant header, `<think>` seen
//    first -> REASONING; `</think>` or nothing -> CONTENT;
//  - REASONING -> CONTENT on `</think>` (dropped) or on the tool-call start token (kept: the tool parser needs it);
//  - `<think>` generated in CONTENT -> REASONING (dropped).
// Token ids come from the tokenizer (never hard-coded); without `<think>`/`</think>` tokens the splitter is off.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace latent::server {

struct ReasoningTokens {
  int32_t think_start = -1, think_end = -1;
  std::vector<int32_t> tool_start;  // GLM <tool_call>; DeepSeek <｜tool▁calls▁begin｜>
  std::vector<int32_t> assistant;   // <|assistant|> / <｜Assistant｜>
  bool usable() const { return think_start >= 0 && think_end >= 0; }
};

enum class Channel { Reasoning, Content };

Channel initial_channel(std::span<const int32_t> prompt, const ReasoningTokens& t);

class ReasoningSplitter {
 public:
  ReasoningSplitter() = default;
  // enabled = false (no reasoning parser, or the tokens are missing): everything is content.
  ReasoningSplitter(const ReasoningTokens* t, bool enabled, Channel initial);
  struct Route {
    Channel channel;
    bool drop;  // a <think> / </think> marker: neither field shows it
  };
  Route route(int32_t token);
  Channel state() const { return state_; }

 private:
  const ReasoningTokens* t_ = nullptr;
  bool enabled_ = false;
  Channel state_ = Channel::Content;
};

}  // namespace latent::server
