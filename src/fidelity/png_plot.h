// A small line-chart renderer that writes PNG (zlib for deflate; a built-in 5x7 bitmap font covering printable
// ASCII, with descenders). Used by `latent fidelity --plot` for the per-layer error chart. No plotting library
// exists in Debian's C++ stack.
//
// The y axis is linear (from 0, or from the lowest value when it is negative) or symlog (linear within
// ±linear_threshold, logarithmic beyond); both show zero. Series labels are drawn in full in a legend under the
// plot (wrapped, never cut). write_line_chart_png returns the layout it drew, which chart_layout_json turns into
// the data dump written beside the PNG: tests check the chart from it.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace latent {

enum class YScale { Linear, Symlog };
const char* y_scale_name(YScale s);
YScale parse_y_scale(const std::string& name);  // "linear" | "symlog"; throws Error otherwise

struct ChartSeries {
  std::string label;
  std::vector<double> y;  // one value per x = 0, 1, 2, ...; non-finite values are not drawn
  bool emphasis = false;  // drawn thicker, in black (e.g. the mean)
};

// A shaded band between two curves (e.g. min..max over prompts), drawn under the series.
struct ChartBand {
  std::string label;
  std::vector<double> lo, hi;
};

struct ChartOptions {
  std::string title;     // large, wrapped to the width
  std::string subtitle;  // under the title, wrapped
  std::string x_label;
  std::string y_label;
  std::vector<std::string> x_tick_labels;  // optional: the label of x = i (default: i)
  YScale y_scale = YScale::Linear;
  double linear_threshold = 0.0;  // symlog: |y| below it is linear; 0 = chosen from the data
  int width = 1000;
  int plot_height = 420;  // the canvas height follows from it, the title and the legend
};

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

// What was drawn, in pixels (origin top left) and data units.
struct ChartLayout {
  int width = 0, height = 0;
  int plot_left = 0, plot_top = 0, plot_right = 0, plot_bottom = 0;
  YScale y_scale = YScale::Linear;
  double y_min = 0, y_max = 1, linear_threshold = 0;
  double x_min = 0, x_max = 0;
  std::vector<double> y_ticks;
  std::vector<std::string> y_tick_labels;
  std::vector<std::string> title_lines, subtitle_lines;
  std::string x_label, y_label, note;
  struct Legend {
    std::string label;
    std::vector<std::string> lines;  // the label as wrapped (concatenated with single spaces = label)
    Rgb color;
    int x = 0, y = 0, text_right = 0;  // swatch position and where the longest line's text ends
  };
  struct Series {
    std::string label;
    Rgb color;
    std::vector<double> y;
    std::vector<int> px, py;  // marker centers (px/py of a non-finite value: -1)
  };
  std::vector<Series> series;
  std::vector<Legend> legend;
  double y_pixel(double v) const;  // the row a value maps to
};

nlohmann::json chart_layout_json(const ChartLayout& l);

// Throws latent::Error when the file cannot be written or the options are unusable.
ChartLayout write_line_chart_png(const std::string& path, const std::vector<ChartSeries>& series,
                                 const ChartOptions& opt, const std::vector<ChartBand>& bands = {});

// The width in pixels of `s` in the chart font at `scale` (one glyph per byte; UTF-8 sequences count once).
int chart_text_width(const std::string& s, int scale = 1);

}  // namespace latent
