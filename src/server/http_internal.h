// Internal to the HTTP server: the shared state handlers see, and the handler entry points (one file per group).
#pragma once
#include <httplib.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "core/log.h"
#include "server/api_error.h"
#include "server/http_server.h"

namespace latent::server {

enum class ServeState { Loading, Ready, Draining, Failed };

struct HttpContext {
  HttpContext(HttpOptions o, Metrics& m) : opt(std::move(o)), metrics(m) {}
  HttpOptions opt;
  Metrics& metrics;
  mutable std::mutex mu;
  std::shared_ptr<Service> service;
  ServeState state = ServeState::Loading;
  std::atomic<int> active_generations{0};

  // The service when ready; else ApiError 503 model_loading / draining / engine_dead.
  std::shared_ptr<Service> ready_service() const;
  ServeState current_state() const {
    std::lock_guard lk(mu);
    return state;
  }
};

void send_json(httplib::Response& res, const nlohmann::ordered_json& j, int status = 200);
void send_error(httplib::Response& res, const ApiError& e);

void handle_chat(HttpContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_completions(HttpContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_models(HttpContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_model(HttpContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_health(HttpContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_version(HttpContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_metrics(HttpContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_tokenize(HttpContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_detokenize(HttpContext& ctx, const httplib::Request& req, httplib::Response& res);

// Runs a handler body, turning ApiError / other exceptions into the error JSON (§3).
template <class F>
void guarded(HttpContext& ctx, httplib::Response& res, F&& f) {
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
