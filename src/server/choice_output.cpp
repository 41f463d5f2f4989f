#include "server/choice_output.h"

#include <algorithm>
#include <random>

namespace latent::server {

namespace {

std::mt19937_64& rng() {
  thread_local std::mt19937_64 g([] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }());
  return g;
}

bool all_ws(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; });
}

}  // namespace

std::string random_hex(size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kHex[rng()() & 15];
  return s;
}

std::string random_call_id() {
  static const char* kAlnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string s = "call_";
  for (int i = 0; i < 24; ++i) s += kAlnum[rng()() % 62];
  return s;
}

ChoiceOutput::ChoiceOutput(OutputConfig cfg)
    : cfg_(std::move(cfg)),
      splitter_(cfg_.reasoning_tokens, cfg_.reasoning_enabled, cfg_.initial),
      reasoning_detok_(cfg_.codec),
      content_detok_(cfg_.codec),
      stop_(cfg_.stop),
      tools_(make_tool_parser(cfg_.tool_format, cfg_.tools)) {
  last_channel_ = splitter_.state();
}

void ChoiceOutput::move_logprobs(ChoiceDelta& out, bool force) {
  if (pending_logprobs_.empty() || (!force && !out.has_output())) return;
  for (auto& e : pending_logprobs_) {
    all_logprobs_.push_back(e);
    out.logprobs.push_back(std::move(e));
  }
  pending_logprobs_.clear();
}

void ChoiceOutput::emit_content(const std::string& text, ChoiceDelta& out) {
  if (text.empty()) return;
  if (content_.empty()) {
    ws_hold_ += text;
    if (all_ws(ws_hold_)) return;
    content_ += ws_hold_;
    out.content += ws_hold_;
    ws_hold_.clear();
    return;
  }
  content_ += text;
  out.content += text;
}

void ChoiceOutput::add_calls(std::vector<ToolCall>& calls, ChoiceDelta& out) {
  for (auto& c : calls) {
    if (!cfg_.parallel_tool_calls && !calls_.empty()) continue;  // at most one call (docs/api.md §tools)
    const int index = static_cast<int>(calls_.size());
    const std::string id = random_call_id();
    ToolCallDelta head;
    head.index = index;
    head.id = id;
    head.name = c.name;
    head.first = true;
    out.tool_calls.push_back(head);
    ToolCallDelta args;
    args.index = index;
    args.arguments = c.arguments;
    out.tool_calls.push_back(args);
    call_ids_.push_back(id);
    calls_.push_back(std::move(c));
  }
}

void ChoiceOutput::content_text(const std::string& text, ChoiceDelta& out) {
  if (text.empty() || stopped_) return;
  auto m = stop_.feed(text);
  ToolParser::Out po;
  tools_->feed(m.emit, po);
  emit_content(po.content, out);
  add_calls(po.calls, out);
  if (m.stopped) stopped_ = true;
}

void ChoiceOutput::echo(const std::vector<SampleResult>& entries, ChoiceDelta& out) {
  if (!cfg_.echo) return;
  content_ += cfg_.echo_text;
  out.content += cfg_.echo_text;
  if (!cfg_.logprobs) return;
  LogprobEntry first;
  first.token = cfg_.echo_first_token;
  first.null_logprob = true;
  all_logprobs_.push_back(first);
  out.logprobs.push_back(first);
  for (const auto& e : entries) {
    LogprobEntry x{e.token, e.logprob, e.top};
    all_logprobs_.push_back(x);
    out.logprobs.push_back(std::move(x));
  }
}

bool ChoiceOutput::push(const SampleResult& s, bool stop_token, ChoiceDelta& out) {
  ++completion_tokens_;
  if (stop_token || finished_) return false;
  const auto route = splitter_.route(s.token);
  if (route.channel == Channel::Reasoning && s.token != (cfg_.reasoning_tokens ? cfg_.reasoning_tokens->think_end : -1))
    ++reasoning_tokens_;
  if (cfg_.logprobs && !stopped_) pending_logprobs_.push_back({s.token, s.logprob, s.top});
  // A channel change ends the previous channel's pending bytes.
  if (route.channel != last_channel_) {
    if (last_channel_ == Channel::Reasoning) {
      const std::string t = reasoning_detok_.flush();
      reasoning_ += t;
      out.reasoning += t;
    } else {
      content_text(content_detok_.flush(), out);
    }
    last_channel_ = route.channel;
  }
  if (route.channel == Channel::Reasoning) produced_reasoning_ = true;
  const bool skip =
      route.drop || (cfg_.skip_special && cfg_.codec->is_special(s.token) &&
                     std::find(cfg_.keep_ids.begin(), cfg_.keep_ids.end(), s.token) == cfg_.keep_ids.end());
  if (!skip) {
    if (route.channel == Channel::Reasoning) {
      const std::string t = reasoning_detok_.push(s.token);
      reasoning_ += t;
      out.reasoning += t;
    } else {
      content_text(content_detok_.push(s.token), out);
    }
  }
  if (stopped_ && cfg_.logprobs && !pending_logprobs_.empty() && out.content.empty())
    pending_logprobs_.pop_back();  // the token that completed a stop string is cut with it
  move_logprobs(out, false);
  return stopped_;
}

std::string ChoiceOutput::finish(FinishReason r, ChoiceDelta& out) {
  if (finished_) return finish_reason_;
  finished_ = true;
  {
    const std::string t = reasoning_detok_.flush();
    reasoning_ += t;
    out.reasoning += t;
  }
  content_text(content_detok_.flush(), out);
  ToolParser::Out po;
  if (!stopped_) tools_->feed(stop_.finish(), po);
  tools_->finish(po);
  emit_content(po.content, out);
  add_calls(po.calls, out);
  if (!ws_hold_.empty() && calls_.empty()) {
    content_ += ws_hold_;
    out.content += ws_hold_;
  }
  ws_hold_.clear();
  move_logprobs(out, true);
  if (r == FinishReason::Length)
    finish_reason_ = "length";
  else
    finish_reason_ = calls_.empty() ? "stop" : "tool_calls";
  return finish_reason_;
}

}  // namespace latent::server
