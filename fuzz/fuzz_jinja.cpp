// libFuzzer target for the Jinja lexer / parser / interpreter.
// Input: template source, optionally followed by a NUL byte and a JSON object used as the render context
// (without one, a small chat-like context with messages and tools is used). Every failure must be a
// latent::Error; anything else (crash, sanitizer report, other exception, leak) is a bug.
//   seeds: tests/data/jinja/templates/*.jinja, tests/data/jinja/glm5.jinja, the "template" fields of
//   tests/data/jinja/snippets.jsonl
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "jinja/template.h"

namespace {

const nlohmann::ordered_json& default_context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true, "documents": null,
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather \u00e9",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi <think> {{ x }}"},
      {"role": "assistant", "content": "<think>r</think>ok", "reasoning_content": "hmm",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": 1.5}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
      {"role": "user", "content": [{"type": "text", "text": "parts"}, {"type": "image"}]}]
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view src = in.substr(0, nul);
  nlohmann::ordered_json ctx = default_context();
  if (nul != std::string_view::npos) {
    auto parsed = nlohmann::ordered_json::parse(in.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) ctx = std::move(parsed);
  }
  latent::jinja::RenderOptions opt;
  opt.limits.max_steps = 20000;
  opt.limits.max_output = 1 << 20;
  opt.limits.max_call_depth = 64;
  opt.now = [] {
    std::tm tm{};
    tm.tm_year = 125;
    tm.tm_mday = 1;
    return tm;
  };
  try {
    const latent::jinja::Template t(src, "fuzz");
    (void)t.render(ctx, opt);
  } catch (const latent::Error&) {
  }
  return 0;
}
