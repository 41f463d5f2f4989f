// Test doubles for the server: a byte-level codec with the GLM added tokens and a tiny GLM-like template, and an
// engine that replays scripted outputs. A prompt containing "[[name]]" makes the engine emit the token script
// registered under that name (then <|endoftext|>); other prompts get letters derived from the history.
#pragma once
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../runtime/fake_paged_store.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "server/text_codec.h"

namespace latent::testing {

class FakeCodec : public server::TextCodec {
 public:
  FakeCodec() {
    const char* added[] = {"<|endoftext|>", "[gMASK]",         "<sop>",      "<|system|>",  "<|user|>",
                           "<|assistant|>", "<|observation|>", "<think>",    "</think>",    "<tool_call>",
                           "</tool_call>",  "<arg_key>",       "</arg_key>", "<arg_value>", "</arg_value>"};
    for (const char* a : added) added_.push_back(a);
  }
  static constexpr int32_t kEos = 256, kUser = 260, kAssistant = 261, kObservation = 262, kThink = 263, kThinkEnd = 264,
                           kToolCall = 265;
  std::vector<int32_t> encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
      int best = -1;
      size_t blen = 0;
      for (size_t k = 0; k < added_.size(); ++k)
        if (text.compare(i, added_[k].size(), added_[k]) == 0 && added_[k].size() > blen) {
          best = static_cast<int>(k);
          blen = added_[k].size();
        }
      if (best >= 0) {
        ids.push_back(256 + best);
        i += blen;
      } else {
        ids.push_back(static_cast<unsigned char>(text[i]));
        ++i;
      }
    }
    return ids;
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string b;
    for (int32_t id : ids)
      if (!(skip_special && is_special(id))) b += token_bytes(id);
    return b;  // tests use valid UTF-8 only through this path
  }
  bool byte_level() const override { return true; }
  std::string token_bytes(int32_t id) const override {
    if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
    if (id >= 256 && id < 256 + static_cast<int32_t>(added_.size())) return added_[static_cast<size_t>(id - 256)];
    return {};
  }
  std::string token_str(int32_t id) const override { return token_bytes(id); }
  bool is_special(int32_t id) const override { return id >= 256 && id <= 262; }
  std::optional<int32_t> token_id(std::string_view t) const override {
    for (size_t k = 0; k < added_.size(); ++k)
      if (added_[k] == t) return 256 + static_cast<int32_t>(k);
    return std::nullopt;
  }
  int64_t id_limit() const override { return 256 + static_cast<int64_t>(added_.size()); }
  bool has_chat_template() const override { return true; }
  std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools, bool add_gen,
                          const nlohmann::ordered_json& vars, const std::string* override_source) const override {
    std::string s = "[gMASK]<sop>";
    if (override_source) s += *override_source;
    if (tools.is_array()) s += "<|system|>TOOLS" + tools.dump();
    for (const auto& m : messages) {
      const std::string role = m["role"];
      const std::string content = m["content"].is_string() ? m["content"].get<std::string>() : "";
      if (content.find("{{fail}}") != std::string::npos) throw Error("template error: raise_exception('boom')");
      if (role == "assistant")
        s += "<|assistant|></think>" + content;
      else if (role == "tool")
        s += "<|observation|>" + content;
      else
        s += "<|" + role + "|>" + content;
    }
    if (add_gen) {
      const bool off = vars.contains("enable_thinking") && !vars["enable_thinking"].get<bool>();
      s += off ? "<|assistant|></think>" : "<|assistant|><think>";
    }
    return s;
  }

 private:
  std::vector<std::string> added_;
};

class ScriptEngine : public Engine {
 public:
  static constexpr int64_t kV = 280;
  int64_t vocab_size() const override { return kV; }
  int64_t kv_bytes_per_token() const override { return 64; }
  void copy_block(int32_t src, int32_t dst, int64_t n_tokens) override {
    std::lock_guard lk(mu_);
    store_.copy_block(src, dst, n_tokens);
  }
  void step(std::span<const EngineStepItem> items, float* logits) override {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    std::lock_guard lk(mu_);
    int64_t row = 0;
    for (const auto& it : items) {
      const std::vector<int32_t> hist = store_.apply(it);
      // The prompt length: known when a choice's cache was shared (its first item decodes right after the prompt)
      // or when the first logits are asked for (a prompt whose prefix came from the prefix cache starts later).
      auto [pl, first] = prompt_len_.try_emplace(it.seq, -1);
      if (first && it.start > 0 && it.decode) pl->second = it.start;
      if (!it.want_logits) continue;
      if (pl->second < 0) pl->second = static_cast<int64_t>(hist.size());
      float* r = logits + row * kV;
      for (int64_t v = 0; v < kV; ++v) r[v] = 0.0f;
      const int32_t nx = next(hist, pl->second);
      r[nx] = 40.0f;
      // a runner-up so that sampling with temperature has choices
      r[(nx + 1) % 256] = 9.0f;
      ++row;
    }
  }
  void set_script(const std::string& name, std::vector<int32_t> tokens) {
    std::lock_guard lk(mu_);
    scripts_[name] = std::move(tokens);
  }
  std::atomic<int> delay_ms{0};

 private:
  int32_t next(const std::vector<int32_t>& hist, int64_t prompt_len) const {
    std::string text;
    for (int64_t i = 0; i < prompt_len; ++i)
      if (hist[static_cast<size_t>(i)] < 256) text += static_cast<char>(hist[static_cast<size_t>(i)]);
    const int64_t k = static_cast<int64_t>(hist.size()) - prompt_len;
    for (const auto& [name, script] : scripts_)
      if (text.find("[[" + name + "]]") != std::string::npos)
        return k < static_cast<int64_t>(script.size()) ? script[static_cast<size_t>(k)] : 256;
    uint64_t x = 1469598103934665603ull;
    for (int32_t t : hist) x = (x ^ static_cast<uint64_t>(t)) * 1099511628211ull;
    return static_cast<int32_t>('a' + x % 26);
  }
  std::mutex mu_;
  FakePagedStore store_;
  std::map<SeqId, int64_t> prompt_len_;
  std::map<std::string, std::vector<int32_t>> scripts_;
};

// Token script from text: added tokens recognized, other bytes one token each.
inline std::vector<int32_t> script(const std::string& text) { return FakeCodec().encode(text, false); }

}  // namespace latent::testing
