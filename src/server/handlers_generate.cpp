// POST /v1/chat/completions and /v1/completions: validation (spec api.md §3.4 order), submission, then either the
// whole JSON response (watching the socket for a disconnect while waiting, §11.4) or an SSE stream (§5.12, §6.5).
#include <chrono>
#include <ctime>

#include "server/http_internal.h"
#include "server/socket_watch.h"

namespace latent::server {

using httplib::Request;
using httplib::Response;
using namespace std::chrono_literals;

namespace {

struct ActiveGuard {
  explicit ActiveGuard(std::atomic<int>& c) : c_(&c) { c_->fetch_add(1); }
  ~ActiveGuard() {
    if (c_) c_->fetch_sub(1);
  }
  void release() { c_ = nullptr; }
  std::atomic<int>* c_;
};

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

void count_finished(HttpContext& ctx, const RequestState& st) {
  for (int i = 0; i < st.n_choices(); ++i) {
    ctx.metrics.request_success.inc(st.output(i).finish_reason());
    ctx.metrics.reasoning_tokens.inc(static_cast<uint64_t>(st.output(i).reasoning_tokens()));
  }
}

// Waits for the whole request. False when the client went away (the job is cancelled).
bool wait_done(const GenerationJob& job, const Request& req) {
  PeerWatch watch(req.remote_addr, req.remote_port, req.local_port);
  std::vector<StreamEvent> ev;
  while (true) {
    ev.clear();
    job.state->wait(ev, 50ms);
    for (const auto& e : ev)
      if (e.kind == StreamEvent::Kind::Abort) throw abort_error(e);
    if (job.state->all_finished()) return true;
    if (watch.closed()) {
      job.cancel();
      return false;
    }
  }
}

struct StreamCtx {
  HttpContext* ctx = nullptr;
  std::shared_ptr<Service> svc;  // kept alive while the stream runs
  GenerationJob job;
  ResponseHeader h;
  FormatOptions f;
  bool chat = true;
  bool logprobs = false;
  std::vector<StreamEvent> pending;
  std::vector<size_t> text_offset;
  bool started = false, done = false;
  int finished = 0;
  std::unique_ptr<PeerWatch> watch;
  Clock::time_point last_write = Clock::now();
  double ping_s = 15;
};

std::string error_event(const char* code, const std::string& message) {
  ojson e = ojson::object();
  e["message"] = message;
  e["type"] = "server_error";
  e["param"] = nullptr;
  e["code"] = code;
  return sse_data(ojson{{"error", e}}) + "data: [DONE]\n\n";
}

// One call of the chunked content provider: writes what is available (waiting up to 50 ms). False ends the
// connection (client gone).
bool pump(StreamCtx& sc, httplib::DataSink& sink) {
  std::string out;
  if (!sc.started) {
    sc.started = true;
    if (sc.chat)
      for (int i = 0; i < sc.job.n_choices; ++i)
        out += sse_data(chat_chunk(sc.h, i, ojson{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr, sc.f));
  }
  if (sc.pending.empty() && out.empty()) sc.job.state->wait(sc.pending, 50ms);
  for (auto& e : sc.pending) {
    if (sc.done) break;
    switch (e.kind) {
      case StreamEvent::Kind::Delta:
        if (sc.chat) {
          ojson delta = chat_delta(e.delta, sc.f);
          const bool lp = sc.logprobs && !e.delta.logprobs.empty();
          if (delta.empty() && !lp) break;
          out += sse_data(chat_chunk(sc.h, e.choice, std::move(delta),
                                     lp ? chat_logprobs_json(e.delta.logprobs, sc.svc->codec()) : ojson(nullptr),
                                     nullptr, sc.f));
        } else {
          if (e.delta.content.empty() && e.delta.logprobs.empty()) break;
          ojson lp = nullptr;
          auto& off = sc.text_offset[static_cast<size_t>(e.choice)];
          if (sc.logprobs) lp = completion_logprobs_json(e.delta.logprobs, sc.svc->codec(), off);
          off += e.delta.content.size();
          out += sse_data(completion_chunk(sc.h, e.choice, e.delta.content, std::move(lp), nullptr, sc.f));
        }
        break;
      case StreamEvent::Kind::Finish:
        if (sc.chat) out += sse_data(chat_chunk(sc.h, e.choice, ojson::object(), nullptr, e.finish_reason.c_str(), sc.f));
        else out += sse_data(completion_chunk(sc.h, e.choice, "", nullptr, e.finish_reason.c_str(), sc.f));
        ++sc.finished;
        break;
      case StreamEvent::Kind::Abort:
        out += error_event(abort_code(e.abort), e.abort == AbortReason::EngineError ? "Internal server error." : e.message);
        sc.done = true;
        break;
    }
  }
  sc.pending.clear();
  if (!sc.done && sc.finished >= sc.job.n_choices) {
    count_finished(*sc.ctx, *sc.job.state);
    if (sc.f.include_usage) out += sse_data(usage_chunk(sc.h, sc.chat, usage_of(*sc.job.state, sc.job.prompt_tokens)));
    out += "data: [DONE]\n\n";
    sc.done = true;
  }
  const auto now = Clock::now();
  if (out.empty() && sc.ping_s > 0 && std::chrono::duration<double>(now - sc.last_write).count() >= sc.ping_s)
    out = ": ping\n\n";
  if (!out.empty()) {
    if (!sink.write(out.data(), out.size())) {
      sc.job.cancel();
      return false;
    }
    sc.last_write = now;
  }
  if (sc.done) {
    sink.done();
    return true;
  }
  if (sc.watch && sc.watch->closed()) {
    sc.job.cancel();
    return false;
  }
  return true;
}

void start_stream(HttpContext& ctx, const Request& req, Response& res, std::shared_ptr<StreamCtx> sc, ActiveGuard& guard) {
  sc->ctx = &ctx;
  sc->ping_s = ctx.opt.sse_ping_interval_s;
  sc->text_offset.assign(static_cast<size_t>(sc->job.n_choices), 0);
  sc->watch = std::make_unique<PeerWatch>(req.remote_addr, req.remote_port, req.local_port);
  // SSE headers go out when the request is scheduled or the first ping is due (§11.3); until then errors keep
  // their HTTP status.
  const auto t0 = Clock::now();
  while (true) {
    std::vector<StreamEvent> ev;
    sc->job.state->wait(ev, 50ms, /*wait_scheduled=*/true);
    for (auto& e : ev) {
      if (e.kind == StreamEvent::Kind::Abort) throw abort_error(e);
      sc->pending.push_back(std::move(e));
    }
    if (sc->job.state->scheduled()) break;
    if (sc->ping_s > 0 && std::chrono::duration<double>(Clock::now() - t0).count() >= sc->ping_s) break;
    if (sc->watch->closed()) {
      sc->job.cancel();
      res.status = 499;
      return;
    }
  }
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  std::atomic<int>* active = guard.c_;
  guard.release();
  res.set_chunked_content_provider(
      "text/event-stream; charset=utf-8", [sc](size_t, httplib::DataSink& sink) { return pump(*sc, sink); },
      [sc, active](bool) {
        if (!sc->done) sc->job.cancel();
        active->fetch_sub(1);
      });
}

ResponseHeader header(const Service& svc, const std::string& prefix, const std::string& model) {
  ResponseHeader h;
  h.id = prefix + random_hex(32);
  h.created = static_cast<int64_t>(std::time(nullptr));
  h.model = model;
  h.fingerprint = svc.info().fingerprint;
  return h;
}

}  // namespace

void handle_chat(HttpContext& ctx, const Request& req, Response& res) {
  ActiveGuard guard(ctx.active_generations);
  guarded(ctx, res, [&] {
    auto svc = ctx.ready_service();
    const ojson body = parse_json_body(req.body);
    ChatRequest r = parse_chat_request(body, svc->validation());
    if (r.c.unknown_fields) ctx.metrics.unknown_fields.inc(static_cast<uint64_t>(r.c.unknown_fields));
    auto sc = std::make_shared<StreamCtx>();
    sc->job = svc->start_chat(r);
    sc->svc = svc;
    sc->h = header(*svc, "chatcmpl-", r.c.model);
    sc->f.include_reasoning = r.include_reasoning;
    sc->f.reasoning_field = ctx.opt.reasoning_field;
    sc->f.include_usage = r.c.stream && r.c.include_usage;
    sc->chat = true;
    sc->logprobs = r.logprobs;
    if (r.c.stream) return start_stream(ctx, req, res, sc, guard);
    if (!wait_done(sc->job, req)) {
      res.status = 499;
      return;
    }
    count_finished(ctx, *sc->job.state);
    send_json(res, chat_response(sc->h, *sc->job.state, sc->job.prompt_tokens, r.logprobs, sc->f, svc->codec()));
  });
}

void handle_completions(HttpContext& ctx, const Request& req, Response& res) {
  ActiveGuard guard(ctx.active_generations);
  guarded(ctx, res, [&] {
    auto svc = ctx.ready_service();
    const ojson body = parse_json_body(req.body);
    CompletionRequest r = parse_completion_request(body, svc->validation());
    if (r.c.unknown_fields) ctx.metrics.unknown_fields.inc(static_cast<uint64_t>(r.c.unknown_fields));
    auto sc = std::make_shared<StreamCtx>();
    sc->job = svc->start_completion(r);
    sc->svc = svc;
    sc->h = header(*svc, "cmpl-", r.c.model);
    sc->f.include_usage = r.c.stream && r.c.include_usage;
    sc->chat = false;
    sc->logprobs = r.logprobs.has_value();
    if (r.c.stream) return start_stream(ctx, req, res, sc, guard);
    if (!wait_done(sc->job, req)) {
      res.status = 499;
      return;
    }
    count_finished(ctx, *sc->job.state);
    send_json(res, completion_response(sc->h, *sc->job.state, sc->job.prompt_tokens, sc->logprobs, svc->codec()));
  });
}

}  // namespace latent::server
