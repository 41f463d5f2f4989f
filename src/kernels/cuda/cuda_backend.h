// The CUDA backend (src/kernels/cuda): every Backend op on one CUDA stream of the current device, both activation
// modes. Plain C++ header (no CUDA types) so that the registry and the tests include it from host code.
#pragma once
#include <memory>

#include "backend/backend.h"

namespace latent {

// Throws Error naming the CUDA error when no usable GPU is there (no device, no driver, driver too old).
// `threads` is accepted for symmetry with the CPU backends and ignored (host threads are not used).
std::unique_ptr<Backend> make_cuda_backend(int threads);

}  // namespace latent
