#include "server/chat_once.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "runtime/metrics.h"
#include "runtime/scheduler.h"
#include "server/api_error.h"
#include "server/service.h"

namespace latent::server {

std::string run_chat_once(LoadedModel& m, const ChatOnceOptions& opt, std::FILE* out) {
  Metrics metrics;
  SchedulerOptions so;
  so.max_context = m.info.max_model_len;
  so.banned = &m.banned;
  so.device_sampling = !opt.host_sampling;
  so.num_speculative_tokens = m.num_speculative_tokens;
  // One sequence: a pool that holds the whole context (+ one block of headroom).
  const int64_t blocks = (m.info.max_model_len + so.kv_block_tokens) / so.kv_block_tokens + 1;
  so.kv_total_blocks = m.engine->configure(blocks * so.kv_block_tokens * m.engine->kv_bytes_per_token(),
                                           so.kv_block_tokens, so.max_batch_tokens, 1, so.max_context);
  Scheduler sched(*m.engine, so, &metrics);
  sched.start();
  Service svc(m.info, ServiceOptions{}, *m.codec, sched, metrics);

  ojson body = ojson::object();
  body["messages"] = ojson::array();
  if (!opt.system.empty()) body["messages"].push_back({{"role", "system"}, {"content", opt.system}});
  body["messages"].push_back({{"role", "user"}, {"content", opt.text}});
  if (opt.max_tokens > 0) body["max_tokens"] = opt.max_tokens;
  if (opt.temperature) body["temperature"] = *opt.temperature;
  if (opt.seed) body["seed"] = *opt.seed;
  if (opt.enable_thinking) body["chat_template_kwargs"] = {{"enable_thinking", *opt.enable_thinking}};
  if (opt.ignore_eos) body["ignore_eos"] = true;
  GenerationJob job;
  try {
    const ChatRequest r = parse_chat_request(body, svc.validation());
    job = svc.start_chat(r);
  } catch (const ApiError& e) {
    fail("{}", e.message);
  }
  const bool tty = isatty(fileno(out));
  bool in_reasoning = false;
  std::string finish;
  while (finish.empty()) {
    std::vector<StreamEvent> ev;
    job.state->wait(ev, std::chrono::milliseconds(100));
    for (auto& e : ev) {
      if (e.kind == StreamEvent::Kind::Abort) fail("generation aborted: {}", e.message);
      if (e.kind == StreamEvent::Kind::Finish) finish = e.finish_reason;
      if (e.kind != StreamEvent::Kind::Delta) continue;
      if (!e.delta.reasoning.empty() && opt.show_reasoning) {
        if (!in_reasoning) std::fputs(tty ? "\x1b[2m" : "<think>", out);
        in_reasoning = true;
        std::fputs(e.delta.reasoning.c_str(), out);
      }
      if (!e.delta.content.empty() || !e.delta.tool_calls.empty()) {
        if (in_reasoning) std::fputs(tty ? "\x1b[0m\n" : "</think>\n", out);
        in_reasoning = false;
        std::fputs(e.delta.content.c_str(), out);
        for (const auto& t : e.delta.tool_calls) {
          if (t.first)
            std::fprintf(out, "\n[tool call %s] ", t.name.c_str());
          else
            std::fputs(t.arguments.c_str(), out);
        }
      }
      std::fflush(out);
    }
  }
  if (in_reasoning) std::fputs(tty ? "\x1b[0m" : "</think>", out);
  std::fputs("\n", out);
  sched.stop();
  return finish;
}

}  // namespace latent::server
