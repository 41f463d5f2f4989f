// LATENT_HD: a function for both the host and the device (nvcc: __host__ __device__, inlined), plain inline in host
// builds — for the small pieces the CUDA kernels and the host code (references, tests) share.
#pragma once

#if defined(__CUDACC__)
#define LATENT_HD __host__ __device__ __forceinline__
#else
#define LATENT_HD inline
#endif
