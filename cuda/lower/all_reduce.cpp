// Lowering of all_reduce (circuit/prims/all_reduce.cpp): a copy of the bucket into the output,
// which the device program then hands to the process's device collective (NCCL, or staged
// through host memory; cuda/runtime/collective.hpp) to be averaged over the ranks in place. In
// one process with no device collective, the copy is the whole op.
#include "cuda/lower/elementwise.hpp"
#include "cuda/lower/families.hpp"

namespace kiln::cuda {

namespace {

LoweredOp lower_all_reduce(const Circuit& c, const Op& op) {
  LoweredOp lo = strided_copy(c, op, c.info(op.inputs[0]).shape.strides());
  lo.mean_over_ranks = true;
  lo.summary = "all_reduce: a copy, then the mean over the ranks in place (device collective)";
  return lo;
}

}  // namespace

void register_all_reduce_lowering(LoweringTable& t) {
  t.add(PrimId::all_reduce, lower_all_reduce, "a copy, then the device collective's mean over the ranks (NCCL)");
}

}  // namespace kiln::cuda
