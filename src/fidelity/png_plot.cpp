#include "fidelity/png_plot.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "core/error.h"

namespace latent {

namespace {

// 5x7 glyphs, one byte per row, bit 4 = leftmost column.
struct Glyph {
  char c;
  std::array<uint8_t, 7> rows;
};
constexpr Glyph kFont[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}}, {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}}, {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}}, {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}}, {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}}, {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}}, {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}}, {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}}, {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}}, {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}}, {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
    {'*', {0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00}}, {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}}, {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}},
    {'>', {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08}}, {'|', {0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
};

struct Rgb {
  uint8_t r, g, b;
};

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(static_cast<size_t>(w) * static_cast<size_t>(h), Rgb{255, 255, 255}) {}
  void set(int x, int y, Rgb c) {
    if (x >= 0 && y >= 0 && x < w_ && y < h_) px_[static_cast<size_t>(y) * static_cast<size_t>(w_) + static_cast<size_t>(x)] = c;
  }
  void line(double x0, double y0, double x1, double y1, Rgb c, int thick = 1) {
    const int steps = static_cast<int>(std::max(std::abs(x1 - x0), std::abs(y1 - y0))) + 1;
    for (int i = 0; i <= steps; ++i) {
      const double t = static_cast<double>(i) / steps;
      const int x = static_cast<int>(std::lround(x0 + (x1 - x0) * t)), y = static_cast<int>(std::lround(y0 + (y1 - y0) * t));
      for (int dx = -(thick / 2); dx <= thick / 2; ++dx)
        for (int dy = -(thick / 2); dy <= thick / 2; ++dy) set(x + dx, y + dy, c);
    }
  }
  void rect(int x0, int y0, int x1, int y1, Rgb c) {
    for (int y = y0; y <= y1; ++y)
      for (int x = x0; x <= x1; ++x) set(x, y, c);
  }
  void text(int x, int y, const std::string& s, Rgb c, int scale = 1) {
    for (char ch : s) {
      char u = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      for (const auto& g : kFont)
        if (g.c == u)
          for (int r = 0; r < 7; ++r)
            for (int col = 0; col < 5; ++col)
              if (g.rows[static_cast<size_t>(r)] & (0x10 >> col))
                for (int a = 0; a < scale; ++a)
                  for (int b = 0; b < scale; ++b) set(x + col * scale + a, y + r * scale + b, c);
      x += 6 * scale;
    }
  }
  static int text_width(const std::string& s, int scale = 1) { return static_cast<int>(s.size()) * 6 * scale; }
  void write_png(const std::string& path) const;

 private:
  int w_, h_;
  std::vector<Rgb> px_;
};

void put_u32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}

void chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  std::vector<uint8_t> td(type, type + 4);
  td.insert(td.end(), data.begin(), data.end());
  out.insert(out.end(), td.begin(), td.end());
  put_u32(out, static_cast<uint32_t>(crc32(0L, td.data(), static_cast<uInt>(td.size()))));
}

void Canvas::write_png(const std::string& path) const {
  std::vector<uint8_t> raw;
  raw.reserve(static_cast<size_t>(h_) * (static_cast<size_t>(w_) * 3 + 1));
  for (int y = 0; y < h_; ++y) {
    raw.push_back(0);  // filter: none
    for (int x = 0; x < w_; ++x) {
      const Rgb& c = px_[static_cast<size_t>(y) * static_cast<size_t>(w_) + static_cast<size_t>(x)];
      raw.insert(raw.end(), {c.r, c.g, c.b});
    }
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::vector<uint8_t> z(zlen);
  if (compress2(z.data(), &zlen, raw.data(), static_cast<uLong>(raw.size()), 9) != Z_OK)
    fail("{}: PNG compression failed", path);
  z.resize(zlen);
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  std::vector<uint8_t> ihdr;
  put_u32(ihdr, static_cast<uint32_t>(w_));
  put_u32(ihdr, static_cast<uint32_t>(h_));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit RGB
  chunk(png, "IHDR", ihdr);
  chunk(png, "IDAT", z);
  chunk(png, "IEND", {});
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("{}: cannot write the plot", path);
  const size_t n = std::fwrite(png.data(), 1, png.size(), f);
  const bool ok = n == png.size() && std::fclose(f) == 0;
  if (!ok) fail("{}: cannot write the plot", path);
}

constexpr Rgb kPalette[] = {{31, 119, 180}, {214, 39, 40}, {44, 160, 44}, {255, 127, 14},
                            {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {23, 190, 207}};

}  // namespace

void write_line_chart_png(const std::string& path, const std::vector<ChartSeries>& series, const ChartOptions& opt) {
  Canvas cv(opt.width, opt.height);
  const int left = 80, right = 200, top = 40, bottom = 50;
  const int x0 = left, x1 = opt.width - right, y0 = opt.height - bottom, y1 = top;
  size_t npts = 1;
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : series) {
    npts = std::max(npts, s.y.size());
    for (double v : s.y)
      if (std::isfinite(v) && (!opt.log_y || v > 0)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
  }
  if (!std::isfinite(lo)) lo = opt.log_y ? 1e-8 : 0.0, hi = opt.log_y ? 1.0 : 1.0;
  if (opt.log_y) {
    lo = std::pow(10.0, std::floor(std::log10(lo)));
    hi = std::pow(10.0, std::ceil(std::log10(hi)));
    if (hi <= lo) hi = lo * 10;
  } else if (hi <= lo) {
    hi = lo + 1;
  }
  auto ymap = [&](double v) {
    double t;
    if (opt.log_y) t = v > 0 ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : 0.0;
    else t = (v - lo) / (hi - lo);
    return y0 + (y1 - y0) * std::clamp(t, 0.0, 1.0);
  };
  auto xmap = [&](double i) { return x0 + (x1 - x0) * (npts > 1 ? i / static_cast<double>(npts - 1) : 0.5); };
  const Rgb axis{60, 60, 60}, grid{225, 225, 225};
  // Grid and tick labels.
  if (opt.log_y) {
    for (double d = lo; d <= hi * 1.0001; d *= 10) {
      const double y = ymap(d);
      cv.line(x0, y, x1, y, grid);
      const std::string s = fmt::format("{:.0e}", d);
      cv.text(x0 - 8 - Canvas::text_width(s), static_cast<int>(y) - 3, s, axis);
    }
  } else {
    for (int k = 0; k <= 5; ++k) {
      const double v = lo + (hi - lo) * k / 5.0;
      const double y = ymap(v);
      cv.line(x0, y, x1, y, grid);
      const std::string s = fmt::format("{:.3g}", v);
      cv.text(x0 - 8 - Canvas::text_width(s), static_cast<int>(y) - 3, s, axis);
    }
  }
  const size_t xstep = std::max<size_t>(1, npts / 12);
  for (size_t i = 0; i < npts; i += xstep) {
    const double x = xmap(static_cast<double>(i));
    cv.line(x, y0, x, y0 + 4, axis);
    const std::string s = std::to_string(i);
    cv.text(static_cast<int>(x) - Canvas::text_width(s) / 2, y0 + 8, s, axis);
  }
  cv.line(x0, y0, x1, y0, axis);
  cv.line(x0, y0, x0, y1, axis);
  // Series.
  for (size_t si = 0; si < series.size(); ++si) {
    const Rgb c = kPalette[si % std::size(kPalette)];
    const auto& y = series[si].y;
    for (size_t i = 0; i < y.size(); ++i) {
      const double px = xmap(static_cast<double>(i)), py = ymap(y[i]);
      cv.rect(static_cast<int>(px) - 2, static_cast<int>(py) - 2, static_cast<int>(px) + 2, static_cast<int>(py) + 2, c);
      if (i > 0) cv.line(xmap(static_cast<double>(i - 1)), ymap(y[i - 1]), px, py, c, 2);
    }
    const int ly = top + 10 + static_cast<int>(si) * 16;
    cv.rect(x1 + 15, ly, x1 + 27, ly + 6, c);
    cv.text(x1 + 33, ly, series[si].label.substr(0, 26), axis);
  }
  cv.text(left, 12, opt.title, axis, 2);
  cv.text((x0 + x1) / 2 - Canvas::text_width(opt.x_label) / 2, opt.height - 20, opt.x_label, axis);
  cv.text(8, top - 16, opt.y_label, axis);
  cv.write_png(path);
}

}  // namespace latent
