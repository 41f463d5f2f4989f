// The HTTP/1.1 front end over Boost.Beast (request parsing) and Boost.Asio (event loop): a few io threads serve every
// connection, none is tied to one. Each connection is a Session running on its own strand: it reads the header,
// checks route / auth / size before the body is read (docs/api.md §auth, §transport), reads the body into one buffer,
// runs the handler (on the io thread for the cheap endpoints, on a small worker pool for the ones that parse and
// tokenize), and then either writes the answer or drives a GenerationRun: the scheduler thread only queues events and
// posts a wake-up; the strand turns them into bytes and writes one buffer at a time, so a reader that stops reading
// holds back its own stream only (and is dropped after --write-timeout, its request cancelled).
#include "server/http_server.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "server/choice_output.h"
#include "server/http_internal.h"

namespace latent::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

bool HttpRequest::has_header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return true;
  return false;
}

std::string HttpResponse::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

std::shared_ptr<Service> HttpContext::ready_service() const {
  std::lock_guard lk(mu);
  switch (state) {
    case ServeState::Loading: throw server_error(503, "model_loading", "The model is loading; retry shortly.");
    case ServeState::Draining: throw server_error(503, "draining", "The server is shutting down.");
    case ServeState::Failed: throw server_error(503, "engine_dead", "The model failed to load; see the server log.");
    case ServeState::Ready: break;
  }
  if (service->scheduler().stats().dead)
    throw server_error(503, "engine_dead", "The engine loop failed; the server must be restarted.");
  return service;
}

void send_json(HttpResponse& res, const nlohmann::ordered_json& j, int status) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), "application/json");
}

void send_error(HttpResponse& res, const ApiError& e) {
  res.status = e.status;
  for (const auto& [k, v] : e.headers) res.set_header(k, v);
  res.set_content(e.body_text(), "application/json");
}

namespace {

using Handler = void (*)(HttpContext&, HttpRequest&, HttpResponse&);

struct Route {
  const char* path;
  bool prefix;
  const char* allow;  // Allow header
  bool auth;          // protected (docs/api.md §auth); /metrics decided by the flag
  Handler handler;
  bool worker;  // parses a body / tokenizes: runs on the worker pool, not on an io thread
};

const Route kRoutes[] = {
    {"/v1/chat/completions", false, "POST", true, handle_chat, true},
    {"/v1/completions", false, "POST", true, handle_completions, true},
    {"/v1/models", false, "GET, HEAD", true, handle_models, false},
    {"/v1/models/", true, "GET, HEAD", true, handle_model, false},
    {"/health", false, "GET, HEAD", false, handle_health, false},
    {"/version", false, "GET, HEAD", false, handle_version, false},
    {"/metrics", false, "GET, HEAD", false, handle_metrics, false},
    {"/tokenize", false, "POST", true, handle_tokenize, true},
    {"/detokenize", false, "POST", true, handle_detokenize, true},
};

const Route* find_route(const std::string& path) {
  for (const Route& r : kRoutes)
    if (r.prefix ? (path.size() > std::string_view(r.path).size() && path.rfind(r.path, 0) == 0) : path == r.path)
      return &r;
  return nullptr;
}

bool method_allowed(const Route& r, const std::string& m) {
  const std::string_view a = r.allow;
  size_t s = 0;
  while (s < a.size()) {
    size_t e = a.find(", ", s);
    if (e == std::string_view::npos) e = a.size();
    if (a.substr(s, e - s) == m) return true;
    s = e + 2;
  }
  return false;
}

// Constant-time equality (time depends only on the lengths).
bool ct_equal(const std::string& a, const std::string& b) {
  unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool authorized(const HttpOptions& o, const HttpRequest& req) {
  if (o.api_keys.empty()) return true;
  std::string key;
  const std::string auth = req.header("Authorization");
  if (auth.size() > 7 && (auth.compare(0, 7, "Bearer ") == 0 || auth.compare(0, 7, "bearer ") == 0))
    key = auth.substr(7);
  else
    key = req.header("x-api-key");
  bool ok = false;
  for (const auto& k : o.api_keys) ok |= ct_equal(key, k);  // no early exit
  return ok && !key.empty();
}

bool valid_request_id(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-')) return false;
  return true;
}

bool origin_allowed(const std::string& allowed, const std::string& origin) {
  if (allowed == "*") return true;
  size_t start = 0;
  while (start <= allowed.size()) {
    size_t end = allowed.find(',', start);
    if (end == std::string::npos) end = allowed.size();
    std::string item = allowed.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item == origin) return true;
    start = end + 1;
  }
  return false;
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, s)));
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

constexpr size_t kLargeBody = 1u << 20;        // after requests this large, return freed memory to the system
constexpr size_t kMaxBacklog = 1u << 16;       // queued stream events of a reader that does not read
constexpr size_t kMaxLingerBytes = 64u << 20;  // discarded after an early answer (413, 401) before closing
constexpr double kLingerSeconds = 2.0;
// After a second signal: how long the aborted streams get to write their error event before the server stops.
constexpr auto kForcedLinger = std::chrono::milliseconds(200);

}  // namespace

struct HttpServer::Impl {
  explicit Impl(HttpOptions o, Metrics& m)
      : ctx(std::move(o), m),
        ioc(std::max(1, ctx.opt.threads)),
        acceptor(ioc),
        retry(ioc),
        workers(static_cast<size_t>(std::max(1, ctx.opt.workers))) {}
  // Declared before the io context and the pool: sessions destroyed with them still count down.
  HttpContext ctx;
  std::atomic<int64_t> connections{0};
  std::atomic<bool> stop_requested{false}, serving{false};
  std::atomic<bool> drain_abort{false};  // abort_drain(): end shutdown()'s wait now
  std::mutex stop_mu;
  int port = -1;
  Clock::time_point last_accept_warning{};
  asio::io_context ioc;
  tcp::acceptor acceptor;
  asio::steady_timer retry;
  asio::thread_pool workers;
  void accept();
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket s, HttpServer::Impl& srv)
      : srv_(srv), ctx_(srv.ctx), sock_(std::move(s)), timer_(sock_.get_executor()) {
    srv_.connections.fetch_add(1);
  }
  ~Session() {
    srv_.connections.fetch_sub(1);
    // A session dropped with the io context (the server stopped while its large body arrived) never ran
    // uncount_large: keep the count exact.
    if (large_counted_) ctx_.large_requests.end();
  }
  void start() { read_request(); }

 private:
  enum class TimerKind { Idle, Reading, Generating, Closing };

  HttpServer::Impl& srv_;
  HttpContext& ctx_;
  tcp::socket sock_;
  asio::steady_timer timer_;
  uint64_t timer_seq_ = 0;
  TimerKind timer_kind_ = TimerKind::Idle;
  beast::flat_buffer buf_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  HttpRequest req_;
  HttpResponse res_;
  const Route* route_ = nullptr;
  std::string wire_;
  std::string request_id_;
  std::vector<std::pair<std::string, std::string>> extra_headers_;
  Clock::time_point t_start_;       // the request's first byte was readable (its access line's duration)
  Clock::time_point t_first_byte_;  // idem, set before the header is parsed
  bool keep_alive_ = true, http11_ = true, head_ = false, close_after_ = false, closed_ = false, timed_out_ = false;
  bool large_ = false, large_counted_ = false, chunked_ = false, head_sent_ = false, writing_ = false,
       disconnect_ = false;
  uint64_t watch_seq_ = 0;
  bool watching_ = false, in_request_ = false;
  Clock::time_point write_started_;
  std::shared_ptr<GenerationRun> gen_;
  std::optional<AccessInfo> access_;
  std::atomic<bool> news_posted_{false};
  std::unique_ptr<std::array<char, 4096>> scratch_;
  size_t lingered_ = 0;

  // ---- timer -------------------------------------------------------------------------------------------------
  void arm(Clock::time_point at, TimerKind kind) {
    timer_kind_ = kind;
    const uint64_t seq = ++timer_seq_;
    timer_.expires_at(at);
    timer_.async_wait([self = shared_from_this(), seq](beast::error_code ec) {
      if (ec || seq != self->timer_seq_) return;
      self->on_timer();
    });
  }
  void disarm() {
    ++timer_seq_;
    timer_.cancel();
  }
  void on_timer() {
    switch (timer_kind_) {
      case TimerKind::Idle: return close_now();
      case TimerKind::Closing: return close_now();
      case TimerKind::Reading: {
        timed_out_ = true;
        beast::error_code ec;
        sock_.cancel(ec);  // the pending read completes with operation_aborted, then answers 408
        return;
      }
      case TimerKind::Generating:
        if (writing_ && Clock::now() - write_started_ >= seconds(ctx_.opt.write_timeout_s))
          return drop("the client stopped reading its response");
        return pump();
    }
  }

  // ---- reading -----------------------------------------------------------------------------------------------
  void read_request() {
    req_ = HttpRequest{};
    res_ = HttpResponse{};
    route_ = nullptr;
    extra_headers_.clear();
    access_.reset();
    head_ = close_after_ = timed_out_ = large_ = head_sent_ = disconnect_ = false;
    parser_.emplace();
    parser_->header_limit(64 * 1024);
    parser_->body_limit(boost::none);  // the limit is checked after auth (docs/api.md §auth), then set for the body
    if (buf_.size() > 0) return read_header();
    arm(Clock::now() + seconds(ctx_.opt.keep_alive_timeout_s), TimerKind::Idle);
    sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_) return self->close_now();
      self->read_header();
    });
  }

  void read_header() {
    t_first_byte_ = Clock::now();
    arm(t_first_byte_ + seconds(ctx_.opt.read_timeout_s), TimerKind::Reading);
    bhttp::async_read_header(sock_, buf_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void fail_read(beast::error_code ec) {
    if (closed_) return;
    if (parser_ && parser_->get().body().size() >= kLargeBody) count_large();
    uncount_large();
    if (timed_out_) {
      if (!in_request_) {
        in_request_ = true;
        t_start_ = t_first_byte_;
        request_id_ = random_hex(32);
      }
      send_error(res_, ApiError(408, "invalid_request_error", "request_timeout", std::nullopt,
                                "The request was not received in time."));
      close_after_ = true;
      return respond();
    }
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted || ec == bhttp::error::partial_message)
      return close_now();
    if (!in_request_) {
      in_request_ = true;
      t_start_ = t_first_byte_;
      request_id_ = random_hex(32);
    }
    if (ec == bhttp::error::body_limit) {
      ctx_.metrics.requests_rejected.inc("too_large");
      send_error(res_, too_large_error(ctx_.opt.max_request_bytes));
    } else if (ec == bhttp::error::header_limit) {
      send_error(res_, ApiError(431, "invalid_request_error", "invalid_value", std::nullopt,
                                "The request headers exceed 64 KiB."));
    } else {
      send_error(res_, ApiError(400, "invalid_request_error", "invalid_json", std::nullopt,
                                fmt::format("Malformed HTTP request: {}.", ec.message())));
    }
    close_after_ = true;
    respond();
  }

  void on_header(beast::error_code ec) {
    if (ec) return fail_read(ec);
    t_start_ = t_first_byte_;
    in_request_ = true;
    const auto& msg = parser_->get();
    req_.method = std::string(msg.method_string());
    const std::string_view target = msg.target();
    req_.path = std::string(target.substr(0, target.find('?')));
    for (const auto& f : msg) req_.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    keep_alive_ = msg.keep_alive();
    http11_ = msg.version() >= 11;
    head_ = req_.method == "HEAD";
    const std::string rid = req_.header("X-Request-Id");
    request_id_ = valid_request_id(rid) ? rid : random_hex(32);
    if (pre_route()) {
      if (!parser_->is_done()) close_after_ = true;  // the body was not read
      return respond();
    }
    if (parser_->is_done()) return dispatch();
    parser_->body_limit(ctx_.opt.max_request_bytes);
    if (const auto cl = parser_->content_length()) large_ = *cl >= kLargeBody;
    if (large_) count_large();
    if (iequals(req_.header("Expect"), "100-continue")) {
      wire_ = "HTTP/1.1 100 Continue\r\n\r\n";
      return asio::async_write(sock_, asio::buffer(wire_), [self = shared_from_this()](beast::error_code e, size_t) {
        if (e) return self->close_now();
        self->read_body();
      });
    }
    read_body();
  }

  void read_body() {
    bhttp::async_read(sock_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->fail_read(ec);
      self->req_.body = std::move(self->parser_->get().body());
      self->large_ = self->large_ || self->req_.body.size() >= kLargeBody;
      if (self->large_) self->count_large();
      self->dispatch();
    });
  }

  // Route, CORS, auth and size checks before the body is read. True when `res_` already holds the answer.
  bool pre_route() {
    const HttpOptions& o = ctx_.opt;
    if (!o.allowed_origins.empty()) {
      const std::string origin = req_.header("Origin");
      if (!origin.empty() && origin_allowed(o.allowed_origins, origin)) {
        extra_headers_.emplace_back("Access-Control-Allow-Origin", o.allowed_origins == "*" ? "*" : origin);
        extra_headers_.emplace_back("Vary", "Origin");
      }
      if (req_.method == "OPTIONS") {
        res_.set_header("Access-Control-Allow-Methods", "GET, POST, HEAD, OPTIONS");
        res_.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Request-Id, x-api-key");
        res_.set_header("Access-Control-Max-Age", "600");
        res_.status = 204;
        return true;
      }
    }
    route_ = find_route(req_.path);
    if (!route_) {
      send_error(res_, not_found_error(fmt::format("Unknown path '{}'.", req_.path)));
      return true;
    }
    if (!method_allowed(*route_, req_.method)) {
      send_error(res_, method_not_allowed_error(route_->allow));
      return true;
    }
    const bool needs_auth = std::string_view(route_->path) == "/metrics" ? o.metrics_require_auth : route_->auth;
    if (needs_auth && !authorized(o, req_)) {
      ctx_.metrics.requests_rejected.inc("auth");
      send_error(res_, auth_error());
      return true;
    }
    if (const auto cl = parser_->content_length(); cl && *cl > o.max_request_bytes) {
      ctx_.metrics.requests_rejected.inc("too_large");
      send_error(res_, too_large_error(o.max_request_bytes));
      return true;
    }
    if (route_->prefix) req_.path_param = req_.path.substr(std::string_view(route_->path).size());
    return false;
  }

  // ---- handling ----------------------------------------------------------------------------------------------
  void dispatch() {
    disarm();
    parser_.reset();
    if (!route_->worker) {
      run_handler();
      return on_handled();
    }
    asio::post(srv_.workers, [self = shared_from_this()] {
      self->run_handler();
      asio::post(self->sock_.get_executor(), [self] { self->on_handled(); });
    });
  }

  // On an io thread or a worker; nothing else touches req_ / res_ meanwhile.
  void run_handler() {
    try {
      route_->handler(ctx_, req_, res_);
    } catch (const std::exception& e) {
      log::error("internal error: {}", e.what());
      res_ = HttpResponse{};
      send_error(res_, server_error(500, "internal_error", "Internal server error."));
    }
    std::string().swap(req_.body);
    // A large body, its JSON and its tokens were freed: when no other large request is in flight, give the pages
    // back (here, on a worker thread, for the routes that parse bodies).
    if (large_counted_) {
      large_counted_ = false;
      if (ctx_.large_requests.end()) release_free_memory();
    }
  }

  void count_large() {
    if (large_counted_) return;
    large_counted_ = true;
    ctx_.large_requests.begin();
  }
  // A large request that ends without its handler (a body that failed to arrive, a closed connection): once its
  // buffers are freed, the release runs on the worker pool.
  void uncount_large() {
    if (!large_counted_) return;
    large_counted_ = false;
    parser_.reset();
    std::string().swap(req_.body);
    if (ctx_.large_requests.end()) asio::post(srv_.workers, [] { release_free_memory(); });
  }

  void on_handled() {
    if (closed_) return;
    if (!res_.generation) return respond();
    gen_ = std::move(res_.generation);
    res_ = HttpResponse{};
    std::weak_ptr<Session> weak = shared_from_this();
    gen_->set_notify([weak] {
      if (auto s = weak.lock()) s->on_news();
    });
    watch_peer();
    pump();
  }

  // Scheduler thread: never blocks; coalesces wake-ups.
  void on_news() {
    if (news_posted_.exchange(true)) return;
    asio::post(sock_.get_executor(), [self = shared_from_this()] {
      self->news_posted_.store(false);
      self->pump();
    });
  }

  // Notices a client that closes while its generation runs (docs/api.md §scheduling): readable + a zero-byte
  // peek is EOF.
  void watch_peer() {
    watching_ = true;
    const uint64_t seq = ++watch_seq_;
    sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this(), seq](beast::error_code ec) {
      if (ec || seq != self->watch_seq_ || !self->gen_ || self->closed_) return;
      char c;
      const ssize_t n = ::recv(self->sock_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) {  // a pipelined request: it waits in the socket until this answer is done
        self->watching_ = false;
        return;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->watch_peer();
      self->disconnect_ = true;
      self->gen_->cancel();
      self->finish_generation();
      self->close_now();
    });
  }

  void stop_watch() {
    if (!watching_) return;
    watching_ = false;
    ++watch_seq_;
    beast::error_code ec;
    sock_.cancel(ec);  // only the peer watch is pending here
  }

  void finish_generation() {
    if (!gen_) return;
    access_ = gen_->access();
    gen_->set_notify(nullptr);
    gen_.reset();
  }

  void drop(const char* why) {
    log::warn("request {}: {}; dropping the connection and cancelling the request", request_id_, why);
    disconnect_ = true;
    if (gen_) gen_->cancel();
    finish_generation();
    close_now();
  }

  void pump() {
    if (!gen_ || closed_) return;
    if (gen_->backlog() > kMaxBacklog) return drop("the client does not read its stream");
    if (writing_) return;
    std::string out;
    const auto p = gen_->poll(res_, out, Clock::now());
    if (p == GenerationRun::Poll::Respond) {
      finish_generation();
      stop_watch();
      return respond();
    }
    if (p == GenerationRun::Poll::Pending) return arm_generation_timer();
    wire_.clear();
    if (!head_sent_) {
      chunked_ = http11_;
      if (!http11_) close_after_ = true;  // HTTP/1.0: the stream ends with the connection
      wire_ = head(/*streaming=*/true, 0);
      head_sent_ = true;
    }
    if (chunked_) {
      if (!out.empty()) wire_ += fmt::format("{:x}\r\n", out.size()) + out + "\r\n";
      if (gen_->done()) wire_ += "0\r\n\r\n";
    } else {
      wire_ += out;
    }
    writing_ = true;
    write_started_ = Clock::now();
    arm_generation_timer();
    asio::async_write(sock_, asio::buffer(wire_),
                      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_stream_written(ec); });
  }

  void arm_generation_timer() {
    Clock::time_point at = gen_ ? gen_->next_wakeup() : Clock::time_point::max();
    if (writing_) at = std::min(at, write_started_ + seconds(ctx_.opt.write_timeout_s));
    if (at == Clock::time_point::max()) return disarm();
    arm(at, TimerKind::Generating);
  }

  void on_stream_written(beast::error_code ec) {
    writing_ = false;
    if (!ec && gen_) gen_->written();
    if (closed_) return;
    if (ec) {
      disconnect_ = true;
      if (gen_) gen_->cancel();
      finish_generation();
      return close_now();
    }
    if (gen_ && gen_->done()) {
      res_.status = 200;
      finish_generation();
      stop_watch();
      disarm();
      return end_request();
    }
    pump();
  }

  // ---- writing -----------------------------------------------------------------------------------------------
  std::string head(bool streaming, size_t content_length) {
    if (ctx_.current_state() == ServeState::Draining) close_after_ = true;
    if (!keep_alive_) close_after_ = true;
    if (res_.close) close_after_ = true;
    const auto st = bhttp::int_to_status(static_cast<unsigned>(res_.status));
    std::string h = fmt::format("HTTP/1.1 {} {}\r\n", res_.status, std::string_view(bhttp::obsolete_reason(st)));
    h += "Server: latent\r\nX-Request-Id: " + request_id_ + "\r\n";
    for (const auto& [k, v] : extra_headers_) h += k + ": " + v + "\r\n";
    for (const auto& [k, v] : res_.headers) h += k + ": " + v + "\r\n";
    if (!res_.content_type.empty()) h += "Content-Type: " + res_.content_type + "\r\n";
    if (streaming) {
      if (chunked_) h += "Transfer-Encoding: chunked\r\n";
    } else if (res_.status != 204 && res_.status >= 200) {
      h += fmt::format("Content-Length: {}\r\n", content_length);
    }
    h += close_after_ ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
    return h;
  }

  void respond() {
    if (closed_) return;
    disarm();
    wire_ = head(/*streaming=*/false, res_.body.size());
    if (!head_) wire_ += res_.body;
    std::string().swap(res_.body);
    ctx_.responses_writing.fetch_add(1);
    asio::async_write(sock_, asio::buffer(wire_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        self->disconnect_ = true;
        self->close_now();
      } else {
        self->end_request();
      }
      self->ctx_.responses_writing.fetch_sub(1);
    });
  }

  // One access line per request (also for a client that went away), once.
  void log_access() {
    if (!in_request_) return;
    in_request_ = false;
    const int status = disconnect_ && !head_sent_ ? 499 : res_.status;
    ctx_.metrics.http_requests.inc(std::to_string(status));
    const bool quiet = !access_ && status == 200 && route_ && !route_->worker;  // probes and scrapes
    const log::Level lv = quiet ? log::Level::Debug : log::Level::Info;
    if (log::level() > lv) return;
    nlohmann::ordered_json f = nlohmann::ordered_json::object();
    f["id"] = request_id_;
    // "-": not parsed (a client that never finished its headers).
    f["method"] = req_.method.empty() ? "-" : req_.method;
    f["path"] = req_.path.empty() ? "-" : req_.path;
    f["status"] = status;
    if (access_) {
      f["prompt_tokens"] = access_->prompt_tokens;
      f["cached_tokens"] = access_->cached_tokens;
      f["completion_tokens"] = access_->completion_tokens;
      // A JSON answer whose write failed reached no one.
      f["sent_tokens"] = !access_->stream && disconnect_ ? 0 : access_->sent_tokens;
      f["ttft_ms"] = access_->ttft_s < 0 ? -1.0 : std::round(access_->ttft_s * 1e4) / 10;
      f["finish_reason"] = access_->finish_reason;
      if (access_->spec_accepted_tokens >= 0) f["spec_accepted_tokens"] = access_->spec_accepted_tokens;
    }
    f["duration_ms"] = std::round(ms_since(t_start_) * 10) / 10;
    f["disconnect"] = disconnect_;
    log::event(lv, "access", f);
  }

  // The answer is written: the next request (keep-alive) or the close.
  void end_request() {
    log_access();
    req_ = HttpRequest{};
    wire_.clear();
    wire_.shrink_to_fit();
    if (closed_) return;
    if (close_after_) return linger_close();
    read_request();
  }

  // Half-close, then read and discard what the client still sends (a body we did not read) so the kernel does not
  // reset the connection before the client read the answer.
  void linger_close() {
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close_now();
    if (!scratch_) scratch_ = std::make_unique<std::array<char, 4096>>();
    arm(Clock::now() + seconds(kLingerSeconds), TimerKind::Closing);
    drain();
  }
  void drain() {
    sock_.async_read_some(asio::buffer(*scratch_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->lingered_ += n;
      if (ec || self->lingered_ > kMaxLingerBytes) return self->close_now();
      self->drain();
    });
  }

  void close_now() {
    if (closed_) return;
    closed_ = true;
    disarm();
    uncount_large();
    if (gen_) {
      disconnect_ = true;
      gen_->cancel();
      finish_generation();
    }
    log_access();
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
  }
};

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket sock) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors (EMFILE) and the like: say so at most once a second and retry shortly.
      const auto now = Clock::now();
      if (now - last_accept_warning > std::chrono::seconds(1)) {
        last_accept_warning = now;
        log::warn("accept failed: {} ({} connections open)", ec.message(), connections.load());
      }
      retry.expires_after(std::chrono::milliseconds(50));
      retry.async_wait([this](beast::error_code e) {
        if (!e) accept();
      });
      return;
    }
    beast::error_code e2;
    sock.set_option(tcp::no_delay(true), e2);
    if (ctx.opt.socket_send_buffer > 0)
      sock.set_option(asio::socket_base::send_buffer_size(ctx.opt.socket_send_buffer), e2);
    std::make_shared<Session>(std::move(sock), *this)->start();
    accept();
  });
}

HttpServer::HttpServer(HttpOptions opt, Metrics& metrics) : impl_(std::make_unique<Impl>(std::move(opt), metrics)) {}

HttpServer::~HttpServer() {
  stop();
  impl_->workers.stop();
  impl_->workers.join();
}

void HttpServer::set_service(std::shared_ptr<Service> service) {
  std::lock_guard lk(impl_->ctx.mu);
  impl_->ctx.service = std::move(service);
  if (impl_->ctx.state == ServeState::Loading) impl_->ctx.state = ServeState::Ready;
}

void HttpServer::set_failed(const std::string& reason) {
  log::error("model load failed: {}", reason);
  std::lock_guard lk(impl_->ctx.mu);
  impl_->ctx.state = ServeState::Failed;
}

int HttpServer::bind() {
  const auto& o = impl_->ctx.opt;
  beast::error_code ec;
  tcp::endpoint ep;
  const auto addr = asio::ip::make_address(o.host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, static_cast<uint16_t>(o.port));
  } else {
    tcp::resolver res(impl_->ioc);
    auto r = res.resolve(o.host, std::to_string(o.port), ec);
    if (ec || r.empty()) fail("--host {}: cannot resolve ({})", o.host, ec ? ec.message() : "no address");
    ep = r.begin()->endpoint();
  }
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (ec) fail("cannot listen on {}:{}: {}", o.host, o.port, ec.message());
  a.set_option(tcp::acceptor::reuse_address(true), ec);  // SO_REUSEADDR only: never share a port (no SO_REUSEPORT)
  a.bind(ep, ec);
  if (ec == asio::error::address_in_use) fail("cannot listen on {}:{}: address already in use", o.host, o.port);
  if (ec) fail("cannot listen on {}:{}: {}", o.host, o.port, ec.message());
  a.listen(tcp::acceptor::max_listen_connections, ec);
  if (ec) fail("cannot listen on {}:{}: {}", o.host, o.port, ec.message());
  impl_->port = a.local_endpoint().port();
  return impl_->port;
}

void HttpServer::serve() {
  Impl& m = *impl_;
  {
    std::lock_guard lk(m.stop_mu);
    if (m.stop_requested.load()) return;
    m.serving.store(true);
  }
  m.accept();
  auto guard = asio::make_work_guard(m.ioc);
  std::vector<std::thread> extra;
  for (int i = 1; i < std::max(1, m.ctx.opt.threads); ++i) extra.emplace_back([&m] { m.ioc.run(); });
  m.ioc.run();
  for (auto& t : extra) t.join();
  m.serving.store(false);
}

int64_t HttpServer::shutdown(double timeout_s) {
  Impl& m = *impl_;
  const auto t0 = Clock::now();
  std::shared_ptr<Service> svc;
  {
    std::lock_guard lk(m.ctx.mu);
    if (m.ctx.state == ServeState::Ready) svc = m.ctx.service;
    m.ctx.state = ServeState::Draining;
  }
  int64_t aborted = 0;
  if (svc) {
    Scheduler& s = svc->scheduler();
    s.begin_drain();
    const SchedulerStats st = s.stats();
    log::info("draining: waiting up to {} s for {} running and {} waiting requests (a second signal ends the wait)",
              timeout_s, st.running_requests, st.waiting);
    const auto until = t0 + seconds(timeout_s);
    bool idle = false;
    while (!(idle = s.wait_idle(0)) && Clock::now() < until && !m.drain_abort.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto limit = until + std::chrono::milliseconds(300);
    if (!idle) {
      const bool forced = m.drain_abort.load();
      aborted = s.abort_all(AbortReason::Shutdown, "The server is shutting down.");
      if (forced)
        log::warn("draining ended early by a second signal: {} request(s) aborted", aborted);
      else
        log::warn("draining: {} s passed; {} request(s) still running aborted", timeout_s, aborted);
      // abort_all returns once every request has its abort event (after the step that was running); the
      // streams still have to write that last event: give them up to 1 s from here, not from the timeout (under
      // a loaded machine the step alone could eat a fixed 300 ms and streams ended without their error event).
      limit = forced ? Clock::now() + kForcedLinger : std::max(limit, Clock::now() + std::chrono::milliseconds(1000));
    }
    // Let the connections write their last bytes (bounded: a client that does not read cannot hold shutdown; a
    // second signal cuts it to kForcedLinger).
    std::optional<Clock::time_point> forced_at;
    while (m.ctx.active_generations.load() > 0 || m.ctx.responses_writing.load() > 0) {
      const auto now = Clock::now();
      if (!forced_at && m.drain_abort.load()) forced_at = now;
      if (now >= limit || (forced_at && now >= *forced_at + kForcedLinger)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  stop();
  return aborted;
}

void HttpServer::abort_drain() { impl_->drain_abort.store(true); }

void HttpServer::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard lk(m.stop_mu);
    m.stop_requested.store(true);
  }
  m.ioc.stop();
  while (m.serving.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::lock_guard lk(m.stop_mu);
  beast::error_code ec;
  if (m.acceptor.is_open()) m.acceptor.close(ec);  // no io thread runs now
}

int64_t HttpServer::open_connections() const { return impl_->connections.load(); }

}  // namespace latent::server
