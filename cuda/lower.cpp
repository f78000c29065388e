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
  r.alias_of = alias_input(op.prim->name);
  return r;
}

const std::map<std::string, Entry>& table() {
  static const std::map<std::string, Entry> t = {
      {"pointwise", {lower_pointwise, "elementwise kernel, body in f32, broadcasting as addressing"}},
      {"reduce", {lower_reduce, "rows: block per row (shuffles + shared); other axes: thread per output"}},
      {"reduce_all", {lower_reduce, "tree: block partials, then one block (no atomics)"}},
      {"matmul", {lower_matmul, "64x64x16 shared-memory tiles, 4x4 per thread, FFMA"}},
      {"fused_matmul",
       {lower_matmul, "the matmul kernel reading through views, prologues on load, epilogues on store"}},
      {"column_sums", {lower_column_sums, "thread per column, rows in order, one accumulator per body"}},
      {"gather_rows", {lower_gather, "thread per element, indices checked"}},
      {"gather_last", {lower_gather, "thread per output element, indices checked"}},
      {"scatter_add_rows", {lower_gather, "zero + f32 atomic adds, indices checked"}},
      {"one_hot", {lower_one_hot, "elementwise, indices checked"}},
      {"reshape", {lower_alias, "alias (no kernel)"}},
      {"permute", {lower_move, "copy with permuted strides"}},
      {"broadcast", {lower_move, "copy with zero strides"}},
      {"slice", {lower_move, "copy with offset addressing"}},
      {"concat", {lower_move, "one launch, each element read from its input"}},
      {"split", {lower_move, "one copy per piece"}},
      {"where", {lower_where, "elementwise select"}},
      {"cast", {lower_cast, "elementwise cvt"}},
      {"stop_gradient", {lower_alias, "alias (no kernel)"}},
      {"fill", {lower_constant, "elementwise constant"}},
      {"iota", {lower_constant, "elementwise index expression (s64)"}},
      {"random", {lower_random, "Philox4x32-10 in kernel IR, same bits"}},
      {"assign", {lower_alias, "commit copy after the step succeeds"}},
      {"fused_rows", {lower_fused_rows, "warp per row: reductions in registers, outputs in a last pass"}},
      {"multi_tensor", {lower_multi_tensor, "one launch over every group (block ranges per group); sums: partials"}},
  };
  return t;
}

}  // namespace

LoweredOp lower(const Circuit& c, int op_index) {
  const Op& op = c.ops().at(static_cast<size_t>(op_index));
  auto it = table().find(op.prim->name);
  if (it == table().end()) fail(op.prim->name, op.scope, "has no GPU lowering");
  require_gpu_dtypes(c, op);
  LoweredOp r = it->second.fn(c, op);
  if (r.summary.empty()) r.summary = it->second.summary;
  return r;
}

int alias_input(const std::string& prim) {
  if (prim == "assign") return 1;
  return prim == "reshape" || prim == "stop_gradient" ? 0 : -1;
}

std::string lowering_summary(const std::string& prim) {
  auto it = table().find(prim);
  return it == table().end() ? std::string() : it->second.summary;
}

}  // namespace kiln::cuda
