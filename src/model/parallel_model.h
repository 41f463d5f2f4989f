// ParallelModel: one model over several ranks (tensor / expert parallelism, model/shard.h) in ONE process with ONE
// thread per rank (parallel/communicator.h says why). Each rank has its own backend (CPU: a CPU backend with a
// share of the threads; CUDA: GPU r), its own Model holding only its slices of the checkpoint, and its own copy
// of the latent cache. A step is handed to every rank thread, which runs the same Model::step; the communicator
// (in-process for host backends, NCCL for CUDA) combines the partial results inside the step.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "parallel/communicator.h"

namespace latent {

// One sequence's cache on every rank (the single-sequence convenience, as KvCache).
class ParallelKvCache {
 public:
  ParallelKvCache(const ModelConfig& cfg, int ranks, int64_t block_tokens = 64);
  int64_t length() const { return caches_.front()->length(); }
  void clear();
  void truncate(int64_t n);
  KvCache& rank(int r) { return *caches_[static_cast<size_t>(r)]; }

 private:
  std::vector<std::unique_ptr<KvCache>> caches_;
};

class ParallelModel {
 public:
  // backend: "cpu" or "ref" (ranks as threads over the in-process communicator; `threads` split over the ranks,
  // 0 = available_cpus()) or "cuda" (rank r on GPU r, NCCL). Throws Error on an invalid layout (names the config field
  // or the tensor), or when fewer GPUs than ranks are visible.
  ParallelModel(const ModelConfig& cfg, const PrecisionPlan& plan, const std::string& backend, int threads,
                const ParallelConfig& pc, ModelOptions opt = {});
  ~ParallelModel();
  ParallelModel(const ParallelModel&) = delete;
  ParallelModel& operator=(const ParallelModel&) = delete;

  int ranks() const { return pc_.ranks; }
  const ParallelConfig& parallel() const { return pc_; }
  const ModelConfig& config() const { return cfg_; }
  Model& rank(int r) { return *models_[static_cast<size_t>(r)]; }
  Backend& backend(int r) { return *backends_[static_cast<size_t>(r)]; }
  Communicator& comm(int r) { return *comms_[static_cast<size_t>(r)]; }  // use only inside run() (every rank)
  DType cache_dtype() const { return models_.front()->cache_dtype(); }
  void set_options(const ModelOptions& o);

  // Model::step on every rank, each over its own cache (caches[r], allocated on rank r: make_caches).
  void step(const Step& st, std::span<PagedKvCache* const> caches, float* logits, std::vector<float>* hidden = nullptr);
  // Model::forward on every rank over its own KvCache.
  void forward(std::span<const int32_t> ids, ParallelKvCache& cache, float* logits, bool all_rows = true,
               std::vector<float>* hidden = nullptr);
  std::vector<float> logits(std::span<const int32_t> ids);
  void reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_ctx, int64_t max_blocks);
  // A paged pool of num_blocks blocks per rank, each allocated by its rank's backend (on its GPU).
  std::vector<std::unique_ptr<PagedKvCache>> make_caches(int64_t num_blocks, int64_t block_tokens);
  // Copy on write of a shared block, on every rank.
  void copy_block(std::span<PagedKvCache* const> caches, int32_t src, int32_t dst, int64_t n_tokens);

  // Runs fn(rank) on every rank's thread and waits for all; rethrows the error of the lowest rank that failed on
  // its own (not one woken by a peer's abort), so the message does not depend on thread timing.
  void run(const std::function<void(int)>& fn);

 private:
  void worker(int r);
  static ModelOptions rank_options(ModelOptions o, int r);

  const ModelConfig& cfg_;
  ParallelConfig pc_;
  bool cuda_ = false;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::unique_ptr<InProcessGroup> group_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<Model>> models_;

  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t job_gen_ = 0;
  int done_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;  // per rank, of the current job
  std::vector<std::thread> threads_;
};

}  // namespace latent
