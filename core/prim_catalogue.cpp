// prim_catalogue: the registry and the lowering table side by side.
#include <spdlog/fmt/fmt.h>

#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/core/prim_catalogue.hpp>
#include <kiln/cuda/lower/lower.hpp>

namespace kiln {

namespace {

// How the PTX back end runs a Prim: its lowering's summary, or for a user Prim what its spec gave.
std::string gpu_lowering(const PrimDef& p) {
  if (p.id != PrimId::user) {
    const std::string s = cuda::lowering_summary(p.id);
    return s.empty() ? "no" : s;
  }
  if (p.forwards_input0) return "none needed: a custom VJP's value is its forward's";
  if (p.gpu_kernel) return "kernels of its own (kernel IR)";
  if (p.row_body) return "row body (fused_rows, fused like kiln's own)";
  return p.pointwise_body ? "pointwise body (fused like kiln's own)" : "no (CPU only)";
}

}  // namespace

std::string prim_catalogue() {
  std::string out = fmt::format("{:<18} {:<18} {:<6} {:<8} {:<8} {:<6} {}\n", "prim", "family", "shape", "ref f32",
                                "ref f64", "vjp", "lowering (GPU)");
  int n = 0;
  for (const PrimDef* p : PrimRegistry::instance().all()) {
    const char* vjp = !p->differentiable ? "n/a" : p->vjp ? "yes" : "no";
    out +=
        fmt::format("{:<18} {:<18} {:<6} {:<8} {:<8} {:<6} {}\n", p->name, p->family, p->shape ? "yes" : "no",
                    p->eval && p->ref_f32 ? "yes" : "no", p->eval && p->ref_f64 ? "yes" : "no", vjp, gpu_lowering(*p));
    ++n;
  }
  out += fmt::format("{} prims\n\npasses, in order (--passes -name,... switches them off):\n", n);
  for (const PassInfo& pass : pipeline_passes())
    out += fmt::format("  {:<22} {:<9} {}\n", pass.name, pass.gpu_only ? "GPU plans" : "all plans", pass.does);
  return out;
}

}  // namespace kiln
