// The CUDA backend's layout of MXFP4 codes on the device: each 32-bit word of codes (the 8 columns 8j .. 8j+7 of a
// row, standard layout: column i in bits 4i .. 4i+3, low nibble = even column) has its 32 bits permuted at load, so
// that the tensor-core kernels turn a pair of adjacent columns (2p, 2p+1) into two bf16 bit patterns with one shift
// and one AND (docs/cuda.md "Device contract"). A layout, never a change of value: every code keeps its four
// bits, the scales are untouched, and mx_unswizzle gives the stored word back.
//
// Pair p's even column sits in the low half-word and its odd column in the high half-word, each code's bits
// (m0 = mantissa, m1 m2 = exponent, s = sign) at the positions mx_swz_pos(p, b) gives (+16 for the odd column). Pairs
// 0..2 need one shift (none, << 3, << 6) to bring m0..m2 to bf16 bits 6..8 and s to bit 15 (the subnormal e2m1 · 2^-126
// the scale multiply then makes exact); the 16 bits of a half-word cannot hold four such patterns, so pair 3 takes
// three shifts (11 integer operations per word, 1.4 per value, against ~2.3 for the standard layout).
// Host and device: the swizzle kernel, the decoders and the CPU test of this layout share these functions.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace latent::cuda {

// The bit (of the low half-word) holding bit b (m0, m1, m2, s) of pair p's even column: nibble 4p + b of
// 0xBAED9210C543F876, i.e. pair 0 {6, 7, 8, 15}, pair 1 {3, 4, 5, 12}, pair 2 {0, 1, 2, 9}, pair 3 {13, 14, 10, 11}.
LATENT_HD constexpr int mx_swz_pos(int p, int b) {
  return static_cast<int>((0xBAED9210C543F876ull >> (4 * (4 * p + b))) & 0xFu);
}

// Standard word -> swizzled word.
LATENT_HD constexpr uint32_t mx_swizzle(uint32_t w) {
  uint32_t o = 0;
  for (int i = 0; i < 8; ++i)
    for (int b = 0; b < 4; ++b) o |= ((w >> (4 * i + b)) & 1u) << (mx_swz_pos(i >> 1, b) + 16 * (i & 1));
  return o;
}

// Swizzled word -> standard word (13 shifted masks: the scalar and fp32 paths, which then decode as before).
LATENT_HD constexpr uint32_t mx_unswizzle(uint32_t w) {
  return ((w >> 24) & 0x80u) | ((w >> 18) & 0x70u) | ((w >> 13) & 0x8000u) | ((w >> 12) & 0x8u) | ((w >> 7) & 0x7000u) |
         ((w >> 6) & 0x7u) | ((w >> 2) & 0x800000u) | ((w >> 1) & 0x30000800u) | ((w << 4) & 0xC0700000u) |
         ((w << 5) & 0x700u) | ((w << 10) & 0x80000u) | ((w << 11) & 0x3000000u) | ((w << 16) & 0xC070000u);
}

// The bf16 bit patterns (low half: column 2p, high half: column 2p + 1) of pair P of a swizzled word: magnitude in
// bits 6..8, sign in bit 15 — e2m1 · 2^-126, made exact by the block's scale multiplier (mx_mult).
template <int P>
LATENT_HD constexpr uint32_t mx_swz_pair(uint32_t w) {
  constexpr uint32_t kMask = 0x81C081C0u;
  if constexpr (P == 0) return w & kMask;
  if constexpr (P == 1) return (w << 3) & kMask;
  if constexpr (P == 2) return (w << 6) & kMask;
  return ((w >> 7) & 0x00C000C0u) | ((w >> 2) & 0x01000100u) | ((w << 4) & 0x80008000u);
}

// Tile-major order of a weight's code bytes (a second part of the same layout, for weights whose shape allows it:
// mx_tile_major_ok). Rows in tiles of 16, columns in chunks of 128 (64 bytes of codes per row); a tile's chunk is
// one 1 KiB piece, its 16 rows' 64 bytes in row order, and the pieces of a tile follow each other, then the next tile.
// The MXFP4 decode kernels give a warp a 16-row tile and read it chunk by chunk: a round of loads then covers a few
// KiB of consecutive bytes instead of 16 rows' 256-byte pieces spread over 16 rows (bench/mx_pattern_bench: 2,995
// against 1,942 GB/s on an H200). Bytes only move: the words (and their pair swizzle) and the scales are unchanged.
constexpr int64_t kMxTileRows = 16, kMxChunkBytes = 64, kMxTileChunkBytes = kMxTileRows * kMxChunkBytes;
LATENT_HD constexpr bool mx_tile_major_ok(int64_t rows, int64_t cols, int64_t row_bytes) {
  return rows > 0 && rows % kMxTileRows == 0 && cols > 0 && cols % 128 == 0 && row_bytes == cols / 2;
}
// The offset in the tile-major order of byte b of row r's codes (row_bytes bytes a row).
LATENT_HD constexpr int64_t mx_tile_major_offset(int64_t r, int64_t b, int64_t row_bytes) {
  return ((r / kMxTileRows) * (row_bytes / kMxChunkBytes) + b / kMxChunkBytes) * kMxTileChunkBytes +
         (r % kMxTileRows) * kMxChunkBytes + b % kMxChunkBytes;
}

}  // namespace latent::cuda
