// JSON shapes of the OpenAI responses (docs/api.md §usage, §response, §streaming, §logprobs, §completions): usage,
// logprobs, chat and completion responses and stream chunks.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "server/choice_output.h"
#include "server/request_state.h"
#include "server/text_codec.h"

namespace latent::server {

using ojson = nlohmann::ordered_json;

enum class ReasoningField { ReasoningContent, Reasoning, Both };

struct ResponseHeader {
  std::string id;       // chatcmpl-... / cmpl-...
  int64_t created = 0;  // Unix seconds
  std::string model;
  std::string fingerprint;
};

struct FormatOptions {
  bool include_reasoning = true;
  ReasoningField reasoning_field = ReasoningField::Both;
  bool include_usage = false;  // streaming: "usage": null on every chunk, then the usage chunk
};

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t reasoning_tokens, int64_t cached = 0);
// Totals over the choices of a finished request.
ojson usage_of(const RequestState& st, int64_t prompt_tokens);

ojson chat_logprobs_json(const std::vector<LogprobEntry>& entries, const TextCodec& codec);
// Legacy completions logprobs; text_offset starts at `offset`.
ojson completion_logprobs_json(const std::vector<LogprobEntry>& entries, const TextCodec& codec, size_t offset = 0);

ojson chat_response(const ResponseHeader& h, const RequestState& st, int64_t prompt_tokens, bool logprobs,
                    const FormatOptions& f, const TextCodec& codec);
ojson completion_response(const ResponseHeader& h, const RequestState& st, int64_t prompt_tokens, bool logprobs,
                          const TextCodec& codec);

// Stream chunks (one choice each).
ojson chat_chunk(const ResponseHeader& h, int index, ojson delta, ojson logprobs, const char* finish_reason,
                 const FormatOptions& f);
ojson chat_delta(const ChoiceDelta& d, const FormatOptions& f);
ojson completion_chunk(const ResponseHeader& h, int index, const std::string& text, ojson logprobs,
                       const char* finish_reason, const FormatOptions& f);
ojson usage_chunk(const ResponseHeader& h, bool chat, ojson usage);

// "data: <json>\n\n"
std::string sse_data(const ojson& j);

}  // namespace latent::server
