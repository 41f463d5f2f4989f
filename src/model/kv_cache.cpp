#include "model/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace latent {

namespace {

int64_t elem_size(DType d) { return d == DType::BF16 ? 2 : 4; }

bool layer_has_index(const ModelConfig& cfg, int64_t l) {
  if (!cfg.has_indexer()) return false;
  if (l >= cfg.num_hidden_layers) return true;  // an MTP layer: always its own indexer
  return static_cast<size_t>(l) < cfg.layer_has_indexer.size() && cfg.layer_has_indexer[static_cast<size_t>(l)];
}

}  // namespace

int64_t kv_bytes_per_token(const ModelConfig& cfg, DType dtype, int64_t mtp_layers) {
  int64_t elems = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers + mtp_layers; ++l) {
    elems += cfg.kv_lora_rank + cfg.qk_rope_head_dim;
    if (layer_has_index(cfg, l)) elems += cfg.index_head_dim;
  }
  return std::max<int64_t>(1, elems * elem_size(dtype));
}

int64_t PagedKvCache::blocks_for_budget(const ModelConfig& cfg, int64_t budget_bytes, int64_t block_tokens, DType dtype,
                                        int64_t mtp_layers) {
  if (block_tokens < 1) fail("--kv-block-tokens must be >= 1 (got {})", block_tokens);
  const int64_t per_block = kv_bytes_per_token(cfg, dtype, mtp_layers) * block_tokens;
  const int64_t n = budget_bytes / per_block;
  if (n < 1)
    fail("--kv-cache-bytes {} holds no KV block: one block of {} tokens needs {} bytes for this model", budget_bytes,
         block_tokens, per_block);
  return n;
}

PagedKvCache::PagedKvCache(const ModelConfig& cfg, Backend& be, int64_t num_blocks, int64_t block_tokens, DType dtype,
                           int64_t mtp_layers)
    : be_(be), num_blocks_(num_blocks), block_tokens_(block_tokens), dtype_(dtype) {
  if (num_blocks < 1) fail("KV cache: needs at least one block (got {})", num_blocks);
  if (block_tokens < 1) fail("KV cache: --kv-block-tokens must be >= 1 (got {})", block_tokens);
  if (dtype != DType::F32 && dtype != DType::BF16)
    fail("KV cache: dtype {} is not supported (f32 or bf16)", dtype_name(dtype));
  const int64_t L = cfg.num_hidden_layers + std::max<int64_t>(0, mtp_layers);
  latent_.resize(static_cast<size_t>(L));
  index_.resize(static_cast<size_t>(L));
  try {
    for (int64_t l = 0; l < L; ++l) {
      KvPool& p = latent_[static_cast<size_t>(l)];
      p = {nullptr, dtype, num_blocks, block_tokens, cfg.kv_lora_rank + cfg.qk_rope_head_dim};
      const int64_t nb = p.rows() * p.width * elem_size(dtype);
      p.data = be.alloc(static_cast<size_t>(nb), "the latent KV cache");
      bytes_ += nb;
      KvPool& ip = index_[static_cast<size_t>(l)];
      ip = {nullptr, dtype, num_blocks, block_tokens, 0};
      if (layer_has_index(cfg, l)) {
        ip.width = cfg.index_head_dim;
        const int64_t ib = ip.rows() * ip.width * elem_size(dtype);
        ip.data = be.alloc(static_cast<size_t>(ib), "the DSA indexer key cache");
        bytes_ += ib;
      }
    }
  } catch (...) {
    for (auto& p : latent_)
      if (p.data) be_.dealloc(p.data);
    for (auto& p : index_)
      if (p.data) be_.dealloc(p.data);
    throw;
  }
}

PagedKvCache::~PagedKvCache() {
  for (auto& p : latent_)
    if (p.data) be_.dealloc(p.data);
  for (auto& p : index_)
    if (p.data) be_.dealloc(p.data);
}

void PagedKvCache::copy_block(int32_t src, int32_t dst, int64_t n_tokens) {
  if (src == dst || n_tokens <= 0) return;
  for (auto& p : latent_) be_.kv_copy_block(p, src, dst, n_tokens);
  for (auto& p : index_)
    if (p.data) be_.kv_copy_block(p, src, dst, n_tokens);
}

void PagedKvCache::copy_prefix_from(const PagedKvCache& from, int64_t n_blocks) {
  if (n_blocks > num_blocks_ || n_blocks > from.num_blocks_ || from.block_tokens_ != block_tokens_ ||
      from.dtype_ != dtype_ || from.latent_.size() != latent_.size())
    fail("KV cache: cannot copy {} blocks between pools of different shapes", n_blocks);
  for (size_t l = 0; l < latent_.size(); ++l) {
    const int64_t row = latent_[l].width * elem_size(dtype_);
    be_.copy(latent_[l].data, from.latent_[l].data, static_cast<size_t>(n_blocks * block_tokens_ * row));
    if (index_[l].data) {
      const int64_t irow = index_[l].width * elem_size(dtype_);
      be_.copy(index_[l].data, from.index_[l].data, static_cast<size_t>(n_blocks * block_tokens_ * irow));
    }
  }
}

KvCache::KvCache(const ModelConfig& cfg, int64_t block_tokens, int64_t mtp_layers)
    : cfg_(cfg), block_tokens_(block_tokens), mtp_layers_(mtp_layers) {
  if (block_tokens < 1) fail("KV cache: block_tokens must be >= 1 (got {})", block_tokens);
}

void KvCache::truncate(int64_t n) {
  if (n < 0 || n > len_) fail("kv cache: cannot truncate {} tokens to {}", len_, n);
  len_ = n;
}

const std::vector<int32_t>& KvCache::ensure(Backend& be, DType dtype, int64_t n_tokens) {
  const int64_t need = std::max<int64_t>(1, (n_tokens + block_tokens_ - 1) / block_tokens_);
  if (pool_ && (&pool_->backend() != &be || pool_->dtype() != dtype)) {
    if (len_ > 0) fail("kv cache: the sequence was computed with another backend or cache dtype");
    pool_.reset();
  }
  if (!pool_ || pool_->num_blocks() < need) {
    const int64_t have = pool_ ? pool_->num_blocks() : 0;
    const int64_t grow = std::max<int64_t>(need, std::max<int64_t>(4, 2 * have));
    auto bigger = std::make_unique<PagedKvCache>(cfg_, be, grow, block_tokens_, dtype, mtp_layers_);
    const int64_t used = (len_ + block_tokens_ - 1) / block_tokens_;
    if (pool_ && used > 0) bigger->copy_prefix_from(*pool_, used);
    pool_ = std::move(bigger);
  }
  if (static_cast<int64_t>(blocks_.size()) < pool_->num_blocks()) {
    blocks_.resize(static_cast<size_t>(pool_->num_blocks()));
    for (size_t i = 0; i < blocks_.size(); ++i) blocks_[i] = static_cast<int32_t>(i);
  }
  return blocks_;
}

}  // namespace latent
