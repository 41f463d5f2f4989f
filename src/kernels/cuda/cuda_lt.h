// The cuBLASLt GEMM of the bf16 matmul path (prefill sizes): y [M, N] fp32 = x [M, Kp] · W [N, Kp]ᵀ with bf16
// operands (row-major, leading dimension Kp), fp32 accumulation and fp32 output (cuBLASLt "TN": D = Wᵀᵀ·x in its
// column-major terms, D [N, M] with ld N = y row-major). One handle, one workspace, one plan (layouts + the
// heuristic's algorithm) per shape and alignment, all made once: a call after the first for its shape only
// enqueues the GEMM (host work only besides it, so it records into a CUDA graph), and the same shape always runs
// the same algorithm (results identical between eager steps and graph replays).
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

namespace latent::cuda {

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

 private:
  struct Plan;
  using Key = std::array<int64_t, 6>;  // M, N, Kp, alignment of W, x, y
  Plan* plan_for(const void* w, const void* x, int64_t M, int64_t N, int64_t Kp, const float* y);
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* desc_ = nullptr;    // cublasLtMatmulDesc_t (TN, fp32 compute)
  void* workspace_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace latent::cuda
