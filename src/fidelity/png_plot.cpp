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

// The font: 5 columns, 7 rows above the baseline, 2 descender rows ('#' = ink). One glyph per printable ASCII
// character; any other byte (or UTF-8 sequence) is drawn as '?'.
struct GlyphArt {
  char c;
  const char* rows;  // 7 or 9 rows of 5, separated by spaces
};
constexpr GlyphArt kFontArt[] = {
    {' ', "..... ..... ..... ..... ..... ..... ....."},
    {'!', "..#.. ..#.. ..#.. ..#.. ..#.. ..... ..#.."},
    {'"', ".#.#. .#.#. .#.#. ..... ..... ..... ....."},
    {'#', ".#.#. .#.#. ##### .#.#. ##### .#.#. .#.#."},
    {'$', "..#.. .#### #.#.. .###. ..#.# ####. ..#.."},
    {'%', "##... ##..# ...#. ..#.. .#... #..## ...##"},
    {'&', ".##.. #..#. #.#.. .#... #.#.# #..#. .##.#"},
    {'\'', "..#.. ..#.. .#... ..... ..... ..... ....."},
    {'(', "...#. ..#.. .#... .#... .#... ..#.. ...#."},
    {')', ".#... ..#.. ...#. ...#. ...#. ..#.. .#..."},
    {'*', "..... ..#.. #.#.# .###. #.#.# ..#.. ....."},
    {'+', "..... ..#.. ..#.. ##### ..#.. ..#.. ....."},
    {',', "..... ..... ..... ..... ..... .##.. ..#.. .#... ....."},
    {'-', "..... ..... ..... ##### ..... ..... ....."},
    {'.', "..... ..... ..... ..... ..... .##.. .##.."},
    {'/', "..... ....# ...#. ..#.. .#... #.... ....."},
    {'0', ".###. #...# #..## #.#.# ##..# #...# .###."},
    {'1', "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###."},
    {'2', ".###. #...# ....# ...#. ..#.. .#... #####"},
    {'3', "##### ...#. ..#.. ...#. ....# #...# .###."},
    {'4', "...#. ..##. .#.#. #..#. ##### ...#. ...#."},
    {'5', "##### #.... ####. ....# ....# #...# .###."},
    {'6', "..##. .#... #.... ####. #...# #...# .###."},
    {'7', "##### ....# ...#. ..#.. .#... .#... .#..."},
    {'8', ".###. #...# #...# .###. #...# #...# .###."},
    {'9', ".###. #...# #...# .#### ....# ...#. .##.."},
    {':', "..... .##.. .##.. ..... .##.. .##.. ....."},
    {';', "..... .##.. .##.. ..... .##.. ..#.. .#..."},
    {'<', "...#. ..#.. .#... #.... .#... ..#.. ...#."},
    {'=', "..... ..... ##### ..... ##### ..... ....."},
    {'>', ".#... ..#.. ...#. ....# ...#. ..#.. .#..."},
    {'?', ".###. #...# ....# ...#. ..#.. ..... ..#.."},
    {'@', ".###. #...# #.### #.#.# #.### #.... .###."},
    {'A', ".###. #...# #...# ##### #...# #...# #...#"},
    {'B', "####. #...# #...# ####. #...# #...# ####."},
    {'C', ".###. #...# #.... #.... #.... #...# .###."},
    {'D', "###.. #..#. #...# #...# #...# #..#. ###.."},
    {'E', "##### #.... #.... ####. #.... #.... #####"},
    {'F', "##### #.... #.... ####. #.... #.... #...."},
    {'G', ".###. #...# #.... #.### #...# #...# .####"},
    {'H', "#...# #...# #...# ##### #...# #...# #...#"},
    {'I', ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###."},
    {'J', "..### ...#. ...#. ...#. ...#. #..#. .##.."},
    {'K', "#...# #..#. #.#.. ##... #.#.. #..#. #...#"},
    {'L', "#.... #.... #.... #.... #.... #.... #####"},
    {'M', "#...# ##.## #.#.# #.#.# #...# #...# #...#"},
    {'N', "#...# #...# ##..# #.#.# #..## #...# #...#"},
    {'O', ".###. #...# #...# #...# #...# #...# .###."},
    {'P', "####. #...# #...# ####. #.... #.... #...."},
    {'Q', ".###. #...# #...# #...# #.#.# #..#. .##.#"},
    {'R', "####. #...# #...# ####. #.#.. #..#. #...#"},
    {'S', ".#### #.... #.... .###. ....# ....# ####."},
    {'T', "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#.."},
    {'U', "#...# #...# #...# #...# #...# #...# .###."},
    {'V', "#...# #...# #...# #...# #...# .#.#. ..#.."},
    {'W', "#...# #...# #...# #.#.# #.#.# #.#.# .#.#."},
    {'X', "#...# #...# .#.#. ..#.. .#.#. #...# #...#"},
    {'Y', "#...# #...# #...# .#.#. ..#.. ..#.. ..#.."},
    {'Z', "##### ....# ...#. ..#.. .#... #.... #####"},
    {'[', ".###. .#... .#... .#... .#... .#... .###."},
    {'\\', "..... #.... .#... ..#.. ...#. ....# ....."},
    {']', ".###. ...#. ...#. ...#. ...#. ...#. .###."},
    {'^', "..#.. .#.#. #...# ..... ..... ..... ....."},
    {'_', "..... ..... ..... ..... ..... ..... ..... ##### ....."},
    {'`', ".#... ..#.. ...#. ..... ..... ..... ....."},
    {'a', "..... ..... .###. ....# .#### #...# .####"},
    {'b', "#.... #.... #.##. ##..# #...# #...# ####."},
    {'c', "..... ..... .###. #.... #.... #...# .###."},
    {'d', "....# ....# .##.# #..## #...# #...# .####"},
    {'e', "..... ..... .###. #...# ##### #.... .###."},
    {'f', "..##. .#..# .#... ###.. .#... .#... .#..."},
    {'g', "..... ..... .#### #...# #...# #...# .#### ....# .###."},
    {'h', "#.... #.... #.##. ##..# #...# #...# #...#"},
    {'i', "..#.. ..... .##.. ..#.. ..#.. ..#.. .###."},
    {'j', "...#. ..... ..##. ...#. ...#. ...#. ...#. #..#. .##.."},
    {'k', "#.... #.... #..#. #.#.. ##... #.#.. #..#."},
    {'l', ".##.. ..#.. ..#.. ..#.. ..#.. ..#.. .###."},
    {'m', "..... ..... ##.#. #.#.# #.#.# #.#.# #.#.#"},
    {'n', "..... ..... #.##. ##..# #...# #...# #...#"},
    {'o', "..... ..... .###. #...# #...# #...# .###."},
    {'p', "..... ..... ####. #...# #...# #...# ####. #.... #...."},
    {'q', "..... ..... .#### #...# #...# #...# .#### ....# ....#"},
    {'r', "..... ..... #.##. ##..# #.... #.... #...."},
    {'s', "..... ..... .#### #.... .###. ....# ####."},
    {'t', ".#... .#... ###.. .#... .#... .#..# ..##."},
    {'u', "..... ..... #...# #...# #...# #..## .##.#"},
    {'v', "..... ..... #...# #...# #...# .#.#. ..#.."},
    {'w', "..... ..... #...# #...# #.#.# #.#.# .#.#."},
    {'x', "..... ..... #...# .#.#. ..#.. .#.#. #...#"},
    {'y', "..... ..... #...# #...# #...# #...# .#### ....# .###."},
    {'z', "..... ..... ##### ...#. ..#.. .#... #####"},
    {'{', "...## ..#.. ..#.. .#... ..#.. ..#.. ...##"},
    {'|', "..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ....."},
    {'}', "##... ..#.. ..#.. ...#. ..#.. ..#.. ##..."},
    {'~', "..... ..... .#... #.#.# ...#. ..... ....."},
};

constexpr int kGlyphRows = 9, kGlyphCols = 5, kAdvance = 6, kLineHeight = 12;

using GlyphBits = std::array<uint8_t, kGlyphRows>;  // bit 4 = leftmost column

const std::array<GlyphBits, 128>& font() {
  static const std::array<GlyphBits, 128> table = [] {
    std::array<GlyphBits, 128> t{};
    for (const GlyphArt& g : kFontArt) {
      GlyphBits bits{};
      int row = 0, col = 0;
      for (const char* p = g.rows; *p; ++p) {
        if (*p == ' ') {
          ++row;
          col = 0;
          continue;
        }
        if (*p == '#') bits[static_cast<size_t>(row)] |= static_cast<uint8_t>(0x10 >> col);
        ++col;
      }
      t[static_cast<size_t>(static_cast<unsigned char>(g.c))] = bits;
    }
    return t;
  }();
  return table;
}

// The characters drawn for s: printable ASCII as is, whitespace as ' ', anything else (a UTF-8 sequence counts
// once) as '?'.
std::string drawable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b == '\t' || b == '\n' || b == '\r')
      out += ' ';
    else if (b >= 0x20 && b < 0x7F)
      out += static_cast<char>(b);
    else if (b >= 0x80 && b < 0xC0)
      continue;  // UTF-8 continuation byte: part of the previous '?'
    else
      out += '?';
  }
  return out;
}

// Greedy word wrap to at most max_chars per line; a word longer than a line is broken.
std::vector<std::string> wrap(const std::string& text, size_t max_chars) {
  std::vector<std::string> lines;
  const std::string s = drawable(text);
  max_chars = std::max<size_t>(max_chars, 8);
  std::string cur;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ') ++j;
    std::string word = s.substr(i, j - i);
    i = j;
    if (word.empty()) break;
    while (!word.empty()) {
      const size_t need = cur.empty() ? word.size() : cur.size() + 1 + word.size();
      if (need <= max_chars) {
        cur += (cur.empty() ? "" : " ") + word;
        word.clear();
      } else if (cur.empty()) {
        cur = word.substr(0, max_chars);
        word = word.substr(max_chars);
        lines.push_back(cur);
        cur.clear();
      } else {
        lines.push_back(cur);
        cur.clear();
      }
    }
  }
  if (!cur.empty() || lines.empty()) lines.push_back(cur);
  return lines;
}

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(static_cast<size_t>(w) * static_cast<size_t>(h), Rgb{255, 255, 255}) {}
  void set(int x, int y, Rgb c) {
    if (x >= 0 && y >= 0 && x < w_ && y < h_)
      px_[static_cast<size_t>(y) * static_cast<size_t>(w_) + static_cast<size_t>(x)] = c;
  }
  void line(double x0, double y0, double x1, double y1, Rgb c, int thick = 1) {
    const int steps = static_cast<int>(std::max(std::abs(x1 - x0), std::abs(y1 - y0))) + 1;
    const int lo = -((thick - 1) / 2), hi = thick / 2;
    for (int i = 0; i <= steps; ++i) {
      const double t = static_cast<double>(i) / steps;
      const int x = static_cast<int>(std::lround(x0 + (x1 - x0) * t)),
                y = static_cast<int>(std::lround(y0 + (y1 - y0) * t));
      for (int dx = lo; dx <= hi; ++dx)
        for (int dy = lo; dy <= hi; ++dy) set(x + dx, y + dy, c);
    }
  }
  void rect(int x0, int y0, int x1, int y1, Rgb c) {
    for (int y = y0; y <= y1; ++y)
      for (int x = x0; x <= x1; ++x) set(x, y, c);
  }
  // Left to right from (x, y) = top left of the first glyph cell.
  void text(int x, int y, const std::string& s, Rgb c, int scale = 1) {
    for (char ch : drawable(s)) {
      glyph(ch, [&](int col, int row) {
        for (int a = 0; a < scale; ++a)
          for (int b = 0; b < scale; ++b) set(x + col * scale + a, y + row * scale + b, c);
      });
      x += kAdvance * scale;
    }
  }
  // Bottom to top (rotated 90° counter-clockwise) from (x, y) = bottom left of the first glyph cell.
  void text_up(int x, int y, const std::string& s, Rgb c) {
    for (char ch : drawable(s)) {
      glyph(ch, [&](int col, int row) { set(x + row, y - col, c); });
      y -= kAdvance;
    }
  }
  void write_png(const std::string& path) const;

 private:
  template <class F>
  static void glyph(char ch, F&& plot) {
    const auto u = static_cast<unsigned char>(ch);
    const GlyphBits& g = font()[u < 128 ? u : static_cast<unsigned char>('?')];
    for (int r = 0; r < kGlyphRows; ++r)
      for (int col = 0; col < kGlyphCols; ++col)
        if (g[static_cast<size_t>(r)] & (0x10 >> col)) plot(col, r);
  }
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

constexpr Rgb kPalette[] = {{31, 119, 180},  {214, 39, 40}, {44, 160, 44},   {255, 127, 14},
                            {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {23, 190, 207}};
constexpr Rgb kEmphasis{20, 20, 20}, kBand{200, 215, 235}, kAxis{60, 60, 60}, kGrid{225, 225, 225};

// A step of 1, 2 or 5 times a power of ten near range/target_ticks.
double nice_step(double range, int target_ticks) {
  const double raw = range / target_ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / p;
  return (m <= 1.0 ? 1.0 : m <= 2.0 ? 2.0 : m <= 5.0 ? 5.0 : 10.0) * p;
}

std::string linear_tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-9) return "0";
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  if (decimals > 4 || std::abs(v) >= 1e6) return fmt::format("{:.1e}", v);
  return fmt::format("{:.{}f}", v, decimals);
}

double symlog(double v, double c) {
  const double a = std::abs(v);
  const double f = a <= c ? a / c : 1.0 + std::log10(a / c);
  return v < 0 ? -f : f;
}

}  // namespace

const char* y_scale_name(YScale s) { return s == YScale::Linear ? "linear" : "symlog"; }

YScale parse_y_scale(const std::string& name) {
  if (name == "linear") return YScale::Linear;
  if (name == "symlog") return YScale::Symlog;
  fail("unknown y scale '{}' (known: linear, symlog)", name);
}

int chart_text_width(const std::string& s, int scale) {
  return static_cast<int>(drawable(s).size()) * kAdvance * scale;
}

double ChartLayout::y_pixel(double v) const {
  auto f = [&](double x) { return y_scale == YScale::Linear ? x : symlog(x, linear_threshold); };
  const double t = (f(v) - f(y_min)) / (f(y_max) - f(y_min));
  return plot_bottom + (plot_top - plot_bottom) * std::clamp(t, 0.0, 1.0);
}

nlohmann::json chart_layout_json(const ChartLayout& l) {
  nlohmann::json j;
  j["width"] = l.width;
  j["height"] = l.height;
  j["plot_area"] = {{"left", l.plot_left}, {"top", l.plot_top}, {"right", l.plot_right}, {"bottom", l.plot_bottom}};
  j["title_lines"] = l.title_lines;
  j["subtitle_lines"] = l.subtitle_lines;
  j["x_label"] = l.x_label;
  j["y_label"] = l.y_label;
  j["y_scale"] = y_scale_name(l.y_scale);
  j["y_min"] = l.y_min;
  j["y_max"] = l.y_max;
  if (l.y_scale == YScale::Symlog) j["linear_threshold"] = l.linear_threshold;
  j["y_ticks"] = l.y_ticks;
  j["y_tick_labels"] = l.y_tick_labels;
  j["x_min"] = l.x_min;
  j["x_max"] = l.x_max;
  j["note"] = l.note;
  auto rgb = [](Rgb c) { return nlohmann::json::array({c.r, c.g, c.b}); };
  j["series"] = nlohmann::json::array();
  for (const auto& s : l.series) {
    nlohmann::json y = nlohmann::json::array();
    for (double v : s.y) y.push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr));
    j["series"].push_back({{"label", s.label}, {"color", rgb(s.color)}, {"y", y}, {"px", s.px}, {"py", s.py}});
  }
  j["legend"] = nlohmann::json::array();
  for (const auto& e : l.legend)
    j["legend"].push_back({{"label", e.label},
                           {"lines", e.lines},
                           {"color", rgb(e.color)},
                           {"x", e.x},
                           {"y", e.y},
                           {"text_right", e.text_right}});
  return j;
}

ChartLayout write_line_chart_png(const std::string& path, const std::vector<ChartSeries>& series,
                                 const ChartOptions& opt, const std::vector<ChartBand>& bands) {
  if (opt.width < 400 || opt.width > 8000 || opt.plot_height < 100 || opt.plot_height > 8000)
    fail("{}: chart size {}x{} outside 400..8000 x 100..8000", path, opt.width, opt.plot_height);
  ChartLayout L;
  L.width = opt.width;
  L.y_scale = opt.y_scale;
  L.x_label = opt.x_label;

  // --- data range
  size_t npts = 1;
  double lo = INFINITY, hi = -INFINITY, min_abs = INFINITY;
  auto see = [&](const std::vector<double>& v) {
    npts = std::max(npts, v.size());
    for (double x : v)
      if (std::isfinite(x)) {
        lo = std::min(lo, x);
        hi = std::max(hi, x);
        if (x != 0.0) min_abs = std::min(min_abs, std::abs(x));
      }
  };
  for (const auto& s : series) see(s.y);
  for (const auto& b : bands) see(b.lo), see(b.hi);
  if (!std::isfinite(lo))
    lo = hi = 0.0, L.note = "no finite values";
  else if (lo == 0.0 && hi == 0.0)
    L.note = "all values are 0";
  if (opt.y_scale == YScale::Linear) {
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
    if (hi == lo) hi = lo + 1.0;
    const double step = nice_step(hi - lo, 6);
    L.y_min = std::floor(lo / step + 1e-9) * step;
    L.y_max = std::ceil(hi / step - 1e-9) * step;
    if (L.y_max <= L.y_min) L.y_max = L.y_min + step;
    for (int k = 0;; ++k) {
      const double v = L.y_min + k * step;
      if (v > L.y_max + step * 1e-6) break;
      L.y_ticks.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
      L.y_tick_labels.push_back(linear_tick_label(v, step));
    }
  } else {
    const double max_abs = std::max(std::abs(lo), std::abs(hi));
    double c = opt.linear_threshold;
    if (!(c > 0)) {
      c = std::isfinite(min_abs) ? std::pow(10.0, std::floor(std::log10(min_abs))) : 1.0;
      if (max_abs > 0) c = std::max(c, std::pow(10.0, std::floor(std::log10(max_abs)) - 6));  // at most 7 decades
    }
    L.linear_threshold = c;
    const double top = std::max(c, max_abs > 0 ? std::pow(10.0, std::ceil(std::log10(max_abs) - 1e-9)) : c);
    L.y_max = hi > 0 || lo >= 0 ? top : 0.0;
    L.y_min = lo < 0 ? -top : 0.0;
    std::vector<double> mags;
    for (double d = c; d <= top * 1.0001; d *= 10) mags.push_back(d);
    for (auto it = mags.rbegin(); L.y_min < 0 && it != mags.rend(); ++it) L.y_ticks.push_back(-*it);
    L.y_ticks.push_back(0.0);
    if (L.y_max > 0) L.y_ticks.insert(L.y_ticks.end(), mags.begin(), mags.end());
    for (double v : L.y_ticks) L.y_tick_labels.push_back(v == 0.0 ? "0" : fmt::format("{:.0e}", v));
  }
  L.x_min = 0;
  L.x_max = static_cast<double>(npts - 1);
  L.y_label = opt.y_label;
  if (opt.y_scale == YScale::Symlog)
    L.y_label += fmt::format("{}(symlog: linear below {:.0e})", L.y_label.empty() ? "" : "  ", L.linear_threshold);

  // --- layout (all text in the chart font: 6 px per character, 12 px per line at scale 1)
  const int margin = 16;
  L.title_lines = wrap(opt.title, static_cast<size_t>((opt.width - 2 * margin) / (2 * kAdvance)));
  L.subtitle_lines = opt.subtitle.empty()
                         ? std::vector<std::string>{}
                         : wrap(opt.subtitle, static_cast<size_t>((opt.width - 2 * margin) / kAdvance));
  int tick_w = 0;
  for (const auto& s : L.y_tick_labels) tick_w = std::max(tick_w, chart_text_width(s));
  L.plot_top = margin + static_cast<int>(L.title_lines.size()) * 2 * kLineHeight +
               static_cast<int>(L.subtitle_lines.size()) * kLineHeight + 14;
  L.plot_left = margin + (L.y_label.empty() ? 0 : kLineHeight + 6) + tick_w + 10;
  L.plot_right = opt.width - margin - 10;
  L.plot_bottom = L.plot_top + opt.plot_height;
  const int x_ticks_y = L.plot_bottom + 8, x_label_y = x_ticks_y + kLineHeight + 6;
  int legend_y = x_label_y + (opt.x_label.empty() ? 0 : kLineHeight) + 14;
  const int legend_text_x = L.plot_left + 22;
  const size_t legend_chars = static_cast<size_t>((opt.width - margin - legend_text_x) / kAdvance);
  std::vector<ChartLayout::Legend> legend;
  auto add_legend = [&](const std::string& label, Rgb c) {
    ChartLayout::Legend e;
    e.label = label;
    e.lines = wrap(label, legend_chars);
    e.color = c;
    e.x = L.plot_left;
    e.y = legend_y;
    for (const auto& ln : e.lines) e.text_right = std::max(e.text_right, legend_text_x + chart_text_width(ln));
    legend_y += static_cast<int>(e.lines.size()) * kLineHeight + 4;
    legend.push_back(std::move(e));
  };
  for (const auto& b : bands) add_legend(b.label, kBand);
  size_t palette_i = 0;
  std::vector<Rgb> colors;
  for (const auto& s : series) {
    colors.push_back(s.emphasis ? kEmphasis : kPalette[palette_i++ % std::size(kPalette)]);
    add_legend(s.label, colors.back());
  }
  L.height = legend_y + margin;
  L.legend = legend;

  Canvas cv(L.width, L.height);
  auto xmap = [&](double i) {
    return L.plot_left + (L.plot_right - L.plot_left) * (npts > 1 ? i / static_cast<double>(npts - 1) : 0.5);
  };

  // --- grid, axes, tick labels
  for (size_t k = 0; k < L.y_ticks.size(); ++k) {
    const double y = L.y_pixel(L.y_ticks[k]);
    cv.line(L.plot_left, y, L.plot_right, y, L.y_ticks[k] == 0.0 ? Rgb{150, 150, 150} : kGrid);
    const std::string& s = L.y_tick_labels[k];
    cv.text(L.plot_left - 8 - chart_text_width(s), static_cast<int>(std::lround(y)) - 4, s, kAxis);
  }
  const size_t xstep = std::max<size_t>(1, (npts + 14) / 15);
  for (size_t i = 0; i < npts; i += xstep) {
    const double x = xmap(static_cast<double>(i));
    cv.line(x, L.plot_bottom, x, L.plot_bottom + 4, kAxis);
    const std::string s = i < opt.x_tick_labels.size() ? opt.x_tick_labels[i] : std::to_string(i);
    cv.text(static_cast<int>(x) - chart_text_width(s) / 2, x_ticks_y, s, kAxis);
  }
  cv.line(L.plot_left, L.plot_bottom, L.plot_right, L.plot_bottom, kAxis);
  cv.line(L.plot_left, L.plot_bottom, L.plot_left, L.plot_top, kAxis);

  // --- bands, then series (in order: later ones on top)
  for (const auto& b : bands) {
    const size_t n = std::min(b.lo.size(), b.hi.size());
    for (size_t i = 0; i + 1 < n; ++i) {
      if (!std::isfinite(b.lo[i]) || !std::isfinite(b.hi[i]) || !std::isfinite(b.lo[i + 1]) ||
          !std::isfinite(b.hi[i + 1]))
        continue;
      const double xa = xmap(static_cast<double>(i)), xb = xmap(static_cast<double>(i + 1));
      for (int x = static_cast<int>(std::ceil(xa)); x <= static_cast<int>(std::floor(xb)); ++x) {
        const double t = (x - xa) / (xb - xa);
        const double ya = L.y_pixel(b.lo[i]) + (L.y_pixel(b.lo[i + 1]) - L.y_pixel(b.lo[i])) * t;
        const double yb = L.y_pixel(b.hi[i]) + (L.y_pixel(b.hi[i + 1]) - L.y_pixel(b.hi[i])) * t;
        cv.line(x, ya, x, yb, kBand);
      }
    }
  }
  for (size_t si = 0; si < series.size(); ++si) {
    const ChartSeries& s = series[si];
    const Rgb c = colors[si];
    ChartLayout::Series out;
    out.label = s.label;
    out.color = c;
    out.y = s.y;
    const int half = s.emphasis ? 3 : 2;
    for (size_t i = 0; i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i])) {
        out.px.push_back(-1), out.py.push_back(-1);
        continue;
      }
      const double px = xmap(static_cast<double>(i)), py = L.y_pixel(s.y[i]);
      if (i > 0 && std::isfinite(s.y[i - 1]))
        cv.line(xmap(static_cast<double>(i - 1)), L.y_pixel(s.y[i - 1]), px, py, c, s.emphasis ? 3 : 2);
      const int ix = static_cast<int>(std::lround(px)), iy = static_cast<int>(std::lround(py));
      cv.rect(ix - half, iy - half, ix + half, iy + half, c);
      out.px.push_back(ix), out.py.push_back(iy);
    }
    L.series.push_back(std::move(out));
  }
  if (!L.note.empty()) {
    const int y = (L.plot_top + L.plot_bottom) / 2 - kLineHeight;
    cv.text((L.plot_left + L.plot_right) / 2 - chart_text_width(L.note) / 2, y, L.note, kAxis);
  }

  // --- text: title, subtitle, axis labels, legend
  int ty = margin;
  for (const auto& ln : L.title_lines) cv.text(margin, ty, ln, kAxis, 2), ty += 2 * kLineHeight;
  for (const auto& ln : L.subtitle_lines) cv.text(margin, ty, ln, kAxis), ty += kLineHeight;
  if (!opt.x_label.empty())
    cv.text((L.plot_left + L.plot_right) / 2 - chart_text_width(opt.x_label) / 2, x_label_y, opt.x_label, kAxis);
  if (!L.y_label.empty())
    cv.text_up(margin, (L.plot_top + L.plot_bottom) / 2 + chart_text_width(L.y_label) / 2, L.y_label, kAxis);
  for (const auto& e : L.legend) {
    cv.rect(e.x, e.y + 2, e.x + 14, e.y + 7, e.color);
    int ly = e.y;
    for (const auto& ln : e.lines) cv.text(legend_text_x, ly, ln, kAxis), ly += kLineHeight;
  }
  cv.write_png(path);
  return L;
}

}  // namespace latent
