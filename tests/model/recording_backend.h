// RecordingBackend: a pass-through Backend with CUDA-graph semantics, so that the model's graph logic (decode and
// verify steps, MTP draft passes: Model::run_graph) is tested on the CPU. Every op goes to the backend under test;
// between graph_begin() and graph_end() an op is not run but recorded as a closure over its arguments as they are
// at that moment (pointers, shapes, the contents of small argument structs: what a kernel launch captures), and
// graph_replay() runs the recorded ops in order. Memory traffic the model must not issue inside a recording —
// alloc, dealloc, upload, download, sync, preparing weights, replaying a graph — fails the running test (and throws,
// as a CUDA capture is invalidated by it). The reported device is the caller's choice: Device::Cuda makes the
// engine sample on the "device" (its sample_rows) as it does on a GPU.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace latent::test {

class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(Backend& b, Device reported = Device::Cpu) : b_(b), device_(reported) {}
  const char* name() const override { return b_.name(); }
  int num_threads() const override { return b_.num_threads(); }

  // Ops recorded (into every graph so far), graphs replayed, memory operations refused inside a recording.
  int64_t recorded_ops() const { return recorded_ops_; }
  int64_t replays() const { return replays_; }
  int64_t violations() const { return violations_; }

  // ---------------- memory: never inside a recording ----------------
  Device device() const override { return device_; }
  void* alloc(size_t bytes, const char* what) override {
    outside("alloc");
    return b_.alloc(bytes, what);
  }
  void dealloc(void* p) override {
    outside("dealloc");
    b_.dealloc(p);
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    outside("upload");
    b_.upload(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    outside("download");
    b_.download(dst, src, bytes);
  }
  void sync() override {
    outside("sync");
    b_.sync();
  }
  QuantWeight prepare_weight(const QuantWeight& w) override {
    outside("prepare_weight");
    return b_.prepare_weight(w);
  }
  void reserve_matmul(const QuantWeight* const* w, size_t n, int64_t rows, DType dt) override {
    outside("reserve_matmul");
    b_.reserve_matmul(w, n, rows, dt);
  }
  bool device_lost() const override { return b_.device_lost(); }
  std::pair<size_t, size_t> memory_info() const override { return b_.memory_info(); }
  void* native_stream() override { return b_.native_stream(); }
  // A device-to-device copy is an op (recorded).
  void copy(void* dst, const void* src, size_t bytes) override {
    op([=, this] { b_.copy(dst, src, bytes); });
  }

  // ---------------- graphs ----------------
  bool graphs_supported() const override { return true; }
  void graph_begin() override {
    outside("graph_begin");
    recording_ = true;
    rec_.clear();
  }
  int graph_end() override {
    if (!recording_) fail("recording backend: graph_end without graph_begin");
    recording_ = false;
    const int id = next_id_++;
    graphs_[id] = std::move(rec_);
    rec_.clear();
    return id;
  }
  void graph_replay(int id) override {
    outside("graph_replay");
    const auto it = graphs_.find(id);
    if (it == graphs_.end()) {
      ADD_FAILURE() << "recording backend: replay of graph " << id << ", which does not exist (released?)";
      fail("recording backend: no graph {}", id);
    }
    ++replays_;
    for (const auto& f : it->second) f();
  }
  void graph_release(int id) override { graphs_.erase(id); }
  int64_t graph_kernels(int id) const override {
    const auto it = graphs_.find(id);
    return it == graphs_.end() ? 0 : static_cast<int64_t>(it->second.size());
  }

  // ---------------- linear ----------------
  void matmul(const QuantWeight& w, const Tensor& x, const Tensor& y, const Epilogue& ep = {}) override {
    op([this, w, x, y, e = EpilogueCopy(ep, 1)] { b_.matmul(w, x, y, e.get()); });
  }
  void grouped_matmul(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const Tensor& x,
                      const Tensor& y, const Epilogue& ep = {}) override {
    op([this, ws = std::vector<const QuantWeight*>(w, w + n_groups), n_groups, offsets, x, y,
        e = EpilogueCopy(ep, n_groups)] { b_.grouped_matmul(ws.data(), n_groups, offsets, x, y, e.get()); });
  }
  void act_quant_fp8(const Tensor& x, int64_t group, bool pow2_scale, const Tensor& xq) override {
    op([=, this] { b_.act_quant_fp8(x, group, pow2_scale, xq); });
  }
  void matmul_act_fp8(const QuantWeight& w, const Tensor& x, const ActFp8& a, const Tensor& y,
                      const Epilogue& ep = {}) override {
    op([this, w, x, a, y, e = EpilogueCopy(ep, 1)] { b_.matmul_act_fp8(w, x, a, y, e.get()); });
  }
  void grouped_matmul_act_fp8(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const Tensor& x,
                              const ActFp8& a, const Tensor& y, const Epilogue& ep = {}) override {
    op([this, ws = std::vector<const QuantWeight*>(w, w + n_groups), n_groups, offsets, x, a, y,
        e = EpilogueCopy(ep, n_groups)] { b_.grouped_matmul_act_fp8(ws.data(), n_groups, offsets, x, a, y, e.get()); });
  }
  void embedding(const QuantWeight& table, const int32_t* ids, const Tensor& out) override {
    op([=, this] { b_.embedding(table, ids, out); });
  }

  // ---------------- norms / elementwise ----------------
  void rms_norm(const Tensor& x, const float* w, float eps, const Tensor& y) override {
    op([=, this] { b_.rms_norm(x, w, eps, y); });
  }
  void add_rms_norm(const Tensor& h, const Tensor& delta, const float* w, float eps, const Tensor& y) override {
    op([=, this] { b_.add_rms_norm(h, delta, w, eps, y); });
  }
  void layer_norm(const Tensor& x, const float* w, const float* bias, float eps, const Tensor& y) override {
    op([=, this] { b_.layer_norm(x, w, bias, eps, y); });
  }
  void rope(const Tensor& x, int64_t n_heads, int64_t head_stride, const int64_t* pos, const RopeParams& p) override {
    op([=, this] { b_.rope(x, n_heads, head_stride, pos, p); });
  }
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    op([=, this] { b_.silu_mul(gate, up, out); });
  }
  void add(const Tensor& y, const Tensor& x) override {
    op([=, this] { b_.add(y, x); });
  }
  void convert(const Tensor& src, const Tensor& dst) override {
    op([=, this] { b_.convert(src, dst); });
  }

  // ---------------- attention, indexer ----------------
  void mla_attention_naive(const MlaDims& d, const Tensor& q, const Tensor& kvb, const Tensor& k_pe, int64_t T,
                           const int64_t* q_pos, const KeySelection& sel, float scale, const Tensor& o) override {
    op([=, this] { b_.mla_attention_naive(d, q, kvb, k_pe, T, q_pos, sel, scale, o); });
  }
  void mla_attention_absorbed(const MlaDims& d, const Tensor& q, const QuantWeight& kv_b, const Tensor& c,
                              const Tensor& k_pe, int64_t T, const int64_t* q_pos, const KeySelection& sel, float scale,
                              const Tensor& o) override {
    op([=, this] { b_.mla_attention_absorbed(d, q, kv_b, c, k_pe, T, q_pos, sel, scale, o); });
  }
  void indexer_scores(const Tensor& q, const Tensor& w, const Tensor& k, int64_t n_heads, float scale,
                      const int64_t* q_pos, float* scores) override {
    op([=, this] { b_.indexer_scores(q, w, k, n_heads, scale, q_pos, scores); });
  }
  void indexer_scores_paged(const Tensor& q, const Tensor& w, const KvPool& pool, const StepSeqs& seqs, int64_t r0,
                            int64_t n_heads, float scale, const int64_t* q_pos, int64_t T, float* scores) override {
    op([=, this] { b_.indexer_scores_paged(q, w, pool, seqs, r0, n_heads, scale, q_pos, T, scores); });
  }
  void topk_select(const float* scores, int64_t S, int64_t T, int64_t k, const int64_t* q_pos, int32_t* sel,
                   int32_t* count) override {
    op([=, this] { b_.topk_select(scores, S, T, k, q_pos, sel, count); });
  }

  // ---------------- MoE ----------------
  void router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
              float* weights) override {
    op([=, this] { b_.router(logits, bias, M, p, ids, weights); });
  }
  void scatter_add_weighted(const Tensor& x, const int32_t* token, const float* weight, const Tensor& y) override {
    op([=, this] { b_.scatter_add_weighted(x, token, weight, y); });
  }
  void moe_group(const int32_t* ids, const float* weights, int64_t M, int64_t K, int64_t E, int64_t* offsets,
                 int32_t* token, float* weight) override {
    op([=, this] { b_.moe_group(ids, weights, M, K, E, offsets, token, weight); });
  }
  void moe_combine(const Tensor& x, const int32_t* ids, int64_t K, const int64_t* offsets, const int32_t* token,
                   const float* weight, const Tensor& y) override {
    op([=, this] { b_.moe_combine(x, ids, K, offsets, token, weight, y); });
  }

  // ---------------- data movement, cache ----------------
  void gather_rows(const Tensor& src, const int32_t* rows, const Tensor& dst) override {
    op([=, this] { b_.gather_rows(src, rows, dst); });
  }
  void scale(const Tensor& x, float s) override {
    op([=, this] { b_.scale(x, s); });
  }
  void fill(const Tensor& x, float v) override {
    op([=, this] { b_.fill(x, v); });
  }
  void kv_store(const KvPool& pool, const int64_t* slots, const Tensor& src, int64_t col0) override {
    op([=, this] { b_.kv_store(pool, slots, src, col0); });
  }
  void kv_gather(const KvPool& pool, const int32_t* blocks, int64_t col0, const Tensor& dst) override {
    op([=, this] { b_.kv_gather(pool, blocks, col0, dst); });
  }
  void kv_copy_block(const KvPool& pool, int32_t src, int32_t dst, int64_t n_tokens) override {
    op([=, this] { b_.kv_copy_block(pool, src, dst, n_tokens); });
  }
  void mla_attention_absorbed_paged(const MlaDims& d, const Tensor& q, const QuantWeight& kv_b, const KvPool& pool,
                                    const StepSeqs& seqs, const int64_t* pos, const KeySelection& sel, float scale,
                                    const Tensor& o) override {
    op([=, this] { b_.mla_attention_absorbed_paged(d, q, kv_b, pool, seqs, pos, sel, scale, o); });
  }

  // ---------------- decode blocks (the backend under test's own, fused or default) ----------------
  void mla_qkv(const MlaLayer& L, const Tensor& x, const StepTokens& tok, const KvPool& pool, const Tensor& cq,
               const Tensor& q, const Tensor& kv) override {
    op([=, this, l = LayerCopy<MlaLayer>(L)] { b_.mla_qkv(l.get(), x, tok, pool, cq, q, kv); });
  }
  void mla_decode_attention(const MlaLayer& L, const Tensor& q, const KvPool& pool, const StepSeqs& seqs,
                            const int64_t* pos, const KeySelection& sel, const Tensor& o) override {
    op([=, this, l = LayerCopy<MlaLayer>(L)] { b_.mla_decode_attention(l.get(), q, pool, seqs, pos, sel, o); });
  }
  void moe_ffn(const MoeLayer& L, const Tensor& x, const MoeScratch& s, const Tensor& y, bool include_shared) override {
    op([=, this, l = LayerCopy<MoeLayer>(L)] { b_.moe_ffn(l.get(), x, s, y, include_shared); });
  }
  void moe_route(const MoeLayer& L, const Tensor& x, const MoeScratch& s) override {
    op([=, this, l = LayerCopy<MoeLayer>(L)] { b_.moe_route(l.get(), x, s); });
  }
  void moe_experts(const MoeLayer& L, const Tensor& x, const MoeScratch& s, const Tensor& y,
                   bool include_shared) override {
    op([=, this, l = LayerCopy<MoeLayer>(L)] { b_.moe_experts(l.get(), x, s, y, include_shared); });
  }

  // ---------------- sampling ----------------
  void sample_rows(float* logits, int64_t rows, int64_t V, const SampleRowParams* params, const SampleEdit* edits,
                   const uint32_t* allow, const uint32_t* banned, int32_t* ids) override {
    op([=, this] { b_.sample_rows(logits, rows, V, params, edits, allow, banned, ids); });
  }

 private:
  // An epilogue's contents (its pointers name the caller's locals: the residual tensor, the SwiGLU gate weights).
  struct EpilogueCopy {
    const float* bias = nullptr;
    std::vector<const QuantWeight*> glu;
    std::optional<Tensor> gate, residual;
    EpilogueCopy(const Epilogue& ep, int64_t n_glu) : bias(ep.bias) {
      if (ep.glu) glu.assign(ep.glu, ep.glu + n_glu);
      if (ep.gate) gate = *ep.gate;
      if (ep.residual) residual = *ep.residual;
    }
    Epilogue get() const {
      Epilogue e;
      e.bias = bias;
      e.glu = glu.empty() ? nullptr : glu.data();
      e.gate = gate ? &*gate : nullptr;
      e.residual = residual ? &*residual : nullptr;
      return e;
    }
  };
  // A block's layer arguments with their declared-activation settings (ActFp8: its scratch is the workspace's at
  // recording time) copied.
  template <class Layer>
  struct LayerCopy {
    Layer layer;
    std::optional<ActFp8> act;
    explicit LayerCopy(const Layer& l) : layer(l) {
      if (l.act) act = *l.act;
    }
    Layer get() const {
      Layer l = layer;
      l.act = act ? &*act : nullptr;
      return l;
    }
  };
  template <class F>
  void op(F&& f) {
    if (!recording_) {
      f();
      return;
    }
    ++recorded_ops_;
    rec_.emplace_back(std::forward<F>(f));
  }
  void outside(const char* what) {
    if (!recording_) return;
    ++violations_;
    ADD_FAILURE() << "recording backend: " << what << " inside a graph recording";
    recording_ = false;  // (the recording is invalid, as a CUDA capture would be)
    rec_.clear();
    fail("recording backend: {} inside a graph recording", what);
  }

  Backend& b_;
  Device device_;
  bool recording_ = false;
  std::vector<std::function<void()>> rec_;
  std::map<int, std::vector<std::function<void()>>> graphs_;
  int next_id_ = 1;
  int64_t recorded_ops_ = 0, replays_ = 0, violations_ = 0;
};

}  // namespace latent::test
