// latent serve [--model DIR] [--host 127.0.0.1] [--port 8000] ... — the OpenAI-compatible server (spec api.md).
// Listens at once (answering 503 model_loading), loads the model with a progress bar on a terminal, logs the
// precision plan, then serves until SIGINT / SIGTERM, which drain gracefully (--shutdown-timeout).
#include <pthread.h>
#include <unistd.h>

#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "core/log.h"
#include "server/http_server.h"
#include "server/serving_model.h"

#ifndef LATENT_VERSION
#define LATENT_VERSION "0.0.0"
#endif

namespace latent::cli {

namespace {

struct ServeOpts {
  ModelFlags model;
  std::string host = "127.0.0.1", backend = "cpu", activations = "fp32", chat_template, default_sampling,
              reasoning_parser = "auto", tool_parser = "auto", reasoning_field = "both", allowed_origins,
              metrics_prefix = "latent:", api_key_file;
  int port = 8000, http_threads = 256, max_n = 16;
  std::vector<std::string> served_names, api_keys;
  int64_t max_model_len = 0, max_num_seqs = 64, max_queue_len = 1024, max_batch_tokens = 512, prefill_chunk = 256,
          kv_block_tokens = 64, max_output_tokens = 0;
  std::string kv_cache_bytes = "4G";
  double max_queue_wait = 600, request_timeout = 0, read_timeout = 60, sse_ping = 15,
         shutdown_timeout = 30;
  size_t max_request_bytes = 32u << 20;
  bool trust_template = false, clamp = false, no_metrics = false, metrics_auth = false, stop_on_loop = false,
       deterministic = false, no_prefault = false;
};

// A one-line progress bar on stderr (only on a terminal).
class ProgressBar {
 public:
  ProgressBar() : tty_(isatty(2) != 0) {}
  void update(const std::string& stage, uint64_t done, uint64_t total) {
    if (!tty_) return;
    if (total == 0) {
      std::fprintf(stderr, "\r\x1b[Klatent: loading %s ...", stage.c_str());
    } else {
      const double f = static_cast<double>(done) / static_cast<double>(total);
      const int w = 40, fill = static_cast<int>(f * w);
      std::string bar(static_cast<size_t>(fill), '#');
      bar.resize(w, '.');
      std::fprintf(stderr, "\r\x1b[Klatent: loading %s [%s] %3.0f%% %.2f/%.2f GiB", stage.c_str(), bar.c_str(), f * 100,
                   static_cast<double>(done) / (1u << 30), static_cast<double>(total) / (1u << 30));
    }
    std::fflush(stderr);
    dirty_ = true;
  }
  void done() {
    if (tty_ && dirty_) std::fprintf(stderr, "\r\x1b[K");
    dirty_ = false;
  }

 private:
  bool tty_;
  bool dirty_ = false;
};

// "4G", "512M", "1.5GiB", "1000000" -> bytes.
double parse_bytes(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    fail("--kv-cache-bytes: '{}' is not a size (e.g. 4G, 512M, 1000000)", s);
  }
  std::string unit = s.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  double mul = 1;
  if (unit == "K") mul = 1024.0;
  else if (unit == "M") mul = 1024.0 * 1024;
  else if (unit == "G") mul = 1024.0 * 1024 * 1024;
  else if (unit == "T") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") fail("--kv-cache-bytes: unknown unit in '{}'", s);
  if (v <= 0) fail("--kv-cache-bytes must be > 0 (got '{}')", s);
  return v * mul;
}

std::vector<std::string> collect_keys(const ServeOpts& o) {
  std::vector<std::string> keys;
  auto add_list = [&](const std::string& s) {
    std::stringstream ss(s);
    std::string k;
    while (std::getline(ss, k, ','))
      if (!k.empty()) keys.push_back(k);
  };
  for (const auto& k : o.api_keys) add_list(k);
  if (!o.api_key_file.empty()) {
    std::ifstream f(o.api_key_file);
    if (!f) fail("--api-key-file {}: cannot open", o.api_key_file);
    std::string line;
    while (std::getline(f, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') keys.push_back(line);
    }
  }
  if (const char* e = std::getenv("LATENT_API_KEY"); e && *e) add_list(e);
  return keys;
}

void run_serve(const ServeOpts& o) {
  if (o.activations != "fp32" && o.activations != "bf16") fail("--activations must be fp32 or bf16 (got '{}')", o.activations);
  if (o.reasoning_field != "both" && o.reasoning_field != "reasoning_content" && o.reasoning_field != "reasoning")
    fail("--reasoning-field must be reasoning_content, reasoning or both (got '{}')", o.reasoning_field);
  if (o.kv_block_tokens < 1) fail("--kv-block-tokens must be >= 1");
  if (o.max_n < 1) fail("--max-n must be >= 1");
  const std::string dir = o.model.model_dir();

  // Signals go to one thread (sigwait), so every other thread must have them blocked.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  Metrics metrics;
  server::HttpOptions ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.threads = o.http_threads;
  ho.max_request_bytes = o.max_request_bytes;
  ho.read_timeout_s = o.read_timeout;
  ho.api_keys = collect_keys(o);
  ho.metrics_enabled = !o.no_metrics;
  ho.metrics_require_auth = o.metrics_auth;
  ho.metrics_prefix = o.metrics_prefix;
  ho.allowed_origins = o.allowed_origins;
  ho.sse_ping_interval_s = o.sse_ping;
  ho.reasoning_field = o.reasoning_field == "both" ? server::ReasoningField::Both
                       : o.reasoning_field == "reasoning" ? server::ReasoningField::Reasoning
                                                          : server::ReasoningField::ReasoningContent;
  ho.version = LATENT_VERSION;
#ifdef NDEBUG
  ho.build_type = "Release";
#else
  ho.build_type = "Debug";
#endif
  server::HttpServer http(ho, metrics);
  const int port = http.bind();
  log::info("listening on http://{}:{} (model loading){}", o.host, port, ho.api_keys.empty() ? "" : ", API key required");
  std::thread serve_thread([&] { http.serve(); });

  std::atomic<bool> loaded{false};
  std::atomic<bool> quitting{false};  // set before this thread is woken by our own SIGTERM (load failure, exit)
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig == 0 || quitting.load()) return;
    if (!loaded.load()) {
      std::fprintf(stderr, "\nlatent: interrupted while loading\n");
      std::_Exit(130);
    }
    log::info("signal {}: shutting down (up to {} s for running requests)", sig, o.shutdown_timeout);
    http.shutdown(o.shutdown_timeout);
  });

  std::unique_ptr<server::LoadedModel> m;
  std::unique_ptr<Scheduler> sched;
  std::shared_ptr<server::Service> svc;
  try {
    server::ServeModelOptions mo;
    mo.model_dir = dir;
    mo.plan = o.model.plan_options();
    mo.threads = o.model.threads;
    mo.backend = o.backend;
    mo.bf16_activations = o.activations == "bf16";
    mo.served_names = o.served_names;
    mo.max_model_len = o.max_model_len;
    mo.chat_template_file = o.chat_template;
    mo.deterministic = o.deterministic;
    mo.prefault = !o.no_prefault;
    mo.version = LATENT_VERSION;
    ProgressBar bar;
    m = server::load_serving_model(mo, [&](const std::string& s, uint64_t d, uint64_t t) { bar.update(s, d, t); });
    bar.done();
    log::info("model {} ({}), precision plan:\n{}", dir, arch_name(m->files.cfg->arch), m->plan_text);

    SchedulerOptions so;
    so.max_num_seqs = o.max_num_seqs;
    so.max_queue_len = o.max_queue_len;
    so.max_batch_tokens = o.max_batch_tokens;
    so.prefill_chunk = o.prefill_chunk;
    so.max_queue_wait_s = o.max_queue_wait;
    so.request_timeout_s = o.request_timeout;
    so.kv_block_tokens = o.kv_block_tokens;
    so.stop_on_loop = o.stop_on_loop;
    so.banned = &m->banned;
    const double budget = parse_bytes(o.kv_cache_bytes);
    so.max_context = m->info.max_model_len;
    so.kv_total_blocks = m->engine->configure(static_cast<int64_t>(budget), o.kv_block_tokens, so.max_batch_tokens,
                                              so.max_num_seqs, so.max_context);
    const int64_t capacity = so.kv_total_blocks * o.kv_block_tokens;
    if (capacity < m->info.max_model_len) {
      log::warn("the KV cache budget holds {} tokens, less than the context length {}: serving max_model_len = {} "
                "(raise --kv-cache-bytes)", capacity, m->info.max_model_len, capacity);
      m->info.max_model_len = capacity;
    }
    so.max_context = m->info.max_model_len;
    log::info("KV cache: {} blocks x {} tokens = {} tokens ({} bytes/token, {} cache, {:.2f} GiB allocated of "
              "--kv-cache-bytes {}), max_model_len {}, step workspace {:.1f} MiB for {} tokens",
              so.kv_total_blocks, o.kv_block_tokens, capacity, m->engine->kv_bytes_per_token(),
              dtype_name(m->model->cache_dtype()), double(m->engine->cache()->bytes()) / double(1u << 30),
              o.kv_cache_bytes, m->info.max_model_len, double(m->model->workspace_bytes()) / double(1u << 20),
              so.max_batch_tokens);
    sched = std::make_unique<Scheduler>(*m->engine, so, &metrics);
    sched->start();
    metrics.set_gauge_source([s = sched.get()] { return s->gauges(); });
    server::ServiceOptions svo;
    svo.max_n = o.max_n;
    svo.clamp_max_tokens = o.clamp;
    if (o.max_output_tokens > 0) svo.max_output_tokens = o.max_output_tokens;
    svo.trust_request_chat_template = o.trust_template;
    svo.reasoning_parser = o.reasoning_parser;
    svo.tool_parser = o.tool_parser;
    if (!o.default_sampling.empty()) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(o.default_sampling);
      } catch (const nlohmann::json::exception& e) {
        fail("--default-sampling-params: not valid JSON ({})", e.what());
      }
      svo.default_sampling = server::SamplingDefaults::from_json(j, "--default-sampling-params");
    }
    svc = std::make_shared<server::Service>(m->info, svo, *m->codec, *sched, metrics);
  } catch (...) {
    http.stop();
    serve_thread.join();
    quitting.store(true);
    pthread_kill(signal_thread.native_handle(), SIGTERM);
    signal_thread.join();
    throw;
  }
  http.set_service(svc);
  loaded.store(true);
  log::info("serving '{}' on http://{}:{} (reasoning parser: {}, tool parser: {})", svc->info().served_names.front(),
            o.host, port, svc->reasoning_enabled() ? "glm45" : "none", server::tool_format_name(svc->tool_format()));
  serve_thread.join();
  sched->stop();
  quitting.store(true);
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  log::info("stopped");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOpts>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (spec api.md)");
  o->model.add_to(cmd);
  cmd->add_option("--host", o->host, "Listen address (default 127.0.0.1)");
  cmd->add_option("--port", o->port, "Listen port (default 8000)");
  cmd->add_option("--served-model-name", o->served_names, "Model name(s) clients use; first = primary (repeatable)");
  cmd->add_option("--max-model-len", o->max_model_len, "Context length served (default: config.json)");
  cmd->add_option("--chat-template", o->chat_template, "Jinja chat template file (overrides the model's)");
  cmd->add_flag("--trust-request-chat-template", o->trust_template, "Accept `chat_template` in requests");
  cmd->add_option("--backend", o->backend, "Compute backend: cpu (default) or ref");
  cmd->add_option("--activations", o->activations, "fp32 (default) or bf16");
  cmd->add_option("--api-key", o->api_keys, "Require this Bearer key (repeatable or comma-separated)");
  cmd->add_option("--api-key-file", o->api_key_file, "File with one API key per line (# comments)");
  cmd->add_option("--http-threads", o->http_threads, "HTTP worker threads; each open stream holds one (default 256)");
  cmd->add_option("--max-request-bytes", o->max_request_bytes, "Request body limit (default 32 MiB)");
  cmd->add_option("--read-timeout", o->read_timeout, "Seconds to receive a request (default 60)");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Sequences in the running batch (default 64)");
  cmd->add_option("--max-queue-len", o->max_queue_len, "Waiting requests before 503 (default 1024)");
  cmd->add_option("--max-queue-wait", o->max_queue_wait, "Seconds a request may wait in the queue (default 600, 0 = none)");
  cmd->add_option("--request-timeout", o->request_timeout, "Seconds per request from arrival (default 0 = off)");
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens, "Tokens per engine step (default 512)");
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Prompt chunk size for chunked prefill (default 256)");
  cmd->add_option("--kv-cache-bytes", o->kv_cache_bytes, "KV cache budget, e.g. 4G, 512M (default 4G)");
  cmd->add_option("--kv-block-tokens", o->kv_block_tokens, "Tokens per KV cache block (default 64)");
  cmd->add_option("--max-n", o->max_n, "Largest `n` accepted (default 16)");
  cmd->add_option("--max-output-tokens", o->max_output_tokens, "Cap on generated tokens when max_tokens is absent");
  cmd->add_flag("--clamp-max-tokens", o->clamp, "Reduce max_tokens to fit the context instead of answering 400");
  cmd->add_option("--default-sampling-params", o->default_sampling, "JSON object of sampling defaults");
  cmd->add_option("--reasoning-parser", o->reasoning_parser, "auto (default), none, glm45, deepseek_r1");
  cmd->add_option("--tool-parser", o->tool_parser, "auto (default), none, glm47, deepseek");
  cmd->add_option("--reasoning-field", o->reasoning_field, "reasoning_content, reasoning or both (default)");
  cmd->add_option("--sse-ping-interval", o->sse_ping, "Seconds between SSE pings when idle (default 15, 0 = off)");
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout, "Seconds to let requests finish on SIGTERM (default 30)");
  cmd->add_option("--allowed-origins", o->allowed_origins, "Enable CORS for these origins (comma list or *)");
  cmd->add_flag("--no-metrics", o->no_metrics, "Disable /metrics");
  cmd->add_flag("--metrics-require-auth", o->metrics_auth, "Protect /metrics with the API key");
  cmd->add_option("--metrics-prefix", o->metrics_prefix, "Prefix of metric names (default 'latent:')");
  cmd->add_flag("--stop-on-loop", o->stop_on_loop, "End a choice that falls into a repetition loop (finish_reason length)");
  cmd->add_flag("--deterministic", o->deterministic, "Report deterministic mode (per-sequence compute is batch-invariant)");
  cmd->add_flag("--no-prefault", o->no_prefault, "Do not read the weights in at start");
  cmd->callback([o]() { run_serve(*o); });
}

}  // namespace latent::cli
