// ModelEngine: the scheduler's Engine over latent::Model (model/model.h). It owns the paged KV block pool (the
// cache's storage, allocated once through the model's backend from the --kv-cache-bytes budget) and turns a
// scheduler step into one batched Model::step: every item's tokens in one flat batch, each with its block table.
#pragma once
#include <memory>
#include <vector>

#include "model/model.h"
#include "model/parallel_model.h"
#include "runtime/engine.h"

namespace latent::server {

class ModelEngine : public Engine {
 public:
  explicit ModelEngine(Model& model);
  // Over every rank of a parallel model: one block pool per rank (the latent cache is replicated), the same
  // block ids on every rank; a step runs on all ranks.
  explicit ModelEngine(ParallelModel& model);
  int64_t vocab_size() const override;
  int64_t kv_bytes_per_token() const override { return bytes_per_token_; }
  void copy_block(int32_t src, int32_t dst, int64_t n_tokens) override;
  void step(std::span<const EngineStepItem> items, float* logits) override;
  // On a device backend (single rank) the scheduler's rows are sampled there (Backend::sample_rows).
  bool samples_on_device() const override { return !pm_ && model_.backend().device() != Device::Cpu; }
  void step_sampled(std::span<const EngineStepItem> items, const SampleBatch& sampling, int32_t* ids) override;
  bool lost() const override { return model_.backend().device_lost(); }

  // Reserves the model's step workspace for the scheduler's limits (so that no step allocates), then allocates the
  // block pool from a byte budget (blocks of block_tokens tokens). budget_bytes <= 0: from the device's free
  // memory after weights and workspace, leaving (1 - mem_fraction) of its total free (a device backend only).
  // With a parallel model every rank holds the whole cache (replicated): on a device the budget is per GPU, on host
  // memory it is shared by the ranks (divided). Returns the number of blocks.
  int64_t configure(int64_t budget_bytes, int64_t block_tokens, int64_t max_batch_tokens, int64_t max_seqs,
                    int64_t max_context, double mem_fraction = 0.9);
  const PagedKvCache* cache() const { return pm_ ? rank_caches_.front().get() : cache_.get(); }
  DType cache_dtype() const { return model_.cache_dtype(); }
  int64_t workspace_bytes() const { return model_.workspace_bytes(); }  // per rank

 private:
  Model& model_;               // the model (rank 0 of a parallel one)
  ParallelModel* pm_ = nullptr;
  std::vector<std::unique_ptr<PagedKvCache>> rank_caches_;  // parallel: one pool per rank
  std::vector<PagedKvCache*> rank_cache_ptrs_;
  int64_t bytes_per_token_ = 0;
  std::unique_ptr<PagedKvCache> cache_;
  std::vector<int32_t> tokens_;  // grow-only staging of a step
  std::vector<StepSequence> seqs_;
  void stage(std::span<const EngineStepItem> items);
};

}  // namespace latent::server
