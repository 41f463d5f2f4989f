// latent serve [--model DIR] [--host 127.0.0.1] [--port 8000] ... — the OpenAI-compatible server (docs/api.md).
// Listens at once (answering 503 model_loading), loads the model with a progress bar on a terminal, logs the
// precision plan, then serves until SIGINT / SIGTERM, which drain gracefully (--shutdown-timeout).
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "core/log.h"
#include "server/host_memory.h"
#include "server/http_server.h"
#include "server/model_engine.h"
#include "server/serving_model.h"

#ifndef LATENT_VERSION
#define LATENT_VERSION "0.0.0"
#endif

namespace latent::cli {

namespace {

struct ServeOpts {
  ModelFlags model;
  std::string host = "127.0.0.1", backend = "cpu", activations, chat_template, default_sampling,
              reasoning_parser = "auto", tool_parser = "auto", reasoning_field = "both", allowed_origins,
              metrics_prefix = "latent:", api_key_file, log_level, log_format = "text";
  int port = 8000, http_threads = 2, http_workers = 4, max_n = 16;
  std::vector<std::string> served_names, api_keys;
  // max_batch_tokens / prefill_chunk 0: by device (512 / 256 on the CPU, 2,048 / 2,048 on --device cuda).
  int64_t max_model_len = 0, max_num_seqs = 64, max_queue_len = 1024, max_batch_tokens = 0, prefill_chunk = 0,
          kv_block_tokens = 64, max_output_tokens = 0;
  double mixed_step_factor = -1;  // --mixed-step-factor (0: off; -1: by device, 1.75 on the CPU, off on cuda)
  std::string kv_cache_bytes = "auto";
  double max_queue_wait = 600, request_timeout = 0, read_timeout = 60, sse_ping = 15, shutdown_timeout = 30,
         keep_alive_timeout = 60, write_timeout = 30;
  double gpu_memory_fraction = 0.9;  // --gpu-memory-utilization (0, 1]: for the CUDA backend's KV budget
  bool prefix_cache = true;          // --enable-prefix-caching / --no-enable-prefix-caching
  size_t max_request_bytes = 32u << 20;
  bool trust_template = false, clamp = false, no_metrics = false, metrics_auth = false, stop_on_loop = false,
       deterministic = false, no_prefault = false, allow_long_context = false, no_cuda_graphs = false,
       host_sampling = false;
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
  if (unit == "K")
    mul = 1024.0;
  else if (unit == "M")
    mul = 1024.0 * 1024;
  else if (unit == "G")
    mul = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    mul = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    fail("--kv-cache-bytes: unknown unit in '{}'", s);
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
  for (const auto& k : o.api_keys) {
    bool any = false;
    for (char c : k) any |= c != ',' && c != ' ';
    if (!any) fail("--api-key: the key is empty (an empty key would leave the server open; omit the flag instead)");
    add_list(k);
  }
  if (!o.api_key_file.empty()) {
    std::ifstream f(o.api_key_file);
    if (!f) fail("--api-key-file {}: cannot open", o.api_key_file);
    std::string line;
    const size_t before = keys.size();
    while (std::getline(f, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') keys.push_back(line);
    }
    if (keys.size() == before) fail("--api-key-file {}: holds no key", o.api_key_file);
  }
  if (const char* e = std::getenv("LATENT_API_KEY"); e && *e) add_list(e);
  return keys;
}

// Lets a server hold tens of thousands of connections: the soft descriptor limit goes up to the hard one.
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

void run_serve(const ServeOpts& o) {
  server::tune_allocator_for_serving();  // memory comes back after large requests (server/host_memory.h)
  if (!o.log_level.empty()) log::set_level(*log::parse_level(o.log_level));
  log::set_format(o.log_format == "json" ? log::Format::Json : log::Format::Text);
  // Flags whose check needs more than a range: before anything is loaded.
  for (const auto& n : o.served_names)
    if (n.empty()) fail("--served-model-name: the name is empty");
  if (o.host.empty()) fail("--host: the address is empty (e.g. 127.0.0.1, 0.0.0.0, ::)");
  if (!o.metrics_prefix.empty()) {
    bool ok = !std::isdigit(static_cast<unsigned char>(o.metrics_prefix[0]));
    for (char c : o.metrics_prefix) ok &= std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':';
    if (!ok)
      fail("--metrics-prefix '{}': allowed are letters, digits, '_' and ':' (not starting with a digit)",
           o.metrics_prefix);
  }
  // "auto": on the CPU what the server can use (server::host_kv_auto, sized once the model is loaded); on a device,
  // what --gpu-memory-utilization leaves after weights and workspace (0 here).
  const bool kv_auto = o.kv_cache_bytes == "auto";
  const double kv_budget = kv_auto ? 0.0 : parse_bytes(o.kv_cache_bytes);
  server::SamplingDefaults default_sampling;
  if (!o.default_sampling.empty())
    default_sampling = server::SamplingDefaults::from_flag(o.default_sampling, "--default-sampling-params");
  const std::vector<std::string> api_keys = collect_keys(o);
  log::debug("prefix caching {}, gpu memory fraction {}", o.prefix_cache ? "on" : "off", o.gpu_memory_fraction);
  raise_fd_limit();
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
  ho.workers = o.http_workers;
  ho.max_request_bytes = o.max_request_bytes;
  ho.read_timeout_s = o.read_timeout;
  ho.keep_alive_timeout_s = o.keep_alive_timeout;
  ho.write_timeout_s = o.write_timeout;
  ho.api_keys = api_keys;
  ho.metrics_enabled = !o.no_metrics;
  ho.metrics_require_auth = o.metrics_auth;
  ho.metrics_prefix = o.metrics_prefix;
  ho.allowed_origins = o.allowed_origins;
  ho.sse_ping_interval_s = o.sse_ping;
  ho.reasoning_field = o.reasoning_field == "both"        ? server::ReasoningField::Both
                       : o.reasoning_field == "reasoning" ? server::ReasoningField::Reasoning
                                                          : server::ReasoningField::ReasoningContent;
  ho.version = build_version();
  ho.git_sha = build_commit();
  ho.build_type = build_type();
  server::HttpServer http(ho, metrics);
  const int port = http.bind();
  log::info("listening on http://{}:{} (model loading){}", o.host, port,
            ho.api_keys.empty() ? "" : ", API key required");
  std::thread serve_thread([&] { http.serve(); });

  std::atomic<bool> loaded{false};
  std::atomic<bool> quitting{false};      // set before this thread is woken by our own SIGTERM (load failure, exit)
  std::atomic<int64_t> drain_aborted{0};  // requests the signal-driven drain aborted (exit status 1 when any)
  std::thread drainer;                    // runs http.shutdown after the first signal; joined at exit
  // First SIGTERM / SIGINT: drain (up to --shutdown-timeout). A second one ends the drain at once, aborting what
  // still runs (as uvicorn and vLLM do); a third exits on the spot.
  std::thread signal_thread([&] {
    for (int n = 0;; ++n) {
      int sig = 0;
      sigwait(&sigs, &sig);
      if (sig == 0 || quitting.load()) return;
      if (!loaded.load()) {
        std::fprintf(stderr, "\nlatent: interrupted while loading\n");
        std::_Exit(130);
      }
      if (n == 0) {
        log::info("signal {}: shutting down (up to {} s for running requests; a second signal ends the wait)", sig,
                  o.shutdown_timeout);
        drainer = std::thread([&] { drain_aborted.store(http.shutdown(o.shutdown_timeout)); });
      } else if (n == 1) {
        log::warn("signal {} again: ending the drain now, aborting the requests still running", sig);
        http.abort_drain();
      } else {
        log::error("signal {} a third time: exiting at once", sig);
        std::_Exit(1);
      }
    }
  });

  struct {
    std::mutex mu;
    std::string what;
    std::thread stopper;  // runs http.shutdown (the scheduler thread must not block on it)
  } engine_lost;
  std::unique_ptr<server::LoadedModel> m;
  std::unique_ptr<Scheduler> sched;
  std::shared_ptr<server::Service> svc;
  try {
    server::ServeModelOptions mo;
    mo.model_dir = dir;
    mo.plan = o.model.plan_options();
    mo.threads = o.model.threads;
    mo.backend = o.model.backend_name(o.backend);
    mo.bf16_activations = o.model.bf16_activations(o.activations);
    mo.act_declared = ModelFlags::declared_activations(o.activations);
    mo.cuda_graphs = !o.no_cuda_graphs;
    mo.num_speculative_tokens = o.model.num_speculative_tokens();
    log::info("{}; decode steps {}", o.model.activations_line(o.activations),
              o.model.device != "cuda" ? "eager"
              : o.no_cuda_graphs       ? "eager (--no-cuda-graphs)"
                                       : "in CUDA graphs (--no-cuda-graphs: eager)");
    mo.parallel = o.model.parallel();
    mo.served_names = o.served_names;
    mo.max_model_len = o.max_model_len;
    mo.allow_long_context = o.allow_long_context;
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
    // On a GPU a prompt chunk of 2,048 runs near the prefill rate of whole prompts (GLM-5 shape, H100, 32 decoding
    // streams: a 16K-token prompt's first token in 1.07 s against 2.1 s at 256, the streams' median inter-token
    // latency 1.0x of theirs alone against 3.1x; bench/README.md "Chunked prefill beside decoding streams"). The mixed
    // step bound is on by default on the CPU only: on the GPU a mixed step has a large fixed cost (an eager step
    // reading nearly every expert), so small chunks there cost prompts far more time than they save the streams.
    const bool gpu = o.model.device == "cuda";
    so.max_batch_tokens = o.max_batch_tokens > 0 ? o.max_batch_tokens : gpu ? 2048 : 512;
    so.prefill_chunk = o.prefill_chunk > 0 ? o.prefill_chunk : gpu ? 2048 : 256;
    so.mixed_step_factor = o.mixed_step_factor >= 0 ? o.mixed_step_factor : gpu ? 0.0 : 1.75;
    so.max_queue_wait_s = o.max_queue_wait;
    so.request_timeout_s = o.request_timeout;
    so.kv_block_tokens = o.kv_block_tokens;
    so.stop_on_loop = o.stop_on_loop;
    so.prefix_cache = o.prefix_cache;
    // What decides a cached block's contents besides its tokens: the checkpoint, the plan (transforms included)
    // and the activation / cache dtype.
    so.prefix_cache_salt = std::hash<std::string>{}(
        dir + "\n" + m->plan_text + "\n" + (mo.bf16_activations ? "bf16" : "fp32") +
        (mo.act_declared ? " declared" : "") + "\n" + std::to_string(m->files.cfg->vocab_size));
    so.banned = &m->banned;
    so.device_sampling = !o.host_sampling;
    // A lost device context (a CUDA kernel fault): the step's requests were aborted with a 500; stop serving and
    // exit non-zero (below) rather than answer from a poisoned device.
    so.on_engine_lost = [&http, &engine_lost](const std::string& what) {
      log::error("the device context is lost ({}): shutting down", what);
      std::lock_guard lk(engine_lost.mu);
      engine_lost.what = what;
      engine_lost.stopper = std::thread([&http] { http.shutdown(2.0); });
    };
    double budget = kv_budget;
    if (kv_auto && o.model.device != "cuda") {
      const int64_t bpt = m->engine->kv_bytes_per_token(), replicas = m->engine->host_replicas();
      const server::HostKvAuto a = server::host_kv_auto(o.max_num_seqs, m->info.max_model_len, o.prefix_cache, bpt,
                                                        o.kv_block_tokens, server::host_available_memory(), replicas);
      budget = static_cast<double>(a.bytes);
      log::info(
          "KV cache auto (CPU): {} sequences x {} tokens (--max-num-seqs x --max-model-len) = {} tokens{} -> "
          "{} tokens in {} blocks, {:.1f} MiB at {} bytes/token{}{}; its pages become resident as blocks are "
          "first written, so RSS grows to that as the cache (and the prefix cache) fills",
          o.max_num_seqs, m->info.max_model_len, a.running_tokens,
          o.prefix_cache ? fmt::format(" + {} for the prefix cache ({:.0f}%)", a.prefix_tokens,
                                       server::HostKvAuto::kPrefixCacheShare * 100)
                         : std::string(" (prefix cache off)"),
          a.tokens, a.blocks, double(a.bytes) / double(1u << 20), bpt,
          replicas > 1 ? fmt::format(" x {} ranks", replicas) : std::string(),
          a.capped
              ? fmt::format(", capped at {:.0f}% of the {:.1f} MiB available",
                            server::HostKvAuto::kHostMemoryShare * 100, double(a.available_bytes) / double(1u << 20))
              : std::string());
    }
    so.max_context = m->info.max_model_len;
    so.kv_total_blocks = m->engine->configure(static_cast<int64_t>(budget), o.kv_block_tokens, so.max_batch_tokens,
                                              so.max_num_seqs, so.max_context, o.gpu_memory_fraction);
    const int64_t capacity = so.kv_total_blocks * o.kv_block_tokens;
    if (capacity < m->info.max_model_len) {
      log::warn(
          "the KV cache budget holds {} tokens, less than the context length {}: serving max_model_len = {} "
          "(raise --kv-cache-bytes)",
          capacity, m->info.max_model_len, capacity);
      m->info.max_model_len = capacity;
    }
    so.max_context = m->info.max_model_len;
    log::info(
        "KV cache: {} blocks x {} tokens = {} tokens ({} bytes/token, {} cache, {:.1f} MiB reserved for "
        "--kv-cache-bytes {}), max_model_len {}, step workspace {:.1f} MiB for {} tokens",
        so.kv_total_blocks, o.kv_block_tokens, capacity, m->engine->kv_bytes_per_token(),
        dtype_name(m->engine->cache_dtype()), double(m->engine->cache()->bytes()) / double(1u << 20), o.kv_cache_bytes,
        m->info.max_model_len, double(m->engine->workspace_bytes()) / double(1u << 20), so.max_batch_tokens);
    so.num_speculative_tokens = mo.num_speculative_tokens;
    if (so.num_speculative_tokens > 0) {
      const int64_t given = o.model.speculative_disable_batch_size();
      if (given >= 0) {
        so.speculative_max_batch = given;
        log::info(
            "speculative decoding: MTP, {} draft tokens per step; no drafts above {} decoding sequences "
            "(--speculative-disable-batch-size)",
            so.num_speculative_tokens, given);
      } else {
        const auto c = m->engine->speculation_crossover(so.num_speculative_tokens, so.max_num_seqs);
        so.speculative_max_batch = c.max_batch;
        if (c.max_batch < 0)
          log::warn(
              "speculative decoding: MTP, {} draft tokens per step, but no drafts at any batch size: a verify "
              "and its draft step cost more than they save even at batch 1 (measured: {}; "
              "--speculative-disable-batch-size to force)",
              so.num_speculative_tokens, c.summary);
        else
          log::info(
              "speculative decoding: MTP, {} draft tokens per step; no drafts above {} decoding sequences "
              "(measured: {}; --speculative-disable-batch-size to change)",
              so.num_speculative_tokens, c.max_batch, c.summary);
      }
    }
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
    svo.default_sampling = default_sampling;
    svc = std::make_shared<server::Service>(m->info, svo, *m->codec, *sched, metrics);
  } catch (...) {
    http.stop();
    serve_thread.join();
    {
      std::lock_guard lk(engine_lost.mu);
      if (engine_lost.stopper.joinable()) engine_lost.stopper.join();
    }
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
  quitting.store(true);
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  if (drainer.joinable()) drainer.join();
  sched->stop();
  {
    std::lock_guard lk(engine_lost.mu);
    if (engine_lost.stopper.joinable()) engine_lost.stopper.join();
    if (!engine_lost.what.empty()) fail("serve: the engine's device context was lost: {}", engine_lost.what);
  }
  if (const int64_t n = drain_aborted.load(); n > 0) {
    log::warn("stopped: the shutdown aborted {} request(s); exit status 1", n);
    set_exit_code(1);
    return;
  }
  log::info("stopped");
}

// Edit distance for the "did you mean" of an unknown flag.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0u : 1u)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Leftover arguments (allow_extras): an unknown flag names the nearest known one.
void reject_unknown(const CLI::App* cmd) {
  for (const std::string& arg : cmd->remaining()) {
    const std::string flag = arg.substr(0, arg.find('='));
    if (flag.rfind("-", 0) != 0) fail("unexpected argument '{}' (latent serve takes flags only; see --help)", arg);
    std::string best;
    size_t best_d = SIZE_MAX;
    for (const CLI::Option* opt : cmd->get_options())
      for (const std::string& n : opt->get_lnames()) {
        const size_t d = edit_distance(flag, "--" + n);
        if (d < best_d) {
          best_d = d;
          best = "--" + n;
        }
      }
    if (!best.empty() && best_d <= std::max<size_t>(3, flag.size() / 3))
      fail("unknown flag {} (did you mean {}?)", flag, best);
    fail("unknown flag {} (see latent serve --help)", flag);
  }
}

// CLI11 validator: a number in (0, 1].
const CLI::Validator kFraction(
    [](std::string& s) -> std::string {
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (end == s.c_str() || *end != '\0' || !(v > 0 && v <= 1)) return "value " + s + " is not in (0, 1]";
      return "";
    },
    "(0,1]");

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOpts>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/api.md)");
  cmd->allow_extras();  // unknown flags are answered with the nearest known one (reject_unknown)
  const CLI::Range kPositive(1.0, 1e18), kNonNegative(0.0, 1e18);
  o->model.add_to(cmd);
  o->model.add_parallel_to(cmd);
  o->model.add_speculative_to(cmd);
  // Flags that vLLM also has keep vLLM's names (README "latent serve for vLLM users"); the second name of a pair
  // is the vLLM alias.
  cmd->add_option("--host", o->host, "Listen address (default 127.0.0.1)");
  cmd->add_option("--port", o->port, "Listen port 1-65535, 0 = any free port (default 8000)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--served-model-name", o->served_names, "Model name(s) clients use; first = primary (repeatable)");
  cmd->add_option("--max-model-len", o->max_model_len, "Context length served (default: config.json)")
      ->check(kPositive);
  cmd->add_flag("--allow-long-context", o->allow_long_context,
                "Accept --max-model-len above the model's max_position_embeddings");
  cmd->add_option("--chat-template", o->chat_template, "Jinja chat template file (overrides the model's)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--trust-request-chat-template", o->trust_template, "Accept `chat_template` in requests");
  cmd->add_option("--backend", o->backend, "Compute backend: cpu (default) or ref");
  cmd->add_option("--activations", o->activations,
                  "fp32, bf16 (default: bf16 on --device cuda, fp32 on cpu) or declared (FP8 activations where the "
                  "checkpoint declares them, the default elsewhere)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_flag("--no-cuda-graphs", o->no_cuda_graphs, "--device cuda: run decode steps eagerly (no CUDA graphs)");
  cmd->add_flag("--host-sampling", o->host_sampling,
                "--device cuda: sample on the host (logits copied back every step) instead of on the GPU");
  cmd->add_option("--api-key", o->api_keys, "Require this Bearer key (repeatable or comma-separated)");
  cmd->add_option("--api-key-file", o->api_key_file, "File with one API key per line (# comments)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--http-threads", o->http_threads, "io threads serving every connection (default 2)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--http-workers", o->http_workers,
                  "Threads that parse request bodies, render templates and tokenize (default 4)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--max-request-bytes", o->max_request_bytes, "Request body limit (default 32 MiB)")->check(kPositive);
  cmd->add_option("--read-timeout", o->read_timeout, "Seconds to receive a request (default 60)")->check(kPositive);
  cmd->add_option("--keep-alive-timeout", o->keep_alive_timeout, "Seconds an idle connection stays open (default 60)")
      ->check(kPositive);
  cmd->add_option("--write-timeout", o->write_timeout,
                  "Seconds a client may take to accept one write before it is dropped (default 30)")
      ->check(kPositive);
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Sequences in the running batch (default 64)")->check(kPositive);
  cmd->add_option("--max-queue-len", o->max_queue_len, "Waiting requests before 503 (default 1024)")->check(kPositive);
  cmd->add_option("--max-queue-wait", o->max_queue_wait,
                  "Seconds a request may wait in the queue (default 600, 0 = none)")
      ->check(kNonNegative);
  cmd->add_option("--request-timeout", o->request_timeout, "Seconds per request from arrival (default 0 = off)")
      ->check(kNonNegative);
  cmd->add_option("--max-batch-tokens,--max-num-batched-tokens", o->max_batch_tokens,
                  "Tokens per engine step (default 512 on the CPU, 2048 on --device cuda)")
      ->check(kPositive);
  cmd->add_option("--prefill-chunk", o->prefill_chunk,
                  "Prompt chunk size for chunked prefill (default 256 on the CPU, 2048 on --device cuda)")
      ->check(kPositive);
  cmd->add_option("--mixed-step-factor", o->mixed_step_factor,
                  "A step with decodes takes only the prompt tokens that keep it within this factor of a decode-only "
                  "step, by measured step times (default 1.75 on the CPU, 0 = off on --device cuda: the token budget "
                  "alone)")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            try {
              const double v = std::stod(s);
              if (v == 0.0 || v > 1.0) return "";
            } catch (...) {
            }
            return "must be 0 (off) or a number above 1, got '" + s + "'";
          },
          "0 or >1", "mixed-step-factor"));
  cmd->add_option("--kv-cache-bytes", o->kv_cache_bytes,
                  "KV cache budget, e.g. 4G, 512M; auto (default): on the CPU --max-num-seqs x --max-model-len tokens "
                  "+ 25% for the prefix cache, at most half the available memory; on a GPU the memory "
                  "--gpu-memory-utilization leaves after weights and workspace");
  cmd->add_option("--kv-block-tokens", o->kv_block_tokens, "Tokens per KV cache block (default 64)")->check(kPositive);
  cmd->add_option("--gpu-memory-utilization,--gpu-memory-fraction", o->gpu_memory_fraction,
                  "Fraction of GPU memory (0, 1] the CUDA backend may use (default 0.9; vLLM's name, "
                  "--gpu-memory-fraction the same)")
      ->check(kFraction);
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching,!--no-prefix-cache", o->prefix_cache,
                "Reuse the KV blocks of identical prompt prefixes (automatic prefix caching, default on)");
  cmd->add_option("--max-n", o->max_n, "Largest `n` accepted (default 16)")->check(CLI::Range(1, 1024));
  cmd->add_option("--max-output-tokens", o->max_output_tokens, "Cap on generated tokens when max_tokens is absent")
      ->check(kNonNegative);
  cmd->add_flag("--clamp-max-tokens", o->clamp, "Reduce max_tokens to fit the context instead of answering 400");
  cmd->add_option("--default-sampling-params", o->default_sampling,
                  "JSON object of sampling defaults (temperature, top_p, top_k, min_p, *_penalty)");
  cmd->add_option("--reasoning-parser", o->reasoning_parser, "auto (default), none, glm45, deepseek_r1")
      ->check(CLI::IsMember({"auto", "none", "glm45", "deepseek_r1"}));
  cmd->add_option("--tool-parser,--tool-call-parser", o->tool_parser, "auto (default), none, glm47, deepseek")
      ->check(CLI::IsMember({"auto", "none", "glm47", "deepseek"}));
  cmd->add_option("--reasoning-field", o->reasoning_field, "reasoning_content, reasoning or both (default)")
      ->check(CLI::IsMember({"both", "reasoning_content", "reasoning"}));
  cmd->add_option("--sse-ping-interval", o->sse_ping, "Seconds between SSE pings when idle (default 15, 0 = off)")
      ->check(kNonNegative);
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout, "Seconds to let requests finish on SIGTERM (default 30)")
      ->check(kNonNegative);
  cmd->add_option("--allowed-origins", o->allowed_origins, "Enable CORS for these origins (comma list or *)");
  cmd->add_flag("--no-metrics", o->no_metrics, "Disable /metrics");
  cmd->add_flag("--metrics-require-auth", o->metrics_auth, "Protect /metrics with the API key");
  cmd->add_option("--metrics-prefix", o->metrics_prefix, "Prefix of metric names (default 'latent:')");
  cmd->add_option("--log-level", o->log_level, "debug, info (default), warn, error, off (else LATENT_LOG_LEVEL)")
      ->check(CLI::IsMember({"debug", "info", "warn", "error", "off"}));
  cmd->add_option("--log-format", o->log_format, "text (default) or json (one JSON object per line)")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag("--stop-on-loop", o->stop_on_loop,
                "End a choice that falls into a repetition loop (finish_reason length)");
  cmd->add_flag("--deterministic", o->deterministic,
                "Report deterministic mode (per-sequence compute is batch-invariant)");
  cmd->add_flag("--no-prefault", o->no_prefault, "Do not read the weights in at start");
  cmd->callback([o, cmd]() {
    reject_unknown(cmd);
    run_serve(*o);
  });
}

}  // namespace latent::cli
