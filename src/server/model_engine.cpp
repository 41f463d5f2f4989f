#include "server/model_engine.h"

#include <algorithm>

#include "core/error.h"

namespace latent::server {

ModelEngine::ModelEngine(Model& model) : model_(model) {
  const ModelConfig& c = model.config();
  int64_t floats = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    floats += c.kv_lora_rank + c.qk_rope_head_dim;
    if (static_cast<size_t>(l) < c.layer_has_indexer.size() && c.layer_has_indexer[static_cast<size_t>(l)])
      floats += c.index_head_dim;
  }
  bytes_per_token_ = std::max<int64_t>(1, floats * static_cast<int64_t>(sizeof(float)));
}

int64_t ModelEngine::vocab_size() const { return model_.config().vocab_size; }

void ModelEngine::add_sequence(SeqId seq) { caches_[seq] = std::make_unique<KvCache>(model_.config()); }

void ModelEngine::remove_sequence(SeqId seq) { caches_.erase(seq); }

void ModelEngine::fork_sequence(SeqId from, SeqId to) {
  auto f = caches_.find(from);
  if (f == caches_.end()) fail("engine: fork from unknown sequence {}", from);
  caches_[to] = std::make_unique<KvCache>(*f->second);
}

void ModelEngine::step(std::span<const EngineStepItem> items, float* logits) {
  const int64_t V = vocab_size();
  int64_t row = 0;
  for (const auto& it : items) {
    auto c = caches_.find(it.seq);
    if (c == caches_.end()) fail("engine: unknown sequence {}", it.seq);
    float* out = it.want_logits ? logits + row * V : nullptr;
    model_.forward(it.tokens, *c->second, out, /*all_rows=*/false);
    if (it.want_logits) ++row;
  }
}

}  // namespace latent::server
