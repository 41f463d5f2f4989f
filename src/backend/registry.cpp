// Backend registry: "ref" (scalar oracle) and "cpu" (optimized CPU kernels: src/kernels/cpu provides
// kernels/cpu/cpu_backend.h declaring `std::unique_ptr<Backend> make_cpu_backend(int threads)`, defined in
// kernels/cpu/cpu_backend.cpp). Until both files exist "cpu" falls back to "ref".
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
  fail("unknown backend '{}' (known: ref, cpu)", name);
}

std::vector<std::string> backend_names() { return {"ref", "cpu"}; }

}  // namespace latent
