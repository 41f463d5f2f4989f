// Loads everything `latent serve` needs from a model directory: tokenizer + chat template, the checkpoint with its
// precision plan, the Model on a backend, the Engine, generation_config.json (EOS set, sampling defaults) and the
// /v1/models metadata. Weights are memory-mapped; load() touches every page once so that the first requests do not
// stall on disk reads, reporting progress (bytes) to a callback.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "loader/precision_plan.h"
#include "model/model.h"
#include "server/hf_codec.h"
#include "server/model_engine.h"
#include "server/service.h"

namespace latent::server {

struct ServeModelOptions {
  std::string model_dir;
  PlanOptions plan;
  int threads = 0;
  std::string backend = "cpu";
  bool bf16_activations = false;
  bool act_declared = false;  // --activations declared (ModelOptions::act_fp8_declared where the plan has any)
  ParallelConfig parallel;    // ranks > 1: a ParallelModel (tensor / expert parallel, one thread per rank)
  bool cuda_graphs = true;    // decode steps as CUDA graphs where the backend supports them (ModelOptions::graphs)
  int64_t num_speculative_tokens = 0;     // > 0: the MTP layer is loaded and drafts this many tokens per step
  std::vector<std::string> served_names;  // empty: the directory's name
  int64_t max_model_len = 0;              // 0: config max_position_embeddings
  bool allow_long_context = false;        // accept max_model_len > max_position_embeddings
  std::string chat_template_file;
  bool deterministic = false;
  bool prefault = true;
  std::string version = "0.0.0";
};

struct LoadedModel {
  ModelFiles files;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;             // one rank (null when parallel)
  std::unique_ptr<ParallelModel> parallel;  // several ranks
  std::unique_ptr<ModelEngine> engine;
  std::unique_ptr<HfCodec> codec;
  ModelInfo info;
  std::vector<bool> banned;            // [vocab_size]: ids with no token string (never sampled)
  int64_t num_speculative_tokens = 0;  // ServeModelOptions::num_speculative_tokens (the MTP layer is loaded)
  std::string plan_text;               // `latent plan` table for the start log
};

// stage: "tokenizer", "checkpoint", "weights", "model"; done/total in bytes for "weights".
using LoadProgress = std::function<void(const std::string& stage, uint64_t done, uint64_t total)>;

// Throws latent::Error naming the file / field on any failure.
std::unique_ptr<LoadedModel> load_serving_model(const ServeModelOptions& opt, const LoadProgress& progress = {});

// generation_config.json: eos_token_id (int or list) and sampling defaults; absent file -> empty.
struct GenerationConfig {
  std::vector<int32_t> eos_ids;
  SamplingDefaults defaults;
};
GenerationConfig read_generation_config(const std::string& model_dir);

}  // namespace latent::server
