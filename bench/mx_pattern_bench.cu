// The DRAM access pattern of the MXFP4 grouped GEMV, alone (bench/README.md "The routed experts' MXFP4 access
// pattern"): the bytes the batch-1 SwiGLU expert call of the GLM-5 shape reads (8 experts × gate and up, each
// [2048 × 6144] MXFP4 codes, 100 MB per call, rotated over 1.2 GB so that no call hits the L2), loaded with the
// real kernel's loads per lane — rows g and g + 8 of a 16-row tile, 16 bytes per lane, 4 chunks of 128 columns in
// flight, gate and up — and only xor-ed, in three address patterns:
//   row-major   today's layout: a warp per 16-row tile walks its rows, 256 bytes of each per round;
//   tile-major  a 16-row tile's 128-column chunk stored as 1 KB (a warp's round is 4 KB contiguous);
//   block-row   today's layout, a block of 8 warps per tile, warp w taking chunks w, w + 8, ...
// at one block of 8 warps per SM (the real kernel's 186 registers allow no more; forced with dynamic shared memory)
// and unlimited; then a plain read probe. Prints µs per call and GB/s.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

constexpr int kChunks = 4;

#define CHECK(x)                                                                        \
  do {                                                                                  \
    const cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

// TILED false: row r at r · rb, its chunk kb at 64 · kb; true: tile t's chunk kb at (t · nkb + kb) · 1024, row r % 16
// at 64 · (r % 16) within it.
template <bool TILED>
__global__ void __launch_bounds__(256)
    warp_pattern(const uint8_t* a, const uint8_t* b, int64_t tiles, int64_t nkb, int64_t rb, unsigned* out) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint32_t acc = 0;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * 8;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5); item < tiles; item += warps) {
    const int64_t base = TILED ? item * 16 * rb + g * 64 + 16 * t : (item * 16 + g) * rb + 16 * t;
    const int64_t second = TILED ? 8 * 64 : 8 * rb, kstride = TILED ? 1024 : 64;
    for (int64_t kb0 = 0; kb0 < nkb; kb0 += kChunks) {
      uint4 w[4 * kChunks];
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int64_t o = base + (kb0 + j) * kstride;
        w[4 * j] = __ldcs(reinterpret_cast<const uint4*>(a + o));
        w[4 * j + 1] = __ldcs(reinterpret_cast<const uint4*>(a + o + second));
        w[4 * j + 2] = __ldcs(reinterpret_cast<const uint4*>(b + o));
        w[4 * j + 3] = __ldcs(reinterpret_cast<const uint4*>(b + o + second));
      }
#pragma unroll
      for (int j = 0; j < 4 * kChunks; ++j) acc += w[j].x ^ w[j].y ^ w[j].z ^ w[j].w;
    }
  }
  if (acc == 0x12345678u) out[0] = acc;  // (never: keeps the loads)
}

__global__ void __launch_bounds__(256)
    block_pattern(const uint8_t* a, const uint8_t* b, int64_t tiles, int64_t nkb, int64_t rb, unsigned* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  uint32_t acc = 0;
  for (int64_t item = blockIdx.x; item < tiles; item += gridDim.x) {
    const int64_t base = (item * 16 + g) * rb + 16 * t;
    for (int64_t kb0 = warp; kb0 < nkb; kb0 += 8 * kChunks) {
      uint4 w[4 * kChunks];
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int64_t kb = kb0 + 8 * j < nkb ? kb0 + 8 * j : kb0, o = base + kb * 64;
        w[4 * j] = __ldcs(reinterpret_cast<const uint4*>(a + o));
        w[4 * j + 1] = __ldcs(reinterpret_cast<const uint4*>(a + o + 8 * rb));
        w[4 * j + 2] = __ldcs(reinterpret_cast<const uint4*>(b + o));
        w[4 * j + 3] = __ldcs(reinterpret_cast<const uint4*>(b + o + 8 * rb));
      }
#pragma unroll
      for (int j = 0; j < 4 * kChunks; ++j) acc += w[j].x ^ w[j].y ^ w[j].z ^ w[j].w;
    }
  }
  if (acc == 0x12345678u) out[0] = acc;
}

__global__ void read_probe(const uint4* p, int64_t n, unsigned* out) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

}  // namespace

int main() {
  const int64_t experts = 8, rows = 2048, cols = 6144, rb = cols / 2, nkb = cols / 128, copies = 12;
  const size_t mat = static_cast<size_t>(experts * rows * rb);  // gate (or up) of the 8 experts
  uint8_t* buf = nullptr;
  unsigned* out = nullptr;
  CHECK(cudaMalloc(&buf, mat * 2 * copies));
  CHECK(cudaMemset(buf, 1, mat * 2 * copies));
  CHECK(cudaMalloc(&out, 4));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const int64_t tiles = experts * rows / 16;
  const int kOneBlockSmem = 150 * 1024;
  // Mean µs of `iters` calls after 3 warm-up calls; call i reads copy i % copies.
  auto time = [&](auto&& launch, int iters) {
    for (int i = 0; i < 3; ++i) launch(i);
    cudaDeviceSynchronize();
    cudaEventRecord(e0);
    for (int i = 0; i < iters; ++i) launch(i);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    return 1e3 * ms / iters;
  };
  auto a_of = [&](int i) { return buf + static_cast<size_t>(i % copies) * 2 * mat; };
  const char* names[3] = {"row-major ", "tile-major", "block-row "};
  for (int mode = 0; mode < 3; ++mode)
    for (bool one : {true, false}) {
      const int smem = one ? kOneBlockSmem : 0;
      const double us = time(
          [&](int i) {
            const uint8_t* a = a_of(i);
            if (mode == 0) {
              cudaFuncSetAttribute(warp_pattern<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
              warp_pattern<false><<<sms * 8, 256, smem>>>(a, a + mat, tiles, nkb, rb, out);
            } else if (mode == 1) {
              cudaFuncSetAttribute(warp_pattern<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
              warp_pattern<true><<<sms * 8, 256, smem>>>(a, a + mat, tiles, nkb, rb, out);
            } else {
              cudaFuncSetAttribute(block_pattern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
              block_pattern<<<sms*(one ? 1 : 4), 256, smem>>>(a, a + mat, tiles, nkb, rb, out);
            }
          },
          40);
      std::printf("mx pattern %s %-22s %8.1f us %6.0f GB/s\n", names[mode],
                  one ? "1 block of 8 warps/SM" : (mode == 2 ? "4 blocks/SM" : "8 blocks/SM"), us,
                  2.0 * static_cast<double>(mat) / us / 1e3);
    }
  for (int bpsm : {4, 8, 16}) {
    const int64_t n = static_cast<int64_t>(2 * mat / 16);
    const double us =
        time([&](int i) { read_probe<<<sms * bpsm, 256>>>(reinterpret_cast<const uint4*>(a_of(i)), n, out); }, 40);
    std::printf("read probe %2d blocks/SM %19s %8.1f us %6.0f GB/s\n", bpsm, "", us,
                2.0 * static_cast<double>(mat) / us / 1e3);
  }
  CHECK(cudaGetLastError());
  cudaFree(buf);
  cudaFree(out);
  return 0;
}
