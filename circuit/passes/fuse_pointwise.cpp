// Pointwise fusion.
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <sstream>

#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {

namespace {

struct FusedOp {
  Params params;
  std::vector<ValueId> inputs;   // ids of the original circuit
  int absorbed = 0;              // ops substituted into this one
  bool removed = false;          // absorbed into its consumer
  Phase phase = Phase::Forward;  // the latest of the ops substituted and this one's
};

bool is_pointwise(const Op& op) { return op.is(PrimId::pointwise); }

// A pointwise op over float fills only is a fill of its result (constant folding: the seed of
// a loss's gradient times the mean's 1 / n), evaluated in f64 and rounded once to the dtype.
std::optional<Params> folded_fill(const Circuit& c, const Op& op, const FusedOp& f) {
  const ValueInfo& out = c.info(op.outputs[0]);
  if (!is_pointwise(op) || (out.dtype != DType::f32 && out.dtype != DType::f64)) return std::nullopt;
  std::vector<double> values;
  for (ValueId in : f.inputs) {
    const std::optional<double> v = FillParams::float_value(c, in);
    if (!v) return std::nullopt;
    values.push_back(*v);
  }
  double v = f.params.body.eval(values);
  if (out.dtype == DType::f32) v = static_cast<float>(v);
  return FillParams{out.shape, v, out.dtype}.to_params();
}

}  // namespace

Circuit fuse_pointwise(const Circuit& c, std::vector<ValueId>& outputs) {
  const auto& ops = c.ops();
  std::vector<int32_t> uses(c.num_values(), 0);
  for (const Op& op : ops)
    for (ValueId in : op.inputs) ++uses[static_cast<size_t>(in)];
  for (ValueId o : outputs) uses[static_cast<size_t>(o)] += 1 << 20;  // protected
  // The op that overwrites a buffer version, for the rule that no read of a buffer's old
  // contents may move past the assign that overwrites it.
  std::vector<int32_t> assigned_at(c.num_values(), -1);
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].prim->side_effect) assigned_at[static_cast<size_t>(ops[i].inputs[0])] = static_cast<int32_t>(i);

  const std::vector<int32_t> matmuls_before = matmuls_before_each_op(c);  // kLargeValueBytes (below)

  std::vector<FusedOp> fused(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) fused[i] = {ops[i].params, ops[i].inputs, 0, false, ops[i].phase};
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!is_pointwise(ops[i])) continue;
    FusedOp& cons = fused[i];
    const ValueInfo& out = c.info(ops[i].outputs[0]);
    // Substituting a producer appends its inputs; keep scanning until no input qualifies.
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t k = 0; k < cons.inputs.size(); ++k) {
        const ValueId v = cons.inputs[k];
        const int32_t p = c.value(v).producer;
        if (p < 0 || !is_pointwise(ops[static_cast<size_t>(p)]) || fused[static_cast<size_t>(p)].removed) continue;
        int32_t refs = 0;
        for (ValueId in : cons.inputs) refs += in == v;
        if (uses[static_cast<size_t>(v)] != refs || c.info(v) != out) continue;
        FusedOp& prod = fused[static_cast<size_t>(p)];
        bool moves_past_assign = false;
        for (ValueId in : prod.inputs) {
          int32_t a = assigned_at[static_cast<size_t>(in)];
          moves_past_assign = moves_past_assign || (a > p && a < static_cast<int32_t>(i));
        }
        if (moves_past_assign) continue;
        // Absorbing the producer keeps its inputs live until the consumer (kLargeValueBytes).
        if (out.nbytes() >= kLargeValueBytes && matmuls_before[i] > matmuls_before[static_cast<size_t>(p) + 1])
          continue;
        // in_j of the producer's body -> the consumer's input holding the same value.
        std::vector<ScalarExp> prod_subs;
        for (ValueId pin : prod.inputs) {
          size_t at = 0;
          while (at < cons.inputs.size() && cons.inputs[at] != pin) ++at;
          if (at == cons.inputs.size()) cons.inputs.push_back(pin);
          prod_subs.push_back(se::in(static_cast<int>(at)));
        }
        ScalarExp inlined = prod.params.body.substitute(prod_subs);
        std::vector<ScalarExp> cons_subs;
        for (size_t j = 0; j < cons.inputs.size(); ++j)
          cons_subs.push_back(cons.inputs[j] == v ? inlined : se::in(static_cast<int>(j)));
        cons.params.body = cons.params.body.substitute(cons_subs);
        // Drop the absorbed value from the input list, renumbering the body.
        std::vector<ValueId> kept;
        std::vector<ScalarExp> renumber;
        for (ValueId in : cons.inputs) {
          renumber.push_back(in == v ? ScalarExp() : se::in(static_cast<int>(kept.size())));
          if (in != v) kept.push_back(in);
        }
        cons.params.body = cons.params.body.substitute(renumber);
        cons.inputs = std::move(kept);
        cons.absorbed += prod.absorbed + 1;
        cons.phase = std::max(cons.phase, prod.phase);
        prod.removed = true;
        changed = true;
        break;
      }
    }
  }

  Rebuild r(c);
  Circuit& out = r.out();
  bool folded = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (fused[i].removed) continue;
    std::vector<ValueId> outs;
    if (std::optional<Params> fill = folded_fill(c, ops[i], fused[i])) {
      outs = out.add_op(PrimId::fill, *fill, {}, ops[i].scope);
      folded = true;
    } else {
      outs = out.add_op(*ops[i].prim, fused[i].params, r.at(fused[i].inputs), ops[i].scope);
    }
    out.set_absorbed(out.ops().size() - 1, fused[i].absorbed);
    out.set_phase(out.ops().size() - 1, fused[i].phase);
    for (size_t k = 0; k < outs.size(); ++k) r.map(ops[i].outputs[k], outs[k]);
  }
  Circuit result = r.finish(outputs);
  return folded ? dce(result, outputs) : result;  // the fills folded away may be dead now
}

}  // namespace kiln
