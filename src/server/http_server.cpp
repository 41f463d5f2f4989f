#include "server/http_server.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <regex>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "server/choice_output.h"
#include "server/http_internal.h"

namespace latent::server {

using httplib::Request;
using httplib::Response;
using HandlerResponse = httplib::Server::HandlerResponse;

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

void send_json(Response& res, const nlohmann::ordered_json& j, int status) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), "application/json");
}

void send_error(Response& res, const ApiError& e) {
  res.status = e.status;
  for (const auto& [k, v] : e.headers) res.set_header(k.c_str(), v);
  res.set_content(e.body_text(), "application/json");
}

namespace {

struct Route {
  const char* path;
  bool prefix;
  const char* allow;  // Allow header
  bool auth;          // protected (§2.3); /metrics decided by the flag
};

const Route kRoutes[] = {
    {"/v1/chat/completions", false, "POST", true},
    {"/v1/completions", false, "POST", true},
    {"/v1/models", false, "GET, HEAD", true},
    {"/v1/models/", true, "GET, HEAD", true},
    {"/health", false, "GET, HEAD", false},
    {"/version", false, "GET, HEAD", false},
    {"/metrics", false, "GET, HEAD", false},
    {"/tokenize", false, "POST", true},
    {"/detokenize", false, "POST", true},
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

bool authorized(const HttpOptions& o, const Request& req) {
  if (o.api_keys.empty()) return true;
  std::string key;
  const std::string auth = req.get_header_value("Authorization");
  if (auth.size() > 7 && (auth.compare(0, 7, "Bearer ") == 0 || auth.compare(0, 7, "bearer ") == 0)) key = auth.substr(7);
  else key = req.get_header_value("x-api-key");
  bool ok = false;
  for (const auto& k : o.api_keys) ok |= ct_equal(key, k);  // no early exit
  return ok && !key.empty();
}

std::string request_id(const Request& req) {
  static const std::regex kValid("^[A-Za-z0-9._:-]{1,128}$");
  const std::string id = req.get_header_value("X-Request-Id");
  if (!id.empty() && std::regex_match(id, kValid)) return id;
  return random_hex(32);
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

}  // namespace

struct HttpServer::Impl {
  Impl(HttpOptions o, Metrics& m) : ctx(std::move(o), m) {}
  HttpContext ctx;
  httplib::Server svr;
  int port = -1;
  // stop() may come before serve() has entered httplib's listen loop (a load failure right after bind): these
  // make that case return from serve() instead of listening forever.
  std::atomic<bool> serve_entered{false}, serve_returned{false}, stop_requested{false};
  void setup();
  HandlerResponse pre_route(const Request& req, Response& res);
};

HandlerResponse HttpServer::Impl::pre_route(const Request& req, Response& res) {
  const HttpOptions& o = ctx.opt;
  res.set_header("X-Request-Id", request_id(req));
  if (!o.allowed_origins.empty()) {
    const std::string origin = req.get_header_value("Origin");
    if (!origin.empty() && origin_allowed(o.allowed_origins, origin)) {
      res.set_header("Access-Control-Allow-Origin", o.allowed_origins == "*" ? "*" : origin);
      res.set_header("Vary", "Origin");
    }
    if (req.method == "OPTIONS") {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, HEAD, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Request-Id, x-api-key");
      res.set_header("Access-Control-Max-Age", "600");
      res.status = 204;
      return HandlerResponse::Handled;
    }
  }
  const Route* r = find_route(req.path);
  if (!r) {
    send_error(res, not_found_error(fmt::format("Unknown path '{}'.", req.path)));
    return HandlerResponse::Handled;
  }
  if (!method_allowed(*r, req.method)) {
    send_error(res, method_not_allowed_error(r->allow));
    return HandlerResponse::Handled;
  }
  const bool needs_auth = std::string_view(r->path) == "/metrics" ? o.metrics_require_auth : r->auth;
  if (needs_auth && !authorized(o, req)) {
    ctx.metrics.requests_rejected.inc("auth");
    send_error(res, auth_error());
    return HandlerResponse::Handled;
  }
  if (req.has_header("Content-Length")) {
    const std::string cl = req.get_header_value("Content-Length");
    char* end = nullptr;
    const unsigned long long n = std::strtoull(cl.c_str(), &end, 10);
    if (end != cl.c_str() && n > o.max_request_bytes) {
      ctx.metrics.requests_rejected.inc("too_large");
      send_error(res, too_large_error(o.max_request_bytes));
      res.set_header("Connection", "close");
      return HandlerResponse::Handled;
    }
  }
  return HandlerResponse::Unhandled;
}

void HttpServer::Impl::setup() {
  const HttpOptions& o = ctx.opt;
  const int threads = std::max(2, o.threads);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_payload_max_length(o.max_request_bytes);
  svr.set_read_timeout(static_cast<time_t>(std::max(1.0, o.read_timeout_s)));
  svr.set_write_timeout(30);
  svr.set_keep_alive_timeout(5);
  svr.set_tcp_nodelay(true);
  svr.set_pre_routing_handler([this](const Request& req, Response& res) { return pre_route(req, res); });
  svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const Request&, Response& res) {
    if (!res.body.empty()) return HandlerResponse::Unhandled;
    switch (res.status) {
      case 413: send_error(res, too_large_error(ctx.opt.max_request_bytes)); break;
      case 404: send_error(res, not_found_error("Not found.")); break;
      case 408: send_error(res, ApiError(408, "invalid_request_error", "request_timeout", std::nullopt, "The request was not received in time.")); break;
      case 400: send_error(res, ApiError(400, "invalid_request_error", "invalid_json", std::nullopt, "Malformed HTTP request.")); break;
      default:
        if (res.status >= 500) send_error(res, server_error(res.status, "internal_error", "Internal server error."));
        else send_error(res, ApiError(res.status, "invalid_request_error", "invalid_value", std::nullopt, "Bad request."));
    }
    return HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      log::error("internal error: {}", e.what());
    } catch (...) {
      log::error("internal error: unknown exception");
    }
    send_error(res, server_error(500, "internal_error", "Internal server error."));
  });
  svr.set_logger([this](const Request& req, const Response& res) {
    ctx.metrics.http_requests.inc(std::to_string(res.status));
    log::debug("{} {} {} -> {} [{}]", req.remote_addr, req.method, req.path, res.status, res.get_header_value("X-Request-Id"));
  });
  HttpContext* c = &ctx;
  svr.Post("/v1/chat/completions", [c](const Request& q, Response& r) { handle_chat(*c, q, r); });
  svr.Post("/v1/completions", [c](const Request& q, Response& r) { handle_completions(*c, q, r); });
  svr.Get("/v1/models", [c](const Request& q, Response& r) { handle_models(*c, q, r); });
  svr.Get(R"(/v1/models/(.+))", [c](const Request& q, Response& r) { handle_model(*c, q, r); });
  svr.Get("/health", [c](const Request& q, Response& r) { handle_health(*c, q, r); });
  svr.Get("/version", [c](const Request& q, Response& r) { handle_version(*c, q, r); });
  svr.Get("/metrics", [c](const Request& q, Response& r) { handle_metrics(*c, q, r); });
  svr.Post("/tokenize", [c](const Request& q, Response& r) { handle_tokenize(*c, q, r); });
  svr.Post("/detokenize", [c](const Request& q, Response& r) { handle_detokenize(*c, q, r); });
}

HttpServer::HttpServer(HttpOptions opt, Metrics& metrics) : impl_(std::make_unique<Impl>(std::move(opt), metrics)) {
  impl_->setup();
}

HttpServer::~HttpServer() { stop(); }

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
  if (o.port == 0) {
    impl_->port = impl_->svr.bind_to_any_port(o.host);
    if (impl_->port < 0) fail("cannot bind {} on any port", o.host);
  } else {
    if (!impl_->svr.bind_to_port(o.host, o.port)) fail("cannot listen on {}:{} (address in use or not available)", o.host, o.port);
    impl_->port = o.port;
  }
  return impl_->port;
}

void HttpServer::serve() {
  impl_->serve_entered.store(true);
  if (!impl_->stop_requested.load()) impl_->svr.listen_after_bind();
  impl_->serve_returned.store(true);
}

void HttpServer::shutdown(double timeout_s) {
  std::shared_ptr<Service> svc;
  {
    std::lock_guard lk(impl_->ctx.mu);
    if (impl_->ctx.state == ServeState::Ready) svc = impl_->ctx.service;
    impl_->ctx.state = ServeState::Draining;
  }
  if (svc) {
    Scheduler& s = svc->scheduler();
    s.begin_drain();
    log::info("draining: waiting up to {} s for running requests", timeout_s);
    if (!s.wait_idle(timeout_s)) {
      log::warn("draining: aborting the requests still running");
      s.abort_all(AbortReason::Shutdown, "The server is shutting down.");
    }
    // Let the handlers write their last bytes.
    for (int i = 0; i < 200 && impl_->ctx.active_generations.load() > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop();
}

void HttpServer::stop() {
  impl_->stop_requested.store(true);
  // serve() entered but not yet listening: wait until httplib runs (or serve() saw the request and returned).
  while (impl_->serve_entered.load() && !impl_->svr.is_running() && !impl_->serve_returned.load())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (impl_->svr.is_running()) impl_->svr.stop();
}

}  // namespace latent::server
