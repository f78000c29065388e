// absorb_padding (absorb_padding.hpp): zero columns concatenated after fused_rows outputs written
// by the op itself.
#include <algorithm>
#include <cmath>
#include <map>

#include <kiln/circuit/passes/absorb_padding.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {

namespace {

// True if v is all +0: a fill of +0 or a cast of one (the kernels' zero columns are +0).
bool is_zeros(const Circuit& c, ValueId v) {
  const int32_t producer = c.value(v).producer;
  if (producer >= 0 && c.ops()[static_cast<size_t>(producer)].is(PrimId::cast))
    return is_zeros(c, c.ops()[static_cast<size_t>(producer)].inputs[0]);
  const std::optional<FillParams> fill = FillParams::producing(c, v);
  return fill && fill->value == 0.0 && !std::signbit(fill->value);
}

// The output index in its fused_rows producer of the value that concat `op` pads, or -1 where
// the concat is not [row output, zeros] along the last axis or something else reads the output.
int padded_output(const Circuit& c, const Op& op, const std::vector<std::vector<int32_t>>& readers,
                  const std::vector<bool>& requested) {
  if (!op.is(PrimId::concat) || op.inputs.size() != 2) return -1;
  const ValueId rows = op.inputs[0];
  const int rank = c.info(rows).shape.rank();
  if (rank < 1 || ConcatParams::of(op).axis != rank - 1 || !is_zeros(c, op.inputs[1])) return -1;
  if (requested[static_cast<size_t>(rows)] || readers[static_cast<size_t>(rows)].size() != 1) return -1;
  const int32_t producer = c.value(rows).producer;
  if (producer < 0 || !c.ops()[static_cast<size_t>(producer)].is(PrimId::fused_rows)) return -1;
  const Op& p = c.ops()[static_cast<size_t>(producer)];
  const auto o = static_cast<size_t>(std::find(p.outputs.begin(), p.outputs.end(), rows) - p.outputs.begin());
  const RowProgram rp = RowProgram::from_params(p.params);
  return rp.output_per_row[o] || rp.padding(o) > 0 ? -1 : static_cast<int>(o);
}

}  // namespace

Circuit absorb_padding(const Circuit& c, std::vector<ValueId>& outputs) {
  const std::vector<std::vector<int32_t>> readers = value_readers(c);
  std::vector<bool> requested(c.num_values(), false);
  for (ValueId o : outputs) requested[static_cast<size_t>(o)] = true;
  // Per producing op (index), its padding concats (indices).
  std::map<int32_t, std::vector<int32_t>> concats_of;
  for (size_t i = 0; i < c.ops().size(); ++i)
    if (padded_output(c, c.ops()[i], readers, requested) >= 0)
      concats_of[c.value(c.ops()[i].inputs[0]).producer].push_back(static_cast<int32_t>(i));
  if (concats_of.empty()) return c;
  const std::vector<std::vector<int32_t>> groups = producer_groups(concats_of);
  auto merge = [&](size_t g) {
    const std::vector<int32_t>& group = groups[g];
    const Op& producer = c.ops()[static_cast<size_t>(group[0])];
    RowProgram rp = RowProgram::from_params(producer.params);
    rp.output_pad.resize(rp.output_bodies.size(), 0);
    // The op's outputs stay in place; a padded one stands for its concat's result.
    MergedOp m{PrimId::fused_rows, {}, producer.inputs, producer.outputs};
    for (size_t j = 1; j < group.size(); ++j) {
      const Op& concat = c.ops()[static_cast<size_t>(group[j])];
      const auto o = static_cast<size_t>(padded_output(c, concat, readers, requested));
      rp.output_pad[o] = c.info(concat.outputs[0]).shape.dims().back() - rp.n();
      m.replaces[o] = concat.outputs[0];
    }
    m.params = rp.to_params(producer.params.dtype);
    return m;
  };
  Circuit absorbed = contract_groups(c, groups, merge, outputs, "absorb_padding");
  return dce(absorbed, outputs);  // the zeros nothing reads now
}

}  // namespace kiln
