// Contraction of op groups: what a fusion pass does once it has chosen which ops become one.
// Shared by the row fusion (fuse_rows.cpp) and the multi-tensor merge (merge_multi_tensor.cpp).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>

namespace kiln {

// The successors of each op: its readers, and for a read of a buffer's old contents the
// assign that overwrites it (that read must stay before the assign).
std::vector<std::vector<int32_t>> op_successors(const Circuit& c);

// The ops that read each value (indices into c.ops(), ascending; an op reading a value twice
// is listed twice).
std::vector<std::vector<int32_t>> value_readers(const Circuit& c);

// A circuit rebuilt from `from` op by op (for passes that rewrite some ops and copy the rest):
// the externals are copied at construction; `at` maps from's ids to the new circuit's.
class Rebuild {
 public:
  explicit Rebuild(const Circuit& from);
  Circuit& out() { return out_; }
  ValueId at(ValueId v) const { return remap_[static_cast<size_t>(v)]; }
  std::vector<ValueId> at(const std::vector<ValueId>& ids) const;
  void map(ValueId from, ValueId to) { remap_[static_cast<size_t>(from)] = to; }
  // Appends op with `params` (its own where not given), its scope, phase and absorbed count,
  // and maps its outputs.
  void copy(const Op& op, const Params* params = nullptr);
  // Appends an op of `like`'s Prim, scope, phase and absorbed count with `params` and `inputs`
  // (ids of the result); maps nothing: its outputs may differ from like's (a rewritten op).
  std::vector<ValueId> emit(const Op& like, const Params& params, const std::vector<ValueId>& inputs);
  // The result; `outputs` (ids of `from`) are mapped. Verifies the circuit.
  Circuit finish(std::vector<ValueId>& outputs);

 private:
  Circuit out_;
  std::vector<ValueId> remap_;
};

// True if a path of successors leaves the ops `group` and comes back into it (contracting the
// group into one op would make a cycle).
bool leaves_and_returns(const std::vector<std::vector<int32_t>>& succ, const std::vector<int32_t>& group);

// The op that replaces a group: it takes `inputs` (ids of the original circuit) and its
// outputs stand, in order, for `replaces` (values of the group's members that something
// outside the group reads). An empty `replaces` drops the group (nothing reads it).
struct MergedOp {
  PrimId prim{};
  Params params;
  std::vector<ValueId> inputs;
  std::vector<ValueId> replaces;
};

// Groups of ops for contract_groups: per producing op (index), the ops that join it (indices,
// ascending), each group the producer followed by them.
std::vector<std::vector<int32_t>> producer_groups(const std::map<int32_t, std::vector<int32_t>>& joining);

// Rebuilds c with each group of ops (indices into c.ops(), one or more each, disjoint) replaced
// by the op merge(group index) describes, every op emitted in a topological order of the
// contracted graph (earliest op first among the ready ones, so the order is deterministic).
// A merged op counts its members as absorbed, takes the latest of their phases and the first
// non-empty scope among them. Throws kiln::Error naming `pass` if the contraction has a cycle (a pass that
// checks its groups never sees this). `outputs` are rewritten to their ids in the result.
Circuit contract_groups(const Circuit& c, const std::vector<std::vector<int32_t>>& groups,
                        const std::function<MergedOp(size_t group)>& merge, std::vector<ValueId>& outputs,
                        const std::string& pass);

}  // namespace kiln
