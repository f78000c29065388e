// `kiln prims`: the Prim catalogue, one row per Prim: its family (source file) and whether it
// has a shape rule, Eigen f32/f64 reference, VJP rule, and a GPU kernel lowering; then the
// pass pipeline in order, by the names `--passes -NAME` takes.
#include <cstdio>

#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/cuda/lower/lower.hpp>

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
  std::printf("%-18s %-18s %-6s %-8s %-8s %-6s %s\n", "prim", "family", "shape", "ref f32", "ref f64", "vjp",
              "lowering (GPU)");
  int n = 0;
  for (const PrimDef* p : PrimRegistry::instance().all()) {
    const char* vjp = !p->differentiable ? "n/a" : p->vjp ? "yes" : "no";
    std::string lowering = cuda::lowering_summary(p->id);
    std::printf("%-18s %-18s %-6s %-8s %-8s %-6s %s\n", p->name.c_str(), p->family.c_str(), p->shape ? "yes" : "no",
                p->eval && p->ref_f32 ? "yes" : "no", p->eval && p->ref_f64 ? "yes" : "no", vjp,
                lowering.empty() ? "no" : lowering.c_str());
    ++n;
  }
  std::printf("%d prims\n\npasses, in order (--passes -name,... switches them off):\n", n);
  for (const PassInfo& pass : pipeline_passes())
    std::printf("  %-22s %-9s %s\n", pass.name, pass.gpu_only ? "GPU plans" : "all plans", pass.does);
  return 0;
}

}  // namespace kiln::cli
