// The optimized CPU backend: AVX-512 (F+BW+VL) or AVX2+FMA+F16C kernels chosen at run time, with a scalar
// fallback. Weights are streamed once per call in their stored format and dequantized in registers; every dot
// product accumulates in fp32 (results differ from the double-accumulating ref backend by rounding only).
// Threads (core/threads.h ThreadPool) split output rows, experts x rows, heads and tokens.
//
// ISA selection: the best level the CPU (and OS) supports, unless LATENT_CPU_ISA=avx512|avx2|scalar asks for a
// lower one (a level the machine lacks falls back to the best available, with a warning).
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace latent {

enum class CpuIsa : uint8_t { Scalar, Avx2, Avx512 };

const char* cpu_isa_name(CpuIsa isa);  // "scalar", "avx2", "avx512"
// Whether this machine can run `isa` (and the build contains its kernels).
bool cpu_isa_supported(CpuIsa isa);
// Levels this machine can run, lowest first (always contains Scalar).
std::vector<CpuIsa> cpu_isas_available();
// The level make_cpu_backend(threads) picks: LATENT_CPU_ISA if set and supported, else the best supported.
CpuIsa cpu_isa_default();

// `threads` = 0 → available_cpus() (core/threads.h).
std::unique_ptr<Backend> make_cpu_backend(int threads);
// A specific ISA level (tests); an unsupported level falls back to the best supported one.
std::unique_ptr<Backend> make_cpu_backend(int threads, CpuIsa isa);
// Whether the backend's prepare_weight copies weights into 64-byte aligned memory on huge pages when it runs the
// AVX-512 or AVX2 kernels, up to half the available memory (cpu_realign_default(): yes unless LATENT_CPU_REALIGN=0).
bool cpu_realign_default();
// `realign_budget`: the bytes the copies may take (tests); -1: half the memory available at the first copy.
std::unique_ptr<Backend> make_cpu_backend(int threads, CpuIsa isa, bool realign_weights, int64_t realign_budget = -1);

}  // namespace latent
