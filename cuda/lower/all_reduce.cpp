// Lowering of all_reduce (circuit/prims/all_reduce.cpp): a copy kernel marked all_reduce_mean;
// reduce_scatter and all_gather: over one rank a copy, over several no launch, the op marked for
// the device collective's reduce-scatter or all-gather.
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
  lo.collective = RankCollective::all_reduce_mean;
  lo.summary = "all_reduce: the device collective's mean over the ranks (one process without one: a copy)";
  return lo;
}

// ZeRO-1's collectives, params {N}. The device program checks N against the run's ranks.
LoweredOp lower_shard_collective(const Circuit& c, const Op& op, const Target& target) {
  const bool scatter = op.is(PrimId::reduce_scatter);
  const int64_t ranks = op.params.ints.size() == 1 ? op.params.ints[0] : 0;
  if (ranks < 1) throw Error(std::string(op.prim->name) + ": params: expected {ranks}, a count of at least 1");
  if (ranks == 1) {
    LoweredOp lo = strided_copy(c, op, target, c.info(op.inputs[0]).shape.strides());
    lo.summary = std::string(op.prim->name) + " over one rank: a copy";
    return lo;
  }
  LoweredOp lo;
  lo.collective = scatter ? RankCollective::reduce_scatter_mean : RankCollective::all_gather;
  lo.summary = std::string(op.prim->name) + ": the device collective's " +
               (scatter ? "reduce-scatter (this rank's chunk of the mean)" : "all-gather") + " over " +
               std::to_string(ranks) + " ranks";
  return lo;
}

}  // namespace

void register_all_reduce_lowering(LoweringTable& t) {
  t.add(PrimId::all_reduce, lower_all_reduce, "the device collective's mean over the ranks (NCCL); a copy alone");
  t.add(PrimId::reduce_scatter, lower_shard_collective,
        "ZeRO-1's reduce-scatter: the device collective's (a copy over one rank)");
  t.add(PrimId::all_gather, lower_shard_collective, "ZeRO-1's all-gather: the device collective's (a copy over one rank)");
}

}  // namespace kiln::cuda
