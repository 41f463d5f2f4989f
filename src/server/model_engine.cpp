#include "server/model_engine.h"

#include <algorithm>

#include "core/error.h"

namespace latent::server {

ModelEngine::ModelEngine(Model& model)
    : model_(model), bytes_per_token_(latent::kv_bytes_per_token(model.config(), model.cache_dtype())) {}

ModelEngine::ModelEngine(ParallelModel& pm)
    : model_(pm.rank(0)), pm_(&pm), bytes_per_token_(latent::kv_bytes_per_token(pm.config(), pm.cache_dtype())) {}

int64_t ModelEngine::vocab_size() const { return model_.config().vocab_size; }

int64_t ModelEngine::configure(int64_t budget_bytes, int64_t block_tokens, int64_t max_batch_tokens,
                               int64_t max_seqs, int64_t max_context, double mem_fraction) {
  const ModelConfig& c = model_.config();
  cache_.reset();
  rank_caches_.clear();
  rank_cache_ptrs_.clear();
  const int64_t max_blocks = (max_context + block_tokens - 1) / block_tokens;
  if (pm_)
    pm_->reserve(max_batch_tokens, max_seqs, max_context, max_blocks);
  else
    model_.reserve(max_batch_tokens, max_seqs, max_context, max_blocks);
  if (budget_bytes <= 0) {
    const auto [free_b, total_b] = model_.backend().memory_info();
    if (total_b == 0) fail("--kv-cache-bytes auto: the {} backend has no device memory to size it from",
                           model_.backend().name());
    if (!(mem_fraction > 0.0 && mem_fraction <= 1.0))
      fail("--gpu-memory-utilization must be in (0, 1] (got {})", mem_fraction);
    const double keep = (1.0 - mem_fraction) * static_cast<double>(total_b);
    budget_bytes = static_cast<int64_t>(static_cast<double>(free_b) - keep);
    if (budget_bytes <= 0)
      fail("KV cache: {:.1f} MiB of {:.1f} MiB device memory is free after the weights and the step workspace; "
           "--gpu-memory-utilization {} leaves none for the KV cache",
           free_b / 1048576.0, total_b / 1048576.0, mem_fraction);
  }
  // Every rank holds the whole (replicated) cache: a device budget is per GPU; ranks on host memory share it.
  if (pm_ && model_.backend().device() == Device::Cpu) budget_bytes /= pm_->ranks();
  const int64_t blocks = PagedKvCache::blocks_for_budget(c, budget_bytes, block_tokens, model_.cache_dtype());
  if (pm_) {
    rank_caches_ = pm_->make_caches(blocks, block_tokens);
    for (auto& rc : rank_caches_) rank_cache_ptrs_.push_back(rc.get());
  } else {
    cache_ = std::make_unique<PagedKvCache>(c, model_.backend(), blocks, block_tokens, model_.cache_dtype());
  }
  tokens_.reserve(static_cast<size_t>(max_batch_tokens));
  seqs_.reserve(static_cast<size_t>(max_seqs));
  return blocks;
}

void ModelEngine::copy_block(int32_t src, int32_t dst, int64_t n_tokens) {
  if (pm_ && !rank_cache_ptrs_.empty()) return pm_->copy_block(rank_cache_ptrs_, src, dst, n_tokens);
  if (!cache_) fail("engine: the KV cache is not configured");
  cache_->copy_block(src, dst, n_tokens);
}

void ModelEngine::step(std::span<const EngineStepItem> items, float* logits) {
  stage(items);
  if (pm_)
    pm_->step(Step{tokens_, seqs_}, rank_cache_ptrs_, logits);
  else
    model_.step(Step{tokens_, seqs_}, *cache_, logits);
}

void ModelEngine::step_sampled(std::span<const EngineStepItem> items, const SampleBatch& sampling, int32_t* ids) {
  if (!samples_on_device()) fail("engine: sampling on the device needs a single-rank model on a device backend");
  stage(items);
  model_.step(Step{tokens_, seqs_}, *cache_, nullptr, nullptr, &sampling, ids);
}

void ModelEngine::stage(std::span<const EngineStepItem> items) {
  if (!cache_ && rank_cache_ptrs_.empty()) fail("engine: the KV cache is not configured");
  tokens_.clear();
  seqs_.clear();
  for (const auto& it : items) {
    tokens_.insert(tokens_.end(), it.tokens.begin(), it.tokens.end());
    StepSequence q;
    q.start = it.start;
    q.n_tokens = static_cast<int64_t>(it.tokens.size());
    q.blocks = it.blocks;
    q.logits = it.all_logits ? LogitRows::All : it.want_logits ? LogitRows::Last : LogitRows::None;
    q.decode = it.decode;
    seqs_.push_back(q);
  }
}

}  // namespace latent::server
