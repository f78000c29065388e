// Training curves as an SVG picture (`kiln plot`): the training loss (each step, faint, and a
// moving average over it) and the validation loss against steps, the learning rate in a panel
// below; several runs overlaid, one colour each, named in a legend.
#pragma once

#include <string>
#include <vector>

#include <kiln/train/metrics_log.hpp>

namespace kiln::cli {

struct PlotRun {
  std::string label;  // the legend's name for the run (its file's name)
  std::vector<MetricsRecord> records;
};

// A self-contained SVG document. Non-finite values leave gaps in their curves. A run with no
// training or validation loss at all is an error naming it.
std::string training_curves_svg(const std::vector<PlotRun>& runs, const std::string& title);

}  // namespace kiln::cli
