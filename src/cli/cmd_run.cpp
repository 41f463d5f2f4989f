// latent run [--model DIR] (--prompt TEXT | --prompt-tokens IDS | --chat TEXT) [--max-tokens N] [--temperature T]
// --prompt / --prompt-tokens: plain generation without a chat template: prints the generated ids (one line,
// streamed), then their text on a second line when the model directory has a tokenizer.json. --prompt is encoded
// with add_special_tokens (the post-processor's BOS, as HF tokenizer(text) does).
// --chat: one conversation through the serving path (chat template, scheduler, sampler, reasoning split), the
// reasoning printed between <think> and </think> (dimmed on a terminal), then the answer.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/parallel_model.h"
#include "runtime/collecting_sink.h"
#include "runtime/scheduler.h"
#include "server/chat_once.h"
#include "server/model_engine.h"
#include "server/serving_model.h"
#include "tokenizer/tokenizer.h"

namespace latent::cli {

void register_run(CLI::App& app) {
  struct Opts {
    ModelFlags model;
    std::string chat, system;
    bool no_think = false;
    std::string prompt, prompt_tokens, activations, backend = "cpu";
    bool no_cuda_graphs = false, host_sampling = false;
    int64_t max_tokens = 16;
    double temperature = 0.0;
    uint64_t seed = 0;
    bool ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("run", "One plain generation on the terminal (no chat template)");
  o->model.add_to(cmd);
  o->model.add_parallel_to(cmd);
  o->model.add_speculative_to(cmd);
  auto* p_text = cmd->add_option("--prompt", o->prompt, "Prompt text (needs tokenizer.json)");
  auto* p_ids = cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt token ids, e.g. \"1 2 3\"");
  auto* p_chat = cmd->add_option("--chat", o->chat, "A user message: one chat turn through the chat template");
  cmd->add_option("--system", o->system, "System message for --chat");
  cmd->add_flag("--no-think", o->no_think, "--chat with enable_thinking=false");
  p_text->excludes(p_ids);
  p_chat->excludes(p_text);
  p_chat->excludes(p_ids);
  auto* p_max = cmd->add_option("--max-tokens", o->max_tokens,
                                "Number of tokens to generate (default 16; with --chat: up to the context)");
  cmd->add_option("--temperature", o->temperature, "0 = greedy (default)");
  cmd->add_option("--seed", o->seed, "Sampling seed");
  cmd->add_option("--activations", o->activations,
                  "fp32, bf16 (default: bf16 on --device cuda, fp32 on cpu) or declared (FP8 activations where the "
                  "checkpoint declares them, the default elsewhere)");
  cmd->add_flag("--no-cuda-graphs", o->no_cuda_graphs, "--chat on --device cuda: run decode steps eagerly");
  cmd->add_flag("--host-sampling", o->host_sampling, "--chat on --device cuda: sample on the host, not the GPU");
  cmd->add_option("--backend", o->backend, "ref or cpu (default)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at an end-of-sequence token");
  cmd->callback([o, p_max]() {
    if (o->prompt.empty() && o->prompt_tokens.empty() && o->chat.empty())
      fail("run: give --prompt TEXT, --prompt-tokens IDS or --chat TEXT");
    if (o->max_tokens < 0) fail("--max-tokens must be >= 0 (got {})", o->max_tokens);
    if (o->temperature < 0) fail("--temperature must be >= 0 (got {})", o->temperature);
    const bool bf16 = o->model.bf16_activations(o->activations);
    if (!o->chat.empty()) {
      server::ServeModelOptions so;
      so.model_dir = o->model.model_dir();
      so.plan = o->model.plan_options();
      so.threads = o->model.threads;
      so.backend = o->model.backend_name(o->backend);
      so.bf16_activations = bf16;
      so.act_declared = ModelFlags::declared_activations(o->activations);
      so.cuda_graphs = !o->no_cuda_graphs;
      so.parallel = o->model.parallel();
      so.prefault = false;
      so.num_speculative_tokens = o->model.num_speculative_tokens();
      auto m = server::load_serving_model(so);
      for (const auto& w : m->files.plan->warnings()) std::fprintf(stderr, "latent: warning: %s\n", w.c_str());
      server::ChatOnceOptions co;
      co.text = o->chat;
      co.system = o->system;
      co.max_tokens = p_max->count() ? o->max_tokens : 0;
      co.temperature = o->temperature;
      co.seed = static_cast<int64_t>(o->seed);
      if (o->no_think) co.enable_thinking = false;
      co.ignore_eos = o->ignore_eos;
      co.host_sampling = o->host_sampling;
      const std::string finish = server::run_chat_once(*m, co);
      std::fprintf(stderr, "latent: finish_reason %s\n", finish.c_str());
      return;
    }
    const std::string dir = o->model.model_dir();
    const bool have_tok = std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json");
    std::optional<Tokenizer> tok;
    if (have_tok) tok = Tokenizer::from_file(dir);
    std::vector<int32_t> prompt;
    if (!o->prompt_tokens.empty()) {
      prompt = parse_token_ids(o->prompt_tokens);
    } else {
      if (!tok) fail("run: --prompt needs {}/tokenizer.json; use --prompt-tokens", dir);
      prompt = tok->encode(o->prompt, true);
    }
    if (prompt.empty()) fail("run: the prompt has no tokens");
    ModelFiles mf = open_model_files(dir, o->model.plan_options());
    for (const auto& w : mf.plan->warnings()) std::fprintf(stderr, "latent: warning: %s\n", w.c_str());
    ModelOptions mo;
    mo.bf16_activations = bf16;
    mo.act_fp8_declared = o->model.act_fp8_declared(o->activations, *mf.plan);
    const ParallelConfig pc = o->model.parallel();
    std::unique_ptr<Backend> be;
    std::unique_ptr<Model> one;
    std::unique_ptr<ParallelModel> par;
    if (pc.active()) {
      par = std::make_unique<ParallelModel>(*mf.cfg, *mf.plan, o->model.backend_name(o->backend), o->model.threads, pc,
                                            mo);
    } else {
      be = make_backend(o->model.backend_name(o->backend), o->model.threads);
      one = std::make_unique<Model>(*mf.cfg, *mf.plan, *be, mo);
    }
    GenerateOptions g;
    g.max_new_tokens = o->max_tokens;
    g.temperature = o->temperature;
    g.seed = o->seed;
    if (!o->ignore_eos) g.stop_ids = mf.cfg->eos_token_ids;
    if (o->max_tokens == 0) {
      std::printf("\n");
      return;
    }
    if (o->model.speculation_flags_given()) {
      // Through the scheduler (the serving path), with the MTP layer drafting when k > 0: the same tokens as k = 0.
      const int64_t k = o->model.num_speculative_tokens();
      if (pc.active()) fail("run: speculative decoding needs a single-rank model (no --tensor-parallel-size)");
      one.reset();
      mo.mtp_layers = k > 0 ? 1 : 0;
      one = std::make_unique<Model>(*mf.cfg, *mf.plan, *be, mo);
      server::ModelEngine eng(*one);
      SchedulerOptions so;
      so.num_speculative_tokens = k;
      so.max_num_seqs = 1;
      so.prefix_cache = false;
      const int64_t P = static_cast<int64_t>(prompt.size());
      so.max_context = P + o->max_tokens + 1;
      if (mf.cfg->max_position_embeddings > 0)
        so.max_context = std::min<int64_t>(so.max_context, mf.cfg->max_position_embeddings);
      if (P >= so.max_context) fail("run: the prompt has {} tokens; the context holds {}", P, so.max_context);
      const int64_t blocks = (so.max_context + k + so.kv_block_tokens) / so.kv_block_tokens + 2;
      so.kv_total_blocks = eng.configure(blocks * so.kv_block_tokens * eng.kv_bytes_per_token(), so.kv_block_tokens,
                                         so.max_batch_tokens, 1, so.max_context);
      Scheduler sched(eng, so);
      auto sink = std::make_shared<CollectingSink>([first = true](int32_t id) mutable {
        std::printf(first ? "%d" : " %d", id);
        std::fflush(stdout);
        first = false;
      });
      GenerationRequest req;
      req.prompt = prompt;
      req.max_tokens = o->max_tokens;
      req.sampling.temperature = static_cast<float>(o->temperature);
      req.sampling.seed = static_cast<int64_t>(o->seed);
      if (!o->ignore_eos) req.stop_ids.assign(mf.cfg->eos_token_ids.begin(), mf.cfg->eos_token_ids.end());
      req.ignore_eos = o->ignore_eos;
      req.sink = sink;
      const auto t0 = std::chrono::steady_clock::now();
      sched.start();
      sched.submit(std::move(req));
      const bool finished = sink->wait();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      sched.stop();
      if (!finished) fail("run: generation aborted: {}", sink->aborted);
      std::printf("\n");
      if (tok) std::printf("%s\n", tok->decode(sink->toks).c_str());
      const SchedulerStats st = sched.stats();
      std::string per;
      for (size_t j = 0; j < st.spec_proposed_at.size(); ++j)
        per +=
            fmt::format("{}{:.3f}", j ? " " : "",
                        st.spec_proposed_at[j] ? double(st.spec_accepted_at[j]) / double(st.spec_proposed_at[j]) : 0.0);
      std::fprintf(stderr,
                   "latent: %zu tokens in %.3f s (%.1f tokens/s incl. the prompt), %lld steps; speculative k=%lld: "
                   "%lld drafts proposed, %lld accepted, acceptance per position [%s]\n",
                   sink->toks.size(), secs, double(sink->toks.size()) / secs, static_cast<long long>(st.steps),
                   static_cast<long long>(k), static_cast<long long>(st.spec_proposed),
                   static_cast<long long>(st.spec_accepted), per.c_str());
      return;
    }
    bool first = true;
    auto print = [&](int32_t id) {
      std::printf(first ? "%d" : " %d", id);
      std::fflush(stdout);
      first = false;
    };
    const std::vector<int32_t> out = par ? generate(*par, prompt, g, print) : generate(*one, prompt, g, print);
    std::printf("\n");
    if (tok) std::printf("%s\n", tok->decode(out).c_str());
  });
}

}  // namespace latent::cli
