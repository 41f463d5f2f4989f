// ModelEngine: the scheduler's Engine over latent::Model (model/model.h). Each sequence owns a KvCache (contiguous
// per layer: latent c, k_pe and indexer keys, fp32). Model::forward runs one sequence at a time, so a batched step
// is a loop over its items; chunked prefill and decode share the same call. The scheduler's block accounting bounds
// the caches' total size (kv_bytes_per_token() sizes a block), but the memory is not physically paged.
#pragma once
#include <map>
#include <memory>

#include "model/model.h"
#include "runtime/engine.h"

namespace latent::server {

class ModelEngine : public Engine {
 public:
  explicit ModelEngine(Model& model);
  int64_t vocab_size() const override;
  int64_t kv_bytes_per_token() const override { return bytes_per_token_; }
  void add_sequence(SeqId seq) override;
  void remove_sequence(SeqId seq) override;
  void fork_sequence(SeqId from, SeqId to) override;
  void step(std::span<const EngineStepItem> items, float* logits) override;

 private:
  Model& model_;
  int64_t bytes_per_token_ = 0;
  std::map<SeqId, std::unique_ptr<KvCache>> caches_;
};

}  // namespace latent::server
