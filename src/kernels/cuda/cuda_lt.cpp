// cuBLASLt GEMM of the bf16 matmul path (see cuda_lt.h).
#include "kernels/cuda/cuda_lt.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace latent::cuda {

namespace {

// cuBLASLt is opened with dlopen when the first LtGemm is made, not linked: its 540 MB library costs every process
// that maps it ~25,000 page faults (~0.1 s of CPU) at start for its relocations, and most processes of a CUDA build
// (the CPU device, every CLI command that runs no model, the tests) never call it.
struct LtApi {
  decltype(&::cublasLtCreate) Create = nullptr;
  decltype(&::cublasLtDestroy) Destroy = nullptr;
  decltype(&::cublasLtGetStatusName) GetStatusName = nullptr;
  decltype(&::cublasLtGetStatusString) GetStatusString = nullptr;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
  decltype(&::cublasLtMatmul) Matmul = nullptr;
};

constexpr int kLtEntryPoints = 14;

template <class F>
void resolve(void* lib, const std::string& lib_name, const char* sym, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, sym));
  if (!f)
    fail("CUDA backend: {} has no symbol {} (a cuBLASLt older than the CUDA {} this build compiled against?)", lib_name,
         sym, CUDART_VERSION / 1000);
}

// Opens `name` (a soname for the loader's search, or a path) and resolves every entry point; throws Error naming the
// library and what failed.
LtApi open_lt(const std::string& name) {
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    fail(
        "CUDA backend: cannot load cuBLASLt ({}): {}. It ships with the CUDA {} toolkit (and the nvidia-cublas "
        "wheel): add its directory to LD_LIBRARY_PATH",
        name, why ? why : "dlopen failed", CUDART_VERSION / 1000);
  }
  LtApi a;
  resolve(lib, name, "cublasLtCreate", a.Create);
  resolve(lib, name, "cublasLtDestroy", a.Destroy);
  resolve(lib, name, "cublasLtGetStatusName", a.GetStatusName);
  resolve(lib, name, "cublasLtGetStatusString", a.GetStatusString);
  resolve(lib, name, "cublasLtMatmulDescCreate", a.MatmulDescCreate);
  resolve(lib, name, "cublasLtMatmulDescDestroy", a.MatmulDescDestroy);
  resolve(lib, name, "cublasLtMatmulDescSetAttribute", a.MatmulDescSetAttribute);
  resolve(lib, name, "cublasLtMatrixLayoutCreate", a.MatrixLayoutCreate);
  resolve(lib, name, "cublasLtMatrixLayoutDestroy", a.MatrixLayoutDestroy);
  resolve(lib, name, "cublasLtMatmulPreferenceCreate", a.MatmulPreferenceCreate);
  resolve(lib, name, "cublasLtMatmulPreferenceDestroy", a.MatmulPreferenceDestroy);
  resolve(lib, name, "cublasLtMatmulPreferenceSetAttribute", a.MatmulPreferenceSetAttribute);
  resolve(lib, name, "cublasLtMatmulAlgoGetHeuristic", a.MatmulAlgoGetHeuristic);
  resolve(lib, name, "cublasLtMatmul", a.Matmul);
  return a;
}

// The library this process opens: its soname (LD_LIBRARY_PATH, the ld.so cache), else the same file in the CUDA
// toolkit directory this build compiled against (where an RPATH would have pointed).
std::string lt_library() {
  const std::string soname = "libcublasLt.so." + std::to_string(CUDART_VERSION / 1000);
#ifdef LATENT_CUDA_LIBRARY_DIR
  if (void* probe = dlopen(soname.c_str(), RTLD_LAZY | RTLD_LOCAL)) {
    dlclose(probe);
    return soname;
  }
  const std::string in_toolkit = std::string(LATENT_CUDA_LIBRARY_DIR) + "/" + soname;
  if (void* probe = dlopen(in_toolkit.c_str(), RTLD_LAZY | RTLD_LOCAL)) {
    dlclose(probe);
    return in_toolkit;
  }
#endif
  return soname;  // (open_lt names it in its error)
}

const LtApi& lt() {
  static const LtApi api = open_lt(lt_library());
  return api;
}

}  // namespace

int cublaslt_check(const char* library) {
  (void)open_lt(library ? std::string(library) : lt_library());
  return kLtEntryPoints;
}

namespace {

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail("CUDA backend: cuBLASLt {} failed: {} ({})", what, lt().GetStatusName(s), lt().GetStatusString(s));
}

// Largest power of two (≤ 16) dividing the address: the alignment the heuristic may assume. Capped at 16 (what
// the 16-byte vector and bulk-copy accesses need) so that buffers of any larger alignment share one plan: a shape
// then always runs the same algorithm, whatever the buffers' addresses.
int64_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int64_t al = 16;
  while (al > 1 && (a % static_cast<uintptr_t>(al)) != 0) al /= 2;
  return al;
}

}  // namespace

struct LtGemm::Plan {
  bool ok = false;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) lt().MatrixLayoutDestroy(a);
    if (b) lt().MatrixLayoutDestroy(b);
    if (d) lt().MatrixLayoutDestroy(d);
  }
};

LtGemm::LtGemm() {
  cublasLtHandle_t h = nullptr;
  check_lt(lt().Create(&h), "handle creation (cublasLtCreate)");
  handle_ = h;
  cublasLtMatmulDesc_t op = nullptr;
  check_lt(lt().MatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  desc_ = op;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check_lt(lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
  check_lt(lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
  cublasLtMatmulDesc_t op8 = nullptr;
  check_lt(lt().MatmulDescCreate(&op8, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate (fp8)");
  desc_fp8_ = op8;
  check_lt(lt().MatmulDescSetAttribute(op8, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA (fp8)");
  check_lt(lt().MatmulDescSetAttribute(op8, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB (fp8)");
  const cublasLtMatmulMatrixScale_t wmode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                    xmode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  check_lt(lt().MatmulDescSetAttribute(op8, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &wmode, sizeof(wmode)),
           "set A_SCALE_MODE (128 x 128 blocks)");
  check_lt(lt().MatmulDescSetAttribute(op8, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &xmode, sizeof(xmode)),
           "set B_SCALE_MODE (1 x 128 groups)");
  const cudaError_t e = cudaMalloc(&workspace_, kWorkspaceBytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    workspace_ = nullptr;
    fail("CUDA backend: out of GPU memory allocating the cuBLASLt workspace ({} MiB): {}", kWorkspaceBytes >> 20,
         cudaGetErrorName(e));
  }
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (desc_) lt().MatmulDescDestroy(static_cast<cublasLtMatmulDesc_t>(desc_));
  if (desc_fp8_) lt().MatmulDescDestroy(static_cast<cublasLtMatmulDesc_t>(desc_fp8_));
  if (handle_) lt().Destroy(static_cast<cublasLtHandle_t>(handle_));
}

LtGemm::Plan* LtGemm::plan_for(const void* w, const void* x, int64_t M, int64_t N, int64_t Kp, const float* y,
                               int kind) {
  const Key key{M, N, Kp, alignment_of(w), alignment_of(x), alignment_of(y), kind};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto p = std::make_unique<Plan>();
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  // Column-major terms: A = W stored [Kp x N] (ld Kp), op T; B = x stored [Kp x M] (ld Kp); D [N x M] (ld N).
  const cudaDataType_t in = kind == 1 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  check_lt(lt().MatrixLayoutCreate(&p->a, in, u(Kp), u(N), Kp), "layout A");
  check_lt(lt().MatrixLayoutCreate(&p->b, in, u(Kp), u(M), Kp), "layout B");
  check_lt(lt().MatrixLayoutCreate(&p->d, CUDA_R_32F, u(N), u(M), N), "layout D");
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(lt().MatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = kWorkspaceBytes;
  const auto al = [&](int i) { return static_cast<uint32_t>(key[static_cast<size_t>(i)]); };
  const uint32_t aa = al(3), ab = al(4), ad = al(5);
  cublasStatus_t s = lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (s == CUBLAS_STATUS_SUCCESS)
    s = lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa));
  if (s == CUBLAS_STATUS_SUCCESS)
    s = lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab));
  if (s == CUBLAS_STATUS_SUCCESS)
    s = lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof(ad));
  if (s == CUBLAS_STATUS_SUCCESS)
    s = lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad));
  // The block-scaled modes are looked up with scale pointers set (the workspace stands in; fp8_gemm sets the real
  // ones per call): without them the heuristic answers INVALID_VALUE (cuBLASLt 13.1, probed on an H100).
  if (kind == 1 && s == CUBLAS_STATUS_SUCCESS) {
    auto* op8 = static_cast<cublasLtMatmulDesc_t>(desc_fp8_);
    const void* any = workspace_;
    s = lt().MatmulDescSetAttribute(op8, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &any, sizeof(any));
    if (s == CUBLAS_STATUS_SUCCESS)
      s = lt().MatmulDescSetAttribute(op8, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &any, sizeof(any));
  }
  cublasLtMatmulHeuristicResult_t res{};
  int n = 0;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = lt().MatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_),
                                    static_cast<cublasLtMatmulDesc_t>(kind == 1 ? desc_fp8_ : desc_), p->a, p->b, p->d,
                                    p->d, pref, 1, &res, &n);
  lt().MatmulPreferenceDestroy(pref);
  // No algorithm (NOT_SUPPORTED or none returned): the plan says so and the caller keeps its own kernel.
  p->ok = s == CUBLAS_STATUS_SUCCESS && n > 0 && res.state == CUBLAS_STATUS_SUCCESS;
  if (p->ok) p->algo = res.algo;
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

bool LtGemm::supported(const void* w, const void* x, int64_t M, int64_t N, int64_t Kp, const float* y) {
  return plan_for(w, x, M, N, Kp, y)->ok;
}

bool LtGemm::gemm(const void* w, const void* x, int64_t M, int64_t N, int64_t Kp, float* y, cudaStream_t st) {
  Plan* p = plan_for(w, x, M, N, Kp, y);
  if (!p->ok) return false;
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(lt().Matmul(static_cast<cublasLtHandle_t>(handle_), static_cast<cublasLtMatmulDesc_t>(desc_), &alpha, w,
                       p->a, x, p->b, &beta, y, p->d, y, p->d, &p->algo, workspace_, kWorkspaceBytes, st),
           "matmul (cublasLtMatmul)");
  return true;
}

bool LtGemm::fp8_supported(const void* wq, const void* xq, int64_t M, int64_t N, int64_t K, const float* y) {
  return K % 16 == 0 && plan_for(wq, xq, M, N, K, y, 1)->ok;
}

bool LtGemm::fp8_gemm(const void* wq, const float* w_scale, const void* xq, const float* x_scale, int64_t M, int64_t N,
                      int64_t K, float* y, cudaStream_t st) {
  if (K % 16 != 0) return false;
  Plan* p = plan_for(wq, xq, M, N, K, y, 1);
  if (!p->ok) return false;
  // The scale pointers are read when the GEMM is enqueued (into its launch: graph-safe); one stream, so setting
  // them on the shared descriptor right before is race-free.
  auto* op = static_cast<cublasLtMatmulDesc_t>(desc_fp8_);
  check_lt(lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)),
           "set A_SCALE_POINTER");
  check_lt(lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)),
           "set B_SCALE_POINTER");
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(lt().Matmul(static_cast<cublasLtHandle_t>(handle_), op, &alpha, wq, p->a, xq, p->b, &beta, y, p->d, y, p->d,
                       &p->algo, workspace_, kWorkspaceBytes, st),
           "FP8 x FP8 matmul (cublasLtMatmul)");
  return true;
}

}  // namespace latent::cuda
