// Internal helpers shared by the chat and completion request parsers (request_common.cpp).
#pragma once
#include <initializer_list>

#include "server/request_schema.h"

namespace latent::server::detail {

void parse_model_field(const ojson& b, CommonParams& c);
void parse_stream_fields(const ojson& b, CommonParams& c);
// allow_zero: max_tokens 0 is valid (completions with echo: only the prompt is scored).
void parse_max_tokens(const ojson& b, CommonParams& c, bool chat, bool allow_zero = false);
// temperature, top_p, top_k, min_p, presence / frequency / repetition penalties, logit_bias
void parse_sampling_fields(const ojson& b, CommonParams& c, const ValidationContext& ctx);
void parse_n(const ojson& b, CommonParams& c, const ValidationContext& ctx);
// seed, stop, stop_token_ids, ignore_eos
void parse_stop_fields(const ojson& b, CommonParams& c, const ValidationContext& ctx);
// response_format, guided_json / guided_regex / guided_choice / guided_grammar, structured_outputs: at most one.
void parse_structured(const ojson& b, StructuredSpec& s);
void count_unknown(const ojson& b, CommonParams& c, std::initializer_list<const char*> known);
// 400 unsupported_parameter when the field is set to anything but null / false / 0.
void reject_set(const ojson& b, const char* key, const char* why);

}  // namespace latent::server::detail
