// `kiln prims`: the Prim catalogue (core/prim_catalogue.hpp), one row per Prim: its family (source
// file) and whether it has a shape rule, Eigen f32/f64 reference, VJP rule, and a GPU kernel
// lowering; then the pass pipeline in order, by the names `--passes -NAME` takes.
#include <cstdio>

#include <kiln/core/prim_catalogue.hpp>

#include "commands.hpp"

namespace kiln::cli {

int cmd_prims(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::printf(
        "usage: kiln prims\n\nPrints every registered Prim with the rules it implements.\n"
        "Columns: shape rule, Eigen reference in f32 and f64, VJP rule (\"n/a\": no inputs to\n"
        "differentiate), and how the PTX back end lowers it to kernels. Then the passes a plan\n"
        "runs, in order, by the names `--passes -NAME` takes.\n");
    return args[0] == "--help" || args[0] == "-h" ? 0 : 2;
  }
  std::fputs(prim_catalogue().c_str(), stdout);
  return 0;
}

}  // namespace kiln::cli
