#include "server/model_engine.h"

#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"

namespace latent::server {

HostKvAuto host_kv_auto(int64_t max_num_seqs, int64_t max_model_len, bool prefix_cache, int64_t bytes_per_token,
                        int64_t block_tokens, int64_t available_bytes, int64_t replicas) {
  if (max_num_seqs < 1 || max_model_len < 1 || bytes_per_token < 1 || block_tokens < 1 || replicas < 1)
    fail(
        "--kv-cache-bytes auto: needs positive sizes (max_num_seqs {}, max_model_len {}, {} bytes/token, "
        "{} tokens/block)",
        max_num_seqs, max_model_len, bytes_per_token, block_tokens);
  HostKvAuto a;
  // Saturated far above any memory (the cap below then decides): flags up to 1e18 must not overflow.
  constexpr int64_t kMaxTokens = int64_t{1} << 50;
  a.running_tokens = max_num_seqs > kMaxTokens / max_model_len ? kMaxTokens : max_num_seqs * max_model_len;
  a.prefix_tokens =
      prefix_cache
          ? static_cast<int64_t>(std::ceil(static_cast<double>(a.running_tokens) * HostKvAuto::kPrefixCacheShare))
          : 0;
  // Products checked in double: a block or a pool beyond 2^62 bytes is refused, not wrapped.
  constexpr double kMaxBytes = 4.6e18;
  if (static_cast<double>(bytes_per_token) * static_cast<double>(block_tokens) * static_cast<double>(replicas) >
      kMaxBytes)
    fail("--kv-cache-bytes auto: a KV block of {} tokens at {} bytes/token does not fit in memory", block_tokens,
         bytes_per_token);
  const int64_t per_block = bytes_per_token * block_tokens * replicas;
  a.blocks = (a.running_tokens + a.prefix_tokens + block_tokens - 1) / block_tokens;
  a.available_bytes = std::max<int64_t>(0, available_bytes);
  if (a.available_bytes > 0) {
    const int64_t cap =
        static_cast<int64_t>(static_cast<double>(a.available_bytes) * HostKvAuto::kHostMemoryShare) / per_block;
    if (cap < a.blocks) {
      a.blocks = cap;
      a.capped = true;
    }
    if (a.blocks < 1)
      fail(
          "--kv-cache-bytes auto: {:.1f} MiB of memory is available; half of it does not hold one KV block of {} "
          "tokens ({} bytes); free memory or give --kv-cache-bytes",
          a.available_bytes / 1048576.0, block_tokens, per_block);
  }
  if (static_cast<double>(a.blocks) * static_cast<double>(per_block) > kMaxBytes)  // only when memory is unknown
    fail(
        "--kv-cache-bytes auto: {} sequences x {} tokens at {} bytes/token does not fit in memory (the available "
        "memory could not be read to cap it); give --kv-cache-bytes or smaller --max-num-seqs / --max-model-len",
        max_num_seqs, max_model_len, bytes_per_token);
  a.tokens = a.blocks * block_tokens;
  a.bytes = a.blocks * per_block;
  return a;
}

ModelEngine::ModelEngine(Model& model)
    : model_(model),
      bytes_per_token_(latent::kv_bytes_per_token(model.config(), model.cache_dtype(), model.mtp_layers())) {}

ModelEngine::ModelEngine(ParallelModel& pm)
    : model_(pm.rank(0)), pm_(&pm), bytes_per_token_(latent::kv_bytes_per_token(pm.config(), pm.cache_dtype())) {}

int64_t ModelEngine::vocab_size() const { return model_.config().vocab_size; }

int64_t ModelEngine::configure(int64_t budget_bytes, int64_t block_tokens, int64_t max_batch_tokens, int64_t max_seqs,
                               int64_t max_context, double mem_fraction) {
  const ModelConfig& c = model_.config();
  cache_.reset();
  rank_caches_.clear();
  rank_cache_ptrs_.clear();
  const int64_t max_blocks = (max_context + block_tokens - 1) / block_tokens;
  if (pm_) {
    pm_->reserve(max_batch_tokens, max_seqs, max_context, max_blocks);
  } else {
    // A draft step's first pass writes the draft layer's slots of every token of the step plus one per sequence
    // (the slot before a step's first token pairs with the previous step's row): reserved too, so that it never
    // grows the workspace (which would drop the decode graphs).
    const int64_t draft_tokens = model_.mtp_layers() > 0 ? max_seqs : 0;
    model_.reserve(max_batch_tokens + draft_tokens, max_seqs, max_context, max_blocks);
  }
  if (budget_bytes <= 0) {
    const auto [free_b, total_b] = model_.backend().memory_info();
    if (total_b == 0)
      fail("--kv-cache-bytes auto: the {} backend has no device memory to size it from", model_.backend().name());
    if (!(mem_fraction > 0.0 && mem_fraction <= 1.0))
      fail("--gpu-memory-utilization must be in (0, 1] (got {})", mem_fraction);
    const double keep = (1.0 - mem_fraction) * static_cast<double>(total_b);
    budget_bytes = static_cast<int64_t>(static_cast<double>(free_b) - keep);
    if (budget_bytes <= 0)
      fail(
          "KV cache: {:.1f} MiB of {:.1f} MiB device memory is free after the weights and the step workspace; "
          "--gpu-memory-utilization {} leaves none for the KV cache",
          free_b / 1048576.0, total_b / 1048576.0, mem_fraction);
  }
  // Every rank holds the whole (replicated) cache: a device budget is per GPU; ranks on host memory share it.
  if (pm_ && model_.backend().device() == Device::Cpu) budget_bytes /= pm_->ranks();
  const int64_t mtp = pm_ ? 0 : model_.mtp_layers();
  const int64_t blocks = PagedKvCache::blocks_for_budget(c, budget_bytes, block_tokens, model_.cache_dtype(), mtp);
  if (pm_) {
    rank_caches_ = pm_->make_caches(blocks, block_tokens);
    for (auto& rc : rank_caches_) rank_cache_ptrs_.push_back(rc.get());
  } else {
    cache_ = std::make_unique<PagedKvCache>(c, model_.backend(), blocks, block_tokens, model_.cache_dtype(), mtp);
  }
  tokens_.reserve(static_cast<size_t>(max_batch_tokens));
  max_batch_tokens_ = max_batch_tokens;
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

void ModelEngine::draft(std::span<const EngineDraftItem> items, int32_t* drafts) {
  if (pm_ || model_.mtp_layers() == 0) fail("engine: the model has no MTP layer loaded (speculative decoding is off)");
  if (!cache_) fail("engine: the KV cache is not configured");
  mtp_seqs_.clear();
  for (const EngineDraftItem& it : items) {
    MtpSequence q;
    q.start = it.start;
    q.n_slots = static_cast<int64_t>(it.tokens.size());
    q.tokens = it.tokens;
    q.hidden_row = it.hidden_row;
    q.zero_first = it.zero_first;
    q.blocks = it.blocks;
    q.n_draft = it.n_draft;
    q.decode = it.decode;
    mtp_seqs_.push_back(q);
  }
  model_.mtp_draft(mtp_seqs_, *cache_, drafts);
}

ModelEngine::Crossover ModelEngine::speculation_crossover(int64_t k, int64_t max_seqs, double alpha) {
  Crossover c;
  if (!cache_ || model_.mtp_layers() == 0 || k <= 0) return c;
  const int64_t bt = cache_->block_tokens(), ctx = 16, V = model_.config().vocab_size;
  const int64_t per_seq = (ctx + 2 * k + 2 + bt - 1) / bt;
  double expect = 0, a = 1;
  for (int64_t j = 0; j <= k; ++j, a *= alpha) expect += a;
  c.max_batch = -1;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> toks, drafts, ids;
  std::vector<float> logits;
  std::vector<SampleRowParams> greedy;
  for (int64_t b = 1; b <= max_seqs; b *= 2) {
    if (b * per_seq > cache_->num_blocks() || b * (k + 1) > max_batch_tokens_ || b * ctx > max_batch_tokens_) break;
    tables.assign(static_cast<size_t>(b), {});
    for (int64_t s = 0; s < b; ++s)
      for (int64_t j = 0; j < per_seq; ++j)
        tables[static_cast<size_t>(s)].push_back(static_cast<int32_t>(s * per_seq + j));
    auto run = [&](int64_t n, int64_t start, bool decode, bool all) {
      std::vector<EngineStepItem> items(static_cast<size_t>(b));
      toks.assign(static_cast<size_t>(b * n), 0);
      for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 7 + 3) % V);
      for (int64_t s = 0; s < b; ++s) {
        EngineStepItem& it = items[static_cast<size_t>(s)];
        it.seq = s;
        it.tokens = std::span<const int32_t>(toks.data() + s * n, static_cast<size_t>(n));
        it.start = start;
        it.blocks = tables[static_cast<size_t>(s)];
        it.want_logits = true;
        it.all_logits = all;
        it.decode = decode;
      }
      // As the scheduler runs them: on a device the rows are sampled there and only the ids come back (downloading
      // k + 1 rows of logits per sequence would charge the verify step with a transfer the server never makes).
      const int64_t n_rows = all ? b * n : b;
      const bool on_device = samples_on_device();
      if (on_device) {
        greedy.assign(static_cast<size_t>(n_rows), SampleRowParams{});
        for (SampleRowParams& r : greedy) r.temperature = 0.0f;
        ids.assign(static_cast<size_t>(n_rows), 0);
      } else {
        logits.resize(static_cast<size_t>(n_rows * V));
      }
      const auto t0 = std::chrono::steady_clock::now();
      if (on_device) {
        SampleBatch sb;
        sb.rows = greedy.data();
        sb.n_rows = n_rows;
        step_sampled(items, sb, ids.data());
      } else {
        step(items, logits.data());
      }
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    run(ctx, 0, false, false);  // the contexts
    double plain = 1e30, spec = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      plain = std::min(plain, run(1, ctx, true, false));
      const double v = run(k + 1, ctx, true, true);
      std::vector<EngineDraftItem> d(static_cast<size_t>(b));
      for (int64_t s = 0; s < b; ++s) {
        EngineDraftItem& it = d[static_cast<size_t>(s)];
        it.seq = s;
        it.start = ctx + 1;
        it.tokens = std::span<const int32_t>(toks.data() + s * (k + 1), static_cast<size_t>((k + 2) / 2));
        it.hidden_row = s * (k + 1);
        it.blocks = tables[static_cast<size_t>(s)];
        it.n_draft = static_cast<int32_t>(k);
      }
      drafts.resize(static_cast<size_t>(b * k));
      const auto t0 = std::chrono::steady_clock::now();
      draft(d, drafts.data());
      spec = std::min(spec, v + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double ratio = spec / plain;
    c.summary += fmt::format("{}batch {}: verify+draft {:.2f}x a decode step", c.summary.empty() ? "" : ", ", b, ratio);
    if (ratio < expect) c.max_batch = b;
  }
  c.summary += fmt::format(
      "; worth it below {:.2f}x (1 + a + ... + a^{} tokens per verify at a prior acceptance a = "
      "{})",
      expect, k, alpha);
  if (c.max_batch == max_seqs || (c.max_batch > 0 && c.max_batch * 2 > max_seqs)) c.max_batch = max_seqs;
  return c;
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
