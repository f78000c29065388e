// Lowering of matmul (circuit/prims/matmul.cpp): the fused_matmul kernel running the program
// FusedMatmul::plain describes, the transposes folded into the operands' strides.
#include <spdlog/fmt/fmt.h>

#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/families.hpp>
#include <kiln/cuda/lower/fused_matmul.hpp>

namespace kiln::cuda {

namespace {

LoweredOp lower_matmul(const Circuit& c, const Op& op, const Target& target) {
  const MatmulParams mp = MatmulParams::of(op);
  LoweredOp lo = lower_matmul_program(
      c, op, FusedMatmul::plain(c.info(op.inputs[0]).shape, c.info(op.inputs[1]).shape, mp.transpose_a, mp.transpose_b),
      "kiln_matmul", target);
  lo.summary =
      fmt::format("matmul ta={} tb={}{}", mp.transpose_a, mp.transpose_b, lo.summary.substr(lo.summary.find(':')));
  return lo;
}

}  // namespace

void register_matmul_lowering(LoweringTable& t) {
  t.add(PrimId::matmul, lower_matmul, "64x64x16 shared-memory tiles, 4x4 per thread, FFMA");
}

}  // namespace kiln::cuda
