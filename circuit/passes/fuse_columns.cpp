// Column fusion: sums over the leading (token) axes become column_sums ops
// (circuit/prims/column_sums.cpp), with the pointwise op that only such a sum reads absorbed
// into its body, and sums over one domain that share an input computed in one op. A
// layernorm's parameter gradients, sum(dy * xhat) and sum(dy), thus take one pass over dy and
// never write dy * xhat.
#include <algorithm>

#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

// One sum over axis 0 of an [N, C] value, seen as a sum over the leading axes of `domain`.
struct ColumnSum {
  std::vector<int32_t> members;  // the reduce, then what it absorbed
  Shape domain;
  std::vector<ValueId> inputs;
  ScalarExp body = se::in(0);
  Phase phase = Phase::Forward;
  bool absorbed = false;
  bool matmul_reads_input = false;  // a matmul reads what it sums (a bias gradient beside its weight's)
};

std::vector<ColumnSum> find_sums(const Circuit& c, const std::vector<std::vector<int32_t>>& readers,
                                 const std::vector<bool>& protected_value) {
  const auto& ops = c.ops();
  auto only_reader = [&](ValueId v, int32_t op) {
    return !protected_value[static_cast<size_t>(v)] && readers[static_cast<size_t>(v)] == std::vector<int32_t>{op};
  };
  std::vector<ColumnSum> sums;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (!ReduceParams::is_sum_along(op, 0) || c.info(op.inputs[0]).shape.rank() != 2) continue;
    ColumnSum s;
    s.members = {static_cast<int32_t>(i)};
    s.phase = op.phase;
    ValueId v = op.inputs[0];
    const int64_t cols = c.info(v).shape[1];
    // Through a reshape that keeps the columns: the domain is the value before it.
    const int32_t p = c.value(v).producer;
    int32_t reshape = -1;
    if (p >= 0 && ops[static_cast<size_t>(p)].is(PrimId::reshape)) {
      const Shape& before = c.info(ops[static_cast<size_t>(p)].inputs[0]).shape;
      if (before.rank() >= 2 && before[before.rank() - 1] == cols) {
        reshape = p;
        v = ops[static_cast<size_t>(p)].inputs[0];
      }
    }
    s.domain = c.info(v).shape;
    s.inputs = {v};
    for (ValueId x : {op.inputs[0], v})
      for (int32_t r : readers[static_cast<size_t>(x)])
        s.matmul_reads_input = s.matmul_reads_input || ops[static_cast<size_t>(r)].is(PrimId::matmul);
    // The pointwise producer only this sum reads (through the reshape, if any) joins the body.
    const int32_t q = c.value(v).producer;
    const bool sole = reshape < 0 ? only_reader(v, static_cast<int32_t>(i))
                                  : only_reader(v, reshape) && only_reader(op.inputs[0], static_cast<int32_t>(i));
    if (q >= 0 && sole && ops[static_cast<size_t>(q)].is(PrimId::pointwise) &&
        ops[static_cast<size_t>(q)].phase == op.phase) {
      if (reshape >= 0) s.members.push_back(reshape);
      s.members.push_back(q);
      s.inputs = ops[static_cast<size_t>(q)].inputs;
      s.body = ops[static_cast<size_t>(q)].params.body;
      s.absorbed = true;
    }
    sums.push_back(std::move(s));
  }
  return sums;
}

bool share_input(const ColumnSum& a, const ColumnSum& b) {
  for (ValueId v : a.inputs)
    if (std::find(b.inputs.begin(), b.inputs.end(), v) != b.inputs.end()) return true;
  return false;
}

// True if sum `a` reads a value that one of the ops `members` computes.
bool reads_from(const Circuit& c, const ColumnSum& a, const std::vector<int32_t>& members) {
  for (ValueId v : a.inputs)
    if (std::find(members.begin(), members.end(), c.value(v).producer) != members.end()) return true;
  return false;
}

}  // namespace

Circuit fuse_columns(const Circuit& c, std::vector<ValueId>& outputs) {
  const auto& ops = c.ops();
  const std::vector<std::vector<int32_t>> readers = value_readers(c);
  std::vector<bool> protected_value(c.num_values(), false);
  for (ValueId o : outputs) protected_value[static_cast<size_t>(o)] = true;
  const std::vector<ColumnSum> sums = find_sums(c, readers, protected_value);
  const std::vector<std::vector<int32_t>> succ = op_successors(c);

  // Groups of sums over one domain in one phase, joined one at a time where they share an input,
  // neither reads the other, and no path leaves the joined group and comes back (in op order:
  // deterministic).
  std::vector<std::vector<size_t>> groups;
  std::vector<std::vector<int32_t>> members;
  for (size_t s = 0; s < sums.size(); ++s) {
    bool joined = false;
    for (size_t g = 0; g < groups.size() && !joined; ++g) {
      const ColumnSum& first = sums[groups[g][0]];
      if (first.domain != sums[s].domain || first.phase != sums[s].phase) continue;
      bool shares = false, dependent = reads_from(c, sums[s], members[g]);
      for (size_t t : groups[g]) {
        shares = shares || share_input(sums[t], sums[s]);
        dependent = dependent || reads_from(c, sums[t], sums[s].members);
      }
      if (!shares || dependent) continue;
      std::vector<int32_t> joint = members[g];
      joint.insert(joint.end(), sums[s].members.begin(), sums[s].members.end());
      if (leaves_and_returns(succ, joint)) continue;
      groups[g].push_back(s);
      members[g] = std::move(joint);
      joined = true;
    }
    if (!joined) {
      groups.push_back({s});
      members.push_back(sums[s].members);
    }
  }
  // A lone sum that absorbed nothing and whose input a matmul reads stays a reduce: the matmul
  // fusion takes it as the bias gradient beside the weight gradient. Any other becomes a
  // column_sums op, whose kernel splits the rows across blocks (a reduce along axis 0 runs a
  // thread per column: 3 ms for 8192 x 768 on an H200, where a matmul reads a bias gradient's
  // input only through a cast to bf16).
  std::vector<std::vector<size_t>> kept;
  std::vector<std::vector<int32_t>> kept_members;
  for (size_t g = 0; g < groups.size(); ++g)
    if (groups[g].size() > 1 || sums[groups[g][0]].absorbed || !sums[groups[g][0]].matmul_reads_input) {
      kept.push_back(groups[g]);
      std::sort(members[g].begin(), members[g].end());
      kept_members.push_back(members[g]);
    }
  if (kept.empty()) return c;

  Circuit out = contract_groups(
      c, kept_members,
      [&](size_t k) {
        MergedOp m;
        m.prim = PrimId::column_sums;
        const ColumnSum& first = sums[kept[k][0]];
        ColumnSumsParams cp;
        cp.dtype = c.info(ops[static_cast<size_t>(first.members[0])].outputs[0]).dtype;
        cp.domain = first.domain;
        for (size_t s : kept[k]) {
          std::vector<ScalarExp> subs;
          for (ValueId v : sums[s].inputs) {
            auto at = std::find(m.inputs.begin(), m.inputs.end(), v);
            if (at == m.inputs.end()) at = m.inputs.insert(m.inputs.end(), v);
            subs.push_back(se::in(static_cast<int>(at - m.inputs.begin())));
          }
          cp.bodies.push_back(sums[s].body.substitute(subs));
          m.replaces.push_back(ops[static_cast<size_t>(sums[s].members[0])].outputs[0]);
        }
        m.params = cp.to_params();
        return m;
      },
      outputs, "fuse_columns");
  return dce(out, outputs);
}

}  // namespace kiln
