#include "server/model_engine.h"

#include <algorithm>

#include "core/error.h"

namespace latent::server {

ModelEngine::ModelEngine(Model& model)
    : model_(model), bytes_per_token_(latent::kv_bytes_per_token(model.config(), model.cache_dtype())) {}

int64_t ModelEngine::vocab_size() const { return model_.config().vocab_size; }

int64_t ModelEngine::configure(int64_t budget_bytes, int64_t block_tokens, int64_t max_batch_tokens,
                               int64_t max_seqs, int64_t max_context) {
  const ModelConfig& c = model_.config();
  const int64_t blocks = PagedKvCache::blocks_for_budget(c, budget_bytes, block_tokens, model_.cache_dtype());
  cache_.reset();
  cache_ = std::make_unique<PagedKvCache>(c, model_.backend(), blocks, block_tokens, model_.cache_dtype());
  const int64_t ctx = std::min(max_context, blocks * block_tokens);
  model_.reserve(max_batch_tokens, max_seqs, ctx, (ctx + block_tokens - 1) / block_tokens);
  tokens_.reserve(static_cast<size_t>(max_batch_tokens));
  seqs_.reserve(static_cast<size_t>(max_seqs));
  return blocks;
}

void ModelEngine::copy_block(int32_t src, int32_t dst, int64_t n_tokens) {
  if (!cache_) fail("engine: the KV cache is not configured");
  cache_->copy_block(src, dst, n_tokens);
}

void ModelEngine::step(std::span<const EngineStepItem> items, float* logits) {
  if (!cache_) fail("engine: the KV cache is not configured");
  tokens_.clear();
  seqs_.clear();
  for (const auto& it : items) {
    tokens_.insert(tokens_.end(), it.tokens.begin(), it.tokens.end());
    StepSequence q;
    q.start = it.start;
    q.n_tokens = static_cast<int64_t>(it.tokens.size());
    q.blocks = it.blocks;
    q.logits = it.want_logits ? LogitRows::Last : LogitRows::None;
    seqs_.push_back(q);
  }
  model_.step(Step{tokens_, seqs_}, *cache_, logits);
}

}  // namespace latent::server
