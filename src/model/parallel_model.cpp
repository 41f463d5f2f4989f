#include "model/parallel_model.h"

#include <algorithm>

#include "core/error.h"
#include "core/threads.h"

namespace latent {

ParallelKvCache::ParallelKvCache(const ModelConfig& cfg, int ranks, int64_t block_tokens) {
  for (int r = 0; r < std::max(1, ranks); ++r) caches_.push_back(std::make_unique<KvCache>(cfg, block_tokens));
}
void ParallelKvCache::clear() {
  for (auto& c : caches_) c->clear();
}
void ParallelKvCache::truncate(int64_t n) {
  for (auto& c : caches_) c->truncate(n);
}

ParallelModel::ParallelModel(const ModelConfig& cfg, const PrecisionPlan& plan, const std::string& backend, int threads,
                             const ParallelConfig& pc, ModelOptions opt)
    : cfg_(cfg), pc_(pc) {
  if (pc_.ranks < 1) fail("parallel model: ranks must be >= 1 (got {})", pc_.ranks);
  const int W = pc_.ranks;
  cuda_ = backend == "cuda";
  if (cuda_) {
    const int n = cuda_device_count();
    if (n < W) fail("{}: {} ranks need {} GPUs, {} visible", pc_.describe(), W, W, n);
  }
  int per_rank = 1;
  if (!cuda_) {
    const int total = threads > 0 ? threads : available_cpus();
    per_rank = std::max(1, total / W);
  }
  backends_.resize(static_cast<size_t>(W));
  models_.resize(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) threads_.emplace_back([this, r] { worker(r); });
  try {
    run([&](int r) { backends_[static_cast<size_t>(r)] = make_backend(backend, per_rank); });
    if (cuda_) {
      std::vector<Backend*> bs;
      std::vector<int> devs;
      for (int r = 0; r < W; ++r) {
        bs.push_back(backends_[static_cast<size_t>(r)].get());
        devs.push_back(r);
      }
      comms_ = make_nccl_communicators(bs, devs);
    } else {
      for (auto& b : backends_)
        if (b->device() != Device::Cpu)
          fail("parallel model: the in-process communicator needs host-memory backends ({} is not)", b->name());
      group_ = std::make_unique<InProcessGroup>(W);
      for (int r = 0; r < W; ++r) comms_.push_back(group_->communicator(r));
    }
    run([&](int r) {
      models_[static_cast<size_t>(r)] =
          std::make_unique<Model>(cfg, plan, *backends_[static_cast<size_t>(r)], rank_options(opt, r),
                                  RankContext{pc_, r, comms_[static_cast<size_t>(r)].get()});
    });
  } catch (...) {
    run([&](int r) {  // free each rank's memory on its own thread (its GPU)
      models_[static_cast<size_t>(r)].reset();
    });
    comms_.clear();
    run([&](int r) { backends_[static_cast<size_t>(r)].reset(); });
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_work_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

ParallelModel::~ParallelModel() {
  try {
    run([&](int r) { models_[static_cast<size_t>(r)].reset(); });
    comms_.clear();
    run([&](int r) { backends_[static_cast<size_t>(r)].reset(); });
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : threads_) t.join();
}

void ParallelModel::worker(int r) {
  bool bound = false;
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || job_gen_ != seen; });
      if (stop_) return;
      seen = job_gen_;
      job = job_;
    }
    std::exception_ptr err;
    try {
      if (cuda_ && !bound) {
        cuda_bind_device(r);  // every op of this rank runs on GPU r
        bound = true;
      }
      (*job)(r);
    } catch (...) {
      err = std::current_exception();
      if (group_) group_->abort();  // peers blocked in a collective throw instead of waiting
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      errors_[static_cast<size_t>(r)] = err;
      if (++done_ == pc_.ranks) cv_done_.notify_all();
    }
  }
}

void ParallelModel::run(const std::function<void(int)>& fn) {
  std::unique_lock<std::mutex> lk(mu_);
  job_ = &fn;
  done_ = 0;
  errors_.assign(static_cast<size_t>(pc_.ranks), nullptr);
  ++job_gen_;
  cv_work_.notify_all();
  cv_done_.wait(lk, [&] { return done_ == pc_.ranks; });
  job_ = nullptr;
  std::exception_ptr first, aborted;
  for (const std::exception_ptr& e : errors_) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CollectiveAborted&) {
      if (!aborted) aborted = e;
    } catch (...) {
      if (!first) first = e;
    }
  }
  if (!first) first = aborted;
  if (first) {
    if (group_) group_->reset();
    lk.unlock();
    std::rethrow_exception(first);
  }
}

ModelOptions ParallelModel::rank_options(ModelOptions o, int r) {
  if (r != 0) {
    o.record_decisions = nullptr;  // rank 0 records (the decisions are identical on every rank)
    o.upload_progress = nullptr;   // and reports its upload (the ranks load concurrently; the bar is not shared)
  }
  return o;
}

void ParallelModel::set_options(const ModelOptions& o) {
  for (int r = 0; r < pc_.ranks; ++r) models_[static_cast<size_t>(r)]->set_options(rank_options(o, r));
}

void ParallelModel::step(const Step& st, std::span<PagedKvCache* const> caches, float* logits,
                         std::vector<float>* hidden) {
  if (static_cast<int>(caches.size()) != pc_.ranks)
    fail("parallel step: {} caches for {} ranks", caches.size(), pc_.ranks);
  run([&](int r) {
    models_[static_cast<size_t>(r)]->step(st, *caches[static_cast<size_t>(r)], logits, r == 0 ? hidden : nullptr);
  });
}

void ParallelModel::forward(std::span<const int32_t> ids, ParallelKvCache& cache, float* logits, bool all_rows,
                            std::vector<float>* hidden) {
  run([&](int r) {
    models_[static_cast<size_t>(r)]->forward(ids, cache.rank(r), logits, all_rows, r == 0 ? hidden : nullptr);
  });
}

std::vector<float> ParallelModel::logits(std::span<const int32_t> ids) {
  ParallelKvCache cache(cfg_, pc_.ranks);
  std::vector<float> out(ids.size() * static_cast<size_t>(cfg_.vocab_size));
  forward(ids, cache, out.data(), true);
  return out;
}

void ParallelModel::reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_ctx, int64_t max_blocks) {
  run([&](int r) { models_[static_cast<size_t>(r)]->reserve(max_tokens, max_seqs, max_ctx, max_blocks); });
}

std::vector<std::unique_ptr<PagedKvCache>> ParallelModel::make_caches(int64_t num_blocks, int64_t block_tokens) {
  std::vector<std::unique_ptr<PagedKvCache>> out(static_cast<size_t>(pc_.ranks));
  run([&](int r) {
    out[static_cast<size_t>(r)] = std::make_unique<PagedKvCache>(cfg_, *backends_[static_cast<size_t>(r)], num_blocks,
                                                                 block_tokens, cache_dtype());
  });
  return out;
}

void ParallelModel::copy_block(std::span<PagedKvCache* const> caches, int32_t src, int32_t dst, int64_t n_tokens) {
  run([&](int r) { caches[static_cast<size_t>(r)]->copy_block(src, dst, n_tokens); });
}

}  // namespace latent
