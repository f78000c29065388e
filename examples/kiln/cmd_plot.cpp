// `kiln plot`: training curves from metrics logs (`kiln train` writes them) as one SVG picture.
#include <spdlog/spdlog.h>

#include <filesystem>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/atomic_file.hpp>

#include "args.hpp"
#include "commands.hpp"
#include "svg_plot.hpp"

namespace kiln::cli {

int cmd_plot(const std::vector<std::string>& argv) {
  // Files are the arguments that are neither options nor an option's value.
  const std::set<std::string> takes_value = {"--out", "--title"};
  std::vector<std::string> files, options;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (takes_value.count(argv[i]) && i + 1 < argv.size()) {
      options.insert(options.end(), {argv[i], argv[i + 1]});
      ++i;
    } else if (argv[i].rfind("--", 0) == 0) {
      options.push_back(argv[i]);
    } else {
      files.push_back(argv[i]);
    }
  }
  Args a(options,
         {{"out", "the SVG file to write (default: curves.svg)"},
          {"title", "the picture's title (default: kiln training curves)"}},
         "usage: kiln plot METRICS.jsonl [MORE.jsonl ...] [--out curves.svg]\n\nDraws the training and validation loss "
         "and the learning rate against steps from `kiln train`'s\nmetrics logs, several runs overlaid, as an SVG "
         "picture that a browser opens.");
  if (a.help()) {
    a.print_help();
    return 0;
  }
  if (files.empty())
    throw Error("no metrics log given (usage: kiln plot METRICS.jsonl [MORE.jsonl ...] --out curves.svg)");
  std::vector<PlotRun> runs;
  for (const std::string& f : files) {
    std::string label = std::filesystem::path(f).filename().string();
    for (const char* suffix : {".metrics.jsonl", ".jsonl"})
      if (label.size() > std::strlen(suffix) && label.ends_with(suffix)) {
        label.resize(label.size() - std::strlen(suffix));
        break;
      }
    runs.push_back({label, read_metrics(f)});
  }
  const std::string out = a.str("out", "curves.svg");
  write_file_atomically(out, training_curves_svg(runs, a.str("title", "kiln training curves")));
  spdlog::info("{} run{} drawn in {}", runs.size(), runs.size() == 1 ? "" : "s", out);
  return 0;
}

}  // namespace kiln::cli
