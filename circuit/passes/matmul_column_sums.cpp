// matmul_column_sums (matmul_column_sums.hpp): column sums of matmul epilogues as block sums the
// matmul kernel writes.
#include <algorithm>
#include <map>

#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/passes/matmul_column_sums.hpp>
#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {

namespace {

// The epilogue index in its fused_matmul producer of the value column_sums op `op` sums, or -1
// where the op is not one plain sum of such an epilogue (f32, logical layout, no row or block
// sums, not stored as bf16).
int summed_epilogue(const Circuit& c, const Op& op) {
  if (!op.is(PrimId::column_sums) || op.inputs.size() != 1) return -1;
  const ColumnSumsParams cp = ColumnSumsParams::of(op);
  if (cp.bodies.size() != 1 || cp.bodies[0] != se::in(0) || cp.dtype != DType::f32) return -1;
  const ValueId x = op.inputs[0];
  const int32_t producer = c.value(x).producer;
  if (producer < 0 || !c.ops()[static_cast<size_t>(producer)].is(PrimId::fused_matmul)) return -1;
  const Op& p = c.ops()[static_cast<size_t>(producer)];
  if (p.params.dtype != DType::f32) return -1;
  const FusedMatmul f = FusedMatmul::from_params(p.params);
  const auto r = static_cast<size_t>(std::find(p.outputs.begin(), p.outputs.end(), x) - p.outputs.begin());
  if (f.a_row_sums || f.block_sums || r >= f.epilogues.size() || f.stored_bf16(r)) return -1;
  // The logical layout: (batch..., m, n) row-major, which the domain covers as it is.
  std::vector<int64_t> contiguous(f.batch.size());
  int64_t stride = f.m * f.n;
  for (size_t d = f.batch.size(); d-- > 0;) {
    contiguous[d] = f.batch[d] == 1 ? f.out_batch[d] : stride;
    stride *= f.batch[d];
  }
  if (f.out_shape != f.logical() || f.out_row != f.n || f.out_col != 1 || f.out_batch != contiguous ||
      cp.domain != c.info(x).shape)
    return -1;
  return static_cast<int>(r);
}

}  // namespace

Circuit matmul_column_sums(const Circuit& c, std::vector<ValueId>& outputs) {
  std::map<int32_t, int32_t> sums_of;  // fused_matmul op -> the column_sums op it takes (the first)
  for (size_t i = 0; i < c.ops().size(); ++i)
    if (summed_epilogue(c, c.ops()[i]) >= 0)
      sums_of.emplace(c.value(c.ops()[i].inputs[0]).producer, static_cast<int32_t>(i));
  if (sums_of.empty()) return c;
  const std::vector<std::vector<int32_t>> readers = value_readers(c);
  std::vector<bool> requested(c.num_values(), false);
  for (ValueId o : outputs) requested[static_cast<size_t>(o)] = true;
  std::map<int32_t, ValueId> block_sums;  // column_sums op -> the block sums it now reads (new ids)
  Rebuild r(c);
  for (size_t i = 0; i < c.ops().size(); ++i) {
    const Op& op = c.ops()[i];
    if (auto it = sums_of.find(static_cast<int32_t>(i)); it != sums_of.end()) {
      const Op& sums = c.ops()[static_cast<size_t>(it->second)];
      const auto e = static_cast<size_t>(summed_epilogue(c, sums));
      const ValueId x = op.outputs[e];
      FusedMatmul f = FusedMatmul::from_params(op.params);
      f.block_sums = true;
      f.block_sums_body = f.epilogues[e];
      // Dropped where nothing else reads it, unless it is the only epilogue (an op has one).
      const bool keep =
          requested[static_cast<size_t>(x)] || readers[static_cast<size_t>(x)].size() > 1 || f.epilogues.size() == 1;
      std::vector<ValueId> kept = op.outputs;  // the old outputs the new op's outputs stand for, in order
      if (!keep) {
        f.epilogues.erase(f.epilogues.begin() + static_cast<std::ptrdiff_t>(e));
        if (e < f.epilogue_bf16.size()) f.epilogue_bf16.erase(f.epilogue_bf16.begin() + static_cast<std::ptrdiff_t>(e));
        kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(e));
      }
      const std::vector<ValueId> outs = r.emit(op, f.to_params(DType::f32), r.at(op.inputs));
      for (size_t k = 0; k < kept.size(); ++k) r.map(kept[k], outs[k]);
      block_sums[it->second] = outs.back();
      continue;
    }
    if (auto it = block_sums.find(static_cast<int32_t>(i)); it != block_sums.end()) {
      ColumnSumsParams cp = ColumnSumsParams::of(op);
      cp.domain = r.out().info(it->second).shape;
      r.map(op.outputs[0], r.emit(op, cp.to_params(), {it->second})[0]);
      continue;
    }
    r.copy(op);
  }
  Circuit summed = r.finish(outputs);
  return dce(summed, outputs);
}

}  // namespace kiln
