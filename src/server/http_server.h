// The OpenAI-compatible HTTP server (docs/api.md), event-driven over Boost.Beast / Asio: a few io threads
// serve every connection (none is tied to one); routing (404 / 405), auth before the body is read, body size limit,
// request ids, CORS, OpenAI error JSON for every failure, SSE streaming with backpressure, /metrics, access logs and
// graceful shutdown. The model-facing work is Service's; the server starts before the model is loaded and answers
// 503 model_loading until set_service() is called.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/metrics.h"
#include "server/openai_format.h"
#include "server/service.h"

namespace latent::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 = any free port (tests)
  int threads = 2;  // io threads: they serve every connection
  int workers = 4;  // threads that parse request bodies, render templates and tokenize
  size_t max_request_bytes = 32u << 20;
  double read_timeout_s = 60;         // headers + body of one request
  double keep_alive_timeout_s = 60;   // an idle keep-alive connection is closed after this
  double write_timeout_s = 30;        // a client that takes longer to accept one write is dropped (request cancelled)
  int socket_send_buffer = 0;         // SO_SNDBUF of accepted connections in bytes; 0 = the system's (autotuned)
  std::vector<std::string> api_keys;  // empty = open
  bool metrics_enabled = true;
  bool metrics_require_auth = false;
  std::string metrics_prefix = "latent:";
  std::string allowed_origins;      // "" = CORS off; "*" or a comma list
  double sse_ping_interval_s = 15;  // 0 = off
  ReasoningField reasoning_field = ReasoningField::Both;
  std::string version = "0.0.0", git_sha = "unknown", build_type = "unknown", cuda = "none";
};

class HttpServer {
 public:
  HttpServer(HttpOptions opt, Metrics& metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The model is ready: generation endpoints open.
  void set_service(std::shared_ptr<Service> service);
  // Model loading failed: /health and generation answer 503 engine_dead with this reason logged.
  void set_failed(const std::string& reason);

  // Binds host:port; returns the bound port. Throws latent::Error when the address cannot be bound.
  int bind();
  // Serves until stop() / shutdown() (blocking).
  void serve();
  // Graceful: refuse new requests (503 draining), let running ones finish for up to timeout_s, abort the rest
  // (streams get an error event with code "draining"), then stop listening. Returns how many requests it aborted.
  int64_t shutdown(double timeout_s);
  // Ends a shutdown()'s wait at once (a second SIGTERM / SIGINT): the requests still running are aborted now and
  // their streams get 200 ms to take their last event. Safe from any thread, also before shutdown() began.
  void abort_drain();
  void stop();
  // Connections open now (tests, benchmarks).
  int64_t open_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace latent::server
