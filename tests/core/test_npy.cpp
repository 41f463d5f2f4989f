#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/npy.h"

namespace latent {
namespace {

TEST(Npy, RoundTripF32AndI64) {
  const float f[6] = {1.5f, -2.0f, 0.0f, 3.25f, 1e-3f, -7.0f};
  const int64_t shape[2] = {2, 3};
  std::string b = npy_bytes_f32(f, shape);
  EXPECT_EQ(b.size() % 64, 24u % 64);  // 64-byte aligned header, then 24 data bytes
  EXPECT_EQ(b.substr(0, 6), std::string("\x93NUMPY"));
  NpyArray a = parse_npy(b, "mem");
  EXPECT_EQ(a.kind, NpyArray::Kind::F32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.f32[i], f[i]);

  const int64_t v[3] = {1, -5, 1LL << 40};
  const int64_t s1[1] = {3};
  NpyArray c = parse_npy(npy_bytes_i64(v, s1), "mem");
  EXPECT_EQ(c.kind, NpyArray::Kind::I64);
  EXPECT_EQ(c.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(c.i64[2], 1LL << 40);
  // Header text as numpy writes it.
  std::string h = npy_bytes_i64(v, s1);
  EXPECT_NE(h.find("'shape': (3,)"), std::string::npos);

  // Scalar and empty arrays.
  NpyArray sc = parse_npy(npy_bytes_f32(f, {}), "mem");
  EXPECT_TRUE(sc.shape.empty());
  EXPECT_EQ(sc.f32.size(), 1u);
  const int64_t s0[2] = {0, 4};
  EXPECT_EQ(parse_npy(npy_bytes_f32(nullptr, s0), "mem").f32.size(), 0u);
}

TEST(Npy, FileRoundTrip) {
  const std::string p = (std::filesystem::temp_directory_path() / "latent_test_npy.npy").string();
  const float f[4] = {1, 2, 3, 4};
  const int64_t shape[3] = {1, 2, 2};
  write_npy_f32(p, f, shape);
  NpyArray a = read_npy(p);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{1, 2, 2}));
  EXPECT_EQ(a.f32[3], 4.0f);
  std::filesystem::remove(p);
  EXPECT_THROW(read_npy(p), Error);
}

std::string with_header(const std::string& dict, size_t data_bytes) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(h.size() & 0xFF);
  out += static_cast<char>(h.size() >> 8);
  out += h;
  out.append(data_bytes, '\0');
  return out;
}

TEST(Npy, StrictValidation) {
  // Valid, keys in another order, version 1.0.
  EXPECT_NO_THROW(parse_npy(with_header("{'shape': (2,), 'fortran_order': False, 'descr': '<f4', }", 8), "x"));
  EXPECT_THROW(parse_npy("not an npy file", "x"), Error);
  EXPECT_THROW(parse_npy(with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16), "x"), Error);
  EXPECT_THROW(parse_npy(with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8), "x"), Error);
  EXPECT_THROW(parse_npy(with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8), "x"), Error);
  EXPECT_THROW(parse_npy(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8), "x"), Error);
  EXPECT_THROW(parse_npy(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 12), "x"), Error);
  EXPECT_THROW(parse_npy(with_header("{'descr': '<f4', 'shape': (2,), }", 8), "x"), Error);
  EXPECT_THROW(parse_npy(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8), "x"), Error);
  EXPECT_THROW(parse_npy(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8), "x"),
               Error);
  EXPECT_THROW(
      parse_npy(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 8), "x"),
      Error);
  // Header length beyond the file.
  std::string b = with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  b[8] = '\xff';
  b[9] = '\x7f';
  EXPECT_THROW(parse_npy(b, "x"), Error);
  // Unsupported version.
  b = with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
  b[6] = 4;
  EXPECT_THROW(parse_npy(b, "x"), Error);
}

}  // namespace
}  // namespace latent
