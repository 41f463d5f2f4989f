// Host implementations of the Backend's memory, data-movement and paged-cache ops (backend/backend.h). They are
// the reference semantics of those ops and serve every backend whose memory is host memory (ref, cpu); a device
// backend overrides all of them.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "backend/backend.h"
#include "backend/sample_reference.h"
#include "core/error.h"
#include "kernels/ref/host_tensor.h"
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

namespace {
// dst row = src row (same width), converting the dtype.
void copy_row(const Tensor& src, int64_t rs, const Tensor& dst, int64_t rd) {
  if (src.dtype == dst.dtype) {
    std::memmove(dst.row_ptr(rd), src.row_ptr(rs), dst.elem_size() * static_cast<size_t>(dst.cols));
    return;
  }
  for (int64_t c = 0; c < dst.cols; ++c) host::set(dst, rd, c, host::get(src, rs, c));
}
}  // namespace

void Backend::gather_rows(const Tensor& src, const int32_t* rows, const Tensor& dst) {
  for (int64_t i = 0; i < dst.rows; ++i) copy_row(src, rows[i], dst, i);
}

void Backend::convert(const Tensor& src, const Tensor& dst) {
  for (int64_t r = 0; r < dst.rows; ++r) copy_row(src, r, dst, r);
}

void Backend::scale(const Tensor& x, float s) {
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) host::set(x, r, c, host::get(x, r, c) * s);
}

void Backend::fill(const Tensor& x, float v) {
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) host::set(x, r, c, v);
}

void Backend::add_rms_norm(const Tensor& h, const Tensor& delta, const float* w, float eps, const Tensor& y) {
  add(h, delta);
  rms_norm(h, w, eps, y);
}

namespace {

size_t elem_bytes(const KvPool& pool) { return pool.dtype == DType::BF16 ? 2 : 4; }
// Row r of a pool as a one-row tensor view of columns col0 .. col0 + width.
Tensor pool_row(const KvPool& pool, int64_t r, int64_t col0, int64_t width) {
  char* p = static_cast<char*>(pool.data) + (static_cast<size_t>(r * pool.width + col0)) * elem_bytes(pool);
  return Tensor(p, pool.dtype, 1, width);
}

}  // namespace

void Backend::kv_store(const KvPool& pool, const int64_t* slots, const Tensor& src, int64_t col0) {
  for (int64_t i = 0; i < src.rows; ++i) {
    if (slots[i] < 0) continue;
    copy_row(src, i, pool_row(pool, slots[i], col0, src.cols), 0);
  }
}

void Backend::graph_begin() { fail("the {} backend cannot record graphs", name()); }
int Backend::graph_end() { fail("the {} backend cannot record graphs", name()); }
void Backend::graph_replay(int /*id*/) { fail("the {} backend cannot replay graphs", name()); }
int64_t Backend::graph_kernels(int /*id*/) const { return 0; }

void Backend::kv_gather(const KvPool& pool, const int32_t* blocks, int64_t col0, const Tensor& dst) {
  const int64_t bt = pool.block_tokens;
  for (int64_t t = 0; t < dst.rows; ++t) {
    copy_row(pool_row(pool, static_cast<int64_t>(blocks[t / bt]) * bt + t % bt, col0, dst.cols), 0, dst, t);
  }
}

void Backend::kv_copy_block(const KvPool& pool, int32_t src, int32_t dst, int64_t n_tokens) {
  const size_t row = static_cast<size_t>(pool.width) * elem_bytes(pool);
  char* base = static_cast<char*>(pool.data);
  std::memcpy(base + static_cast<size_t>(dst) * static_cast<size_t>(pool.block_tokens) * row,
              base + static_cast<size_t>(src) * static_cast<size_t>(pool.block_tokens) * row,
              static_cast<size_t>(n_tokens) * row);
}

void Backend::indexer_scores_paged(const Tensor& q, const Tensor& w, const KvPool& pool, const StepSeqs& seqs,
                                   int64_t r0, int64_t n_heads, float scale, const int64_t* q_pos, int64_t T,
                                   float* scores) {
  // Host metadata (a host backend): per sequence overlapping the rows, its keys gathered, then the contiguous op.
  const int64_t n = q.rows, dI = pool.width;
  std::vector<float>& keys = paged_c_;
  for (int64_t s = 0; s < seqs.n_seqs; ++s) {
    const int64_t a = std::max<int64_t>(seqs.q_begin[s], r0), b = std::min<int64_t>(seqs.q_begin[s + 1], r0 + n);
    if (b <= a) continue;
    const int64_t Ts = std::min<int64_t>(seqs.ctx_len[s], T);
    // Grow-only, by doubling (no allocation on the step path once the context stopped outgrowing it).
    const size_t need = static_cast<size_t>(std::max<int64_t>(T, 64) * dI);
    if (keys.capacity() < need) keys.reserve(std::max(need, 2 * keys.capacity()));
    keys.resize(static_cast<size_t>(std::max<int64_t>(Ts, 1) * dI));
    const Tensor kt(keys.data(), DType::F32, Ts, dI);
    kv_gather(pool, seqs.block_table + s * seqs.max_blocks, 0, kt);
    // scores rows a - r0 .. b - r0 with row stride T: one call per row keeps the stride (the op writes [rows, Ts]).
    for (int64_t i = a; i < b; ++i) {
      float* row = scores + (i - r0) * T;
      indexer_scores(q.row_slice(i - r0, 1), w.row_slice(i - r0, 1), kt, n_heads, scale, q_pos + (i - r0), row);
      std::fill(row + Ts, row + T, -std::numeric_limits<float>::infinity());
    }
  }
}

void Backend::mla_attention_absorbed_paged(const MlaDims& d, const Tensor& q, const QuantWeight& kv_b,
                                           const KvPool& pool, const StepSeqs& seqs, const int64_t* pos,
                                           const KeySelection& sel, float scale, const Tensor& o) {
  // Reference semantics: per sequence, its cache gathered into contiguous c / k_pe (fp32), then the contiguous op.
  const int64_t dc = d.latent, dr = d.rope;
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
    const Tensor ct(c.data(), DType::F32, T, dc), kt(kpe.data(), DType::F32, T, dr);
    kv_gather(pool, blocks, 0, ct);
    kv_gather(pool, blocks, dc, kt);
    KeySelection ks;
    if (sel.sel) ks = {sel.sel + b * sel.stride, sel.count + b, sel.stride};
    mla_attention_absorbed(d, q.row_slice(b, n), kv_b, ct, kt, T, pos + b, ks, scale, o.row_slice(b, n));
  }
}

}  // namespace latent
