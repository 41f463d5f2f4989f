// CudaBackend: the Backend interface on one CUDA stream. Memory ops are the CUDA runtime's; every op launches its
// kernel(s) asynchronously on the stream and checks the launch. Weights are uploaded once, as stored
// (prepare_weight). Grouped matmuls read their group offsets on the device; the table of the groups' weights is
// uploaded once per distinct weight list and cached.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_lt.h"
#include "kernels/cuda/cuda_ops.h"

namespace latent {

namespace {

// Errors after which the context is unusable (every later call fails with them): a kernel fault.
bool sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
      return true;
    default:
      return false;
  }
}

// Set once a sticky error was seen (process-wide: the context is the process's).
std::atomic<bool> g_lost{false};

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  if (sticky(e)) {
    g_lost.store(true);
    fail("CUDA backend: {} failed: {} ({}); the CUDA context is lost, no later GPU work can succeed", what,
         cudaGetErrorName(e), cudaGetErrorString(e));
  }
  fail("CUDA backend: {} failed: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
      fail("CUDA backend: no usable GPU: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
    if (n == 0) fail("CUDA backend: no GPU found (cudaGetDeviceCount returned 0)");
    check(cudaGetDevice(&device_), "cudaGetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    lt_ = std::make_unique<cuda::LtGemm>();
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    for (auto& g : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    for (void* p : owned_) cudaFree(p);
    if (scratch_) cudaFree(scratch_);
    if (group_scratch_) cudaFree(group_scratch_);
    for (Scratch* s : {&lt_x_, &lt_w_})
      if (s->p) cudaFree(s->p);
    for (void* p : lt_retired_) cudaFree(p);
    lt_.reset();
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  bool device_lost() const override { return g_lost.load(); }
  int num_threads() const override { return 1; }

  // ---------------- memory ----------------
  Device device() const override { return Device::Cuda; }
  void* native_stream() override { return stream_; }
  void* alloc(size_t bytes, const char* what) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the (non-sticky) allocation error
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail("CUDA backend: out of GPU memory allocating {} ({} bytes = {:.1f} MiB): {:.1f} MiB free of {:.1f} MiB ({})",
           what ? what : "buffer", bytes, bytes / 1048576.0, free_b / 1048576.0, total_b / 1048576.0,
           cudaGetErrorName(e));
    }
    return p;
  }
  std::pair<size_t, size_t> memory_info() const override {
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    return {free_b, total_b};
  }
  void dealloc(void* p) override {
    if (p) check(cudaFree(p), "cudaFree");
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload (cudaMemcpyAsync)");
    check(cudaStreamSynchronize(stream_), "upload (cudaStreamSynchronize)");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download (cudaMemcpyAsync)");
    check(cudaStreamSynchronize(stream_), "download (cudaStreamSynchronize)");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy (cudaMemcpyAsync)");
  }
  void sync() override { check(cudaStreamSynchronize(stream_), "sync (cudaStreamSynchronize)"); }
  QuantWeight prepare_weight(const QuantWeight& w) override {
    QuantWeight d = w;
    const size_t data_bytes = static_cast<size_t>(w.rows * w.row_bytes());
    size_t scale_bytes = 0;
    switch (w.format) {
      case WeightFormat::FP8_E4M3_BLOCK:
        scale_bytes = static_cast<size_t>((w.rows + w.block_rows - 1) / w.block_rows * w.scale_cols()) * 4;
        break;
      case WeightFormat::FP8_E4M3_TENSOR: scale_bytes = 4; break;
      case WeightFormat::FP8_E4M3_CHANNEL: scale_bytes = static_cast<size_t>(w.rows) * 4; break;
      case WeightFormat::MXFP4: scale_bytes = static_cast<size_t>(w.rows * w.scale_cols()); break;
      default: break;
    }
    d.data = upload_owned(w.data, data_bytes, "weight data");
    d.scale = scale_bytes ? upload_owned(w.scale, scale_bytes, "weight scales") : nullptr;
    return d;
  }

  // ---------------- graphs ----------------
  bool graphs_supported() const override { return true; }
  void graph_begin() override {
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  }
  int graph_end() override {
    cudaGraph_t g = nullptr;
    check(cudaStreamEndCapture(stream_, &g), "cudaStreamEndCapture");
    Graph r;
    size_t n = 0;
    cudaError_t e = cudaGraphGetNodes(g, nullptr, &n);
    std::vector<cudaGraphNode_t> nodes(n);
    if (e == cudaSuccess && n) e = cudaGraphGetNodes(g, nodes.data(), &n);
    for (size_t i = 0; e == cudaSuccess && i < n; ++i) {
      cudaGraphNodeType t{};
      e = cudaGraphNodeGetType(nodes[i], &t);
      if (t == cudaGraphNodeTypeKernel) ++r.kernels;
    }
    if (e == cudaSuccess) e = cudaGraphInstantiate(&r.exec, g, 0);
    cudaGraphDestroy(g);
    check(e, "cudaGraphInstantiate");
    graphs_.push_back(r);
    return static_cast<int>(graphs_.size() - 1);
  }
  void graph_replay(int id) override {
    if (id < 0 || id >= static_cast<int>(graphs_.size()) || !graphs_[static_cast<size_t>(id)].exec)
      fail("CUDA backend: no graph {}", id);
    check(cudaGraphLaunch(graphs_[static_cast<size_t>(id)].exec, stream_), "cudaGraphLaunch");
  }
  void graph_release(int id) override {
    if (id < 0 || id >= static_cast<int>(graphs_.size()) || !graphs_[static_cast<size_t>(id)].exec) return;
    sync();
    check(cudaGraphExecDestroy(graphs_[static_cast<size_t>(id)].exec), "cudaGraphExecDestroy");
    graphs_[static_cast<size_t>(id)].exec = nullptr;
    if (!live_graphs()) {  // scratch that only released graphs could still read
      for (void* p : lt_retired_) check(cudaFree(p), "cudaFree");
      lt_retired_.clear();
    }
  }
  int64_t graph_kernels(int id) const override {
    return id >= 0 && id < static_cast<int>(graphs_.size()) ? graphs_[static_cast<size_t>(id)].kernels : 0;
  }

  // ---------------- linear ----------------
  void matmul(const QuantWeight& w, const float* x, int64_t M, float* y) override {
    cuda::launch_matmul(cuda::make_wdesc(w), x, M, y, stream_);
    check_launch("matmul");
  }
  // bf16 mode above the skinny sizes: x (bf16 values) and W as bf16 operands, one cuBLASLt GEMM with fp32
  // accumulation into y. BF16 weights are used in place when their rows are 16-byte aligned (K % 8 == 0); FP8 and
  // MXFP4 weights (and unaligned BF16) are dequantized whole into a reusable bf16 scratch first. Everything else
  // (F32/F16 weights, M ≤ 16, a shape cuBLASLt has no algorithm for, or a graph capture that would need more
  // scratch than any eager step had) takes matmul().
  void matmul_bf16(const QuantWeight& w, const float* x, int64_t M, float* y) override {
    if (!lt_eligible(w, M)) return matmul_tc_or_exact(w, x, M, y);
    const int64_t N = w.rows, K = w.cols, Kp = lt_kp(K);
    const bool direct = lt_direct(w);
    void* xb = lt_scratch(lt_x_, static_cast<size_t>(M * Kp) * 2, "bf16 matmul activations");
    void* ws = direct ? nullptr : lt_scratch(lt_w_, static_cast<size_t>(N * Kp) * 2, "bf16 matmul weights");
    const void* wb = direct ? w.data : ws;
    if (!xb || !wb || !lt_->supported(wb, xb, M, N, Kp, y)) return matmul_tc_or_exact(w, x, M, y);
    cuda::launch_to_bf16(x, M, K, Kp, xb, stream_);
    check_launch("matmul_bf16 (activations to bf16)");
    if (!direct) {
      cuda::launch_dequant_bf16(cuda::make_wdesc(w), Kp, ws, stream_);
      check_launch("matmul_bf16 (weights to bf16)");
    }
    lt_->gemm(wb, xb, M, N, Kp, y, stream_);
    check_launch("matmul_bf16 (cublasLtMatmul)");
    ++lt_calls_;
  }
  void reserve_matmul_bf16(const QuantWeight* const* w, size_t n, int64_t max_rows) override {
    int64_t kmax = 0, wmax = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!w[i] || !w[i]->data || !lt_eligible(*w[i], cuda_lt_min_rows())) continue;
      kmax = std::max(kmax, lt_kp(w[i]->cols));
      if (!lt_direct(*w[i])) wmax = std::max(wmax, w[i]->rows * lt_kp(w[i]->cols));
    }
    if (kmax > 0 && max_rows >= cuda_lt_min_rows())
      lt_scratch(lt_x_, static_cast<size_t>(max_rows * kmax) * 2, "bf16 matmul activations");
    if (wmax > 0) lt_scratch(lt_w_, static_cast<size_t>(wmax) * 2, "bf16 matmul weights");
  }
  int64_t lt_calls() const { return lt_calls_; }
  int64_t tc_calls() const { return tc_calls_; }
  bool tc_dispatch = true;  // cuda_set_tc_dispatch (cuda_backend.h)
  // bf16 mode without cuBLASLt (FP8 weights; BF16 / MXFP4 when cuBLASLt cannot take the shape): the own
  // tensor-core kernel from cuda_lt_min_rows() rows for the formats it multiplies exactly, else the exact kernels.
  void matmul_tc_or_exact(const QuantWeight& w, const float* x, int64_t M, float* y) {
    const cuda::WDesc d = cuda::make_wdesc(w);
    if (!tc_dispatch || M < cuda_lt_min_rows() || !cuda::tc_format(d)) return matmul(w, x, M, y);
    cuda::launch_matmul_tc(d, x, M, y, stream_);
    check_launch("matmul_bf16 (tensor-core kernel)");
    ++tc_calls_;
  }

  void grouped_matmul(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const float* x,
                      float* y) override {
    if (n_groups <= 0) return;
    int64_t rows = 0, cols = 0;
    const cuda::WDesc* table = group_table(w, n_groups, rows, cols);
    if (!table) return;  // every group empty
    void* scratch = group_scratch_for(cuda::grouped_scratch_bytes(n_groups));
    cuda::launch_grouped_matmul(table, n_groups, rows, cols, offsets, x, y, scratch, stream_);
    check_launch("grouped_matmul");
  }
  // The groups of more than 16 rows on the tensor-core kernel when every weight's values or codes are bf16 values
  // (the expert prefill); the others, and tables with another format, as grouped_matmul.
  void grouped_matmul_bf16(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const float* x,
                           float* y) override {
    if (n_groups <= 0) return;
    int64_t rows = 0, cols = 0;
    bool tc = tc_dispatch;
    const cuda::WDesc* table = group_table(w, n_groups, rows, cols, &tc);
    if (!table) return;
    void* scratch = group_scratch_for(cuda::grouped_scratch_bytes(n_groups));
    cuda::launch_grouped_matmul(table, n_groups, rows, cols, offsets, x, y, scratch, stream_, tc);
    check_launch(tc ? "grouped_matmul_bf16 (tensor-core kernel)" : "grouped_matmul_bf16");
    if (tc) ++tc_calls_;
  }
  void embedding(const QuantWeight& table, const int32_t* ids, int64_t M, float* out) override {
    cuda::launch_embedding(cuda::make_wdesc(table), ids, M, out, stream_);
    check_launch("embedding");
  }

  // ---------------- norms / elementwise ----------------
  void rms_norm(const float* x, const float* w, int64_t M, int64_t D, float eps, float* y, bool bf16) override {
    cuda::launch_rms_norm(x, w, M, D, eps, y, bf16, stream_);
    check_launch("rms_norm");
  }
  void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t D, float eps, float* y,
                  bool bf16) override {
    cuda::launch_layer_norm(x, w, b, M, D, eps, y, bf16, stream_);
    check_launch("layer_norm");
  }
  void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
            const int64_t* pos, const RopeParams& p, bool bf16) override {
    cuda::launch_rope(x, n_tokens, n_heads, token_stride, head_stride, pos, p, bf16, stream_);
    check_launch("rope");
  }
  void silu_mul(const float* gate, const float* up, int64_t n, float* out, bool bf16) override {
    cuda::launch_silu_mul(gate, up, n, out, bf16, stream_);
    check_launch("silu_mul");
  }
  void add(float* y, const float* x, int64_t n, bool bf16) override {
    cuda::launch_add(y, x, n, bf16, stream_);
    check_launch("add");
  }
  void round_bf16(float* x, int64_t n) override {
    cuda::launch_round_bf16(x, n, stream_);
    check_launch("round_bf16");
  }

  // ---------------- attention ----------------
  void mla_attention_naive(const MlaDims& d, const float* q, const float* kvb, const float* k_pe, int64_t S, int64_t T,
                           const int64_t* q_pos, const KeySelection& sel, float scale, float* o, bool bf16) override {
    cuda::launch_mla_naive(d, q, kvb, k_pe, S, T, q_pos, sel, scale, o, bf16, stream_);
    check_launch("mla_attention_naive");
  }
  void mla_attention_absorbed(const MlaDims& d, const float* q, const QuantWeight& kv_b, const float* c,
                              const float* k_pe, int64_t S, int64_t T, const int64_t* q_pos, const KeySelection& sel,
                              float scale, float* o, bool bf16) override {
    cuda::launch_mla_absorbed(d, q, cuda::make_wdesc(kv_b), c, k_pe, S, T, q_pos, sel, scale, o, bf16, stream_);
    check_launch("mla_attention_absorbed");
  }

  // ---------------- DSA indexer ----------------
  void indexer_scores(const float* q, const float* w, const float* k, int64_t S, int64_t T, int64_t n_heads,
                      int64_t head_dim, float scale, const int64_t* q_pos, float* scores) override {
    cuda::launch_indexer_scores(q, w, k, S, T, n_heads, head_dim, scale, q_pos, scores, stream_);
    check_launch("indexer_scores");
  }
  void topk_select(const float* scores, int64_t S, int64_t T, int64_t k, const int64_t* q_pos, int32_t* sel,
                   int32_t* count) override {
    void* scratch = scratch_for(cuda::topk_scratch_bytes(S, k));
    cuda::launch_topk_select(scores, S, T, k, q_pos, sel, count, scratch, stream_);
    check_launch("topk_select");
  }

  // ---------------- MoE ----------------
  void router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
              float* weights) override {
    cuda::launch_router(logits, bias, M, p, ids, weights, stream_);
    check_launch("router");
  }
  void scatter_add_weighted(const float* x, const int32_t* token, const float* weight, int64_t n, int64_t D, float* y,
                            bool bf16) override {
    cuda::launch_scatter_add_weighted(x, token, weight, n, D, y, bf16, stream_);
    check_launch("scatter_add_weighted");
  }

  void moe_group(const int32_t* ids, const float* weights, int64_t M, int64_t K, int64_t E, int64_t* offsets,
                 int32_t* token, float* weight) override {
    cuda::launch_moe_group(ids, weights, M, K, E, offsets, token, weight, stream_);
    check_launch("moe_group");
  }

  // ---------------- data movement / small elementwise ----------------
  void sample_rows(float* logits, int64_t rows, int64_t V, const SampleRowParams* params, const SampleEdit* edits,
                   const uint32_t* allow, const uint32_t* banned, int32_t* ids) override {
    cuda::launch_sample_rows(logits, rows, V, params, edits, allow, banned, ids, stream_);
    check_launch("sample_rows");
  }
  void gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t D, float* dst) override {
    cuda::launch_gather_rows(src, rows, n, D, dst, stream_);
    check_launch("gather_rows");
  }
  void copy_cols(const float* src, int64_t src_stride, int64_t col0, int64_t width, int64_t n, float* dst) override {
    cuda::launch_copy_cols(src, src_stride, col0, width, n, dst, stream_);
    check_launch("copy_cols");
  }
  void scale(float* x, int64_t n, float s) override {
    cuda::launch_scale(x, n, s, stream_);
    check_launch("scale");
  }
  void fill(float* x, int64_t n, float v) override {
    cuda::launch_fill(x, n, v, stream_);
    check_launch("fill");
  }
  void add_bias(float* y, const float* b, int64_t M, int64_t N, bool bf16) override {
    cuda::launch_add_bias(y, b, M, N, bf16, stream_);
    check_launch("add_bias");
  }

  // ---------------- paged latent cache ----------------
  void kv_store(const KvPool& pool, const int64_t* slots, int64_t n, const float* src, int64_t col0,
                int64_t width) override {
    cuda::launch_kv_store(pool, slots, n, src, col0, width, stream_);
    check_launch("kv_store");
  }
  void kv_gather(const KvPool& pool, const int32_t* blocks, int64_t n_tokens, int64_t col0, int64_t width,
                 float* dst) override {
    cuda::launch_kv_gather(pool, blocks, n_tokens, col0, width, dst, stream_);
    check_launch("kv_gather");
  }
  void kv_copy_block(const KvPool& pool, int32_t src, int32_t dst, int64_t n_tokens) override {
    const size_t row = static_cast<size_t>(pool.width) * (pool.dtype == DType::BF16 ? 2 : 4);
    const size_t block = static_cast<size_t>(pool.block_tokens) * row;
    char* base = static_cast<char*>(pool.data);
    copy(base + static_cast<size_t>(dst) * block, base + static_cast<size_t>(src) * block,
         static_cast<size_t>(n_tokens) * row);
  }
  void mla_attention_absorbed_paged(const MlaDims& d, const float* q, const QuantWeight& kv_b, const KvPool& pool,
                                    const StepSeqs& seqs, const int64_t* pos, const KeySelection& sel, float scale,
                                    float* o, bool bf16) override {
    cuda::launch_mla_absorbed_paged(d, q, cuda::make_wdesc(kv_b), pool, seqs, pos, sel, scale, o, bf16, stream_);
    check_launch("mla_attention_absorbed_paged");
  }

 private:
  void check_launch(const char* op) { check(cudaGetLastError(), op); }

  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };
  static int64_t lt_kp(int64_t K) { return (K + 7) / 8 * 8; }
  static bool lt_eligible(const QuantWeight& w, int64_t M) {
    // Only formats whose values are exactly bf16 (backend.h): FP8 times fp32 scales would be rounded by a bf16
    // copy, so FP8 stays on the exact kernels until a block-scaled FP8 GEMM takes it.
    switch (w.format) {
      case WeightFormat::BF16:
      case WeightFormat::MXFP4: return M >= cuda_lt_min_rows() && w.rows > 0 && w.cols > 0;
      default: return false;
    }
  }
  static bool lt_direct(const QuantWeight& w) {
    return w.format == WeightFormat::BF16 && w.cols % 8 == 0 && (reinterpret_cast<uintptr_t>(w.data) & 15) == 0;
  }
  bool live_graphs() const {
    for (const auto& g : graphs_)
      if (g.exec) return true;
    return false;
  }
  bool capturing() const {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(stream_, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone;
  }
  // A bf16-path scratch of at least `bytes` (grown by ≥ 1.5× in 2 MiB steps; null when growing is needed during a
  // graph capture). A replaced buffer that live graphs may have recorded is kept until they are released.
  void* lt_scratch(Scratch& s, size_t bytes, const char* what) {
    if (bytes <= s.bytes) return s.p;
    if (capturing()) return nullptr;
    size_t nb = std::max(bytes, s.bytes + s.bytes / 2);
    nb = (nb + (size_t{2} << 20) - 1) / (size_t{2} << 20) * (size_t{2} << 20);
    sync();
    if (s.p) {
      if (live_graphs())
        lt_retired_.push_back(s.p);
      else
        check(cudaFree(s.p), "cudaFree");
      s = {};
    }
    s.p = alloc(nb, what);
    s.bytes = nb;
    return s.p;
  }

  void* upload_owned(const void* src, size_t bytes, const char* what) {
    void* p = alloc(bytes, what);
    owned_.push_back(p);
    upload(p, src, bytes);
    return p;
  }

  // Device scratch of at least `bytes` (grown on demand; growing waits for the stream).
  // A scratch buffer being replaced by a larger one: a live graph may have recorded it (a decode graph captured
  // before a longer prompt grew the scratch), so it is kept until the graphs are released.
  void retire_or_free(void* p) {
    if (!p) return;
    if (live_graphs())
      lt_retired_.push_back(p);
    else
      check(cudaFree(p), "cudaFree");
  }
  void* scratch_for(size_t bytes) {
    if (bytes == 0) return nullptr;
    if (bytes > scratch_bytes_) {
      sync();
      retire_or_free(scratch_);
      scratch_ = nullptr;
      scratch_ = alloc(bytes, "op scratch");
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  // Device scratch of the grouped matmul's group lists (grown on demand; growing waits for the stream).
  void* group_scratch_for(size_t bytes) {
    if (bytes > group_scratch_bytes_) {
      sync();
      retire_or_free(group_scratch_);
      group_scratch_ = nullptr;
      group_scratch_ = alloc(bytes, "grouped matmul scratch");
      group_scratch_bytes_ = bytes;
    }
    return group_scratch_;
  }

  // The device table of a grouped matmul's weights (cached per distinct list of weights).
  // tc (optional): set false unless every listed weight passes cuda::tc_format.
  const cuda::WDesc* group_table(const QuantWeight* const* w, int64_t n_groups, int64_t& rows, int64_t& cols,
                                 bool* tc = nullptr) {
    std::vector<const void*> key(static_cast<size_t>(n_groups));
    std::vector<cuda::WDesc> descs(static_cast<size_t>(n_groups));
    bool any = false;
    for (int64_t g = 0; g < n_groups; ++g) {
      if (!w[g]) continue;
      key[static_cast<size_t>(g)] = w[g]->data;
      descs[static_cast<size_t>(g)] = cuda::make_wdesc(*w[g]);
      if (tc && !cuda::tc_format(descs[static_cast<size_t>(g)])) *tc = false;
      rows = w[g]->rows;
      cols = w[g]->cols;
      any = true;
    }
    if (!any) return nullptr;
    auto it = tables_.find(key);
    if (it != tables_.end()) return it->second;
    auto* t = static_cast<cuda::WDesc*>(upload_owned(descs.data(), descs.size() * sizeof(cuda::WDesc), "group table"));
    tables_.emplace(std::move(key), t);
    return t;
  }

  struct Graph {
    cudaGraphExec_t exec = nullptr;
    int64_t kernels = 0;
  };
  std::vector<Graph> graphs_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> owned_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* group_scratch_ = nullptr;
  size_t group_scratch_bytes_ = 0;
  std::map<std::vector<const void*>, const cuda::WDesc*> tables_;
  std::unique_ptr<cuda::LtGemm> lt_;
  Scratch lt_x_, lt_w_;
  std::vector<void*> lt_retired_;
  int64_t lt_calls_ = 0;
  int64_t tc_calls_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int /*threads*/) { return std::make_unique<CudaBackend>(); }

int64_t cuda_lt_matmuls(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->lt_calls() : -1;
}

int64_t cuda_tc_matmuls(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->tc_calls() : -1;
}

void cuda_set_tc_dispatch(Backend& be, bool on) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) c->tc_dispatch = on;
}

bool cuda_tc_dispatch(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c && c->tc_dispatch;
}

}  // namespace latent
