// Lowering of all_reduce (circuit/prims/all_reduce.cpp): a copy kernel marked mean_over_ranks.
// The device program then adds the process's device collective (cuda/runtime/collective.hpp):
// NCCL in place on the copy, or the host-staged one from the input into the output instead of
// the copy. In one process with no device collective, the copy is the op.
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

namespace {

LoweredOp lower_all_reduce(const Circuit& c, const Op& op, const Target& target) {
  LoweredOp lo = strided_copy(c, op, target, c.info(op.inputs[0]).shape.strides());
  lo.mean_over_ranks = true;
  lo.summary = "all_reduce: the device collective's mean over the ranks (one process without one: a copy)";
  return lo;
}

}  // namespace

void register_all_reduce_lowering(LoweringTable& t) {
  t.add(PrimId::all_reduce, lower_all_reduce, "the device collective's mean over the ranks (NCCL); a copy alone");
}

}  // namespace kiln::cuda
