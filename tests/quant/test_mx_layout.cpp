// The CUDA backend's pair-swizzled MXFP4 word (src/kernels/cuda/mx_layout.h), checked on the host: a bit
// permutation (swizzle then unswizzle gives every word back), each pair's bf16 patterns the exact e2m1 values of its
// two columns times 2^-126 (what the device's scale multiply then makes exact), and every code of every column.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cuda/mx_layout.h"
#include "quant/float_formats.h"

namespace latent {
namespace {

using cuda::mx_swizzle;
using cuda::mx_swz_pair;
using cuda::mx_unswizzle;

uint32_t pair_bits(uint32_t w, int p) {
  switch (p) {
    case 0: return mx_swz_pair<0>(w);
    case 1: return mx_swz_pair<1>(w);
    case 2: return mx_swz_pair<2>(w);
    default: return mx_swz_pair<3>(w);
  }
}
float bf16_value(uint32_t half) { return std::bit_cast<float>((half & 0xFFFFu) << 16); }

// Column i's code of a standard word, and the word's pair p decoded: e2m1(code) · 2^-126 in each half.
void expect_pairs(uint32_t std_word) {
  const uint32_t s = mx_swizzle(std_word);
  ASSERT_EQ(mx_unswizzle(s), std_word) << std::hex << std_word;
  ASSERT_EQ(std::popcount(s), std::popcount(std_word)) << std::hex << std_word;
  for (int p = 0; p < 4; ++p) {
    const uint32_t b = pair_bits(s, p);
    ASSERT_EQ(b & ~0x81C081C0u, 0u) << "pair " << p << " word " << std::hex << std_word;
    for (int h = 0; h < 2; ++h) {
      const uint8_t code = uint8_t((std_word >> (4 * (2 * p + h))) & 0xFu);
      const float want = std::ldexp(e2m1_to_f32(code), -126);
      const float got = bf16_value(b >> (16 * h));
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
          << "pair " << p << " half " << h << " code " << int(code) << " word " << std::hex << std_word;
    }
  }
}

TEST(MxLayout, EveryCodeInEveryColumn) {
  for (int col = 0; col < 8; ++col)
    for (uint32_t code = 0; code < 16; ++code) {
      expect_pairs(code << (4 * col));
      expect_pairs((code << (4 * col)) | (0x5A3C96E1u & ~(0xFu << (4 * col))));
    }
}

TEST(MxLayout, RandomWordsRoundTripAndDecode) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) expect_pairs(static_cast<uint32_t>(rng()));
  expect_pairs(0u);
  expect_pairs(0xFFFFFFFFu);
}

TEST(MxLayout, SwizzleIsAPermutationOfBits) {
  uint32_t seen = 0;
  for (int bit = 0; bit < 32; ++bit) {
    const uint32_t s = mx_swizzle(1u << bit);
    ASSERT_EQ(std::popcount(s), 1) << bit;
    EXPECT_EQ(seen & s, 0u) << bit;
    seen |= s;
  }
  EXPECT_EQ(seen, 0xFFFFFFFFu);
}

// The tile-major byte order: a bijection of the weight's bytes onto [0, rows · row_bytes); a tile's 128-column chunk
// is 1 KiB of consecutive bytes, its rows' 64 bytes in row order; 16-byte pieces (the kernels' loads) stay whole and
// 16-byte aligned; the shapes it takes.
TEST(MxLayout, TileMajorOrderIsABijectionOfWholeChunks) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{16, 128}, {48, 384}, {32, 2048}, {160, 1152}}) {
    const int64_t rb = cols / 2, n = rows * rb;
    ASSERT_TRUE(cuda::mx_tile_major_ok(rows, cols, rb));
    std::vector<uint8_t> hit(static_cast<size_t>(n), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < rb; ++b) {
        const int64_t o = cuda::mx_tile_major_offset(r, b, rb);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, n);
        EXPECT_EQ(hit[static_cast<size_t>(o)]++, 0) << "row " << r << " byte " << b;
        // Consecutive bytes of a 64-byte chunk stay consecutive; a 16-byte piece starts 16-byte aligned.
        if (b % 64 != 0) {
          EXPECT_EQ(o, cuda::mx_tile_major_offset(r, b - 1, rb) + 1);
        }
        if (b % 16 == 0) {
          EXPECT_EQ(o % 16, 0);
        }
        // Tile t's chunk k: bytes [(t · chunks + k) · 1024, + 1024), row r % 16 at 64 · (r % 16).
        EXPECT_EQ(o / 1024, (r / 16) * (rb / 64) + b / 64);
        EXPECT_EQ(o % 1024 / 64, r % 16);
      }
  }
  EXPECT_FALSE(cuda::mx_tile_major_ok(37, 128, 64));  // rows not whole tiles
  EXPECT_FALSE(cuda::mx_tile_major_ok(16, 160, 80));  // columns not whole 128-column chunks
  EXPECT_FALSE(cuda::mx_tile_major_ok(16, 128, 80));  // padded rows
  EXPECT_FALSE(cuda::mx_tile_major_ok(0, 128, 64));
}

}  // namespace
}  // namespace latent
