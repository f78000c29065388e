// Prim family `gather`: row gathers and their adjoints over integer indices.
//   gather_rows      table: (V, D), idx: i32 S -> S + (D)           (embedding lookup)
//   scatter_add_rows idx: i32 S, src: S + (D) -> (rows, D)          zeros, then src rows added at idx
//                    (params {rows} or {rows, ordered}: ordered asks the GPU for source order)
//   one_hot          idx: i32 S -> S + (depth), 1 at idx, 0 elsewhere (params ints {depth}, dtype)
//   gather_last      x: S + (V) float, idx: i32 S -> S + (1): x[s, idx[s]] (a target's logit;
//                    the kept axis lets per-row values combine with it and its gradient
//                    broadcast along the row with no reshape in between)
// An index outside [0, V) is an error naming the op, the index, its position and V.
// VJPs: gather_rows -> scatter_add_rows of g into the table; scatter_add_rows -> gather_rows of
// g for src; gather_last -> select(v == idx, g, 0) over S + (V) as one pointwise op (v an
// iota, idx cast to x's float type: exact below 2^24), so fusion folds it into its consumer
// and no one-hot is written; indices and one_hot have no gradient.
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

void check_index(const char* op, int32_t i, int64_t pos, int64_t limit) {
  if (i < 0 || i >= limit)
    throw Error(std::string("op '") + op + "': index " + std::to_string(i) + " at position " + std::to_string(pos) +
                " is out of range [0, " + std::to_string(limit) + ")");
}

Shape with_last(const Shape& s, int64_t d) {
  std::vector<int64_t> dims = s.dims();
  dims.push_back(d);
  return Shape(dims);
}

std::vector<ValueInfo> gather_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params&) {
  if (in.size() != 2) ctx.fail("takes (table, idx)");
  ctx.require_float(in[0], "table");
  ctx.require_dtype(in[1], DType::i32, "idx");
  if (in[0].shape.rank() != 2) ctx.fail("table must have rank 2 (V, D), received " + in[0].shape.str());
  return {{with_last(in[1].shape, in[0].shape[1]), in[0].dtype}};
}

std::vector<HostTensor> gather_eval(const Op&, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const HostTensor &table = *in[0], &idx = *in[1];
  int64_t v = table.shape()[0], d = table.shape()[1];
  HostTensor out = bufs.output(0);
  ref::dispatch_float(table.dtype(), "gather_rows", [&](auto t) {
    using T = decltype(t);
    for (int64_t p = 0; p < idx.numel(); ++p) {
      int32_t i = idx.data<int32_t>()[p];
      check_index("gather_rows", i, p, v);
      std::copy_n(table.data<T>() + i * d, d, out.data<T>() + p * d);
    }
  });
  return {out};
}

std::vector<ValueId> gather_vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  return {b.scatter_add_rows(op.inputs[1], g[0], b.info(op.inputs[0]).shape[0]), kNoValue};
}

std::vector<ValueInfo> scatter_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 2) ctx.fail("takes (idx, src)");
  ctx.require_dtype(in[0], DType::i32, "idx");
  ctx.require_float(in[1], "src");
  if (p.ints.empty() || p.ints.size() > 2 || p.ints[0] < 1 || (p.ints.size() == 2 && (p.ints[1] & ~1)))
    ctx.fail("params must be {rows >= 1} or {rows >= 1, ordered 0 or 1}");
  const Shape &is = in[0].shape, &ss = in[1].shape;
  if (ss.rank() != is.rank() + 1 || Shape(std::vector<int64_t>(ss.dims().begin(), ss.dims().end() - 1)) != is)
    ctx.fail("src must have shape idx + (D): idx " + is.str() + ", src " + ss.str());
  return {{Shape{p.ints[0], ss[ss.rank() - 1]}, in[1].dtype}};
}

std::vector<HostTensor> scatter_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const HostTensor &idx = *in[0], &src = *in[1];
  int64_t rows = op.params.ints[0], d = bufs.info(0).shape[1];
  HostTensor out = bufs.zeroed_output(0);
  ref::dispatch_float(src.dtype(), "scatter_add_rows", [&](auto t) {
    using T = decltype(t);
    for (int64_t p = 0; p < idx.numel(); ++p) {
      int32_t i = idx.data<int32_t>()[p];
      check_index("scatter_add_rows", i, p, rows);
      T* dst = out.data<T>() + i * d;
      const T* s = src.data<T>() + p * d;
      for (int64_t j = 0; j < d; ++j) dst[j] += s[j];
    }
  });
  return {out};
}

std::vector<ValueId> scatter_vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  return {kNoValue, b.gather_rows(g[0], op.inputs[0])};
}

std::vector<ValueInfo> one_hot_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 1) ctx.fail("takes (idx)");
  ctx.require_dtype(in[0], DType::i32, "idx");
  if (p.ints.size() != 1 || p.ints[0] < 1) ctx.fail("params must be {depth >= 1}");
  ctx.require_float({Shape{}, p.dtype}, "result dtype");
  return {{with_last(in[0].shape, p.ints[0]), p.dtype}};
}

std::vector<HostTensor> one_hot_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const HostTensor& idx = *in[0];
  int64_t depth = op.params.ints[0];
  HostTensor out = bufs.zeroed_output(0);
  ref::dispatch_float(out.dtype(), "one_hot", [&](auto t) {
    using T = decltype(t);
    for (int64_t p = 0; p < idx.numel(); ++p) {
      int32_t i = idx.data<int32_t>()[p];
      check_index("one_hot", i, p, depth);
      out.data<T>()[p * depth + i] = T(1);
    }
  });
  return {out};
}

std::vector<ValueInfo> gather_last_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params&) {
  if (in.size() != 2) ctx.fail("takes (x, idx)");
  ctx.require_float(in[0], "x");
  ctx.require_dtype(in[1], DType::i32, "idx");
  const Shape& xs = in[0].shape;
  if (xs.rank() < 1 || with_last(in[1].shape, xs[xs.rank() - 1]) != xs)
    ctx.fail("x must have shape idx + (V): x " + xs.str() + ", idx " + in[1].shape.str());
  if (xs[xs.rank() - 1] >= (int64_t{1} << 24))
    ctx.fail("the last axis has " + std::to_string(xs[xs.rank() - 1]) +
             " entries; at most 2^24 (indices compared as floats)");
  return {{with_last(in[1].shape, 1), in[0].dtype}};
}

std::vector<HostTensor> gather_last_eval(const Op&, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const HostTensor &x = *in[0], &idx = *in[1];
  const int64_t v = x.shape()[x.shape().rank() - 1];
  HostTensor out = bufs.output(0);
  ref::dispatch_float(x.dtype(), "gather_last", [&](auto t) {
    using T = decltype(t);
    for (int64_t p = 0; p < idx.numel(); ++p) {
      int32_t i = idx.data<int32_t>()[p];
      check_index("gather_last", i, p, v);
      out.data<T>()[p] = x.data<T>()[p * v + i];
    }
  });
  return {out};
}

std::vector<ValueId> gather_last_vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  const ValueInfo& x = b.info(op.inputs[0]);
  const int64_t v = x.shape[x.shape.rank() - 1];
  Shape row = b.info(op.inputs[1]).shape;
  std::vector<int64_t> column = row.dims();
  column.push_back(1);
  ValueId position = b.iota(Shape{v}, x.dtype, ix::coord(0));
  ValueId target = b.reshape(b.cast(op.inputs[1], x.dtype), Shape(column));
  return {b.pointwise(se::select(se::eq(se::in(0), se::in(1)), se::in(2), se::c(0.0)), {position, target, g[0]}),
          kNoValue};
}

}  // namespace

ScatterAddRowsParams ScatterAddRowsParams::of(const Op& op) {
  require_view_of(op, {PrimId::scatter_add_rows}, "ScatterAddRowsParams");
  return {op.params.ints.at(0), op.params.ints.size() == 2 && op.params.ints[1] == 1};
}

Params ScatterAddRowsParams::to_params() const {
  Params p;
  p.ints = {rows};
  if (ordered) p.ints.push_back(1);
  return p;
}

OneHotParams OneHotParams::of(const Op& op) {
  require_view_of(op, {PrimId::one_hot}, "OneHotParams");
  return {op.params.ints.at(0), op.params.dtype};
}

Params OneHotParams::to_params() const {
  Params p;
  p.ints = {depth};
  p.dtype = dtype;
  return p;
}

void register_gather(PrimRegistry& r) {
  PrimDef g;
  g.id = PrimId::gather_rows;
  g.shape = gather_shape;
  g.eval = gather_eval;
  g.vjp = gather_vjp;
  g.nondiff_inputs = {1};
  g.index_input = 1;
  r.add(g, __FILE__);

  PrimDef s;
  s.id = PrimId::scatter_add_rows;
  s.shape = scatter_shape;
  s.eval = scatter_eval;
  s.vjp = scatter_vjp;
  s.nondiff_inputs = {0};
  s.index_input = 0;
  s.describe = [](const Params& p) {
    return "rows=" + std::to_string(p.ints[0]) + (p.ints.size() == 2 && p.ints[1] ? " ordered" : "");
  };
  r.add(s, __FILE__);

  PrimDef gl;
  gl.id = PrimId::gather_last;
  gl.shape = gather_last_shape;
  gl.eval = gather_last_eval;
  gl.vjp = gather_last_vjp;
  gl.nondiff_inputs = {1};
  gl.index_input = 1;
  r.add(gl, __FILE__);

  PrimDef o;
  o.id = PrimId::one_hot;
  o.shape = one_hot_shape;
  o.eval = one_hot_eval;
  o.differentiable = false;
  o.nondiff_inputs = {0};
  o.index_input = 0;
  o.describe = [](const Params& p) { return "depth=" + std::to_string(p.ints[0]) + " " + dtype_name(p.dtype); };
  r.add(o, __FILE__);
}

}  // namespace kiln
