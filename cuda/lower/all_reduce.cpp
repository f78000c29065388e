// Lowering of all_reduce (circuit/prims/all_reduce.cpp) for a run of one rank: a copy. Averaging
// across GPUs needs NCCL inside the step, which kiln does not have yet: a plan with all_reduce
// over several ranks is refused when it is lowered, with that said.
#include <string>

#include "circuit/comm/communicator.hpp"
#include "circuit/ir/error.hpp"
#include "cuda/lower/elementwise.hpp"
#include "cuda/lower/families.hpp"

namespace kiln::cuda {

namespace {

LoweredOp lower_all_reduce(const Circuit& c, const Op& op) {
  if (world().size() > 1)
    fail("all_reduce", op.scope,
         "averaging gradients across " + std::to_string(world().size()) +
             " ranks on the GPU needs NCCL, which kiln's GPU path does not have yet: train data-parallel on the CPU "
             "(--device cpu), or in one process on the GPU");
  LoweredOp lo = strided_copy(c, op, c.info(op.inputs[0]).shape.strides());
  lo.summary = "all_reduce over one rank: a copy";
  return lo;
}

}  // namespace

void register_all_reduce_lowering(LoweringTable& t) {
  t.add(PrimId::all_reduce, lower_all_reduce, "one rank: a copy (several: NCCL, not yet)");
}

}  // namespace kiln::cuda
