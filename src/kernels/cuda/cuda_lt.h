// The cuBLASLt GEMMs: the bf16 matmul path (prefill sizes): y [M, N] fp32 = x [M, Kp] · W [N, Kp]ᵀ with bf16
// operands (row-major, leading dimension Kp), fp32 accumulation and fp32 output (cuBLASLt "TN": D = Wᵀᵀ·x in its
// column-major terms, D [N, M] with ld N = y row-major). One handle, one workspace, one plan (layouts + the
// heuristic's algorithm) per shape and alignment, all made once: a call after the first for its shape only
// enqueues the GEMM (host work only besides it, so it records into a CUDA graph), and the same shape always runs
// the same algorithm (results identical between eager steps and graph replays). And the FP8 x FP8 block-scaled GEMM
// of declared activations (fp8_gemm below).
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

namespace latent::cuda {

// cuBLASLt is not linked: the first LtGemm opens it with dlopen (its soname libcublasLt.so.<CUDA major> through the
// loader's search, else the toolkit directory of the build) and resolves the entry points used here. This opens
// `library` (null: the library an LtGemm would open) and resolves them, returning how many; throws Error naming the
// library and what is missing (no GPU needed).
int cublaslt_check(const char* library = nullptr);

class LtGemm {
 public:
  LtGemm();  // throws Error naming the cuBLASLt or CUDA failure
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  // False when cuBLASLt offers no algorithm for the shape (the caller takes its own kernel); throws on a failed
  // launch. Nothing is enqueued when it returns false.
  bool gemm(const void* w, const void* x, int64_t M, int64_t N, int64_t Kp, float* y, cudaStream_t st);
  // Whether a plan exists for the shape (made now if not); the caller checks before preparing operands.
  bool supported(const void* w, const void* x, int64_t M, int64_t N, int64_t Kp, const float* y);
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // The FP8 x FP8 GEMM of declared activations (cuBLASLt's block-scaled modes, sm_90+): y [M, N] fp32 =
  //   Σ_b s_x[m, b] · s_w[n / 128, b] · Σ_{k in block b} q_x[m, k] · q_w[n, k]
  // with q_w [N, K] e4m3fn codes (row-major, ld K) in 128 x 128 blocks whose scales are w_scale[nb · fp8_ld(Kb) + b]
  // (the checkpoint's [ceil(N/128), Kb] rows, each padded to a multiple of 4), q_x [M, K] e4m3fn codes (ld K), the
  // 1 x 128 group scales x_scale[b · fp8_ld(M) + m] (one group's rows contiguous), Kb = ceil(K / 128). Partial sums
  // in the tensor cores, each 128-column block's promoted to fp32 and scaled there. K % 16 == 0 (the codes' rows
  // 16-byte aligned). False (nothing enqueued) when cuBLASLt has no algorithm for the shape.
  static int64_t fp8_ld(int64_t n) { return (n + 3) / 4 * 4; }
  // The token rows M an FP8 GEMM is run with: cuBLASLt 13.1 on sm_90 has block-scaled algorithms for M a multiple of 4
  // only (NOT_SUPPORTED for M = 1, 2, 6, 17, 130; served for 4, 8, 12, 16, 20, 300: probe on an H100), so callers pad
  // the tokens to a multiple of 4.
  static int64_t fp8_rows(int64_t m) { return (m + 3) / 4 * 4; }
  bool fp8_supported(const void* wq, const void* xq, int64_t M, int64_t N, int64_t K, const float* y);
  bool fp8_gemm(const void* wq, const float* w_scale, const void* xq, const float* x_scale, int64_t M, int64_t N,
                int64_t K, float* y, cudaStream_t st);

 private:
  struct Plan;
  using Key = std::array<int64_t, 7>;  // M, N, Kp, alignment of W, x, y, kind (0 bf16, 1 fp8 block-scaled)
  Plan* plan_for(const void* w, const void* x, int64_t M, int64_t N, int64_t Kp, const float* y, int kind = 0);
  void* handle_ = nullptr;    // cublasLtHandle_t
  void* desc_ = nullptr;      // cublasLtMatmulDesc_t (TN, fp32 compute)
  void* desc_fp8_ = nullptr;  // the same with A (W) 128 x 128 block scales and B (x) 1 x 128 scales
  void* workspace_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace latent::cuda
