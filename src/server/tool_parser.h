// Tool-call parsers over the content text (docs/api.md §tools), streaming: feed() takes text pieces in
// generation order and returns the visible text that can be shown now plus every call that just completed; text
// that may still turn into markup is held back. A call is reported only once it is complete, so streaming and
// non-streaming give the same calls, and an unterminated call at the end is returned as raw text (docs/api.md §tools).
//
// Formats:
//  - Glm47: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call> (whitespace tolerated around
//    NAME and between elements). V is typed by the tool's JSON schema: declared "string" (or unknown and not valid
//    JSON) stays a string, anything else is parsed as JSON.
//  - DeepSeek: <｜tool▁calls▁begin｜> then per call <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```
//    <｜tool▁call▁end｜> (V3 / R1) or <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜> (V3.1), then
//    <｜tool▁calls▁end｜>.
// `arguments` is the JSON object serialized like Python's json.dumps(ensure_ascii=False): ", " and ": ".
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace latent::server {

enum class ToolFormat { None, Glm47, DeepSeek };
const char* tool_format_name(ToolFormat f);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON object text
};

class ToolParser {
 public:
  virtual ~ToolParser() = default;
  struct Out {
    std::string content;
    std::vector<ToolCall> calls;
  };
  virtual void feed(std::string_view text, Out& out) = 0;
  // End of generation: held-back text and any unterminated markup become content.
  virtual void finish(Out& out) = 0;
};

// tools: the request's tools array (for value typing); may be null.
std::unique_ptr<ToolParser> make_tool_parser(ToolFormat f, const nlohmann::ordered_json& tools);

// Python json.dumps(value, ensure_ascii=False) layout.
std::string py_json_dumps(const nlohmann::ordered_json& v);

// Length of the longest suffix of `text` that is a proper prefix of `marker` (0 if none).
size_t partial_suffix(std::string_view text, std::string_view marker);

}  // namespace latent::server
