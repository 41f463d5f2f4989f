#include "server/openai_format.h"

#include <cmath>

namespace latent::server {

namespace {

ojson bytes_array(const std::string& b) {
  ojson a = ojson::array();
  for (unsigned char c : b) a.push_back(static_cast<int>(c));
  return a;
}

std::string piece(const TextCodec& codec, int32_t id) {
  const int32_t ids[1] = {id};
  return codec.decode(ids, false);
}

std::string raw_bytes(const TextCodec& codec, int32_t id) {
  return codec.byte_level() ? codec.token_bytes(id) : piece(codec, id);
}

// JSON cannot hold -inf: a token with zero probability reports a very low finite value (as vLLM does).
double finite(float v) { return std::isfinite(v) ? static_cast<double>(v) : -9999.0; }

void put_reasoning(ojson& o, const std::string* text, const FormatOptions& f) {
  if (!f.include_reasoning) return;
  const ojson v = text ? ojson(*text) : ojson(nullptr);
  if (f.reasoning_field != ReasoningField::Reasoning) o["reasoning_content"] = v;
  if (f.reasoning_field != ReasoningField::ReasoningContent) o["reasoning"] = v;
}

}  // namespace

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t reasoning_tokens, int64_t cached) {
  ojson u = ojson::object();
  u["prompt_tokens"] = prompt_tokens;
  u["completion_tokens"] = completion_tokens;
  u["total_tokens"] = prompt_tokens + completion_tokens;
  u["prompt_tokens_details"] = ojson{{"cached_tokens", cached}};
  u["completion_tokens_details"] = ojson{{"reasoning_tokens", reasoning_tokens}};
  return u;
}

ojson usage_of(const RequestState& st, int64_t prompt_tokens) {
  int64_t comp = 0, reas = 0;
  for (int i = 0; i < st.n_choices(); ++i) {
    comp += st.output(i).completion_tokens();
    reas += st.output(i).reasoning_tokens();
  }
  return usage_json(prompt_tokens, comp, reas, st.cached_tokens());
}

ojson chat_logprobs_json(const std::vector<LogprobEntry>& entries, const TextCodec& codec) {
  ojson content = ojson::array();
  for (const auto& e : entries) {
    ojson o = ojson::object();
    o["token"] = piece(codec, e.token);
    o["logprob"] = finite(e.logprob);
    o["bytes"] = bytes_array(raw_bytes(codec, e.token));
    ojson top = ojson::array();
    for (auto [id, lp] : e.top)
      top.push_back(
          ojson{{"token", piece(codec, id)}, {"logprob", finite(lp)}, {"bytes", bytes_array(raw_bytes(codec, id))}});
    o["top_logprobs"] = std::move(top);
    content.push_back(std::move(o));
  }
  return ojson{{"content", std::move(content)}};
}

ojson completion_logprobs_json(const std::vector<LogprobEntry>& entries, const TextCodec& codec, size_t offset) {
  ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array(), offs = ojson::array();
  for (const auto& e : entries) {
    const std::string t = piece(codec, e.token);
    tokens.push_back(t);
    if (e.null_logprob) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
    } else {
      lps.push_back(finite(e.logprob));
      ojson m = ojson::object();
      for (auto [id, lp] : e.top) m[piece(codec, id)] = finite(lp);
      tops.push_back(std::move(m));
    }
    offs.push_back(offset);
    offset += t.size();
  }
  return ojson{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

ojson chat_response(const ResponseHeader& h, const RequestState& st, int64_t prompt_tokens, bool logprobs,
                    const FormatOptions& f, const TextCodec& codec) {
  ojson choices = ojson::array();
  for (int i = 0; i < st.n_choices(); ++i) {
    const ChoiceOutput& o = st.output(i);
    ojson msg = ojson::object();
    msg["role"] = "assistant";
    msg["content"] = o.content().empty() ? ojson(nullptr) : ojson(o.content());
    put_reasoning(msg, o.reasoning().empty() ? nullptr : &o.reasoning(), f);
    if (!o.calls().empty()) {
      ojson calls = ojson::array();
      for (size_t k = 0; k < o.calls().size(); ++k)
        calls.push_back(ojson{{"id", o.call_ids()[k]},
                              {"type", "function"},
                              {"function", ojson{{"name", o.calls()[k].name}, {"arguments", o.calls()[k].arguments}}}});
      msg["tool_calls"] = std::move(calls);
    }
    msg["refusal"] = nullptr;
    ojson c = ojson::object();
    c["index"] = i;
    c["message"] = std::move(msg);
    c["logprobs"] = logprobs ? chat_logprobs_json(o.all_logprobs(), codec) : ojson(nullptr);
    c["finish_reason"] = o.finish_reason();
    choices.push_back(std::move(c));
  }
  ojson r = ojson::object();
  r["id"] = h.id;
  r["object"] = "chat.completion";
  r["created"] = h.created;
  r["model"] = h.model;
  r["system_fingerprint"] = h.fingerprint;
  r["choices"] = std::move(choices);
  r["usage"] = usage_of(st, prompt_tokens);
  return r;
}

ojson completion_response(const ResponseHeader& h, const RequestState& st, int64_t prompt_tokens, bool logprobs,
                          const TextCodec& codec) {
  ojson choices = ojson::array();
  for (int i = 0; i < st.n_choices(); ++i) {
    const ChoiceOutput& o = st.output(i);
    ojson c = ojson::object();
    c["index"] = i;
    c["text"] = o.content();
    c["logprobs"] = logprobs ? completion_logprobs_json(o.all_logprobs(), codec) : ojson(nullptr);
    c["finish_reason"] = o.finish_reason();
    choices.push_back(std::move(c));
  }
  ojson r = ojson::object();
  r["id"] = h.id;
  r["object"] = "text_completion";
  r["created"] = h.created;
  r["model"] = h.model;
  r["system_fingerprint"] = h.fingerprint;
  r["choices"] = std::move(choices);
  r["usage"] = usage_of(st, prompt_tokens);
  return r;
}

ojson chat_delta(const ChoiceDelta& d, const FormatOptions& f) {
  ojson delta = ojson::object();
  if (!d.reasoning.empty()) put_reasoning(delta, &d.reasoning, f);
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.tool_calls.empty()) {
    ojson calls = ojson::array();
    for (const auto& t : d.tool_calls) {
      ojson c = ojson::object();
      c["index"] = t.index;
      if (t.first) {
        c["id"] = t.id;
        c["type"] = "function";
        c["function"] = ojson{{"name", t.name}, {"arguments", ""}};
      } else {
        c["function"] = ojson{{"arguments", t.arguments}};
      }
      calls.push_back(std::move(c));
    }
    delta["tool_calls"] = std::move(calls);
  }
  return delta;
}

ojson chat_chunk(const ResponseHeader& h, int index, ojson delta, ojson logprobs, const char* finish_reason,
                 const FormatOptions& f) {
  ojson c = ojson::object();
  c["index"] = index;
  c["delta"] = std::move(delta);
  c["logprobs"] = std::move(logprobs);
  c["finish_reason"] = finish_reason ? ojson(finish_reason) : ojson(nullptr);
  ojson r = ojson::object();
  r["id"] = h.id;
  r["object"] = "chat.completion.chunk";
  r["created"] = h.created;
  r["model"] = h.model;
  r["system_fingerprint"] = h.fingerprint;
  r["choices"] = ojson::array({std::move(c)});
  if (f.include_usage) r["usage"] = nullptr;
  return r;
}

ojson completion_chunk(const ResponseHeader& h, int index, const std::string& text, ojson logprobs,
                       const char* finish_reason, const FormatOptions& f) {
  ojson c = ojson::object();
  c["index"] = index;
  c["text"] = text;
  c["logprobs"] = std::move(logprobs);
  c["finish_reason"] = finish_reason ? ojson(finish_reason) : ojson(nullptr);
  ojson r = ojson::object();
  r["id"] = h.id;
  r["object"] = "text_completion";
  r["created"] = h.created;
  r["model"] = h.model;
  r["system_fingerprint"] = h.fingerprint;
  r["choices"] = ojson::array({std::move(c)});
  if (f.include_usage) r["usage"] = nullptr;
  return r;
}

ojson usage_chunk(const ResponseHeader& h, bool chat, ojson usage) {
  ojson r = ojson::object();
  r["id"] = h.id;
  r["object"] = chat ? "chat.completion.chunk" : "text_completion";
  r["created"] = h.created;
  r["model"] = h.model;
  r["system_fingerprint"] = h.fingerprint;
  r["choices"] = ojson::array();
  r["usage"] = std::move(usage);
  return r;
}

std::string sse_data(const ojson& j) {
  return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

}  // namespace latent::server
