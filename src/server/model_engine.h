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

// --kv-cache-bytes auto on the CPU: the pool holds what the server can use, --max-num-seqs sequences of
// --max-model-len tokens, plus kPrefixCacheShare of that for the prefix cache (when it is on: finished requests'
// blocks stay cached where running ones do not need them), capped at kHostMemoryShare of the memory available
// (MemAvailable, or the cgroup's limit less its usage when that is lower). In whole blocks.
struct HostKvAuto {
  static constexpr double kPrefixCacheShare = 0.25;
  static constexpr double kHostMemoryShare = 0.5;
  int64_t running_tokens = 0;   // max_num_seqs x max_model_len
  int64_t prefix_tokens = 0;    // the prefix cache's share (0 when it is off)
  int64_t blocks = 0;           // the pool, after the cap
  int64_t tokens = 0;           // blocks x block_tokens
  int64_t bytes = 0;            // tokens x bytes per token (x replicas): what may become resident
  int64_t available_bytes = 0;  // the memory it was capped against (0: unknown, no cap)
  bool capped = false;
};
HostKvAuto host_kv_auto(int64_t max_num_seqs, int64_t max_model_len, bool prefix_cache, int64_t bytes_per_token,
                        int64_t block_tokens, int64_t available_bytes, int64_t replicas = 1);
// (available_bytes: host_available_memory() of server/host_memory.h.)

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
  // Speculative decoding over the model's MTP layer (ModelOptions::mtp_layers; single rank).
  int64_t draft_layers() const override { return pm_ ? 0 : model_.mtp_layers(); }
  void draft(std::span<const EngineDraftItem> items, int32_t* drafts) override;
  // Where speculation stops paying: times a decode step and a verify step of k + 1 tokens plus its draft step at
  // batch 1, 2, 4, ... max_seqs (dummy sequences in the still empty pool, before serving) and returns the largest
  // batch at which (verify + draft) / decode < the expected tokens per verify, 1 + a + a^2 + ... + a^k with a prior
  // per-position acceptance `alpha` (-1: not even at batch 1), and a one-line summary of the figures.
  struct Crossover {
    int64_t max_batch = 0;
    std::string summary;
  };
  Crossover speculation_crossover(int64_t k, int64_t max_seqs, double alpha = 0.6);

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
  // Copies of the cache in host memory: the ranks of a parallel model on the CPU each hold one (a budget in bytes
  // is shared by them), else 1.
  int64_t host_replicas() const { return pm_ && model_.backend().device() == Device::Cpu ? pm_->ranks() : 1; }

 private:
  Model& model_;  // the model (rank 0 of a parallel one)
  ParallelModel* pm_ = nullptr;
  std::vector<std::unique_ptr<PagedKvCache>> rank_caches_;  // parallel: one pool per rank
  std::vector<PagedKvCache*> rank_cache_ptrs_;
  int64_t bytes_per_token_ = 0;
  std::unique_ptr<PagedKvCache> cache_;
  std::vector<int32_t> tokens_;  // grow-only staging of a step
  std::vector<StepSequence> seqs_;
  std::vector<MtpSequence> mtp_seqs_;
  int64_t max_batch_tokens_ = 0;
  void stage(std::span<const EngineStepItem> items);
};

}  // namespace latent::server
