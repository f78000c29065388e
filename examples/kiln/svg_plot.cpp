// The SVG of training curves: two panels sharing the step axis, ticks at 1-2-5 steps.
#include "svg_plot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <kiln/circuit/ir/error.hpp>

namespace kiln::cli {

namespace {

constexpr double kWidth = 860, kLeft = 70, kRight = 20, kTop = 50;
constexpr double kLossHeight = 330, kGap = 55, kLrHeight = 120, kBottom = 45;
const char* const kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  bool empty() const { return !(lo <= hi); }
  // Never zero-wide: a flat curve gets a band around it.
  Range padded() const {
    Range r = *this;
    if (r.empty()) return Range{0, 1};
    const double span = r.hi - r.lo, pad = span > 0 ? 0.04 * span : std::max(std::fabs(r.lo) * 0.05, 1e-3);
    r.lo -= pad, r.hi += pad;
    return r;
  }
};

// Tick values at 1, 2 or 5 times a power of ten, about `count` of them across r.
std::vector<double> ticks(const Range& r, int count) {
  const double raw = (r.hi - r.lo) / count, power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * power >= raw) {
      step = m * power;
      break;
    }
  std::vector<double> out;
  for (double v = std::ceil(r.lo / step) * step; v <= r.hi + 1e-9 * step; v += step)
    out.push_back(std::fabs(v) < 1e-12 * step ? 0 : v);
  return out;
}

std::string label_of(double v) {
  if (v != 0 && (std::fabs(v) < 1e-2 || std::fabs(v) >= 1e5)) return fmt::format("{:.0e}", v);
  return fmt::format("{:g}", v);
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A panel: maps (step, value) into its box and draws the axes, grid and tick labels.
struct Panel {
  double x0, y0, w, h;
  Range xs, ys;
  double px(double step) const { return x0 + (step - xs.lo) / (xs.hi - xs.lo) * w; }
  double py(double v) const { return y0 + h - (v - ys.lo) / (ys.hi - ys.lo) * h; }
  std::string frame(const std::string& y_title, const std::string& x_title) const {
    std::string s =
        fmt::format(R"svg(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="white" stroke="#444"/>)svg"
                    "\n",
                    x0, y0, w, h);
    for (double t : ticks(ys, 6))
      s += fmt::format(R"svg(<line x1="{0:.1f}" x2="{1:.1f}" y1="{2:.1f}" y2="{2:.1f}" stroke="#e3e3e3"/>)svg"
                       R"svg(<text x="{3:.1f}" y="{4:.1f}" text-anchor="end">{5}</text>)svg"
                       "\n",
                       x0, x0 + w, py(t), x0 - 6, py(t) + 4, label_of(t));
    for (double t : ticks(xs, 8))
      s += fmt::format(R"svg(<line x1="{0:.1f}" x2="{0:.1f}" y1="{1:.1f}" y2="{2:.1f}" stroke="#e3e3e3"/>)svg"
                       R"svg(<text x="{0:.1f}" y="{3:.1f}" text-anchor="middle">{4}</text>)svg"
                       "\n",
                       px(t), y0, y0 + h, y0 + h + 16, label_of(t));
    s += fmt::format(
        R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" transform="rotate(-90 {:.1f} {:.1f})">{}</text>)svg"
        "\n",
        x0 - 52, y0 + h / 2, x0 - 52, y0 + h / 2, escape(y_title));
    if (!x_title.empty())
      s += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)svg"
                       "\n",
                       x0 + w / 2, y0 + h + 34, escape(x_title));
    return s;
  }
  // A polyline through the finite points; a non-finite value ends one and starts the next.
  std::string curve(const std::vector<std::pair<double, double>>& points, const std::string& style) const {
    std::string s, run;
    auto flush = [&] {
      if (!run.empty())
        s += fmt::format(R"svg(<polyline fill="none" {} points="{}"/>)svg"
                         "\n",
                         style, run);
      run.clear();
    };
    for (const auto& [x, y] : points) {
      if (!std::isfinite(y)) {
        flush();
        continue;
      }
      run += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    }
    flush();
    return s;
  }
};

// An exponential moving average whose span is about 2% of the run (at least a few steps), so
// that its curve reads as the trend at any run length; non-finite values pass through as gaps.
std::vector<std::pair<double, double>> smoothed(const std::vector<std::pair<double, double>>& points) {
  const double span = std::max(5.0, 0.02 * static_cast<double>(points.size())), alpha = 2 / (span + 1);
  std::vector<std::pair<double, double>> out;
  std::optional<double> avg;
  double weight = 0;
  for (const auto& [x, y] : points) {
    if (!std::isfinite(y)) {
      out.push_back({x, y});
      avg.reset(), weight = 0;
      continue;
    }
    // Bias-corrected, so that the first steps are not pulled toward zero.
    avg = avg ? (1 - alpha) * *avg + alpha * y : alpha * y;
    weight = (1 - alpha) * weight + alpha;
    out.push_back({x, *avg / weight});
  }
  return out;
}

}  // namespace

std::string training_curves_svg(const std::vector<PlotRun>& runs, const std::string& title) {
  if (runs.empty()) throw Error("nothing to plot: no metrics log given");
  struct Curves {
    std::vector<std::pair<double, double>> loss, val, lr;
  };
  std::vector<Curves> curves;
  Range steps, losses, lrs;
  for (const PlotRun& run : runs) {
    Curves c;
    for (const MetricsRecord& r : run.records) {
      if (r.start) continue;
      const double step = static_cast<double>(r.step);
      if (r.loss) c.loss.push_back({step, *r.loss}), losses.add(*r.loss), steps.add(step);
      if (r.val_loss) c.val.push_back({step, *r.val_loss}), losses.add(*r.val_loss), steps.add(step);
      if (r.lr) c.lr.push_back({step, *r.lr}), lrs.add(*r.lr);
    }
    if (c.loss.empty() && c.val.empty())
      throw Error("the metrics log '" + run.label + "' holds no training or validation loss to plot");
    curves.push_back(std::move(c));
  }
  const double plot_w = kWidth - kLeft - kRight;
  const double height = kTop + kLossHeight + kGap + kLrHeight + kBottom;
  Panel loss_panel{kLeft, kTop, plot_w, kLossHeight, steps.padded(), losses.padded()};
  Panel lr_panel{kLeft, kTop + kLossHeight + kGap, plot_w, kLrHeight, steps.padded(), lrs.padded()};

  std::string svg = fmt::format(
      R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{0:.0f}" height="{1:.0f}" viewBox="0 0 {0:.0f} {1:.0f}" )svg"
      R"svg(font-family="sans-serif" font-size="12">)svg"
      "\n<rect width=\"100%\" height=\"100%\" fill=\"#fafafa\"/>\n"
      R"svg(<text x="{2:.1f}" y="28" font-size="16" text-anchor="middle">{3}</text>)svg"
      "\n",
      kWidth, height, kWidth / 2, escape(title));
  svg += loss_panel.frame("loss (nats/token)", "");
  svg += lr_panel.frame("learning rate", "step");
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string colour = kColours[i % std::size(kColours)];
    const Curves& c = curves[i];
    svg += loss_panel.curve(c.loss, fmt::format(R"svg(stroke="{}" stroke-opacity="0.25" stroke-width="1")svg", colour));
    svg += loss_panel.curve(smoothed(c.loss), fmt::format(R"svg(stroke="{}" stroke-width="2")svg", colour));
    svg +=
        loss_panel.curve(c.val, fmt::format(R"svg(stroke="{}" stroke-width="1.5" stroke-dasharray="6 4")svg", colour));
    for (const auto& [x, y] : c.val)
      if (std::isfinite(y))
        svg +=
            fmt::format(R"svg(<circle cx="{:.1f}" cy="{:.1f}" r="3.5" fill="white" stroke="{}" stroke-width="1.5"/>)svg"
                        "\n",
                        loss_panel.px(x), loss_panel.py(y), colour);
    if (!lrs.empty()) svg += lr_panel.curve(c.lr, fmt::format(R"svg(stroke="{}" stroke-width="1.5")svg", colour));
    // The legend, top right inside the loss panel.
    const double ly = kTop + 18 + 34 * static_cast<double>(i), lx = kLeft + plot_w - 250;
    svg += fmt::format(
        R"svg(<line x1="{0:.1f}" x2="{1:.1f}" y1="{2:.1f}" y2="{2:.1f}" stroke="{3}" stroke-width="2"/>)svg"
        R"svg(<text x="{4:.1f}" y="{5:.1f}">{6}</text>)svg"
        R"svg(<line x1="{0:.1f}" x2="{1:.1f}" y1="{7:.1f}" y2="{7:.1f}" stroke="{3}" stroke-width="1.5" stroke-dasharray="6 4"/>)svg"
        R"svg(<text x="{4:.1f}" y="{8:.1f}" fill="#555">validation</text>)svg"
        "\n",
        lx, lx + 24, ly, colour, lx + 30, ly + 4, escape(runs[i].label + ": training (average)"), ly + 15, ly + 19);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace kiln::cli
