#include "core/npy.h"

#include <bit>
#include <cctype>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace latent {

static_assert(std::endian::native == std::endian::little, "npy: little-endian host assumed");

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

constexpr char kMagic[] = "\x93NUMPY";

// A tiny parser for the header dict: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  HeaderParser(std::string_view s, const std::string& name) : s_(s), name_(name) {}

  void parse(std::string& descr, bool& fortran, std::vector<int64_t>& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    ws();
    expect('{');
    for (;;) {
      ws();
      if (peek() == '}') {
        ++i_;
        break;
      }
      std::string key = quoted();
      ws();
      expect(':');
      ws();
      if (key == "descr") {
        if (have_descr) bad("duplicate key 'descr'");
        descr = quoted();
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_fortran) bad("duplicate key 'fortran_order'");
        if (s_.substr(i_, 5) == "False") {
          fortran = false;
          i_ += 5;
        } else if (s_.substr(i_, 4) == "True") {
          fortran = true;
          i_ += 4;
        } else {
          bad("fortran_order is not True/False");
        }
        have_fortran = true;
      } else if (key == "shape") {
        if (have_shape) bad("duplicate key 'shape'");
        shape = tuple();
        have_shape = true;
      } else {
        bad("unexpected key '" + key + "'");
      }
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      ws();
      expect('}');
      break;
    }
    ws();
    if (i_ != s_.size()) bad("trailing characters after the header dict");
    if (!have_descr || !have_fortran || !have_shape) bad("header lacks descr, fortran_order or shape");
  }

 private:
  [[noreturn]] void bad(const std::string& what) { fail("{}: invalid .npy header: {}", name_, what); }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) bad(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string quoted() {
    const char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted string");
    ++i_;
    const size_t b = i_;
    while (i_ < s_.size() && s_[i_] != q) ++i_;
    if (i_ >= s_.size()) bad("unterminated string");
    std::string out(s_.substr(b, i_ - b));
    ++i_;
    return out;
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    for (;;) {
      ws();
      if (peek() == ')') {
        ++i_;
        break;
      }
      if (!std::isdigit(static_cast<unsigned char>(peek()))) bad("shape entry is not a non-negative integer");
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        const int digit = peek() - '0';
        if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) bad("shape entry overflows");
        v = v * 10 + digit;
        ++i_;
      }
      if (peek() == 'L') ++i_;  // python 2 long suffix
      dims.push_back(v);
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      ws();
      expect(')');
      break;
    }
    // A one-element tuple must carry a trailing comma in Python syntax; numpy always writes it. Accept both.
    return dims;
  }

  std::string_view s_;
  const std::string& name_;
  size_t i_ = 0;
};

std::string make_bytes(const void* data, size_t elem_bytes, const char* descr, std::span<const int64_t> shape) {
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) fail("npy: negative dimension {}", shape[i]);
    dict += std::to_string(shape[i]);
    dict += (shape.size() == 1 || i + 1 < shape.size()) ? "," : "";
    if (i + 1 < shape.size()) dict += " ";
    n *= shape[i];
  }
  dict += "), }";
  // magic(6) + version(2) + len(2) + dict + padding + '\n' is a multiple of 64.
  size_t total = 10 + dict.size() + 1;
  size_t pad = (64 - total % 64) % 64;
  dict.append(pad, ' ');
  dict += '\n';
  std::string out(kMagic, 6);
  out += '\x01';
  out += '\x00';
  const uint16_t hl = static_cast<uint16_t>(dict.size());
  out += static_cast<char>(hl & 0xFF);
  out += static_cast<char>(hl >> 8);
  out += dict;
  const size_t nbytes = static_cast<size_t>(n) * elem_bytes;
  const size_t off = out.size();
  out.resize(off + nbytes);
  if (nbytes) std::memcpy(out.data() + off, data, nbytes);
  return out;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("{}: cannot open for writing", path);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) fail("{}: write failed", path);
}

}  // namespace

NpyArray parse_npy(std::string_view b, const std::string& name) {
  if (b.size() < 10 || std::memcmp(b.data(), kMagic, 6) != 0) fail("{}: not a .npy file (bad magic)", name);
  const uint8_t major = static_cast<uint8_t>(b[6]), minor = static_cast<uint8_t>(b[7]);
  if (minor != 0 || major < 1 || major > 3) fail("{}: unsupported .npy version {}.{}", name, major, minor);
  size_t hlen, hstart;
  if (major == 1) {
    hlen = static_cast<uint8_t>(b[8]) | (static_cast<size_t>(static_cast<uint8_t>(b[9])) << 8);
    hstart = 10;
  } else {
    if (b.size() < 12) fail("{}: truncated .npy header", name);
    hlen = 0;
    for (int i = 0; i < 4; ++i) hlen |= static_cast<size_t>(static_cast<uint8_t>(b[8 + i])) << (8 * i);
    hstart = 12;
  }
  if (hlen > b.size() - hstart) fail("{}: .npy header length {} exceeds the file size {}", name, hlen, b.size());
  std::string_view header = b.substr(hstart, hlen);
  for (char c : header)
    if (static_cast<unsigned char>(c) >= 0x80) fail("{}: .npy header is not ASCII", name);
  std::string descr;
  bool fortran = false;
  NpyArray a;
  HeaderParser(header, name).parse(descr, fortran, a.shape);
  if (fortran) fail("{}: fortran_order True is not supported (C order expected)", name);
  size_t elem;
  if (descr == "<f4") {
    a.kind = NpyArray::Kind::F32;
    elem = 4;
  } else if (descr == "<i8") {
    a.kind = NpyArray::Kind::I64;
    elem = 8;
  } else {
    fail("{}: unsupported .npy dtype '{}' (expected '<f4' or '<i8')", name, descr);
  }
  uint64_t n = 1;
  for (int64_t d : a.shape) {
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / 8 / static_cast<uint64_t>(d))
      fail("{}: .npy shape overflows", name);
    n *= static_cast<uint64_t>(d);
  }
  const size_t data_off = hstart + hlen;
  const uint64_t want = n * elem;
  if (b.size() - data_off != want) fail("{}: .npy data is {} bytes, shape needs {}", name, b.size() - data_off, want);
  if (a.kind == NpyArray::Kind::F32) {
    a.f32.resize(n);
    if (n) std::memcpy(a.f32.data(), b.data() + data_off, want);
  } else {
    a.i64.resize(n);
    if (n) std::memcpy(a.i64.data(), b.data() + data_off, want);
  }
  return a;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_npy(ss.str(), path);
}

std::string npy_bytes_f32(const float* data, std::span<const int64_t> shape) {
  return make_bytes(data, 4, "<f4", shape);
}
std::string npy_bytes_i64(const int64_t* data, std::span<const int64_t> shape) {
  return make_bytes(data, 8, "<i8", shape);
}
void write_npy_f32(const std::string& path, const float* data, std::span<const int64_t> shape) {
  write_file(path, npy_bytes_f32(data, shape));
}
void write_npy_i64(const std::string& path, const int64_t* data, std::span<const int64_t> shape) {
  write_file(path, npy_bytes_i64(data, shape));
}

}  // namespace latent
