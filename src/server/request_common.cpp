// Shared request pieces: JSON body parsing, the sampling fields common to chat and completions, model lookup.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "server/json_fields.h"
#include "server/request_common.h"

namespace latent::server {

using namespace fields;

namespace {

// The DOM builder of nlohmann::json, but every rejection (syntax, bad UTF-8, a number that overflows a double)
// becomes 400 invalid_json naming the byte position instead of an exception type the handlers do not expect.
class BodySax : public nlohmann::detail::json_sax_dom_parser<ojson> {
 public:
  explicit BodySax(ojson& root) : nlohmann::detail::json_sax_dom_parser<ojson>(root, /*allow_exceptions=*/true) {}
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& last_token, const Exception& ex) {
    std::string what = ex.what();
    // nlohmann prefixes "[json.exception.parse_error.101] "; keep the human part.
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    if (what.find("line ") == std::string::npos) what = fmt::format("{} at byte {}", what, position);
    (void)last_token;
    throw invalid_json_error(what);
  }
};

}  // namespace

ojson parse_json_body(std::string_view body) {
  ojson j;
  BodySax sax(j);
  try {
    ojson::sax_parse(body.begin(), body.end(), &sax, nlohmann::json::input_format_t::json, /*strict=*/true);
  } catch (const nlohmann::json::exception& e) {  // anything the builder itself throws
    std::string what = e.what();
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    throw invalid_json_error(what);
  }
  if (!j.is_object()) throw invalid_json_error("the body is not a JSON object");
  return j;
}

std::string resolve_model(const std::string& model, bool given, const ValidationContext& ctx) {
  if (!given) return ctx.served_names.empty() ? std::string() : ctx.served_names.front();
  for (const auto& n : ctx.served_names)
    if (n == model) return n;
  throw model_not_found_error(model);
}

namespace detail {

void parse_model_field(const ojson& b, CommonParams& c) {
  if (auto m = opt_string(b, "model", "model")) {
    c.model = *m;
    c.model_given = true;
  }
}

void parse_stream_fields(const ojson& b, CommonParams& c) {
  c.stream = opt_bool(b, "stream", "stream").value_or(false);
  if (const ojson* so = get(b, "stream_options")) {
    if (!so->is_object()) invalid_type("stream_options", "an object");
    c.include_usage = opt_bool(*so, "include_usage", "stream_options.include_usage").value_or(false);
  }
}

void parse_max_tokens(const ojson& b, CommonParams& c, bool chat, bool allow_zero) {
  std::optional<int64_t> mct, mt;
  if (chat) {
    mct = opt_int(b, "max_completion_tokens", "max_completion_tokens");
    if (mct && *mct < 1)
      invalid_value("max_completion_tokens", fmt::format("'max_completion_tokens' must be >= 1 (got {}).", *mct));
  }
  mt = opt_int(b, "max_tokens", "max_tokens");
  if (mt && *mt < (allow_zero ? 0 : 1))
    invalid_value("max_tokens", allow_zero ? fmt::format("'max_tokens' must be >= 0 (got {}).", *mt)
                                           : fmt::format("'max_tokens' must be >= 1 (got {}); 0 is allowed only with "
                                                         "'echo' on /v1/completions.",
                                                         *mt));
  if (mct) {
    c.max_tokens = mct;
    c.max_tokens_param = "max_completion_tokens";
  } else if (mt) {
    c.max_tokens = mt;
    c.max_tokens_param = "max_tokens";
  }
}

void parse_sampling_fields(const ojson& b, CommonParams& c, const ValidationContext& ctx) {
  if ((c.temperature = opt_number(b, "temperature", "temperature"))) range(*c.temperature, 0, 2, "temperature");
  if ((c.top_p = opt_number(b, "top_p", "top_p"))) range(*c.top_p, 0, 1, "top_p", /*lo_open=*/true);
  if ((c.top_k = opt_int(b, "top_k", "top_k"))) {
    const int64_t k = *c.top_k;
    if (k < -1 || (ctx.vocab_size > 0 && k > ctx.vocab_size))
      invalid_value("top_k",
                    fmt::format("'top_k' must be -1 or 0 (disabled) or in 1..{} (got {}).", ctx.vocab_size, k));
  }
  if ((c.min_p = opt_number(b, "min_p", "min_p"))) range(*c.min_p, 0, 1, "min_p");
  if ((c.presence_penalty = opt_number(b, "presence_penalty", "presence_penalty")))
    range(*c.presence_penalty, -2, 2, "presence_penalty");
  if ((c.frequency_penalty = opt_number(b, "frequency_penalty", "frequency_penalty")))
    range(*c.frequency_penalty, -2, 2, "frequency_penalty");
  if ((c.repetition_penalty = opt_number(b, "repetition_penalty", "repetition_penalty")))
    range(*c.repetition_penalty, 0, 2, "repetition_penalty", /*lo_open=*/true);
  if (const ojson* lb = get(b, "logit_bias")) {
    if (!lb->is_object()) invalid_type("logit_bias", "an object mapping token ids to numbers");
    if (lb->size() > 1024)
      invalid_value("logit_bias", fmt::format("'logit_bias' has {} entries; at most 1024 are allowed.", lb->size()));
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& key = it.key();
      const std::string p = "logit_bias." + key;
      int64_t id = -1;
      const bool digits = !key.empty() && key.size() <= 12 &&
                          std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      if (digits) id = std::stoll(key);
      if (!digits || id >= ctx.vocab_size)
        invalid_value("logit_bias",
                      fmt::format("'logit_bias' key '{}' is not a token id in [0, {}).", key, ctx.vocab_size));
      if (!it->is_number()) invalid_type(p, "a number");
      const double v = it->get<double>();
      if (v < -100 || v > 100)
        invalid_value("logit_bias",
                      fmt::format("'logit_bias' value for '{}' must be in [-100, 100] (got {}).", key, v));
      c.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(v));
    }
  }
}

void parse_n(const ojson& b, CommonParams& c, const ValidationContext& ctx) {
  if (auto n = opt_int(b, "n", "n")) {
    if (*n < 1 || *n > ctx.max_n) invalid_value("n", fmt::format("'n' must be in 1..{} (got {}).", ctx.max_n, *n));
    c.n = static_cast<int>(*n);
  }
}

void parse_stop_fields(const ojson& b, CommonParams& c, const ValidationContext& ctx) {
  c.seed = opt_int(b, "seed", "seed");
  if (const ojson* st = get(b, "stop")) {
    auto one = [&](const ojson& v, const std::string& p) {
      if (!v.is_string()) invalid_type(p, "a string");
      const std::string s = v.get<std::string>();
      if (s.empty() || s.size() > 256)
        invalid_value(p, fmt::format("'{}' must be 1..256 bytes (got {}).", p, s.size()));
      c.stop.push_back(s);
    };
    if (st->is_string()) {
      one(*st, "stop");
    } else if (st->is_array()) {
      if (st->size() > 16)
        invalid_value("stop", fmt::format("'stop' has {} entries; at most 16 are allowed.", st->size()));
      for (size_t i = 0; i < st->size(); ++i) one((*st)[i], index("stop", i));
    } else {
      invalid_type("stop", "a string or an array of strings");
    }
  }
  if (const ojson* ids = get(b, "stop_token_ids")) {
    if (!ids->is_array()) invalid_type("stop_token_ids", "an array of integers");
    if (ids->size() > 64)
      invalid_value("stop_token_ids",
                    fmt::format("'stop_token_ids' has {} entries; at most 64 are allowed.", ids->size()));
    for (size_t i = 0; i < ids->size(); ++i) {
      const std::string p = index("stop_token_ids", i);
      const int64_t id = as_int((*ids)[i], p);
      if (id < 0 || id >= ctx.vocab_size)
        invalid_value(p, fmt::format("'{}' = {} is not a token id in [0, {}).", p, id, ctx.vocab_size));
      c.stop_token_ids.push_back(static_cast<int32_t>(id));
    }
  }
  c.ignore_eos = opt_bool(b, "ignore_eos", "ignore_eos").value_or(false);
}

void count_unknown(const ojson& b, CommonParams& c, std::initializer_list<const char*> known) {
  std::set<std::string_view> k(known.begin(), known.end());
  for (auto it = b.begin(); it != b.end(); ++it)
    if (!k.count(it.key())) ++c.unknown_fields;
}

void reject_set(const ojson& b, const char* key, const char* why) {
  const ojson* v = get(b, key);
  if (!v) return;
  if ((v->is_boolean() && !v->get<bool>()) || (v->is_number() && v->get<double>() == 0)) return;
  unsupported(key, fmt::format("'{}' is not supported by this server{}.", key, why));
}

}  // namespace detail
}  // namespace latent::server
