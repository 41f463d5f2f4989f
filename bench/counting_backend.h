// CountingBackend: a pass-through Backend for the benchmarks. Every op goes to the backend under test (so the
// model runs exactly as on that backend); the wrapper counts the bytes and FLOPs each op must move and, with
// profiling on, its time (a device backend is synchronized around each op, so the time is the op's own; the
// synchronization's own cost, measured once, is subtracted). With profiling off, graphs are forwarded too: the
// wrapper is then transparent to a model that captures decode steps.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "read_bandwidth.h"

namespace latent::bench {

inline int64_t dtype_size(DType t) { return t == DType::BF16 ? 2 : 4; }  // the KV pools: F32 or BF16

inline uint64_t scale_bytes(const QuantWeight& w, int64_t rows) {
  switch (w.format) {
    case WeightFormat::MXFP4: return static_cast<uint64_t>(rows * (w.cols / 32));
    case WeightFormat::FP8_E4M3_BLOCK:
      return static_cast<uint64_t>(((rows + w.block_rows - 1) / w.block_rows) * w.scale_cols() * 4);
    case WeightFormat::FP8_E4M3_CHANNEL: return static_cast<uint64_t>(rows * 4);
    case WeightFormat::FP8_E4M3_TENSOR: return 4;
    default: return 0;
  }
}
inline uint64_t weight_bytes(const QuantWeight& w, int64_t rows) {
  return static_cast<uint64_t>(rows * w.row_bytes()) + scale_bytes(w, rows);
}

enum Op { kMatmul, kGrouped, kEmbed, kNorm, kRope, kElem, kAttn, kIndexer, kRouter, kScatter, kKv, kData, kOps };
inline const char* kOpNames[kOps] = {"matmul", "grouped_matmul", "embedding",     "norms",
                                     "rope",   "elementwise",    "mla_attention", "indexer+topk",
                                     "router", "scatter_add",    "kv_cache",      "data"};

// Forwards every op to the backend under test (so the model runs exactly as on that backend), counting the bytes
// and FLOPs each op must move and, with --profile, its wall time.
// Device-side op timing for the profile (cuda_bench gives CUDA events): mark() records a point on the backend's
// stream, seconds(a, b) the time between two marks once the stream has passed them.
struct DeviceTimer {
  virtual ~DeviceTimer() = default;
  virtual int mark() = 0;
  virtual double seconds(int a, int b) = 0;
  virtual void reset() = 0;
};

class CountingBackend final : public Backend {
 public:
  CountingBackend(Backend& b, bool profile) : b_(b), profile_(profile) {}
  const char* name() const override { return b_.name(); }
  int num_threads() const override { return b_.num_threads(); }

  uint64_t weight_bytes_read = 0, kv_bytes_read = 0;
  double flops = 0;  // 2 x multiply-adds of the matmuls and the attention
  std::array<double, kOps> op_time{}, op_flops{};
  std::array<uint64_t, kOps> op_calls{};
  void reset() {
    weight_bytes_read = kv_bytes_read = 0;
    flops = 0;
    op_time.fill(0.0);
    op_flops.fill(0.0);
    op_calls.fill(0);
    details.clear();
  }

  // memory
  Device device() const override { return b_.device(); }
  void* alloc(size_t bytes, const char* what) override { return b_.alloc(bytes, what); }
  void dealloc(void* p) override { b_.dealloc(p); }
  void upload(void* dst, const void* src, size_t bytes) override { b_.upload(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { b_.download(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { b_.copy(dst, src, bytes); }
  void sync() override { b_.sync(); }
  QuantWeight prepare_weight(const QuantWeight& w) override { return b_.prepare_weight(w); }
  bool device_lost() const override { return b_.device_lost(); }
  std::pair<size_t, size_t> memory_info() const override { return b_.memory_info(); }
  void* native_stream() override { return b_.native_stream(); }
  void sample_rows(float* logits, int64_t rows, int64_t V, const SampleRowParams* params, const SampleEdit* edits,
                   const uint32_t* allow, const uint32_t* banned, int32_t* ids) override {
    T t(this, kData);
    b_.sample_rows(logits, rows, V, params, edits, allow, banned, ids);
  }
  // Graphs only while not profiling (a replay runs no op of this wrapper: nothing would be timed or counted).
  bool graphs_supported() const override { return !profile_ && b_.graphs_supported(); }
  void graph_begin() override { b_.graph_begin(); }
  int graph_end() override { return b_.graph_end(); }
  void graph_replay(int id) override { b_.graph_replay(id); }
  void graph_release(int id) override { b_.graph_release(id); }
  int64_t graph_kernels(int id) const override { return b_.graph_kernels(id); }
  void set_profile(bool on) { profile_ = on; }
  void set_default_blocks(bool on) { default_blocks_ = on; }
  // With a device timer the profile times every op between marks on the stream (no synchronization per op: the
  // GPU time of its kernels, launch gaps excluded); finish_profile() collects them after the step.
  DeviceTimer* timer = nullptr;
  void finish_profile() {
    if (!timer) return;
    b_.sync();
    for (const Pending& p : pending_) {
      const double dt = timer->seconds(p.a, p.b);
      op_time[p.op] += dt;
      if (!p.key.empty()) details[p.key].time += dt;
    }
    pending_.clear();
    timer->reset();
  }
  bool profile() const { return profile_; }
  Backend& inner() { return b_; }
  // Per weight shape and format (matmuls, grouped matmuls, the decode attention): time, calls, bytes, when on.
  bool detail = false;
  struct Detail {
    double time = 0;
    uint64_t calls = 0, bytes = 0;
    double flops = 0;
  };
  std::map<std::string, Detail> details;

  void reserve_matmul(const QuantWeight* const* w, size_t n, int64_t rows, DType dt) override {
    b_.reserve_matmul(w, n, rows, dt);
  }

  // linear (a SwiGLU epilogue multiplies a second weight)
  void matmul(const QuantWeight& w, const Tensor& x, const Tensor& y, const Epilogue& ep = {}) override {
    const uint64_t b0 = weight_bytes_read;
    const double f0 = flops;
    count_matmul(w, x.rows);
    if (ep.glu) count_matmul(*ep.glu[0], x.rows);
    T t(this, kMatmul, detail ? label("matmul", w, x.rows, ep.glu != nullptr) : std::string(), b0, f0);
    b_.matmul(w, x, y, ep);
  }
  void grouped_matmul(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const Tensor& x,
                      const Tensor& y, const Epilogue& ep = {}) override {
    const uint64_t b0 = weight_bytes_read;
    const double f0 = flops;
    count_grouped(w, n_groups, offsets);
    if (ep.glu) count_grouped(ep.glu, n_groups, offsets);
    const QuantWeight* w0 = nullptr;
    for (int64_t g = 0; g < n_groups && !w0; ++g) w0 = w[g];
    T t(this, kGrouped, detail && w0 ? label("grouped", *w0, x.rows, ep.glu != nullptr) : std::string(), b0, f0);
    b_.grouped_matmul(w, n_groups, offsets, x, y, ep);
  }
  void embedding(const QuantWeight& table, const int32_t* ids, const Tensor& out) override {
    weight_bytes_read += static_cast<uint64_t>(out.rows * table.row_bytes());
    T t(this, kEmbed);
    b_.embedding(table, ids, out);
  }

  // norms / elementwise
  void rms_norm(const Tensor& x, const float* w, float eps, const Tensor& y) override {
    T t(this, kNorm);
    b_.rms_norm(x, w, eps, y);
  }
  void add_rms_norm(const Tensor& h, const Tensor& delta, const float* w, float eps, const Tensor& y) override {
    T t(this, kNorm);
    b_.add_rms_norm(h, delta, w, eps, y);
  }
  void layer_norm(const Tensor& x, const float* w, const float* b, float eps, const Tensor& y) override {
    T t(this, kNorm);
    b_.layer_norm(x, w, b, eps, y);
  }
  void rope(const Tensor& x, int64_t n_heads, int64_t head_stride, const int64_t* pos, const RopeParams& p) override {
    T t(this, kRope);
    b_.rope(x, n_heads, head_stride, pos, p);
  }
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    T t(this, kElem);
    b_.silu_mul(gate, up, out);
  }
  void add(const Tensor& y, const Tensor& x) override {
    T t(this, kElem);
    b_.add(y, x);
  }
  void convert(const Tensor& src, const Tensor& dst) override {
    T t(this, kElem);
    b_.convert(src, dst);
  }

  // attention
  void mla_attention_naive(const MlaDims& d, const Tensor& q, const Tensor& kvb, const Tensor& k_pe, int64_t T_,
                           const int64_t* q_pos, const KeySelection& sel, float scale, const Tensor& o) override {
    // Keys per query (the causal count, or the selection's count): scores (dn + dr) and P·V (dv) per head.
    const int64_t S = can_read() ? q.rows : 0;
    std::vector<int64_t> pos(static_cast<size_t>(S));
    std::vector<int32_t> cnt(sel.sel ? static_cast<size_t>(S) : 0);
    b_.download(pos.data(), q_pos, sizeof(int64_t) * static_cast<size_t>(S));
    if (sel.sel) b_.download(cnt.data(), sel.count, sizeof(int32_t) * cnt.size());
    double keys = 0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t causal = std::clamp<int64_t>(pos[s] + 1, 0, T_);
      keys += static_cast<double>(sel.sel ? std::min<int64_t>(causal, cnt[s]) : causal);
    }
    const uint64_t b0 = weight_bytes_read + kv_bytes_read;
    const double f0 = flops;
    add_flops(kAttn, 2.0 * keys * static_cast<double>(d.n_heads * (d.qk() + d.v)));
    T t(this, kAttn,
        detail ? std::string(sel.sel ? "mla_attention_naive (DSA)" : "mla_attention_naive") : std::string(), b0, f0);
    b_.mla_attention_naive(d, q, kvb, k_pe, T_, q_pos, sel, scale, o);
  }
  void mla_attention_absorbed(const MlaDims& d, const Tensor& q, const QuantWeight& kv_b, const Tensor& c,
                              const Tensor& k_pe, int64_t T_, const int64_t* q_pos, const KeySelection& sel,
                              float scale, const Tensor& o) override {
    weight_bytes_read += weight_bytes(kv_b, kv_b.rows);
    kv_bytes_read += static_cast<uint64_t>(T_ * (d.latent + d.rope)) * c.elem_size();
    add_flops(kAttn, 2.0 * static_cast<double>(q.rows) * static_cast<double>(d.n_heads) *
                         static_cast<double>(d.nope * d.latent + T_ * (2 * d.latent + d.rope) + d.v * d.latent));
    T t(this, kAttn);
    b_.mla_attention_absorbed(d, q, kv_b, c, k_pe, T_, q_pos, sel, scale, o);
  }
  void mla_attention_absorbed_paged(const MlaDims& d, const Tensor& q, const QuantWeight& kv_b, const KvPool& pool,
                                    const StepSeqs& seqs, const int64_t* pos, const KeySelection& sel, float scale,
                                    const Tensor& o) override {
    count_paged(d, kv_b, pool, seqs, sel);
    T t(this, kAttn);
    b_.mla_attention_absorbed_paged(d, q, kv_b, pool, seqs, pos, sel, scale, o);
  }
  // The MLA query / latent block: the counted step (profile) runs the default composition, so that its matmuls,
  // norms and ropes are counted and timed one by one; the timed steps run the wrapped backend's block (fused on
  // CUDA), as the server does, unless set_default_blocks(true) asks for the default composition there too (the A/B
  // of a fused block: `cuda_bench ctx --default-blocks`).
  void mla_qkv(const MlaLayer& L, const Tensor& x, const StepTokens& tok, const KvPool& pool, const Tensor& cq,
               const Tensor& q, const Tensor& kv) override {
    if (profile_ || default_blocks_)
      Backend::mla_qkv(L, x, tok, pool, cq, q, kv);
    else
      b_.mla_qkv(L, x, tok, pool, cq, q, kv);
  }
  // The decode-attention block (a backend may fuse it): counted like the paged op it defaults to.
  void mla_decode_attention(const MlaLayer& L, const Tensor& q, const KvPool& pool, const StepSeqs& seqs,
                            const int64_t* pos, const KeySelection& sel, const Tensor& o) override {
    const uint64_t b0 = weight_bytes_read + kv_bytes_read;
    const double f0 = flops;
    count_paged(L.d, *L.kv_b, pool, seqs, sel);
    T t(this, kAttn, detail ? "mla_decode_attention" : std::string(), b0, f0);
    b_.mla_decode_attention(L, q, pool, seqs, pos, sel, o);
  }
  void indexer_scores(const Tensor& q, const Tensor& w, const Tensor& k, int64_t n_heads, float scale,
                      const int64_t* q_pos, float* scores) override {
    add_flops(kIndexer, 2.0 * static_cast<double>(q.rows) * static_cast<double>(k.rows) * static_cast<double>(n_heads) *
                            static_cast<double>(k.cols));
    T t(this, kIndexer);
    b_.indexer_scores(q, w, k, n_heads, scale, q_pos, scores);
  }
  void indexer_scores_paged(const Tensor& q, const Tensor& w, const KvPool& pool, const StepSeqs& seqs, int64_t r0,
                            int64_t n_heads, float scale, const int64_t* q_pos, int64_t T, float* scores) override {
    const uint64_t b0 = weight_bytes_read + kv_bytes_read;
    const double f0 = flops;
    add_flops(kIndexer, 2.0 * static_cast<double>(q.rows) * static_cast<double>(T) * static_cast<double>(q.cols));
    kv_bytes_read += static_cast<uint64_t>(T * pool.width * dtype_size(pool.dtype));
    Timer t(this, kIndexer, detail ? "indexer_scores_paged (every key up to T)" : std::string(), b0, f0);
    b_.indexer_scores_paged(q, w, pool, seqs, r0, n_heads, scale, q_pos, T, scores);
  }
  void topk_select(const float* scores, int64_t S, int64_t T_, int64_t k, const int64_t* q_pos, int32_t* sel,
                   int32_t* count) override {
    T t(this, kIndexer, detail ? "topk_select" : std::string(), weight_bytes_read + kv_bytes_read, flops);
    b_.topk_select(scores, S, T_, k, q_pos, sel, count);
  }

  // MoE
  void router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
              float* weights) override {
    T t(this, kRouter);
    b_.router(logits, bias, M, p, ids, weights);
  }
  void scatter_add_weighted(const Tensor& x, const int32_t* token, const float* weight, const Tensor& y) override {
    T t(this, kScatter);
    b_.scatter_add_weighted(x, token, weight, y);
  }
  void moe_combine(const Tensor& x, const int32_t* ids, int64_t K, const int64_t* offsets, const int32_t* token,
                   const float* weight, const Tensor& y) override {
    T t(this, kScatter);
    b_.moe_combine(x, ids, K, offsets, token, weight, y);
  }
  void moe_group(const int32_t* ids, const float* weights, int64_t M, int64_t K, int64_t E, int64_t* offsets,
                 int32_t* token, float* weight) override {
    T t(this, kRouter);
    b_.moe_group(ids, weights, M, K, E, offsets, token, weight);
  }

  // data movement, cache
  void gather_rows(const Tensor& src, const int32_t* rows, const Tensor& dst) override {
    T t(this, kData);
    b_.gather_rows(src, rows, dst);
  }
  void scale(const Tensor& x, float s) override {
    T t(this, kElem);
    b_.scale(x, s);
  }
  void fill(const Tensor& x, float v) override {
    T t(this, kData);
    b_.fill(x, v);
  }
  void kv_store(const KvPool& pool, const int64_t* slots, const Tensor& src, int64_t col0) override {
    T t(this, kKv);
    b_.kv_store(pool, slots, src, col0);
  }
  void kv_gather(const KvPool& pool, const int32_t* blocks, int64_t col0, const Tensor& dst) override {
    kv_bytes_read += static_cast<uint64_t>(dst.rows * dst.cols * dtype_size(pool.dtype));
    T t(this, kKv);
    b_.kv_gather(pool, blocks, col0, dst);
  }
  void kv_copy_block(const KvPool& pool, int32_t src, int32_t dst, int64_t n_tokens) override {
    T t(this, kKv);
    b_.kv_copy_block(pool, src, dst, n_tokens);
  }

 private:
  // kv_b once, the key rows of each sequence once (the most its tokens read), the FLOPs of every token.
  void count_paged(const MlaDims& d, const QuantWeight& kv_b, const KvPool& pool, const StepSeqs& seqs,
                   const KeySelection& sel) {
    if (!can_read()) return;
    weight_bytes_read += weight_bytes(kv_b, kv_b.rows);
    const int64_t esz = dtype_size(pool.dtype);
    std::vector<int32_t> qb(static_cast<size_t>(seqs.n_seqs + 1)), cl(static_cast<size_t>(seqs.n_seqs));
    b_.download(qb.data(), seqs.q_begin, qb.size() * sizeof(int32_t));
    b_.download(cl.data(), seqs.ctx_len, cl.size() * sizeof(int32_t));
    std::vector<int32_t> cnt;
    if (sel.sel) {
      cnt.resize(static_cast<size_t>(qb[seqs.n_seqs]));
      b_.download(cnt.data(), sel.count, cnt.size() * sizeof(int32_t));
    }
    double keys = 0;
    for (int64_t s = 0; s < seqs.n_seqs; ++s) {
      int64_t read = 0;  // key rows this sequence's tokens read (a selection reads only its rows)
      for (int32_t i = qb[s]; i < qb[s + 1]; ++i) {
        const int64_t k = sel.sel ? std::min<int64_t>(cl[s], cnt[static_cast<size_t>(i)]) : cl[s];
        keys += static_cast<double>(k);
        read = std::max(read, k);
      }
      kv_bytes_read += static_cast<uint64_t>(read * (d.latent + d.rope) * esz);
    }
    const double n = qb[seqs.n_seqs] - qb[0];
    add_flops(kAttn, 2.0 * static_cast<double>(d.n_heads) *
                         (n * static_cast<double>((d.nope + d.v) * d.latent) + keys * (2 * d.latent + d.rope)));
  }
  void add_flops(Op op, double f) {
    flops += f;
    op_flops[op] += f;
  }
  void count_matmul(const QuantWeight& w, int64_t M) {
    weight_bytes_read += weight_bytes(w, w.rows);
    add_flops(kMatmul, 2.0 * static_cast<double>(M) * static_cast<double>(w.rows) * static_cast<double>(w.cols));
  }
  // Counting that reads step metadata back from the backend: not while a device step may be recorded into a graph.
  bool can_read() const { return profile_ || !b_.graphs_supported(); }
  void count_grouped(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets_in) {
    if (!can_read()) return;
    // The group offsets live in the backend's memory.
    std::vector<int64_t> off(static_cast<size_t>(n_groups + 1));
    b_.download(off.data(), offsets_in, off.size() * sizeof(int64_t));
    const int64_t* offsets = off.data();
    for (int64_t g = 0; g < n_groups; ++g)
      if (offsets[g + 1] > offsets[g]) {
        weight_bytes_read += weight_bytes(*w[g], w[g]->rows);
        add_flops(kGrouped, 2.0 * static_cast<double>(offsets[g + 1] - offsets[g]) * static_cast<double>(w[g]->rows) *
                                static_cast<double>(w[g]->cols));
      }
  }
  static std::string label(const char* op, const QuantWeight& w, int64_t M, bool glu) {
    return std::string(op) + " " + weight_format_label(w) + " " + std::to_string(w.rows) + "x" +
           std::to_string(w.cols) + (glu ? " x2 (glu)" : "") + " M=" + std::to_string(M);
  }
  // Seconds a synchronize costs with nothing in flight (subtracted from every device op's time).
  double sync_cost() {
    if (sync_cost_ < 0) {
      std::vector<double> v;
      for (int i = 0; i < 50; ++i) {
        b_.sync();
        const double t0 = now_s();
        b_.sync();
        v.push_back(now_s() - t0);
      }
      std::sort(v.begin(), v.end());
      sync_cost_ = v[v.size() / 2];
    }
    return sync_cost_;
  }
  struct Pending {
    Op op;
    std::string key;
    int a, b;
  };
  std::vector<Pending> pending_;
  struct T {  // per-op timer (only while profiling; a device backend is synchronized around the op)
    CountingBackend* c;
    Op op;
    std::string key;
    uint64_t b0;
    double f0, t0;
    int m0 = -1;
    T(CountingBackend* cb, Op o, std::string k = {}, uint64_t bytes0 = 0, double flops0 = 0)
        : c(cb), op(o), key(std::move(k)), b0(bytes0), f0(flops0), t0(0.0) {
      if (!c->profile_) return;
      if (c->timer) {
        m0 = c->timer->mark();
        return;
      }
      if (c->b_.device() != Device::Cpu) c->b_.sync();
      t0 = now_s();
    }
    ~T() {
      if (!c->profile_) return;
      double dt = 0;
      if (c->timer) {
        c->pending_.push_back({op, key, m0, c->timer->mark()});
      } else if (c->b_.device() != Device::Cpu) {
        c->b_.sync();
        dt = std::max(0.0, now_s() - t0 - c->sync_cost());
      } else {
        dt = now_s() - t0;
      }
      c->op_time[op] += dt;
      ++c->op_calls[op];
      if (!key.empty()) {
        Detail& d = c->details[key];
        d.time += dt;
        ++d.calls;
        d.bytes += c->weight_bytes_read + (op == kAttn ? c->kv_bytes_read : 0) - b0;
        d.flops += c->flops - f0;
      }
    }
  };
  using Timer = T;
  double sync_cost_ = -1;
  Backend& b_;
  bool profile_;
  bool default_blocks_ = false;
};

inline void print_profile(const CountingBackend& cb, double per, double wall, const char* what) {
  std::printf("      %s, ms by op:", what);
  double tot = 0;
  for (int o = 0; o < kOps; ++o) tot += cb.op_time[static_cast<size_t>(o)];
  for (int o = 0; o < kOps; ++o) {
    const size_t i = static_cast<size_t>(o);
    if (!cb.op_calls[i]) continue;
    std::printf(" %s %.3f", kOpNames[o], cb.op_time[i] * 1e3 / per);
    if (cb.op_flops[i] > 0 && cb.op_time[i] > 0) std::printf(" (%.1f GFLOP/s)", cb.op_flops[i] / cb.op_time[i] / 1e9);
    std::printf(";");
  }
  std::printf(" ops %.3f of %.3f\n", tot * 1e3 / per, wall * 1e3 / per);
}

}  // namespace latent::bench
