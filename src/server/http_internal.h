// Internal to the HTTP server: the request / response values handlers see, the shared state, the handler entry
// points (one file per group) and GenerationRun, the state of a generation that the connection drives after its
// handler returned (http_server.cpp owns the connections; handlers_generate.cpp the generation side).
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/log.h"
#include "server/api_error.h"
#include "server/host_memory.h"
#include "server/http_server.h"
#include "server/openai_format.h"

namespace latent::server {

enum class ServeState { Loading, Ready, Draining, Failed };

struct HttpRequest {
  std::string method;
  std::string path;        // target without the query
  std::string path_param;  // the {id} of /v1/models/{id}
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Case-insensitive header lookup; "" when absent.
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

class GenerationRun;

struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type;
  std::string body;
  bool close = false;                         // close the connection after this answer
  std::shared_ptr<GenerationRun> generation;  // set by the generation handlers: the connection drives it
  void set_header(std::string k, std::string v) { headers.emplace_back(std::move(k), std::move(v)); }
  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
  std::string header(std::string_view name) const;
};

struct HttpContext {
  HttpContext(HttpOptions o, Metrics& m) : opt(std::move(o)), metrics(m) {}
  HttpOptions opt;
  Metrics& metrics;
  mutable std::mutex mu;
  std::shared_ptr<Service> service;
  ServeState state = ServeState::Loading;
  std::atomic<int> active_generations{0};
  // Plain (non-streamed) responses whose write has not completed yet: shutdown waits for them too, so that their
  // access line is logged (a response written to the kernel but whose completion never ran lost its line).
  std::atomic<int> responses_writing{0};
  // Requests with a body of kLargeBody or more whose buffers are not freed yet: when the last one is done, the
  // allocator gives the freed memory back (server/host_memory.h).
  LargeRequestTracker large_requests;

  // The service when ready; else ApiError 503 model_loading / draining / engine_dead.
  std::shared_ptr<Service> ready_service() const;
  ServeState current_state() const {
    std::lock_guard lk(mu);
    return state;
  }
};

void send_json(HttpResponse& res, const nlohmann::ordered_json& j, int status = 200);
void send_error(HttpResponse& res, const ApiError& e);

// Cheap handlers run on the io threads; the ones that parse bodies or tokenize run on the worker pool.
void handle_chat(HttpContext& ctx, HttpRequest& req, HttpResponse& res);
void handle_completions(HttpContext& ctx, HttpRequest& req, HttpResponse& res);
void handle_models(HttpContext& ctx, HttpRequest& req, HttpResponse& res);
void handle_model(HttpContext& ctx, HttpRequest& req, HttpResponse& res);
void handle_health(HttpContext& ctx, HttpRequest& req, HttpResponse& res);
void handle_version(HttpContext& ctx, HttpRequest& req, HttpResponse& res);
void handle_metrics(HttpContext& ctx, HttpRequest& req, HttpResponse& res);
void handle_tokenize(HttpContext& ctx, HttpRequest& req, HttpResponse& res);
void handle_detokenize(HttpContext& ctx, HttpRequest& req, HttpResponse& res);

// Per-request figures for the access log line.
struct AccessInfo {
  // completion_tokens: generated (also for a request cancelled or aborted midway); sent_tokens: of those, the ones
  // whose output reached the client (a stream: the events of completed writes; a JSON answer: all or none).
  int64_t prompt_tokens = -1, cached_tokens = -1, completion_tokens = -1, sent_tokens = -1;
  bool stream = false;
  int64_t spec_accepted_tokens = -1;  // speculative decoding: draft tokens accepted (-1: speculation off)
  double ttft_s = -1;
  std::string finish_reason;
};

// A submitted generation request. The scheduler thread queues events in its RequestState (never blocking) and
// calls the notify function; the connection then calls poll() on its own strand and writes what it returns.
class GenerationRun {
 public:
  enum class Poll {
    Pending,  // nothing to send now
    Respond,  // the whole answer (JSON or error) is in `res`; the generation is over
    Stream,   // SSE: send the headers in `res` once (headers_sent() false), then the bytes in `out`; done() ends it
  };
  GenerationRun(HttpContext& ctx, std::shared_ptr<Service> svc, GenerationJob job, bool stream);
  ~GenerationRun();
  GenerationRun(const GenerationRun&) = delete;
  GenerationRun& operator=(const GenerationRun&) = delete;

  // f runs on the scheduler thread after each event; it must not block.
  void set_notify(std::function<void()> f);
  Poll poll(HttpResponse& res, std::string& out, Clock::time_point now);
  bool done() const { return done_; }
  bool streaming() const { return stream_; }
  bool headers_sent() const { return started_; }
  // When poll() should run again without news (pings; the SSE headers of a request still queued).
  Clock::time_point next_wakeup() const;
  // Events queued by the engine and not yet taken (a reader that stopped reading makes this grow).
  size_t backlog() const;
  // The client went away or is dropped: the request's sequences are freed within one engine step.
  void cancel();
  // The connection finished writing the bytes of the last poll() (their tokens count as sent).
  void written() { sent_tokens_ += in_flight_tokens_, in_flight_tokens_ = 0; }
  AccessInfo access() const;

  // Filled by the handler.
  ResponseHeader header;
  FormatOptions format;
  bool chat = true;
  bool logprobs = false;

 private:
  void convert(std::vector<StreamEvent>& ev, std::string& out);
  void count_finished();
  HttpContext& ctx_;
  std::shared_ptr<Service> svc_;  // kept alive while the generation runs
  GenerationJob job_;
  bool stream_;
  bool started_ = false, done_ = false, cancelled_ = false, counted_ = false;
  int finished_ = 0;
  int64_t in_flight_tokens_ = 0, sent_tokens_ = 0;  // tokens of the events in the bytes being written / written
  std::vector<StreamEvent> pending_;
  std::vector<size_t> text_offset_;
  Clock::time_point t0_, last_write_;
  double ping_s_;
};

// Runs a handler body, turning ApiError / other exceptions into the error JSON (docs/api.md §errors).
template <class F>
void guarded(HttpContext& ctx, HttpResponse& res, F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    if (e.status == 400 && e.code != "context_length_exceeded") ctx.metrics.requests_rejected.inc("validation");
    send_error(res, e);
  } catch (const std::exception& e) {
    log::error("internal error: {}", e.what());
    send_error(res, server_error(500, "internal_error", "Internal server error."));
  }
}

}  // namespace latent::server
