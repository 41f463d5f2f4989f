#include "op_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>

#include "quant/float_formats.h"

namespace latent::ops {

double norm_err(const float* a, const float* b, size_t n, double floor) {
  double num = 0.0, den = 0.0;
  size_t finite = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool na = std::isnan(a[i]), nb = std::isnan(b[i]);
    if (na || nb) {
      if (na != nb) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
    ++finite;
  }
  den = std::max(den, floor * floor * static_cast<double>(finite));
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
}

std::vector<float> bf16_values(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Weights
// ---------------------------------------------------------------------------------------------------------------
const char* fmt_name(Fmt f) {
  switch (f) {
    case Fmt::F32: return "f32";
    case Fmt::BF16: return "bf16";
    case Fmt::F16: return "f16";
    case Fmt::Fp8Block: return "fp8_block128";
    case Fmt::Fp8BlockOdd: return "fp8_block32x40";
    case Fmt::Fp8BlockFnuz: return "fp8fnuz_block128";
    case Fmt::Fp8Tensor: return "fp8_tensor";
    case Fmt::Fp8Channel: return "fp8_channel";
    case Fmt::Mxfp4: return "mxfp4";
  }
  return "?";
}

bool fp8_fmt(Fmt f) {
  return f == Fmt::Fp8Block || f == Fmt::Fp8BlockOdd || f == Fmt::Fp8BlockFnuz || f == Fmt::Fp8Tensor ||
         f == Fmt::Fp8Channel;
}

namespace {
uint8_t random_fp8(Rng& r, bool fnuz) {
  for (;;) {
    const uint8_t c = static_cast<uint8_t>(r.integer(0, 255));
    if (fnuz ? c != 0x80 : (c & 0x7F) != 0x7F) return c;
  }
}
}  // namespace

HostWeight make_weight(Fmt f, int64_t rows, int64_t cols, Rng& r, bool nan) {
  HostWeight t;
  QuantWeight& q = t.q;
  q.rows = rows;
  q.cols = cols;
  auto put_f32 = [](std::vector<uint8_t>& buf, int64_t i, float v) { std::memcpy(buf.data() + 1 + 4 * i, &v, 4); };
  switch (f) {
    case Fmt::F32:
      q.format = WeightFormat::F32;
      t.data.resize(static_cast<size_t>(rows * cols * 4 + 1));
      for (int64_t i = 0; i < rows * cols; ++i) put_f32(t.data, i, r.normal());
      break;
    case Fmt::BF16:
    case Fmt::F16:
      q.format = f == Fmt::BF16 ? WeightFormat::BF16 : WeightFormat::F16;
      t.data.resize(static_cast<size_t>(rows * cols * 2 + 1));
      for (int64_t i = 0; i < rows * cols; ++i) {
        const float v = r.normal();
        const uint16_t h = f == Fmt::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(t.data.data() + 1 + 2 * i, &h, 2);
      }
      break;
    case Fmt::Fp8Block:
    case Fmt::Fp8BlockOdd:
    case Fmt::Fp8BlockFnuz:
    case Fmt::Fp8Tensor:
    case Fmt::Fp8Channel: {
      q.fnuz = f == Fmt::Fp8BlockFnuz;
      q.format = f == Fmt::Fp8Tensor    ? WeightFormat::FP8_E4M3_TENSOR
                 : f == Fmt::Fp8Channel ? WeightFormat::FP8_E4M3_CHANNEL
                                        : WeightFormat::FP8_E4M3_BLOCK;
      if (f == Fmt::Fp8BlockOdd) {
        q.block_rows = 32;
        q.block_cols = 40;
      }
      t.data.resize(static_cast<size_t>(rows * cols + 1));
      for (int64_t i = 0; i < rows * cols; ++i) t.data[static_cast<size_t>(1 + i)] = random_fp8(r, q.fnuz);
      if (nan && rows * cols > 0)
        for (int k = 0; k < 3; ++k) {
          const int64_t i = r.integer(0, rows * cols - 1);
          t.data[static_cast<size_t>(1 + i)] = q.fnuz ? 0x80 : (r.integer(0, 1) ? 0x7F : 0xFF);
        }
      int64_t ns = 1;
      if (q.format == WeightFormat::FP8_E4M3_CHANNEL) ns = rows;
      if (q.format == WeightFormat::FP8_E4M3_BLOCK)
        ns = ((rows + q.block_rows - 1) / q.block_rows) * ((cols + q.block_cols - 1) / q.block_cols);
      t.scale.resize(static_cast<size_t>(ns * 4 + 1));
      for (int64_t i = 0; i < ns; ++i) put_f32(t.scale, i, r.uniform(0.5f, 2.0f) / 256.0f);
      break;
    }
    case Fmt::Mxfp4: {
      q.format = WeightFormat::MXFP4;
      t.data.resize(static_cast<size_t>(rows * cols / 2 + 1));
      for (size_t i = 1; i < t.data.size(); ++i) t.data[i] = static_cast<uint8_t>(r.integer(0, 255));
      t.scale.resize(static_cast<size_t>(rows * (cols / 32) + 1));
      for (size_t i = 1; i < t.scale.size(); ++i) t.scale[i] = static_cast<uint8_t>(r.integer(118, 130));
      if (nan && t.scale.size() > 1)
        t.scale[static_cast<size_t>(r.integer(1, static_cast<int64_t>(t.scale.size()) - 1))] = 0xFF;
      break;
    }
  }
  q.data = t.data.data() + 1;
  q.scale = t.scale.empty() ? nullptr : t.scale.data() + 1;
  double ss = 0.0;
  int64_t n = 0;
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    dequant_row_ref(q, i, row.data());
    for (float v : row)
      if (std::isfinite(v)) ss += static_cast<double>(v) * v, ++n;
  }
  t.rms = n ? std::sqrt(ss / static_cast<double>(n)) : 0.0;
  return t;
}

std::vector<int64_t> cols_for(Fmt f) {
  if (f == Fmt::Mxfp4) return {32, 96, 160, 1024, 4096 + 32};
  return {1, 7, 33, 95, 161, 128, 1024, 4099};
}

// ---------------------------------------------------------------------------------------------------------------
// Arena
// ---------------------------------------------------------------------------------------------------------------
Arena::~Arena() {
  for (void* p : ptrs_) be.dealloc(p);
}

void* Arena::bytes(size_t n) {
  const size_t sz = std::max<size_t>(n, 4);
  void* p = be.alloc(sz, "op harness buffer");
  ptrs_.push_back(p);
  const std::vector<uint8_t> junk(sz, 0xFF);
  be.upload(p, junk.data(), sz);
  return p;
}

namespace {
// Host storage of rows·ld elements of t holding v (rows·cols values), the padding 0xFF.
std::vector<uint8_t> encode(const std::vector<float>& v, DType t, int64_t rows, int64_t cols, int64_t ld) {
  const size_t es = Tensor::size_of(t);
  std::vector<uint8_t> b(static_cast<size_t>(rows * ld) * es, 0xFF);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float x = v[static_cast<size_t>(r * cols + c)];
      uint8_t* d = b.data() + static_cast<size_t>(r * ld + c) * es;
      if (t == DType::BF16) {
        const uint16_t h = f32_to_bf16(x);
        std::memcpy(d, &h, 2);
      } else {
        std::memcpy(d, &x, 4);
      }
    }
  return b;
}
std::vector<float> decode(const std::vector<uint8_t>& b, DType t) {
  const size_t es = Tensor::size_of(t), n = b.size() / es;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::BF16) {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      v[i] = bf16_to_f32(h);
    } else {
      std::memcpy(&v[i], b.data() + 4 * i, 4);
    }
  }
  return v;
}
}  // namespace

Tensor Arena::up(const std::vector<float>& v, DType t, int64_t rows, int64_t cols, int64_t ld) {
  if (ld < 0) ld = cols;
  EXPECT_EQ(v.size(), static_cast<size_t>(rows * cols)) << "Arena::up: host values do not match the shape";
  const std::vector<uint8_t> b = encode(v, t, rows, cols, ld);
  void* p = bytes(b.size());
  be.upload(p, b.data(), b.size());
  return Tensor(p, t, rows, cols, ld);
}

void Arena::set(const Tensor& t, const std::vector<float>& v) {
  EXPECT_EQ(v.size(), static_cast<size_t>(t.numel())) << "Arena::set: host values do not match the shape";
  const std::vector<uint8_t> b = encode(v, t.dtype, t.rows, t.cols, t.ld);
  be.upload(t.data, b.data(), b.size());
}

Tensor Arena::tensor(DType t, int64_t rows, int64_t cols, int64_t ld) {
  if (ld < 0) ld = cols;
  return Tensor(bytes(static_cast<size_t>(rows * ld) * Tensor::size_of(t)), t, rows, cols, ld);
}

std::vector<float> Arena::down(const Tensor& t, bool with_padding) {
  std::vector<uint8_t> b(static_cast<size_t>(t.rows * t.ld) * t.elem_size());
  if (!b.empty()) be.download(b.data(), t.data, b.size());
  std::vector<float> all = decode(b, t.dtype);
  if (with_padding || t.ld == t.cols) return all;
  std::vector<float> v(static_cast<size_t>(t.rows * t.cols));
  for (int64_t r = 0; r < t.rows; ++r) std::copy_n(all.begin() + r * t.ld, t.cols, v.begin() + r * t.cols);
  return v;
}

KvPool Arena::pool(const std::vector<float>& v, DType t, int64_t blocks, int64_t bt, int64_t width) {
  const Tensor s = up(v, t, blocks * bt, width);
  KvPool p;
  p.data = s.data;
  p.dtype = t;
  p.num_blocks = blocks;
  p.block_tokens = bt;
  p.width = width;
  return p;
}

Out Arena::result(const std::string& name, const Tensor& t, double tol) {
  Out o;
  o.name = name;
  o.tol = tol < 0 ? tol_for(t.dtype) : tol;
  o.f = down(t, true);
  return o;
}

Out Arena::result(const std::string& name, const KvPool& p, double tol) {
  return result(name, Tensor(p.data, p.dtype, p.rows(), p.width), tol);
}

Out Arena::floats(const std::string& name, const float* p, size_t n, double tol) {
  Out o;
  o.name = name;
  o.tol = tol;
  o.f = down(p, n);
  return o;
}

// ---------------------------------------------------------------------------------------------------------------
// Summary
// ---------------------------------------------------------------------------------------------------------------
namespace {
struct Entry {
  double err = 0.0, tol = 0.0;
  bool failed = false;
};
struct Summary {
  std::vector<std::string> order;                                          // case names, first seen first
  std::map<std::string, std::vector<std::pair<std::string, Entry>>> rows;  // case -> (label, entry)
  Entry& at(const std::string& name, const std::string& label) {
    auto it = rows.find(name);
    if (it == rows.end()) {
      order.push_back(name);
      it = rows.emplace(name, std::vector<std::pair<std::string, Entry>>{}).first;
    }
    for (auto& [l, e] : it->second)
      if (l == label) return e;
    it->second.emplace_back(label, Entry{});
    return it->second.back().second;
  }
};
Summary& summary() {
  static Summary s;
  return s;
}

std::string num(double v) {
  if (std::isinf(v)) return "inf";
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}

class SummaryEnv : public ::testing::Environment {
 public:
  void TearDown() override {
    Summary& s = summary();
    if (s.order.empty()) return;
    std::printf(
        "\n[op harness] normalized error |a-b|/|b| of each case against the ref backend (largest over the "
        "case's checks):\n");
    for (const std::string& n : s.order) {
      std::string line, tol;
      bool failed = false;
      double t = 0.0;
      for (const auto& [label, e] : s.rows[n]) {
        if (!line.empty()) line += ", ";
        line += num(e.err) + " " + label;
        failed |= e.failed;
        t = std::max(t, e.tol);
      }
      tol = t == 0.0 ? "exact" : "tol " + num(t);
      std::printf("[op harness] %s: %s (%s)%s\n", n.c_str(), line.c_str(), tol.c_str(), failed ? " FAILED" : "");
    }
    std::fflush(stdout);
  }
};
const auto* const g_env = ::testing::AddGlobalTestEnvironment(new SummaryEnv);

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
uint64_t env_seed() {
  const char* s = std::getenv("LATENT_OP_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 0;
}

Backend& ref_backend() {
  static std::unique_ptr<Backend> r = make_ref_backend(2);
  return *r;
}
}  // namespace

void record_summary(const std::string& name, const std::string& label, double err, double tol) {
  Entry& e = summary().at(name, label);
  e.err = std::max(e.err, err);
  e.tol = std::max(e.tol, tol);
  if (!(err <= tol)) e.failed = true;
}

// ---------------------------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------------------------
CaseCtx::CaseCtx(const std::string& name, std::vector<Tested> under_test)
    : rng(fnv1a(name) ^ env_seed()), name_(name), tested_(std::move(under_test)), seed_(env_seed()) {}

void CaseCtx::check(const std::string& what, const std::function<Outs(Arena&)>& body) {
  Outs want;
  {
    Arena a(ref_backend());
    want = body(a);
  }
  for (const Tested& t : tested_) compare(what, want, body, *t.be, t.label);
}

void CaseCtx::compare(const std::string& what, const Outs& want, const std::function<Outs(Arena&)>& body, Backend& be,
                      const std::string& label) {
  Outs got;
  {
    Arena a(be);
    got = body(a);
    be.sync();
  }
  EXPECT_FALSE(be.device_lost()) << name_ << " " << what << ": the " << label << " device is lost";
  const std::string where = name_ + " [" + what + "] on " + label + " (LATENT_OP_SEED=" + std::to_string(seed_) + ")";
  ASSERT_EQ(want.size(), got.size()) << where;
  for (size_t k = 0; k < want.size(); ++k) {
    const Out &w = want[k], &g = got[k];
    if (w.ints) {
      ASSERT_EQ(w.i.size(), g.i.size()) << where << " " << w.name;
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < w.i.size(); ++i)
        if (w.i[i] != g.i[i] && bad++ == 0) first = i;
      record_summary(name_, label, bad ? std::numeric_limits<double>::infinity() : 0.0, 0.0);
      EXPECT_EQ(bad, 0u) << where << " " << w.name << ": " << bad << " of " << w.i.size() << " differ, first at "
                         << first << " (" << (bad ? g.i[first] : 0) << ", ref " << (bad ? w.i[first] : 0) << ")";
      continue;
    }
    ASSERT_EQ(w.f.size(), g.f.size()) << where << " " << w.name;
    const double e = norm_err(g.f.data(), w.f.data(), w.f.size(), w.floor);
    record_summary(name_, label, e, w.tol);
    if (e <= w.tol) continue;
    // The first element that differs, to say where.
    size_t first = 0;
    for (size_t i = 0; i < w.f.size(); ++i)
      if (!(g.f[i] == w.f[i] || (std::isnan(g.f[i]) && std::isnan(w.f[i])))) {
        first = i;
        break;
      }
    ADD_FAILURE() << where << " " << w.name << ": normalized error " << e << " > "
                  << (w.tol == 0.0 ? std::string("0 (exact)") : num(w.tol)) << "; first difference at element " << first
                  << ": " << g.f[first] << " vs ref " << w.f[first];
  }
}

void run_op_case(const OpCase& c, const std::vector<Tested>& under_test) {
  CaseCtx ctx(c.name, under_test);
  c.run(ctx);
}

void PrintTo(const CaseIndex& p, std::ostream* os) { *os << op_cases()[p.i].name; }

std::vector<CaseIndex> all_case_indices() {
  std::vector<CaseIndex> v;
  for (size_t i = 0; i < op_cases().size(); ++i) v.push_back({i});
  return v;
}

std::string case_test_name(const ::testing::TestParamInfo<CaseIndex>& p) {
  return gtest_name(op_cases()[p.param.i].name);
}

std::string gtest_name(const std::string& s) {
  std::string o;
  for (char ch : s) o += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return o;
}

}  // namespace latent::ops
