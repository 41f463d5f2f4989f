// Host implementations of the Backend's memory, data-movement and paged-cache ops (backend/backend.h). They are
// the reference semantics of those ops and serve every backend whose memory is host memory (ref, cpu); a device
// backend overrides all of them.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "backend/backend.h"
#include "backend/sample_reference.h"
#include "core/error.h"
#include "quant/float_formats.h"

namespace latent {

const char* device_name(Device d) { return d == Device::Cuda ? "cuda" : "cpu"; }

void* Backend::alloc(size_t bytes, const char* what) {
  const size_t n = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, n);
  if (!p) fail("out of host memory allocating {} ({} bytes)", what ? what : "a buffer", bytes);
  return p;
}

void Backend::dealloc(void* p) { std::free(p); }

void Backend::upload(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void Backend::download(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void Backend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}

void Backend::moe_group(const int32_t* ids, const float* weights, int64_t M, int64_t K, int64_t E, int64_t* offsets,
                        int32_t* token, float* weight) {
  std::fill(offsets, offsets + E + 1, int64_t{0});
  for (int64_t i = 0; i < M * K; ++i) ++offsets[ids[i] + 1];
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  // Counting sort, stable in (token, slot) order: ascending expert, then ascending token.
  std::vector<int64_t>& fill = group_fill_;
  fill.assign(offsets, offsets + E);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t at = fill[ids[m * K + k]]++;
      token[at] = static_cast<int32_t>(m);
      weight[at] = weights[m * K + k];
    }
}

void Backend::sample_rows(float* logits, int64_t rows, int64_t V, const SampleRowParams* params,
                          const SampleEdit* edits, const uint32_t* allow, const uint32_t* banned, int32_t* ids) {
  sample_rows_reference(logits, rows, V, params, edits, allow, banned, ids);
}

void Backend::gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t D, float* dst) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * D, src + static_cast<int64_t>(rows[i]) * D, sizeof(float) * D);
}

void Backend::copy_cols(const float* src, int64_t src_stride, int64_t col0, int64_t width, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * width, src + i * src_stride + col0, sizeof(float) * width);
}

void Backend::scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void Backend::fill(float* x, int64_t n, float v) { std::fill(x, x + n, v); }

void Backend::add_bias(float* y, const float* b, int64_t M, int64_t N, bool bf16) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < N; ++j) {
      float& v = y[m * N + j];
      v += b[j];
      if (bf16) v = bf16_to_f32(f32_to_bf16(v));
    }
}

namespace {

inline void store_row(const KvPool& pool, int64_t row, int64_t col0, const float* src, int64_t width) {
  if (pool.dtype == DType::BF16) {
    uint16_t* d = static_cast<uint16_t*>(pool.data) + row * pool.width + col0;
    for (int64_t j = 0; j < width; ++j) d[j] = f32_to_bf16(src[j]);
  } else {
    std::memcpy(static_cast<float*>(pool.data) + row * pool.width + col0, src, sizeof(float) * width);
  }
}

inline void load_row(const KvPool& pool, int64_t row, int64_t col0, int64_t width, float* dst) {
  if (pool.dtype == DType::BF16) {
    const uint16_t* s = static_cast<const uint16_t*>(pool.data) + row * pool.width + col0;
    for (int64_t j = 0; j < width; ++j) dst[j] = bf16_to_f32(s[j]);
  } else {
    std::memcpy(dst, static_cast<const float*>(pool.data) + row * pool.width + col0, sizeof(float) * width);
  }
}

size_t elem_bytes(const KvPool& pool) { return pool.dtype == DType::BF16 ? 2 : 4; }

}  // namespace

void Backend::kv_store(const KvPool& pool, const int64_t* slots, int64_t n, const float* src, int64_t col0,
                       int64_t width) {
  for (int64_t i = 0; i < n; ++i)
    if (slots[i] >= 0) store_row(pool, slots[i], col0, src + i * width, width);
}

void Backend::graph_begin() { fail("the {} backend cannot record graphs", name()); }
int Backend::graph_end() { fail("the {} backend cannot record graphs", name()); }
void Backend::graph_replay(int /*id*/) { fail("the {} backend cannot replay graphs", name()); }
int64_t Backend::graph_kernels(int /*id*/) const { return 0; }

void Backend::kv_gather(const KvPool& pool, const int32_t* blocks, int64_t n_tokens, int64_t col0, int64_t width,
                        float* dst) {
  const int64_t bt = pool.block_tokens;
  for (int64_t t = 0; t < n_tokens; ++t)
    load_row(pool, static_cast<int64_t>(blocks[t / bt]) * bt + t % bt, col0, width, dst + t * width);
}

void Backend::kv_copy_block(const KvPool& pool, int32_t src, int32_t dst, int64_t n_tokens) {
  const size_t row = static_cast<size_t>(pool.width) * elem_bytes(pool);
  char* base = static_cast<char*>(pool.data);
  std::memcpy(base + static_cast<size_t>(dst) * static_cast<size_t>(pool.block_tokens) * row,
              base + static_cast<size_t>(src) * static_cast<size_t>(pool.block_tokens) * row,
              static_cast<size_t>(n_tokens) * row);
}

void Backend::mla_attention_absorbed_paged(const MlaDims& d, const float* q, const QuantWeight& kv_b,
                                           const KvPool& pool, const StepSeqs& seqs, const int64_t* pos,
                                           const KeySelection& sel, float scale, float* o, bool bf16) {
  // Reference semantics: per sequence, its cache gathered into contiguous c / k_pe, then the contiguous op.
  const int64_t dc = d.latent, dr = d.rope, dqk = d.qk(), H = d.n_heads;
  std::vector<float>& c = paged_c_;
  std::vector<float>& kpe = paged_kpe_;
  for (int64_t s = 0; s < seqs.n_seqs; ++s) {
    const int64_t b = seqs.q_begin[s], n = seqs.q_begin[s + 1] - b, T = seqs.ctx_len[s];
    if (n <= 0) continue;
    // Grow-only, by doubling: a step path that does not allocate once the context stopped growing past it.
    const size_t need_c = static_cast<size_t>(std::max<int64_t>(std::max<int64_t>(T, seqs.max_ctx), 64) * dc);
    if (c.capacity() < need_c) c.reserve(std::max(need_c, 2 * c.capacity()));
    const size_t need_k = static_cast<size_t>(std::max<int64_t>(std::max<int64_t>(T, seqs.max_ctx), 64) * dr);
    if (kpe.capacity() < need_k) kpe.reserve(std::max(need_k, 2 * kpe.capacity()));
    c.resize(static_cast<size_t>(std::max<int64_t>(T, 1) * dc));
    kpe.resize(static_cast<size_t>(std::max<int64_t>(T, 1) * dr));
    const int32_t* blocks = seqs.block_table + s * seqs.max_blocks;
    kv_gather(pool, blocks, T, 0, dc, c.data());
    kv_gather(pool, blocks, T, dc, dr, kpe.data());
    KeySelection ks;
    if (sel.sel) ks = {sel.sel + b * sel.stride, sel.count + b, sel.stride};
    mla_attention_absorbed(d, q + b * H * dqk, kv_b, c.data(), kpe.data(), n, T, pos + b, ks, scale,
                           o + b * H * d.v, bf16);
  }
}

}  // namespace latent
