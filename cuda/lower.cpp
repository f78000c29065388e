// Lowering dispatch: which lowering each Prim takes, and the one-line description `kiln prims`
// shows for it.
#include "cuda/lower.hpp"

#include <map>

#include "circuit/error.hpp"
#include "cuda/lower_elementwise.hpp"

namespace kiln::cuda {

namespace {

using LowerFn = LoweredOp (*)(const Circuit& c, const Op& op);

struct Entry {
  LowerFn fn;  // nullptr: output 0 aliases an input, no kernel
  const char* summary;
};

LoweredOp lower_alias(const Circuit&, const Op& op) {
  LoweredOp r;
  r.alias_of = alias_input(op.prim->id);
  return r;
}

const std::map<PrimId, Entry>& table() {
  static const std::map<PrimId, Entry> t = {
      {PrimId::pointwise, {lower_pointwise, "elementwise kernel, body in f32, broadcasting as addressing"}},
      {PrimId::reduce, {lower_reduce, "rows: block per row (shuffles + shared); other axes: thread per output"}},
      {PrimId::reduce_all, {lower_reduce, "tree: block partials, then one block (no atomics)"}},
      {PrimId::matmul, {lower_matmul, "64x64x16 shared-memory tiles, 4x4 per thread, FFMA"}},
      {PrimId::fused_matmul,
       {lower_matmul, "the matmul kernel reading through views, prologues on load, epilogues on store"}},
      {PrimId::column_sums, {lower_column_sums, "thread per column, rows in order, one accumulator per body"}},
      {PrimId::gather_rows, {lower_gather, "thread per element, indices checked"}},
      {PrimId::gather_last, {lower_gather, "thread per output element, indices checked"}},
      {PrimId::scatter_add_rows, {lower_gather, "zero + f32 atomic adds, indices checked"}},
      {PrimId::one_hot, {lower_one_hot, "elementwise, indices checked"}},
      {PrimId::reshape, {lower_alias, "alias (no kernel)"}},
      {PrimId::permute, {lower_move, "copy with permuted strides"}},
      {PrimId::broadcast, {lower_move, "copy with zero strides"}},
      {PrimId::slice, {lower_move, "copy with offset addressing"}},
      {PrimId::concat, {lower_move, "one launch, each element read from its input"}},
      {PrimId::split, {lower_move, "one copy per piece"}},
      {PrimId::where, {lower_where, "elementwise select"}},
      {PrimId::cast, {lower_cast, "elementwise cvt"}},
      {PrimId::stop_gradient, {lower_alias, "alias (no kernel)"}},
      {PrimId::fill, {lower_constant, "elementwise constant"}},
      {PrimId::iota, {lower_constant, "elementwise index expression (s64)"}},
      {PrimId::random, {lower_random, "Philox4x32-10 in kernel IR, same bits"}},
      {PrimId::assign, {lower_alias, "commit copy after the step succeeds"}},
      {PrimId::fused_rows, {lower_fused_rows, "warp per row: reductions in registers, outputs in a last pass"}},
      {PrimId::multi_tensor,
       {lower_multi_tensor, "one launch over every group (block ranges per group); sums: partials"}},
  };
  return t;
}

}  // namespace

LoweredOp lower(const Circuit& c, int op_index) {
  const Op& op = c.ops().at(static_cast<size_t>(op_index));
  auto it = table().find(op.prim->id);
  if (it == table().end()) fail(op.prim->name, op.scope, "has no GPU lowering");
  require_gpu_dtypes(c, op);
  LoweredOp r = it->second.fn(c, op);
  if (r.summary.empty()) r.summary = it->second.summary;
  return r;
}

int alias_input(PrimId prim) {
  if (prim == PrimId::assign) return 1;
  return prim == PrimId::reshape || prim == PrimId::stop_gradient ? 0 : -1;
}

std::string lowering_summary(PrimId prim) {
  auto it = table().find(prim);
  return it == table().end() ? std::string() : it->second.summary;
}

}  // namespace kiln::cuda
