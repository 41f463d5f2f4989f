// Backend registry: "ref" (scalar oracle), "cpu" (optimized CPU kernels: src/kernels/cpu provides
// kernels/cpu/cpu_backend.h declaring `std::unique_ptr<Backend> make_cpu_backend(int threads)`, defined in
// kernels/cpu/cpu_backend.cpp; until both files exist "cpu" falls back to "ref") and "cuda" (src/kernels/cuda,
// only when the build has the CUDA backend: CMake defines LATENT_HAVE_CUDA_BACKEND).
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

#if __has_include("kernels/cpu/cpu_backend.h") && __has_include("kernels/cpu/cpu_backend.cpp")
#include "kernels/cpu/cpu_backend.h"
#define LATENT_HAVE_CPU_BACKEND 1
#else
#define LATENT_HAVE_CPU_BACKEND 0
#endif

#ifndef LATENT_HAVE_CUDA_BACKEND
#define LATENT_HAVE_CUDA_BACKEND 0
#endif
#if LATENT_HAVE_CUDA_BACKEND
#include "kernels/cuda/cuda_backend.h"
#endif

namespace latent {

std::unique_ptr<Backend> make_backend(const std::string& name, int threads) {
  if (name == "ref") return make_ref_backend(threads);
  if (name == "cpu") {
#if LATENT_HAVE_CPU_BACKEND
    return make_cpu_backend(threads);
#else
    return make_ref_backend(threads);
#endif
  }
  if (name == "cuda") {
#if LATENT_HAVE_CUDA_BACKEND
    return make_cuda_backend(threads);  // throws Error naming the CUDA error when no GPU is usable
#else
    fail("this build has no CUDA backend (configure with -DLATENT_CUDA=ON on a machine with nvcc)");
#endif
  }
  fail("unknown backend '{}' (known: {})", name, LATENT_HAVE_CUDA_BACKEND ? "ref, cpu, cuda" : "ref, cpu");
}

std::vector<std::string> backend_names() {
#if LATENT_HAVE_CUDA_BACKEND
  return {"ref", "cpu", "cuda"};
#else
  return {"ref", "cpu"};
#endif
}

}  // namespace latent
