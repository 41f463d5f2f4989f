// POST /v1/chat/completions and /v1/completions: validation (docs/api.md §validation-order) and submission on a worker
// thread, then a GenerationRun that the connection drives without blocking: the whole JSON response when all choices
// finished, or an SSE stream (docs/api.md §streaming) written as the engine produces it.
#include <chrono>
#include <ctime>

#include "server/http_internal.h"

namespace latent::server {

namespace {

const char* abort_code(AbortReason r) {
  switch (r) {
    case AbortReason::QueueTimeout: return "server_is_overloaded";
    case AbortReason::Timeout: return "request_timeout";
    case AbortReason::Shutdown: return "draining";
    case AbortReason::EngineError: return "internal_error";
  }
  return "internal_error";
}

ApiError abort_error(const StreamEvent& e) {
  switch (e.abort) {
    case AbortReason::QueueTimeout: return overloaded_error(e.message);
    case AbortReason::Timeout: return server_error(504, "request_timeout", e.message);
    case AbortReason::Shutdown: return server_error(503, "draining", "The server is shutting down.");
    case AbortReason::EngineError: break;
  }
  return server_error(500, "internal_error", "Internal server error.");
}

std::string error_event(const char* code, const std::string& message) {
  ojson e = ojson::object();
  e["message"] = message;
  e["type"] = "server_error";
  e["param"] = nullptr;
  e["code"] = code;
  return sse_data(ojson{{"error", e}}) + "data: [DONE]\n\n";
}

ResponseHeader make_header(const Service& svc, const std::string& prefix, const std::string& model) {
  ResponseHeader h;
  h.id = prefix + random_hex(32);
  h.created = static_cast<int64_t>(std::time(nullptr));
  h.model = model;
  h.fingerprint = svc.info().fingerprint;
  return h;
}

}  // namespace

GenerationRun::GenerationRun(HttpContext& ctx, std::shared_ptr<Service> svc, GenerationJob job, bool stream)
    : ctx_(ctx),
      svc_(std::move(svc)),
      job_(std::move(job)),
      stream_(stream),
      t0_(Clock::now()),
      last_write_(t0_),
      ping_s_(ctx.opt.sse_ping_interval_s) {
  ctx_.active_generations.fetch_add(1);
  text_offset_.assign(static_cast<size_t>(job_.n_choices), 0);
}

GenerationRun::~GenerationRun() {
  job_.state->set_notify(nullptr);
  if (!done_) job_.cancel();
  ctx_.active_generations.fetch_sub(1);
}

void GenerationRun::set_notify(std::function<void()> f) { job_.state->set_notify(std::move(f)); }

size_t GenerationRun::backlog() const { return job_.state->backlog(); }

void GenerationRun::cancel() {
  if (done_ || cancelled_) return;
  cancelled_ = true;
  job_.cancel();
}

Clock::time_point GenerationRun::next_wakeup() const {
  if (!stream_ || done_ || ping_s_ <= 0) return Clock::time_point::max();
  const auto ping = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(ping_s_));
  return (started_ ? last_write_ : t0_) + ping;
}

void GenerationRun::count_finished() {
  if (counted_) return;
  counted_ = true;
  const RequestState& st = *job_.state;
  if (st.n_choices() > 0) ctx_.metrics.request_success.inc(st.output(0).finish_reason());
  for (int i = 0; i < st.n_choices(); ++i) {
    ctx_.metrics.choice_success.inc(st.output(i).finish_reason());
    ctx_.metrics.reasoning_tokens.inc(static_cast<uint64_t>(st.output(i).reasoning_tokens()));
  }
}

AccessInfo GenerationRun::access() const {
  AccessInfo a;
  a.prompt_tokens = job_.prompt_tokens;
  a.cached_tokens = job_.state->cached_tokens();  // prompt tokens served from the prefix cache
  if (job_.state->spec_proposed() > 0) a.spec_accepted_tokens = job_.state->spec_accepted();
  const RequestState& st = *job_.state;
  if (auto t = st.first_token_time()) a.ttft_s = std::chrono::duration<double>(*t - t0_).count();
  a.stream = stream_;
  a.completion_tokens = st.generated_tokens();
  // A JSON answer carries every token or, not written, none (the connection corrects it when the write fails).
  a.sent_tokens = stream_ ? sent_tokens_ : done_ && st.all_finished() ? a.completion_tokens : 0;
  if (st.all_finished()) {
    for (int i = 0; i < st.n_choices(); ++i) {
      const std::string& why = st.output(i).finish_reason();
      if (a.finish_reason.find(why) == std::string::npos) a.finish_reason += (a.finish_reason.empty() ? "" : ",") + why;
    }
  } else if (auto ab = st.abort_event()) {
    a.finish_reason = std::string("abort:") + abort_code(ab->abort);
  } else if (cancelled_) {
    a.finish_reason = "cancelled";
  }
  return a;
}

void GenerationRun::convert(std::vector<StreamEvent>& ev, std::string& out) {
  for (auto& e : ev) {
    if (done_) break;
    in_flight_tokens_ += e.tokens;
    switch (e.kind) {
      case StreamEvent::Kind::Delta:
        if (chat) {
          ojson delta = chat_delta(e.delta, format);
          const bool lp = logprobs && !e.delta.logprobs.empty();
          if (delta.empty() && !lp) break;
          out += sse_data(chat_chunk(header, e.choice, std::move(delta),
                                     lp ? chat_logprobs_json(e.delta.logprobs, svc_->codec()) : ojson(nullptr), nullptr,
                                     format));
        } else {
          if (e.delta.content.empty() && e.delta.logprobs.empty()) break;
          ojson lp = nullptr;
          auto& off = text_offset_[static_cast<size_t>(e.choice)];
          if (logprobs) lp = completion_logprobs_json(e.delta.logprobs, svc_->codec(), off);
          off += e.delta.content.size();
          out += sse_data(completion_chunk(header, e.choice, e.delta.content, std::move(lp), nullptr, format));
        }
        break;
      case StreamEvent::Kind::Finish:
        if (chat)
          out += sse_data(chat_chunk(header, e.choice, ojson::object(), nullptr, e.finish_reason.c_str(), format));
        else
          out += sse_data(completion_chunk(header, e.choice, "", nullptr, e.finish_reason.c_str(), format));
        ++finished_;
        break;
      case StreamEvent::Kind::Abort:
        out += error_event(abort_code(e.abort),
                           e.abort == AbortReason::EngineError ? "Internal server error." : e.message);
        done_ = true;
        break;
    }
  }
  ev.clear();
  if (!done_ && finished_ >= job_.n_choices) {
    count_finished();
    if (format.include_usage) out += sse_data(usage_chunk(header, chat, usage_of(*job_.state, job_.prompt_tokens)));
    out += "data: [DONE]\n\n";
    done_ = true;
  }
}

GenerationRun::Poll GenerationRun::poll(HttpResponse& res, std::string& out, Clock::time_point now) {
  if (done_) return Poll::Pending;
  std::vector<StreamEvent> ev;
  job_.state->take(ev);
  if (!stream_) {
    for (const auto& e : ev)
      if (e.kind == StreamEvent::Kind::Abort) {
        done_ = true;
        send_error(res, abort_error(e));
        return Poll::Respond;
      }
    if (!job_.state->all_finished()) return Poll::Pending;
    done_ = true;
    count_finished();
    if (chat)
      send_json(res, chat_response(header, *job_.state, job_.prompt_tokens, logprobs, format, svc_->codec()));
    else
      send_json(res, completion_response(header, *job_.state, job_.prompt_tokens, logprobs, svc_->codec()));
    return Poll::Respond;
  }
  if (!started_) {
    // SSE headers go out when the request is scheduled or the first ping is due (docs/api.md §scheduling); until then
    // errors keep their HTTP status.
    for (auto& e : ev) {
      if (e.kind == StreamEvent::Kind::Abort) {
        done_ = true;
        send_error(res, abort_error(e));
        return Poll::Respond;
      }
      pending_.push_back(std::move(e));
    }
    ev.clear();
    const bool ping_due = ping_s_ > 0 && now >= next_wakeup();
    if (!job_.state->scheduled() && !ping_due) return Poll::Pending;
    started_ = true;
    res.status = 200;
    res.content_type = "text/event-stream; charset=utf-8";
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    if (chat)
      for (int i = 0; i < job_.n_choices; ++i)
        out += sse_data(chat_chunk(header, i, ojson{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr, format));
    convert(pending_, out);
    last_write_ = now;
    return Poll::Stream;
  }
  convert(ev, out);
  if (out.empty() && ping_s_ > 0 && now >= next_wakeup()) out = ": ping\n\n";
  if (out.empty()) return Poll::Pending;
  last_write_ = now;
  return Poll::Stream;
}

void handle_chat(HttpContext& ctx, HttpRequest& req, HttpResponse& res) {
  guarded(ctx, res, [&] {
    auto svc = ctx.ready_service();
    ChatRequest r;
    {
      const ojson body = parse_json_body(req.body);
      std::string().swap(req.body);  // the parsed JSON replaces the bytes
      r = parse_chat_request(body, svc->validation());
    }
    if (r.c.unknown_fields) ctx.metrics.unknown_fields.inc(static_cast<uint64_t>(r.c.unknown_fields));
    GenerationJob job = svc->start_chat(r);
    auto run = std::make_shared<GenerationRun>(ctx, svc, std::move(job), r.c.stream);
    run->header = make_header(*svc, "chatcmpl-", r.c.model);
    run->format.include_reasoning = r.include_reasoning;
    run->format.reasoning_field = ctx.opt.reasoning_field;
    run->format.include_usage = r.c.stream && r.c.include_usage;
    run->chat = true;
    run->logprobs = r.logprobs;
    res.generation = std::move(run);
  });
}

void handle_completions(HttpContext& ctx, HttpRequest& req, HttpResponse& res) {
  guarded(ctx, res, [&] {
    auto svc = ctx.ready_service();
    CompletionRequest r;
    {
      const ojson body = parse_json_body(req.body);
      std::string().swap(req.body);
      r = parse_completion_request(body, svc->validation());
    }
    if (r.c.unknown_fields) ctx.metrics.unknown_fields.inc(static_cast<uint64_t>(r.c.unknown_fields));
    GenerationJob job = svc->start_completion(r);
    auto run = std::make_shared<GenerationRun>(ctx, svc, std::move(job), r.c.stream);
    run->header = make_header(*svc, "cmpl-", r.c.model);
    run->format.include_usage = r.c.stream && r.c.include_usage;
    run->chat = false;
    run->logprobs = r.logprobs.has_value();
    res.generation = std::move(run);
  });
}

}  // namespace latent::server
