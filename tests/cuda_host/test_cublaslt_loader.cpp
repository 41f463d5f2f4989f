// The CUDA build's host side, no GPU needed (runs in CI): cuBLASLt is opened with dlopen by the first GEMM, not
// linked, so a process that runs no CUDA GEMM (the CPU device, the CLI commands that load no model, every test
// binary) does not pay its ~25,000 page faults at start (src/kernels/cuda/cuda_lt.cpp).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "../common/run_command.h"
#include "core/error.h"
#include "kernels/cuda/cuda_lt.h"

namespace {

bool maps_have(const std::string& what) {
  std::ifstream f("/proc/self/maps");
  std::string line;
  while (std::getline(f, line))
    if (line.find(what) != std::string::npos) return true;
  return false;
}

// The message of the Error cublaslt_check(library) throws ("" when it throws none).
std::string check_error(const char* library) {
  try {
    latent::cuda::cublaslt_check(library);
  } catch (const latent::Error& e) {
    return e.what();
  }
  return "";
}

// First in the file: under ctest each test runs in its own process, and run whole GoogleTest keeps this order, so no
// test of this binary has opened the library yet.
TEST(CublasLtLoader, NotMappedUntilAGemmNeedsIt) {
  EXPECT_FALSE(maps_have("libcublasLt")) << "a process that made no LtGemm has cuBLASLt mapped (linked again?)";
}

TEST(CublasLtLoader, LatentBinaryDoesNotLinkIt) {
  const char* b = std::getenv("LATENT_BIN");
  const std::string bin = b && *b ? b : LATENT_BINARY_DIR "/latent";
  const std::string deps = latent::test::run_command("ldd '" + bin + "' 2>&1");
  ASSERT_NE(deps.find("libc.so"), std::string::npos) << "ldd " << bin << ": " << deps;
  EXPECT_EQ(deps.find("libcublasLt"), std::string::npos) << deps;
  EXPECT_NE(deps.find("libcudart"), std::string::npos) << deps;  // (the runtime stays linked: small)
}

TEST(CublasLtLoader, OpensAndResolvesEveryEntryPoint) {
  // The toolkit this build compiled against is on the build machine (CI included).
  EXPECT_EQ(latent::cuda::cublaslt_check(), 14);
  EXPECT_TRUE(maps_have("libcublasLt"));
}

TEST(CublasLtLoader, MissingLibraryIsAClearError) {
  const std::string missing = check_error("libcublasLt.so.404");
  EXPECT_NE(missing.find("cannot load cuBLASLt (libcublasLt.so.404)"), std::string::npos) << missing;
  EXPECT_NE(missing.find("LD_LIBRARY_PATH"), std::string::npos) << missing;
  // A library without the entry points (the C library) names the first missing one.
  const std::string no_symbol = check_error("libc.so.6");
  EXPECT_NE(no_symbol.find("libc.so.6 has no symbol cublasLtCreate"), std::string::npos) << no_symbol;
}

}  // namespace
