#include "server/reasoning.h"

#include <algorithm>

namespace latent::server {

namespace {
bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
}  // namespace

Channel initial_channel(std::span<const int32_t> prompt, const ReasoningTokens& t) {
  if (!t.usable()) return Channel::Content;
  for (size_t i = prompt.size(); i-- > 0;) {
    const int32_t id = prompt[i];
    if (id == t.think_start) return Channel::Reasoning;
    if (id == t.think_end) return Channel::Content;
    if (contains(t.assistant, id)) return Channel::Content;
  }
  return Channel::Content;
}

ReasoningSplitter::ReasoningSplitter(const ReasoningTokens* t, bool enabled, Channel initial)
    : t_(t), enabled_(enabled && t && t->usable()), state_(enabled_ ? initial : Channel::Content) {}

ReasoningSplitter::Route ReasoningSplitter::route(int32_t token) {
  if (!enabled_) return {Channel::Content, false};
  if (token == t_->think_end) {
    const bool was = state_ == Channel::Reasoning;
    state_ = Channel::Content;
    // A stray </think> in content is dropped too: it never appears in either field (docs/api.md §reasoning).
    return {was ? Channel::Reasoning : Channel::Content, true};
  }
  if (token == t_->think_start) {
    state_ = Channel::Reasoning;
    return {Channel::Reasoning, true};
  }
  if (state_ == Channel::Reasoning && contains(t_->tool_start, token)) state_ = Channel::Content;
  return {state_, false};
}

}  // namespace latent::server
