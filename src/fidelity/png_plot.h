// A small line-chart renderer that writes PNG (zlib for deflate; a built-in 5x7 bitmap font for labels). Used by
// `latent fidelity --plot` for the per-layer error chart. No plotting library exists in Debian's C++ stack.
#pragma once
#include <string>
#include <vector>

namespace latent {

struct ChartSeries {
  std::string label;
  std::vector<double> y;  // one value per x = 0, 1, 2, ...
};

struct ChartOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_y = true;  // values <= 0 are drawn at the bottom of the axis
  int width = 900;
  int height = 520;
};

// Throws latent::Error when the file cannot be written.
void write_line_chart_png(const std::string& path, const std::vector<ChartSeries>& series, const ChartOptions& opt);

}  // namespace latent
