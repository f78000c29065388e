// Lowering of all_reduce (circuit/prims/all_reduce.cpp): a copy kernel marked mean_over_ranks;
// reduce_scatter and all_gather over one rank: a copy.
// The device program then adds the process's device collective (cuda/runtime/collective.hpp):
// NCCL in place on the copy, or the host-staged one from the input into the output instead of
// the copy. In one process with no device collective, the copy is the op.
#include <kiln/circuit/ir/error.hpp>
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

// ZeRO-1's collectives: over one rank a copy; GPU steps have no reduce-scatter or all-gather
// between ranks yet (kiln train refuses --shard-optimizer on the GPU).
LoweredOp lower_one_rank_copy(const Circuit& c, const Op& op, const Target& target) {
  if (op.params.ints.size() != 1 || op.params.ints[0] != 1)
    throw Error(std::string(op.prim->name) +
                " over several ranks: GPU steps have no reduce-scatter or all-gather between ranks yet (ZeRO-1 runs "
                "on the CPU)");
  LoweredOp lo = strided_copy(c, op, target, c.info(op.inputs[0]).shape.strides());
  lo.summary = std::string(op.prim->name) + " over one rank: a copy";
  return lo;
}

}  // namespace

void register_all_reduce_lowering(LoweringTable& t) {
  t.add(PrimId::all_reduce, lower_all_reduce, "the device collective's mean over the ranks (NCCL); a copy alone");
  t.add(PrimId::reduce_scatter, lower_one_rank_copy, "ZeRO-1's reduce-scatter over one rank (a copy)");
  t.add(PrimId::all_gather, lower_one_rank_copy, "ZeRO-1's all-gather over one rank (a copy)");
}

}  // namespace kiln::cuda
