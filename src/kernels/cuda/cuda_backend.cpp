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
#include "kernels/cuda/cuda_act_quant.h"
#include "kernels/cuda/cuda_lt.h"
#include "kernels/cuda/cuda_mla_decode.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/mx_layout.h"

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
    case cudaErrorDevicesUnavailable: return true;
    default: return false;
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
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };

 public:
  CudaBackend() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) fail("CUDA backend: no usable GPU: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
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
    for (Scratch& s : tmp_)
      if (s.p) cudaFree(s.p);
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
    // (MXFP4 whose shape allows it: the code bytes in tile-major order, mx_layout.h; else as stored.)
    void* tiled = tile_major_upload(w, data_bytes);
    d.data = tiled ? tiled : upload_owned(w.data, data_bytes, "weight data");
    if (tiled) d.mx_tile_major = true;
    d.scale = scale_bytes ? upload_owned(w.scale, scale_bytes, "weight scales") : nullptr;
    // FP8 (e4m3fn) codes scanned once for NaN codes: a weight without any lets the tensor-core kernels leave out
    // their per-block NaN vote (the same values either way).
    const bool fp8 = w.format == WeightFormat::FP8_E4M3_BLOCK || w.format == WeightFormat::FP8_E4M3_TENSOR ||
                     w.format == WeightFormat::FP8_E4M3_CHANNEL;
    if (fp8 && !w.fnuz && data_bytes) {
      if (!nan_flag_) {
        nan_flag_ = static_cast<uint32_t*>(alloc(sizeof(uint32_t), "FP8 NaN scan flag"));
        owned_.push_back(nan_flag_);
      }
      check(cudaMemsetAsync(nan_flag_, 0, sizeof(uint32_t), stream_), "cudaMemsetAsync (FP8 NaN scan)");
      cuda::launch_fp8_nan_scan(d.data, static_cast<int64_t>(data_bytes), nan_flag_, stream_);
      check_launch("FP8 NaN scan");
      uint32_t flag = 1;
      download(&flag, nan_flag_, sizeof(flag));
      d.fp8_nan_free = flag == 0;
    }
    // MXFP4 codes into the pair-swizzled layout the tensor-core kernels decode cheaply (kernels/cuda/mx_layout.h: a
    // bit order inside each 32-bit word of codes; every kernel reading the weight knows it — values unchanged).
    if (w.format == WeightFormat::MXFP4 && !w.mx_swizzled && cuda::mx_swizzle_ok(w.cols, d.data)) {
      cuda::launch_mx_swizzle(const_cast<void*>(d.data), w.rows, w.cols, stream_);
      check_launch("MXFP4 swizzle");
      sync();
      d.mx_swizzled = true;
    }
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
  // y = x·Wᵀ + epilogue. fp32 x (the exactness mode): the exact kernels (skinny ≤ 16 rows, tiled above). bf16 x:
  // the bf16 path — cuBLASLt bf16 GEMMs above the skinny sizes for weights whose values are bf16 (BF16, MXFP4), the
  // own tensor-core kernel for FP8 (raw codes, block scales on fp32 partial sums), the skinny kernels at M ≤ 16.
  // The accumulators are fp32; the epilogue (bias, SwiGLU gate, gate, residual, rounding to y's dtype) runs after.
  void matmul(const QuantWeight& w, const Tensor& x, const Tensor& y, const Epilogue& ep = {}) override {
    const int64_t M = x.rows, N = w.rows;
    if (M <= 0 || N <= 0) return;
    // Decode sizes: the skinny kernels read x in its dtype and apply the epilogue at the store (SwiGLU: the gate
    // rows first, rounded into a scratch of y's dtype, then the up rows with that gate). BF16 / FP8 weights with
    // bf16 x take the tensor-core skinny kernels over the row counts stc_rows() gives (past 16 rows too).
    // More tokens: the tiled tensor-core kernel (the same weights; tile_take).
    const cuda::WDesc d = cuda::make_wdesc(w);
    const cuda::WDesc gd = ep.glu ? cuda::make_wdesc(*ep.glu[0]) : cuda::WDesc{};
    const bool stc = stc_take(d, x, M) && (!ep.glu || stc_take(gd, x, M));
    const bool tile = !stc && tile_take(d, x, M) && (!ep.glu || tile_take(gd, x, M));
    if ((M <= cuda::kSmallMaxRows || stc || tile) && !(ep.glu && ep.gate)) {
      cuda::LinEpi e;
      e.bias = ep.bias;
      if (ep.gate) e.gate = cuda::tview(*ep.gate);
      if (ep.residual) e.residual = cuda::tview(*ep.residual);
      auto run_tile = [&](const cuda::WDesc& wd, const Tensor& out, const cuda::LinEpi& le) {
        const size_t wsb = cuda::tile_ws_bytes(wd, M);
        float* ws = wsb ? static_cast<float*>(tmp_bytes(kTmpTile, wsb, "tiled matmul K-part sums")) : nullptr;
        cuda::launch_matmul_tile(wd, cuda::tview(x), M, cuda::tview(out), le, ws, stream_, tile_wgmma);
      };
      bool gate_mx = true;
      if (ep.glu) {
        const Tensor g(tmp_bytes(kTmpGlu, static_cast<size_t>(M * N) * y.elem_size(), "SwiGLU gate rows"), y.dtype, M,
                       N);
        gate_mx = cuda::mx_tc_ok(gd);
        if (tile)
          run_tile(gd, g, cuda::LinEpi{});
        else if (stc)
          cuda::launch_matmul_stc(gd, cuda::tview(x), M, cuda::tview(g), cuda::LinEpi{}, stream_);
        else
          cuda::launch_matmul_small(gd, cuda::tview(x), M, cuda::tview(g), cuda::LinEpi{}, stream_,
                                    mx_tc(x, gate_mx, false));
        check_launch("matmul (SwiGLU gate)");
        e.gate = cuda::tview(g);
      }
      if (tile) {
        ++tile_calls;
        run_tile(d, y, e);
      } else if (stc) {
        ++stc_calls;
        cuda::launch_matmul_stc(d, cuda::tview(x), M, cuda::tview(y), e, stream_);
      } else {
        cuda::launch_matmul_small(d, cuda::tview(x), M, cuda::tview(y), e, stream_,
                                  mx_tc(x, cuda::mx_tc_ok(d) && gate_mx));
      }
      check_launch("matmul");
      return;
    }
    const bool direct = ep.empty() && y.dtype == DType::F32 && y.contiguous();
    // bf16 x that cuBLASLt can read in place (contiguous, K % 8 == 0, 16-byte aligned): the GEMM reads x's bf16
    // bytes, not an fp32 copy converted back to bf16 (the same values, two kernels fewer per linear).
    if (lt_reads_x(w, x) && (!ep.glu || lt_reads_x(*ep.glu[0], x))) {
      float* acc = direct ? y.f32() : tmp_f32(kTmpAcc, M * N, "matmul accumulators");
      float* gacc = ep.glu ? tmp_f32(kTmpGacc, M * N, "matmul gate accumulators") : nullptr;
      if (lt_gemm_ok(w, x.data, M, acc) && (!ep.glu || lt_gemm_ok(*ep.glu[0], x.data, M, gacc))) {
        lt_gemm_bf16(w, x.data, M, acc);
        if (ep.glu) lt_gemm_bf16(*ep.glu[0], x.data, M, gacc);
        if (!direct) epilogue(acc, gacc, ep, M, N, y, nullptr, nullptr);
        return;
      }
    }
    const float* xf = f32_rows(x, kTmpX, "matmul activations (fp32)");
    float* acc = direct ? y.f32() : tmp_f32(kTmpAcc, M * N, "matmul accumulators");
    linear_f32(w, xf, M, acc, x.bf16());
    if (direct) return;
    float* gacc = nullptr;
    if (ep.glu) {
      gacc = tmp_f32(kTmpGacc, M * N, "matmul gate accumulators");
      linear_f32(*ep.glu[0], xf, M, gacc, x.bf16());
    }
    epilogue(acc, gacc, ep, M, N, y, nullptr, nullptr);
  }
  void reserve_matmul(const QuantWeight* const* w, size_t n, int64_t max_rows, DType x_dtype) override {
    int64_t kmax = 0, nmax = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!w[i] || !w[i]->data) continue;
      kmax = std::max(kmax, w[i]->cols);
      nmax = std::max(nmax, w[i]->rows);
    }
    if (max_rows <= 0 || kmax <= 0) return;
    tmp_f32(kTmpX, max_rows * kmax, "matmul activations (fp32)");
    tmp_f32(kTmpAcc, max_rows * nmax, "matmul accumulators");
    tmp_f32(kTmpGacc, max_rows * nmax, "matmul gate accumulators");
    if (x_dtype == DType::BF16) reserve_lt(w, n, max_rows);
  }

  void grouped_matmul(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const Tensor& x,
                      const Tensor& y, const Epilogue& ep = {}) override {
    if (n_groups <= 0 || x.rows <= 0) return;
    const int64_t R = x.rows, N = y.cols;
    // Few rows in all (the routed experts of a decode batch: at most kWarpGroupedMaxRows (token, expert) pairs, a
    // few per expert): the warp-per-row grouped kernels, x in its dtype, the epilogue at the store; larger calls
    // (prefill) the tensor-core kernels. Decided here, not in moe_experts, so that every caller of grouped_matmul
    // (and a wrapping backend such as the bench's counter) takes the same kernels.
    // Prefill sizes too when every weight (and the SwiGLU gate's) takes the BF16 / FP8 tensor-core kernels and the
    // tiled kernel is on for groups: their groups of more than 16 tokens run on it (cuda_set_tile_rows).
    // MXFP4 tables too (every weight passing mx_tc_ok: the tiled kernel decodes them in shared memory).
    bool big_stc = false;
    if (R > kWarpGroupedMaxRows && tile_grouped && !(ep.glu && ep.gate)) {
      auto takes = [&](const QuantWeight* const* ws) {
        int64_t rows = 0, cols = 0;
        bool all_stc = true, all_mx = true;
        if (!group_table(ws, n_groups, rows, cols, nullptr, &all_mx, &all_stc)) return false;
        return stc_group(x, all_stc) ||
               (all_mx && stc_group(x, true) && tile_format(ws, n_groups) == static_cast<int>(WeightFormat::MXFP4));
      };
      big_stc = takes(w) && (!ep.glu || takes(ep.glu));
    }
    if ((R <= kWarpGroupedMaxRows || big_stc) && !(ep.glu && ep.gate)) {
      int64_t rows = 0, cols = 0;
      bool mx = true, stc = true;
      const cuda::WDesc* table = group_table(w, n_groups, rows, cols, nullptr, &mx, &stc);
      stc = stc_group(x, stc);
      if (!table) return;
      void* scratch = group_scratch_for(cuda::grouped_scratch_bytes(n_groups));
      cuda::LinEpi e;
      e.bias = ep.bias;
      if (ep.gate) e.gate = cuda::tview(*ep.gate);
      if (ep.residual) e.residual = cuda::tview(*ep.residual);
      if (ep.glu) {
        int64_t gr = 0, gc = 0;
        bool gmx = true, gstc = true;
        const cuda::WDesc* gtable = group_table(ep.glu, n_groups, gr, gc, nullptr, &gmx, &gstc);
        gstc = stc_group(x, gstc);
        const Tensor g(tmp_bytes(kTmpGlu, static_cast<size_t>(R * N) * y.elem_size(), "SwiGLU gate rows"), y.dtype, R,
                       N);
        // Gate and up in one pass for the smallest steps (batch 1 at top-8: 3.66 -> 3.48 ms per GLM-5-shape step on
        // the H200); from 64 pairs on its 156 registers (one block per SM) cost more than the second pass saves
        // (batch 32: 10.8 -> 11.3 ms). Both paths give the same bits.
        if (gtable && gr == rows && gc == cols && R <= glu_fused_rows && mx_tc(x, mx && gmx)) {
          cuda::launch_grouped_small_glu(table, gtable, n_groups, rows, R, offsets, cuda::tview(x), cuda::tview(y), e,
                                         cuda::tview(g), scratch, stream_, tile_grouped, tile_format(w, n_groups),
                                         tile_format(ep.glu, n_groups));
          check_launch("grouped_matmul (SwiGLU)");
          return;
        }
        cuda::launch_grouped_small(gtable, n_groups, gr, R, offsets, cuda::tview(x), cuda::tview(g), cuda::LinEpi{},
                                   scratch, stream_, mx_tc(x, gmx, false), gstc, tile_grouped,
                                   tile_format(ep.glu, n_groups), tile_wgmma);
        check_launch("grouped_matmul (SwiGLU gate)");
        e.gate = cuda::tview(g);
      }
      if (stc) ++stc_calls;
      if (big_stc) ++tile_calls;
      cuda::launch_grouped_small(table, n_groups, rows, R, offsets, cuda::tview(x), cuda::tview(y), e, scratch, stream_,
                                 mx_tc(x, mx), stc, tile_grouped, tile_format(w, n_groups), tile_wgmma);
      check_launch("grouped_matmul");
      return;
    }
    const float* xf = f32_rows(x, kTmpX, "grouped matmul activations (fp32)");
    const bool direct = ep.empty() && y.dtype == DType::F32 && y.contiguous();
    float* acc = direct ? y.f32() : tmp_f32(kTmpAcc, R * N, "grouped matmul accumulators");
    if (!grouped_f32(w, n_groups, offsets, xf, acc, x.bf16())) return;  // every group empty
    if (direct) return;
    float* gacc = nullptr;
    if (ep.glu) {
      gacc = tmp_f32(kTmpGacc, R * N, "grouped matmul gate accumulators");
      grouped_f32(ep.glu, n_groups, offsets, xf, gacc, x.bf16());
    }
    // Only the groups' rows [offsets[0], offsets[n_groups]) are written.
    epilogue(acc, gacc, ep, R, N, y, offsets, offsets + n_groups);
  }
  void embedding(const QuantWeight& table, const int32_t* ids, const Tensor& out) override {
    cuda::launch_embedding(cuda::make_wdesc(table), ids, out.rows, cuda::tview(out), stream_);
    check_launch("embedding");
  }

  // Declared FP8 activations (cuda_act_quant.cu). The linear op in the bf16 mode (bf16 x and y), for block-FP8 weights
  // of 128 x 128 blocks (e4m3fn codes, K % 16 == 0, and the gate weight of a SwiGLU alike) from fp8_gemm_min_rows rows:
  // x quantized to codes and 1 x 128 scales, then the FP8 x FP8 cuBLASLt GEMM (cuda_lt.h fp8_gemm: each 128-column
  // block's partial sum promoted to fp32 and scaled by s_x · s_w), then the epilogue. Everything else — the fp32
  // mode (its exact fp32 sums), other block shapes, shapes cuBLASLt has no algorithm for, grouped experts — the
  // default composition (act_quant_fp8, then the exact matmul over q · s).
  void act_quant_fp8(const Tensor& x, int64_t group, bool pow2_scale, const Tensor& xq) override {
    cuda::launch_act_quant_fp8(cuda::tview(x), x.rows, x.cols, group, pow2_scale, xq.f32(), xq.ld, stream_);
    check_launch("act_quant_fp8");
  }
  void matmul_act_fp8(const QuantWeight& w, const Tensor& x, const ActFp8& a, const Tensor& y,
                      const Epilogue& ep = {}) override {
    const int64_t M = x.rows, N = w.rows, K = w.cols;
    if (M <= 0 || N <= 0) return;
    const QuantWeight* g = ep.glu ? ep.glu[0] : nullptr;
    if (!fp8_gemm_eligible(w, x, y) || (g && (!fp8_gemm_eligible(*g, x, y) || g->rows != N)))
      return Backend::matmul_act_fp8(w, x, a, y, ep);
    // The GEMM runs Mp = fp8_rows(M) token rows (cuBLASLt's block-scaled kernels take multiples of 4): the rows past
    // M are zero codes with zero scales, their outputs (zeros) never read.
    const int64_t Mp = cuda::LtGemm::fp8_rows(M), Kb = (K + 127) / 128, Nb = (N + 127) / 128,
                  ldm = cuda::LtGemm::fp8_ld(Mp), ldk = cuda::LtGemm::fp8_ld(Kb);
    // Scratch: the x codes [Mp, K], the x scales [Kb, ldm], the weight (and gate) scales padded to [Nb, ldk] rows
    // when Kb is not a multiple of 4; each part 256-byte aligned.
    const auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t codes_b = up(static_cast<size_t>(Mp * K)), xs_b = up(static_cast<size_t>(Kb * ldm) * 4),
                 ws_b = Kb == ldk ? 0 : up(static_cast<size_t>(Nb * ldk) * 4);
    auto* base = static_cast<uint8_t*>(tmp_bytes(kTmpAct8, codes_b + xs_b + 2 * ws_b, "FP8 activation codes"));
    uint8_t* codes = base;
    auto* xs = reinterpret_cast<float*>(base + codes_b);
    // (y is bf16 here: the fp32 sums always go through the epilogue, which rounds them.)
    float* acc = tmp_f32(kTmpAcc, Mp * N, "matmul accumulators");
    float* gacc = g ? tmp_f32(kTmpGacc, Mp * N, "matmul gate accumulators") : nullptr;
    if (!lt_->fp8_supported(w.data, codes, Mp, N, K, acc) || (g && !lt_->fp8_supported(g->data, codes, Mp, N, K, gacc)))
      return Backend::matmul_act_fp8(w, x, a, y, ep);
    if (Mp != M) {
      check(cudaMemsetAsync(codes + M * K, 0, static_cast<size_t>((Mp - M) * K), stream_), "FP8 codes (padding rows)");
      check(cudaMemsetAsync(xs, 0, static_cast<size_t>(Kb * ldm) * 4, stream_), "FP8 scales (padding rows)");
    }
    cuda::launch_act_quant_fp8_codes(cuda::tview(x), M, K, 128, a.pow2_scale, codes, K, xs, ldm, stream_);
    check_launch("act_quant_fp8 (codes)");
    const auto scales = [&](const QuantWeight& q, int slot) {
      if (!ws_b) return static_cast<const float*>(q.scale);
      auto* d = reinterpret_cast<float*>(base + codes_b + xs_b + static_cast<size_t>(slot) * ws_b);
      check(cudaMemcpy2DAsync(d, static_cast<size_t>(ldk) * 4, q.scale, static_cast<size_t>(Kb) * 4,
                              static_cast<size_t>(Kb) * 4, static_cast<size_t>(Nb), cudaMemcpyDeviceToDevice, stream_),
            "FP8 weight scales (padded rows)");
      return static_cast<const float*>(d);
    };
    lt_->fp8_gemm(w.data, scales(w, 0), codes, xs, Mp, N, K, acc, stream_);
    check_launch("matmul_act_fp8 (cublasLtMatmul)");
    if (g) {
      lt_->fp8_gemm(g->data, scales(*g, 1), codes, xs, Mp, N, K, gacc, stream_);
      check_launch("matmul_act_fp8 (SwiGLU gate, cublasLtMatmul)");
    }
    ++fp8_gemm_calls;
    epilogue(acc, gacc, ep, M, N, y, nullptr, nullptr);
  }

  // ---------------- norms / elementwise ----------------
  void rms_norm(const Tensor& x, const float* w, float eps, const Tensor& y) override {
    cuda::launch_rms_norm(cuda::tview(x), w, x.rows, x.cols, eps, cuda::tview(y), stream_);
    check_launch("rms_norm");
  }
  void add_rms_norm(const Tensor& h, const Tensor& delta, const float* w, float eps, const Tensor& y) override {
    cuda::launch_add_rms_norm(cuda::tview(h), cuda::tview(delta), w, h.rows, h.cols, eps, cuda::tview(y), stream_);
    check_launch("add_rms_norm");
  }
  void layer_norm(const Tensor& x, const float* w, const float* b, float eps, const Tensor& y) override {
    cuda::launch_layer_norm(cuda::tview(x), w, b, x.rows, x.cols, eps, cuda::tview(y), stream_);
    check_launch("layer_norm");
  }
  void rope(const Tensor& x, int64_t n_heads, int64_t head_stride, const int64_t* pos, const RopeParams& p) override {
    cuda::launch_rope(cuda::tview(x), x.rows, n_heads, head_stride, pos, p, stream_);
    check_launch("rope");
  }
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    cuda::launch_silu_mul(cuda::tview(gate), cuda::tview(up), out.rows, out.cols, cuda::tview(out), stream_);
    check_launch("silu_mul");
  }
  void add(const Tensor& y, const Tensor& x) override {
    cuda::launch_add(cuda::tview(y), cuda::tview(x), y.rows, y.cols, stream_);
    check_launch("add");
  }
  void convert(const Tensor& src, const Tensor& dst) override {
    cuda::launch_convert(cuda::tview(src), cuda::tview(dst), dst.rows, dst.cols, stream_);
    check_launch("convert");
  }

  // ---------------- attention ----------------
  void mla_attention_naive(const MlaDims& d, const Tensor& q, const Tensor& kvb, const Tensor& k_pe, int64_t T,
                           const int64_t* q_pos, const KeySelection& sel, float scale, const Tensor& o) override {
    const bool flash = flash_prefill && tc_dispatch;
    uint32_t* mask = nullptr;  // a DSA selection's bitmap for the tensor-core kernel: rows x ceil(T / 32) words
    if (flash && sel.sel && o.dtype == DType::BF16)
      mask = static_cast<uint32_t*>(tmp_bytes(kTmpMask, static_cast<size_t>(q.rows * ((T + 31) / 32)) * 4,
                                              "prefill attention DSA selection bitmap"));
    if (cuda::launch_mla_naive(d, cuda::tview(q), cuda::tview(kvb), cuda::tview(k_pe), q.rows, T, q_pos, sel, scale,
                               cuda::tview(o), stream_, flash, mask))
      ++flash_calls;
    check_launch("mla_attention_naive");
  }
  void mla_attention_absorbed(const MlaDims& d, const Tensor& q, const QuantWeight& kv_b, const Tensor& c,
                              const Tensor& k_pe, int64_t T, const int64_t* q_pos, const KeySelection& sel, float scale,
                              const Tensor& o) override {
    const float* cf = f32_rows(c.with_rows(T), kTmpAcc, "absorbed attention latent (fp32)");
    const float* kf = f32_rows(k_pe.with_rows(T), kTmpGacc, "absorbed attention rope keys (fp32)");
    cuda::launch_mla_absorbed(d, cuda::tview(q), cuda::make_wdesc(kv_b), cf, kf, q.rows, T, q_pos, sel, scale,
                              cuda::tview(o), stream_);
    check_launch("mla_attention_absorbed");
  }

  // ---------------- DSA indexer ----------------
  void indexer_scores(const Tensor& q, const Tensor& w, const Tensor& k, int64_t n_heads, float scale,
                      const int64_t* q_pos, float* scores) override {
    cuda::launch_indexer_scores(cuda::tview(q), cuda::tview(w), cuda::tview(k), q.rows, k.rows, n_heads, k.cols, scale,
                                q_pos, scores, stream_);
    check_launch("indexer_scores");
  }
  void indexer_scores_paged(const Tensor& q, const Tensor& w, const KvPool& pool, const StepSeqs& seqs, int64_t r0,
                            int64_t n_heads, float scale, const int64_t* q_pos, int64_t T, float* scores) override {
    if (tc_indexer && tc_dispatch &&
        cuda::launch_indexer_tc(cuda::tview(q), cuda::tview(w), pool, seqs, r0, q.rows, n_heads,
                                q.cols / std::max<int64_t>(n_heads, 1), scale, q_pos, T, scores, stream_)) {
      ++tc_indexer_calls;
    } else {
      cuda::launch_indexer_scores_paged(cuda::tview(q), cuda::tview(w), pool, seqs, r0, q.rows, n_heads, pool.width,
                                        scale, q_pos, T, scores, stream_);
    }
    check_launch("indexer_scores_paged");
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
  void scatter_add_weighted(const Tensor& x, const int32_t* token, const float* weight, const Tensor& y) override {
    cuda::launch_scatter_add_weighted(cuda::tview(x), token, weight, x.rows, x.cols, cuda::tview(y), stream_);
    check_launch("scatter_add_weighted");
  }

  void moe_combine(const Tensor& x, const int32_t* ids, int64_t K, const int64_t* offsets, const int32_t* token,
                   const float* weight, const Tensor& y) override {
    if (!cuda::launch_moe_combine(cuda::tview(x), ids, y.rows, K, offsets, token, weight, y.cols, cuda::tview(y),
                                  stream_))
      return Backend::moe_combine(x, ids, K, offsets, token, weight, y);
    check_launch("moe_combine");
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
  void gather_rows(const Tensor& src, const int32_t* rows, const Tensor& dst) override {
    cuda::launch_gather_rows(cuda::tview(src), rows, dst.rows, dst.cols, cuda::tview(dst), stream_);
    check_launch("gather_rows");
  }
  void scale(const Tensor& x, float s) override {
    cuda::launch_scale(cuda::tview(x), x.rows, x.cols, s, stream_);
    check_launch("scale");
  }
  void fill(const Tensor& x, float v) override {
    cuda::launch_fill(cuda::tview(x), x.rows, x.cols, v, stream_);
    check_launch("fill");
  }

  // ---------------- paged latent cache ----------------
  // The MLA query / latent block: the default's matmuls, then its rope, norm, rope and store in one kernel (the same
  // bits: the op contract's expect_blocks_equal_defaults). Declared FP8 activations (L.act) are the default's: the
  // model calls Backend::mla_qkv for them.
  void mla_qkv(const MlaLayer& L, const Tensor& x, const StepTokens& tok, const KvPool& pool, const Tensor& cq,
               const Tensor& q, const Tensor& kv) override {
    const int64_t H = L.d.n_heads, dn = L.d.nope, dr = L.d.rope, dc = L.d.latent;
    if (L.act || !cuda::mla_qkv_tail_ok(dc, dr) || L.rope.dim != dr || kv.cols != dc + dr || q.rows != kv.rows) {
      Backend::mla_qkv(L, x, tok, pool, cq, q, kv);
      return;
    }
    Epilogue qa;
    qa.bias = L.q_a_bias;
    matmul(*L.q_a, x, cq, qa);
    rms_norm(cq, L.q_a_norm, L.norm_eps, cq);
    matmul(*L.q_b, cq, q);
    Epilogue ka;
    ka.bias = L.kv_a_bias;
    matmul(*L.kv_a, x, kv, ka);
    cuda::launch_mla_qkv_tail(cuda::tview(q), dn, H, L.d.qk(), cuda::tview(kv), dc, L.kv_a_norm, L.norm_eps, tok.pos,
                              tok.slots, kv.rows, pool, L.rope, stream_);
    check_launch("mla_qkv tail");
  }

  void kv_store(const KvPool& pool, const int64_t* slots, const Tensor& src, int64_t col0) override {
    cuda::launch_kv_store(pool, slots, src.rows, cuda::tview(src), col0, src.cols, stream_);
    check_launch("kv_store");
  }
  void kv_gather(const KvPool& pool, const int32_t* blocks, int64_t col0, const Tensor& dst) override {
    cuda::launch_kv_gather(pool, blocks, dst.rows, col0, dst.cols, cuda::tview(dst), stream_);
    check_launch("kv_gather");
  }
  void kv_copy_block(const KvPool& pool, int32_t src, int32_t dst, int64_t n_tokens) override {
    const size_t row = static_cast<size_t>(pool.width) * (pool.dtype == DType::BF16 ? 2 : 4);
    const size_t block = static_cast<size_t>(pool.block_tokens) * row;
    char* base = static_cast<char*>(pool.data);
    copy(base + static_cast<size_t>(dst) * block, base + static_cast<size_t>(src) * block,
         static_cast<size_t>(n_tokens) * row);
  }
  void mla_attention_absorbed_paged(const MlaDims& d, const Tensor& q, const QuantWeight& kv_b, const KvPool& pool,
                                    const StepSeqs& seqs, const int64_t* pos, const KeySelection& sel, float scale,
                                    const Tensor& o) override {
    cuda::launch_mla_absorbed_paged(d, cuda::tview(q), cuda::make_wdesc(kv_b), pool, seqs, pos, sel, scale,
                                    cuda::tview(o), stream_);
    check_launch("mla_attention_absorbed_paged");
  }

  // ---------------- decode blocks ----------------
  // bf16 mode over a bf16 pool: the FlashMLA-structured kernels of cuda_mla_decode.cu (absorption GEMMs, tensor-core
  // attention with split keys, LSE combine, output absorption); other shapes and the fp32 mode: the generic kernel.
  void mla_decode_attention(const MlaLayer& L, const Tensor& q, const KvPool& pool, const StepSeqs& seqs,
                            const int64_t* pos, const KeySelection& sel, const Tensor& o) override {
    if (!fast_decode || !q.bf16() || !o.bf16() || !cuda::mla_decode_supported(L.d, pool))
      return Backend::mla_decode_attention(L, q, pool, seqs, pos, sel, o);
    const int64_t N = q.rows;
    // Splits from the graph bucket of the run (decode_graph_bucket: a padded graph step splits as an eager one) and
    // from the shared split context (StepSeqs::split_ctx): an eager step splits as a graph replay of its shape.
    const int64_t ctx = seqs.split_ctx > 0 ? std::max(seqs.split_ctx, seqs.max_ctx) : seqs.max_ctx;
    const int splits = cuda::mla_decode_splits(L.d, decode_graph_bucket(N), ctx, mla_split_keys);
    const cuda::MlaDecodeScratch sz = cuda::mla_decode_scratch(L.d, N, splits);
    char* base = static_cast<char*>(
        tmp_bytes(kTmpMla, sz.qlat_bytes + sz.olat_bytes + sz.part_o_bytes + sz.part_ml_bytes + 256, "MLA decode"));
    auto al = [](size_t n) { return (n + 63) / 64 * 64; };
    char* ql = base;
    char* ol = ql + al(sz.qlat_bytes);
    char* po = ol + al(sz.olat_bytes);
    char* pm = po + al(sz.part_o_bytes);
    cuda::launch_mla_decode(L.d, cuda::tview(q), N, cuda::make_wdesc(*L.kv_b), pool, seqs, pos, sel, L.softmax_scale,
                            splits, ql, ol, po, pm, cuda::tview(o), stream_);
    check_launch("mla_decode_attention");
    ++fast_decode_calls;
  }

  int64_t lt_calls() const { return lt_calls_; }
  int64_t tc_calls() const { return tc_calls_; }
  // Whether a skinny matmul with x takes the MXFP4 tensor-core kernels (weights eligible: `ok`); counted once per
  // op (`count`: false for the SwiGLU gate half of one).
  bool mx_tc(const Tensor& x, bool ok, bool count = true) {
    const bool on = ok && tc_dispatch && x.dtype == DType::BF16;
    if (on && count) ++mx_tc_calls;
    return on;
  }
  int64_t mx_tc_calls = 0;
  // The BF16 / FP8 tensor-core skinny kernels (cuda_skinny_tc.cu): a matmul with bf16 x takes them for M in
  // [stc_min(format), stc_max(format)] (cuda_set_stc_rows); grouped calls at decode sizes whenever every weight
  // qualifies. Counter: the calls that took them.
  bool stc_take(const cuda::WDesc& d, const Tensor& x, int64_t M) const {
    if (!tc_dispatch || x.dtype != DType::BF16 || !cuda::stc_ok(d) || !cuda::stc_x_ok(cuda::tview(x))) return false;
    const bool bf16 = d.format == static_cast<int32_t>(WeightFormat::BF16);
    // Under 1,024 rows a block per 16-row tile leaves most SMs idle: the GEMV kernels (split over a block's warps)
    // read such matrices faster up to 8 tokens (cuda_bench skinny: kv_a, router); so do they long rows at one token
    // (o_proj, the dense MLP's up / gate). The limits fall on decode graph bucket edges (1 | 2 | 3-4 | 5-8 | 9-16).
    if (d.rows < 1024 && M < 9) return false;
    if (M == 1 && d.cols > (bf16 ? 4096 : 8192)) return false;
    return M >= (bf16 ? stc_bf16_min : stc_fp8_min) && M <= (bf16 ? stc_bf16_max : stc_fp8_max);
  }
  // The tiled tensor-core kernel (cuda_set_tile_rows): BF16 / FP8 weights passing stc_ok with bf16 x, M in
  // [tile_min(format), tile_max(format)], where the skinny kernels did not take the call.
  bool tile_take(const cuda::WDesc& d, const Tensor& x, int64_t M) const {
    if (!tc_dispatch || x.dtype != DType::BF16 || !cuda::stc_ok(d) || !cuda::stc_x_ok(cuda::tview(x))) return false;
    const bool bf16 = d.format == static_cast<int32_t>(WeightFormat::BF16);
    return M >= (bf16 ? tile_bf16_min : tile_fp8_min) && M <= (bf16 ? tile_bf16_max : tile_fp8_max);
  }
  int64_t tile_calls = 0;
  bool tile_grouped = true;
  bool flash_prefill = true;  // cuda_set_flash_prefill (cuda_backend.h)
  int64_t flash_calls = 0;
  bool tc_indexer = true;       // cuda_set_tc_indexer (cuda_backend.h)
  int mla_split_keys = 0;       // cuda_set_mla_split_keys (cuda_backend.h); 0: mla_decode_splits' rule
  int64_t glu_fused_rows = 32;  // cuda_set_glu_fused_rows (cuda_backend.h): 4 decode tokens x top-8
  bool mx_tile_major = true;    // cuda_set_mx_tile_major (cuda_backend.h)
  bool tile_wgmma = true;       // cuda_set_tile_wgmma (cuda_backend.h)
  int64_t tc_indexer_calls = 0;
  int64_t fp8_gemm_min_rows = 1;  // cuda_set_fp8_gemm_rows (cuda_backend.h); 0: off
  int64_t fp8_gemm_calls = 0;
  // (bf16 x and y: the bf16 mode; its tolerance covers the tensor cores' partial sums inside a 128-column block.)
  bool fp8_gemm_eligible(const QuantWeight& w, const Tensor& x, const Tensor& y) const {
    return fp8_gemm_min_rows > 0 && x.rows >= fp8_gemm_min_rows && x.dtype == DType::BF16 && y.dtype == DType::BF16 &&
           w.format == WeightFormat::FP8_E4M3_BLOCK && !w.fnuz && w.block_rows == 128 && w.block_cols == 128 &&
           w.cols % 16 == 0 && w.data && w.scale && (reinterpret_cast<uintptr_t>(w.data) & 15) == 0 &&
           (reinterpret_cast<uintptr_t>(w.scale) & 15) == 0;
  }
  static constexpr int64_t kTileDefaults[4] = {1, 0, 33, int64_t{1} << 40};  // BF16 min, max; FP8 min, max
  int64_t tile_bf16_min = kTileDefaults[0], tile_bf16_max = kTileDefaults[1], tile_fp8_min = kTileDefaults[2],
          tile_fp8_max = kTileDefaults[3];
  bool stc_group(const Tensor& x, bool all_ok) const {
    return all_ok && stc_grouped && tc_dispatch && x.dtype == DType::BF16 && cuda::stc_x_ok(cuda::tview(x));
  }
  int64_t stc_calls = 0;
  static constexpr int64_t kStcDefaults[4] = {1, 16, 1, 32};  // BF16 min, max; FP8 min, max (cuda_backend.h)
  int64_t stc_bf16_min = kStcDefaults[0], stc_bf16_max = kStcDefaults[1], stc_fp8_min = kStcDefaults[2],
          stc_fp8_max = kStcDefaults[3];
  bool stc_grouped = true;
  bool tc_dispatch = true;  // cuda_set_tc_dispatch (cuda_backend.h)
  bool fast_decode = true;  // cuda_set_fast_decode (cuda_backend.h)
  int64_t fast_decode_calls = 0;

 private:
  void check_launch(const char* op) { check(cudaGetLastError(), op); }

  // ---- the fp32-accumulator linear paths (x contiguous fp32; with x_bf16 its values are bf16) ----
  // matmul of the bf16 path above the skinny sizes: x (bf16 values) and W as bf16 operands, one cuBLASLt GEMM with
  // fp32 accumulation into y. BF16 weights are used in place when their rows are 16-byte aligned (K % 8 == 0); MXFP4
  // weights (and unaligned BF16) are dequantized whole into a reusable bf16 scratch first (exact). FP8 takes the own
  // tensor-core kernel (raw codes); F32/F16 weights, M ≤ 16, and shapes cuBLASLt cannot take the exact kernels.
  void linear_f32(const QuantWeight& w, const float* x, int64_t M, float* y, bool x_bf16) {
    if (!x_bf16) {
      cuda::launch_matmul(cuda::make_wdesc(w), x, M, y, stream_);
      check_launch("matmul");
      return;
    }
    if (!lt_eligible(w, M)) return matmul_tc_or_exact(w, x, M, y);
    const int64_t N = w.rows, K = w.cols, Kp = lt_kp(K);
    const bool direct = lt_direct(w);
    void* xb = lt_scratch(lt_x_, static_cast<size_t>(M * Kp) * 2, "bf16 matmul activations");
    void* ws = direct ? nullptr : lt_scratch(lt_w_, static_cast<size_t>(N * Kp) * 2, "bf16 matmul weights");
    const void* wb = direct ? w.data : ws;
    if (!xb || !wb || !lt_->supported(wb, xb, M, N, Kp, y)) return matmul_tc_or_exact(w, x, M, y);
    cuda::launch_to_bf16(x, M, K, Kp, xb, stream_);
    check_launch("matmul (activations to bf16)");
    if (!direct) {
      cuda::launch_dequant_bf16(cuda::make_wdesc(w), Kp, ws, stream_);
      check_launch("matmul (weights to bf16)");
    }
    lt_->gemm(wb, xb, M, N, Kp, y, stream_);
    check_launch("matmul (cublasLtMatmul)");
    ++lt_calls_;
  }
  // The cuBLASLt path straight from a bf16 activation tensor: x [M, K] contiguous with K % 8 == 0 (then Kp == K and
  // its rows are x's), 16-byte aligned.
  bool lt_reads_x(const QuantWeight& w, const Tensor& x) const {
    return x.dtype == DType::BF16 && x.contiguous() && w.cols == x.cols && x.cols % 8 == 0 &&
           (reinterpret_cast<uintptr_t>(x.data) & 15) == 0 && lt_eligible(w, x.rows);
  }
  // Whether cuBLASLt has an algorithm for w times the bf16 rows xb (K = w.cols, a multiple of 8); grows the bf16
  // weight scratch for weights that are not used in place.
  bool lt_gemm_ok(const QuantWeight& w, const void* xb, int64_t M, float* y) {
    const int64_t N = w.rows, K = w.cols;
    const bool direct = lt_direct(w);
    void* ws = direct ? nullptr : lt_scratch(lt_w_, static_cast<size_t>(N * K) * 2, "bf16 matmul weights");
    const void* wb = direct ? w.data : ws;
    return wb && lt_->supported(wb, xb, M, N, K, y);
  }
  // y = xb · Wᵀ (fp32) on cuBLASLt after lt_gemm_ok said yes: MXFP4 (or unaligned BF16) weights dequantized whole
  // into the bf16 scratch first (exact).
  void lt_gemm_bf16(const QuantWeight& w, const void* xb, int64_t M, float* y) {
    const int64_t N = w.rows, K = w.cols;
    const bool direct = lt_direct(w);
    const void* wb = w.data;
    if (!direct) {
      void* ws = lt_scratch(lt_w_, static_cast<size_t>(N * K) * 2, "bf16 matmul weights");
      cuda::launch_dequant_bf16(cuda::make_wdesc(w), K, ws, stream_);
      check_launch("matmul (weights to bf16)");
      wb = ws;
    }
    lt_->gemm(wb, xb, M, N, K, y, stream_);
    check_launch("matmul (cublasLtMatmul)");
    ++lt_calls_;
  }
  void reserve_lt(const QuantWeight* const* w, size_t n, int64_t max_rows) {
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
  // The bf16 path without cuBLASLt: the own tensor-core kernel from cuda_lt_min_rows() rows for the formats it
  // multiplies exactly, else the exact kernels.
  void matmul_tc_or_exact(const QuantWeight& w, const float* x, int64_t M, float* y) {
    const cuda::WDesc d = cuda::make_wdesc(w);
    if (!tc_dispatch || M < cuda_lt_min_rows() || !cuda::tc_format(d)) {
      cuda::launch_matmul(d, x, M, y, stream_);
      check_launch("matmul");
      return;
    }
    cuda::launch_matmul_tc(d, x, M, y, stream_);
    check_launch("matmul (tensor-core kernel)");
    ++tc_calls_;
  }
  // Grouped: the groups of more than 16 rows on the tensor-core kernel in the bf16 path when every weight's values
  // or codes are bf16 values (the expert prefill); false when every group is empty.
  bool grouped_f32(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const float* x, float* y,
                   bool x_bf16) {
    int64_t rows = 0, cols = 0;
    bool tc = x_bf16 && tc_dispatch;
    const cuda::WDesc* table = group_table(w, n_groups, rows, cols, &tc);
    if (!table) return false;
    void* scratch = group_scratch_for(cuda::grouped_scratch_bytes(n_groups));
    cuda::launch_grouped_matmul(table, n_groups, rows, cols, offsets, x, y, scratch, stream_, tc);
    check_launch(tc ? "grouped_matmul (tensor-core kernel)" : "grouped_matmul");
    if (tc) ++tc_calls_;
    return true;
  }
  void epilogue(const float* acc, const float* gacc, const Epilogue& ep, int64_t M, int64_t N, const Tensor& y,
                const int64_t* row_lo, const int64_t* row_hi) {
    const cuda::TView gate = ep.gate ? cuda::tview(*ep.gate) : cuda::TView{};
    const cuda::TView res = ep.residual ? cuda::tview(*ep.residual) : cuda::TView{};
    cuda::launch_epilogue(acc, gacc, ep.bias, gate, res, M, N, cuda::tview(y), row_lo, row_hi, stream_);
    check_launch("linear epilogue");
  }

  // ---- typed-tensor scratch ----
  enum TmpSlot { kTmpX = 0, kTmpAcc, kTmpGacc, kTmpMla, kTmpGlu, kTmpTile, kTmpMask, kTmpAct8, kTmpSlots };
  static constexpr int64_t kWarpGroupedMaxRows = 1024;  // 128 decode tokens x top-8
  // Device scratch slot of at least n floats (grow-only; a growth during a graph capture is an engine error: the
  // eager step at the graph's shape grows every slot first).
  float* tmp_f32(int slot, int64_t n, const char* what) {
    return static_cast<float*>(tmp_bytes(slot, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float), what));
  }
  void* tmp_bytes(int slot, size_t bytes, const char* what) {
    Scratch& s = tmp_[slot];
    if (bytes <= s.bytes) return s.p;
    if (capturing()) fail("CUDA backend: {} would grow during a graph capture", what);
    size_t nb = std::max(bytes, s.bytes + s.bytes / 2);
    nb = (nb + (size_t{2} << 20) - 1) / (size_t{2} << 20) * (size_t{2} << 20);
    sync();
    retire_or_free(s.p);
    s = {};
    s.p = alloc(nb, what);
    s.bytes = nb;
    return s.p;
  }
  // t's rows as a contiguous fp32 array: t itself when it is F32 and contiguous, else converted into slot.
  const float* f32_rows(const Tensor& t, int slot, const char* what) {
    if (t.dtype == DType::F32 && t.contiguous()) return static_cast<const float*>(t.data);
    float* d = tmp_f32(slot, t.numel(), what);
    cuda::launch_convert(cuda::tview(t), cuda::TView{d, t.cols, 0}, t.rows, t.cols, stream_);
    check_launch(what);
    return d;
  }
  Scratch tmp_[kTmpSlots];

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

  // MXFP4 codes whose shape allows it (mx_tile_major_ok) uploaded into the tile-major byte order (mx_layout.h):
  // through a staging buffer, permuted into the owned one. Null (the caller uploads as stored) for other weights,
  // with cuda_set_mx_tile_major(false), or when the staging buffer does not fit.
  void* tile_major_upload(const QuantWeight& w, size_t bytes) {
    if (!mx_tile_major || w.format != WeightFormat::MXFP4 || w.mx_tile_major || !w.data ||
        !cuda::mx_tile_major_ok(w.rows, w.cols, w.row_bytes()))
      return nullptr;
    void* stage = nullptr;
    if (cudaMalloc(&stage, bytes) != cudaSuccess) {
      cudaGetLastError();  // (clears the failed allocation's error)
      return nullptr;
    }
    void* p = nullptr;
    try {
      upload(stage, w.data, bytes);
      p = alloc(bytes, "weight data");
      owned_.push_back(p);
      cuda::launch_mx_tile_major(stage, p, w.rows, w.row_bytes(), stream_);
      check_launch("MXFP4 tile-major order");
      sync();
    } catch (...) {
      cudaFree(stage);
      throw;
    }
    check(cudaFree(stage), "cudaFree");
    return p;
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

  // The one weight format of a grouped matmul's weights for the tiled kernel (FP8 per tensor and per channel as
  // one), or -2 when they mix formats.
  static int tile_format(const QuantWeight* const* w, int64_t n_groups) {
    int f = -1;
    for (int64_t g = 0; g < n_groups; ++g) {
      if (!w[g]) continue;
      int wf = static_cast<int>(w[g]->format);
      if (w[g]->format == WeightFormat::FP8_E4M3_CHANNEL) wf = static_cast<int>(WeightFormat::FP8_E4M3_TENSOR);
      if (f == -1)
        f = wf;
      else if (f != wf)
        return -2;
    }
    return f == -1 ? -2 : f;
  }

  // The device table of a grouped matmul's weights (cached per distinct list of weights).
  // tc (optional): set false unless every listed weight passes cuda::tc_format.
  // mx (optional): set false unless every listed weight passes cuda::mx_tc_ok; stc (optional): cuda::stc_ok.
  const cuda::WDesc* group_table(const QuantWeight* const* w, int64_t n_groups, int64_t& rows, int64_t& cols,
                                 bool* tc = nullptr, bool* mx = nullptr, bool* stc = nullptr) {
    std::vector<const void*> key(static_cast<size_t>(n_groups));
    std::vector<cuda::WDesc> descs(static_cast<size_t>(n_groups));
    bool any = false;
    for (int64_t g = 0; g < n_groups; ++g) {
      if (!w[g]) continue;
      key[static_cast<size_t>(g)] = w[g]->data;
      descs[static_cast<size_t>(g)] = cuda::make_wdesc(*w[g]);
      if (tc && !cuda::tc_format(descs[static_cast<size_t>(g)])) *tc = false;
      if (mx && !cuda::mx_tc_ok(descs[static_cast<size_t>(g)])) *mx = false;
      if (stc && !cuda::stc_ok(descs[static_cast<size_t>(g)])) *stc = false;
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
  uint32_t* nan_flag_ = nullptr;  // prepare_weight's FP8 NaN scan (device, in owned_)
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

void cuda_set_fast_decode(Backend& be, bool on) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) c->fast_decode = on;
}

int64_t cuda_fast_decode_calls(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->fast_decode_calls : -1;
}

int64_t cuda_mx_tc_matmuls(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->mx_tc_calls : -1;
}

int64_t cuda_stc_matmuls(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->stc_calls : -1;
}

void cuda_set_stc_rows(Backend& be, int64_t bf16_min, int64_t bf16_max, int64_t fp8_min, int64_t fp8_max,
                       bool grouped) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) {
    c->stc_bf16_min = bf16_min;
    c->stc_bf16_max = bf16_max;
    c->stc_fp8_min = fp8_min;
    c->stc_fp8_max = fp8_max;
    c->stc_grouped = grouped;
  }
}

void cuda_reset_stc_rows(Backend& be) {
  if (!dynamic_cast<CudaBackend*>(&be)) return;
  cuda_set_stc_rows(be, CudaBackend::kStcDefaults[0], CudaBackend::kStcDefaults[1], CudaBackend::kStcDefaults[2],
                    CudaBackend::kStcDefaults[3], true);
  cuda_set_tile_rows(be, CudaBackend::kTileDefaults[0], CudaBackend::kTileDefaults[1], CudaBackend::kTileDefaults[2],
                     CudaBackend::kTileDefaults[3], true);
}

int64_t cuda_tile_matmuls(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->tile_calls : -1;
}

void cuda_set_tile_rows(Backend& be, int64_t bf16_min, int64_t bf16_max, int64_t fp8_min, int64_t fp8_max,
                        bool grouped) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) {
    c->tile_grouped = grouped;
    c->tile_bf16_min = bf16_min;
    c->tile_bf16_max = bf16_max;
    c->tile_fp8_min = fp8_min;
    c->tile_fp8_max = fp8_max;
  }
}

void cuda_set_flash_prefill(Backend& be, bool on) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) c->flash_prefill = on;
}

int64_t cuda_flash_prefill_calls(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->flash_calls : -1;
}

void cuda_set_mx_tile_major(Backend& be, bool on) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) c->mx_tile_major = on;
}

void cuda_set_tile_wgmma(Backend& be, bool on) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) c->tile_wgmma = on;
}

void cuda_set_fp8_gemm_rows(Backend& be, int64_t min_rows) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) c->fp8_gemm_min_rows = min_rows > 0 ? min_rows : 0;
}

int64_t cuda_fp8_gemm_calls(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->fp8_gemm_calls : -1;
}

void cuda_set_glu_fused_rows(Backend& be, int64_t rows) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) c->glu_fused_rows = rows > 0 ? rows : 0;
}

void cuda_set_mla_split_keys(Backend& be, int keys) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) c->mla_split_keys = keys > 0 ? keys : 0;
}

void cuda_set_tc_indexer(Backend& be, bool on) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) c->tc_indexer = on;
}

int64_t cuda_tc_indexer_calls(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->tc_indexer_calls : -1;
}

bool cuda_tc_dispatch(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c && c->tc_dispatch;
}

}  // namespace latent
