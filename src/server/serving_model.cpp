#include "server/serving_model.h"

#include <fmt/format.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "loader/plan_report.h"

namespace latent::server {

namespace fs = std::filesystem;

GenerationConfig read_generation_config(const std::string& model_dir) {
  GenerationConfig g;
  const fs::path p = fs::path(model_dir) / "generation_config.json";
  if (!fs::exists(p)) return g;
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", p.string(), e.what());
  }
  if (!j.is_object()) fail("{}: not a JSON object", p.string());
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    auto one = [&](const nlohmann::json& v) {
      if (!v.is_number_integer()) fail("{}: eos_token_id must be an integer or a list of integers", p.string());
      g.eos_ids.push_back(v.get<int32_t>());
    };
    if (it->is_array())
      for (const auto& v : *it) one(v);
    else
      one(*it);
  }
  nlohmann::json samp = nlohmann::json::object();
  for (const char* k : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"})
    if (j.contains(k)) samp[k] = j[k];
  g.defaults = SamplingDefaults::from_json(samp, p.string());
  return g;
}

namespace {

std::string dir_name(const std::string& dir) {
  fs::path p = fs::weakly_canonical(fs::path(dir));
  std::string n = p.filename().string();
  if (n.empty()) n = p.parent_path().filename().string();
  return n.empty() ? "model" : n;
}

void prefault(const Checkpoint& ckpt, const LoadProgress& progress) {
  const uint64_t total = ckpt.total_bytes();
  uint64_t done = 0, last = 0;
  volatile uint8_t sink = 0;
  for (const auto& name : ckpt.names()) {
    const TensorView v = ckpt.view(name);
    const uint8_t* b = v.bytes();
    for (uint64_t i = 0; i < v.nbytes; i += 4096) sink = static_cast<uint8_t>(sink + b[i]);
    done += v.nbytes;
    if (progress && (done - last > (total / 200) || done == total)) {
      progress("weights", done, total);
      last = done;
    }
  }
  (void)sink;
}

std::string weight_formats(const nlohmann::json& summary) {
  std::string s;
  if (summary.contains("weights_params_by_format"))
    for (auto it = summary["weights_params_by_format"].begin(); it != summary["weights_params_by_format"].end(); ++it)
      s += (s.empty() ? "" : "+") + it.key();
  return s.empty() ? "unknown" : s;
}

}  // namespace

std::unique_ptr<LoadedModel> load_serving_model(const ServeModelOptions& opt, const LoadProgress& progress) {
  auto m = std::make_unique<LoadedModel>();
  if (!fs::is_directory(opt.model_dir)) fail("{}: no such model directory", opt.model_dir);
  if (progress) progress("tokenizer", 0, 0);
  m->codec = HfCodec::load(opt.model_dir, opt.chat_template_file);
  if (progress) progress("checkpoint", 0, 0);
  m->files = open_model_files(opt.model_dir, opt.plan);
  const ModelConfig& cfg = *m->files.cfg;
  for (const auto& w : m->files.plan->warnings()) log::warn("{}", w);
  if (opt.max_model_len > 0 && cfg.max_position_embeddings > 0 && opt.max_model_len > cfg.max_position_embeddings &&
      !opt.allow_long_context)
    fail(
        "--max-model-len {} exceeds the model's max_position_embeddings {} (add --allow-long-context to serve it "
        "anyway)",
        opt.max_model_len, cfg.max_position_embeddings);
  if (opt.prefault) prefault(*m->files.ckpt, progress);
  if (progress) progress("model", 0, 0);
  ModelOptions mo;
  mo.bf16_activations = opt.bf16_activations;
  mo.act_fp8_declared = opt.act_declared && m->files.plan->act_fp8_declared();
  if (opt.act_declared && !mo.act_fp8_declared)
    log::info(
        "--activations declared: {}; no module runs declared FP8 activations, so every activation is {} (the "
        "default)",
        m->files.plan->activation_scheme(), opt.bf16_activations ? "bf16" : "fp32");
  mo.graphs = opt.cuda_graphs;
  mo.mtp_layers = opt.num_speculative_tokens > 0 ? 1 : 0;
  if (mo.mtp_layers > 0 && opt.plan.mtp_layers < 1)
    fail("speculative decoding: the precision plan was built without the MTP layer (PlanOptions::mtp_layers)");
  m->num_speculative_tokens = opt.num_speculative_tokens;
  if (progress)
    mo.upload_progress = [&progress](uint64_t done, uint64_t total) { progress("weights onto the GPU", done, total); };
  if (opt.parallel.active()) {
    m->parallel = std::make_unique<ParallelModel>(cfg, *m->files.plan, opt.backend, opt.threads, opt.parallel, mo);
    m->engine = std::make_unique<ModelEngine>(*m->parallel);
  } else {
    m->backend = make_backend(opt.backend, opt.threads);
    m->model = std::make_unique<Model>(cfg, *m->files.plan, *m->backend, mo);
    m->engine = std::make_unique<ModelEngine>(*m->model);
  }
  m->plan_text = format_plan_text(*m->files.plan, cfg, opt.model_dir, opt.plan.allow_lossy,
                                  PlanActivations{opt.bf16_activations ? "bf16" : "fp32", mo.act_fp8_declared});
  if (opt.parallel.active()) m->plan_text += format_sharding_text(cfg, *m->files.plan, opt.parallel);

  // Ids the model can produce but the tokenizer cannot print are never sampled (docs/tokenizer.md §files).
  const int64_t V = cfg.vocab_size;
  m->banned.assign(static_cast<size_t>(V), false);
  int64_t n_banned = 0;
  for (int64_t id = 0; id < V; ++id)
    if (id >= m->codec->id_limit() || m->codec->token_str(static_cast<int32_t>(id)).empty()) {
      m->banned[static_cast<size_t>(id)] = true;
      ++n_banned;
    }
  if (n_banned == V)
    fail("{}: the tokenizer has no token for any id of the model's vocabulary ({} ids)", opt.model_dir, V);

  ModelInfo& info = m->info;
  info.served_names = opt.served_names.empty() ? std::vector<std::string>{dir_name(opt.model_dir)} : opt.served_names;
  info.max_model_len = opt.max_model_len > 0 ? opt.max_model_len : cfg.max_position_embeddings;
  if (info.max_model_len <= 1) fail("{}: cannot determine the context length (set --max-model-len)", opt.model_dir);
  info.vocab_size = V;
  const GenerationConfig gc = read_generation_config(opt.model_dir);
  info.generation_defaults = gc.defaults;
  if (!gc.eos_ids.empty()) {
    info.eos_ids = gc.eos_ids;
  } else {
    for (int64_t e : cfg.eos_token_ids) info.eos_ids.push_back(static_cast<int32_t>(e));
    if (info.eos_ids.empty())
      if (auto e = m->codec->tokenizer().eos_id()) info.eos_ids.push_back(*e);
  }
  for (int32_t e : info.eos_ids)
    if (e < 0 || e >= V) fail("{}: eos_token_id {} is outside the vocabulary [0, {})", opt.model_dir, e, V);
  info.created = static_cast<int64_t>(std::time(nullptr));
  const nlohmann::json summary = plan_summary(*m->files.plan);
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["architecture"] = arch_name(cfg.arch);
  meta["weight_quantization"] = weight_formats(summary);
  meta["activation_dtype"] = opt.bf16_activations ? "bf16" : "f32";
  meta["declared_fp8_activations"] = mo.act_fp8_declared;
  meta["kv_cache_dtype"] = opt.bf16_activations ? "bf16" : "f32";
  meta["tensor_parallel_size"] = 1;
  meta["expert_parallel_size"] = 1;
  meta["data_parallel_size"] = 1;
  if (opt.num_speculative_tokens > 0)
    meta["speculative"] = {{"method", "mtp"}, {"num_speculative_tokens", opt.num_speculative_tokens}};
  else
    meta["speculative"] = nullptr;
  meta["deterministic"] = opt.deterministic;
  meta["lossy"] = m->files.plan->lossy();
  meta["precision_plan"] = nlohmann::ordered_json::parse(summary.dump());
  info.meta = std::move(meta);
  const size_t h = std::hash<std::string>{}(opt.version + "|" + fs::weakly_canonical(opt.model_dir).string() + "|" +
                                            summary.dump() + "|" + opt.backend);
  info.fingerprint = fmt::format("fp_{:012x}", static_cast<uint64_t>(h) & 0xFFFFFFFFFFFFull);
  return m;
}

}  // namespace latent::server
