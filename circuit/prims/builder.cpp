// Builder helpers: each packs Params for one Prim and appends the op.
#include <kiln/circuit/prims/builder.hpp>

namespace kiln {

namespace {
// -1 is the last axis; an axis out of range is passed on unchanged so the shape rule's error
// shows the axis the caller gave.
int normalize(int axis, int rank) { return axis < 0 && axis >= -rank ? axis + rank : axis; }
}  // namespace

ValueId Builder::op(PrimId prim, Params params, std::vector<ValueId> inputs) {
  return c_.add_op(prim, std::move(params), std::move(inputs), scope_).at(0);
}

ValueId Builder::pointwise(const ScalarExp& body, std::vector<ValueId> inputs) {
  Params p;
  p.body = body;
  return op(PrimId::pointwise, std::move(p), std::move(inputs));
}

ValueId Builder::add(ValueId a, ValueId b) { return pointwise(se::in(0) + se::in(1), {a, b}); }
ValueId Builder::sub(ValueId a, ValueId b) { return pointwise(se::in(0) - se::in(1), {a, b}); }
ValueId Builder::mul(ValueId a, ValueId b) { return pointwise(se::in(0) * se::in(1), {a, b}); }
ValueId Builder::div(ValueId a, ValueId b) { return pointwise(se::in(0) / se::in(1), {a, b}); }
ValueId Builder::scale(ValueId a, double s) { return pointwise(se::in(0) * se::c(s), {a}); }

ValueId Builder::reduce(ReduceKind kind, ValueId x, int axis) {
  axis = normalize(axis, info(x).shape.rank());
  return op(PrimId::reduce, ReduceParams{kind, axis}.to_params(), {x});
}

ValueId Builder::reduce_all(ReduceKind kind, ValueId x) {
  return op(PrimId::reduce_all, ReduceParams{kind, -1}.to_params(), {x});
}

ValueId Builder::matmul(ValueId a, ValueId b, bool ta, bool tb) {
  return op(PrimId::matmul, MatmulParams{ta, tb}.to_params(), {a, b});
}

ValueId Builder::gather_rows(ValueId table, ValueId idx) { return op(PrimId::gather_rows, {}, {table, idx}); }

ValueId Builder::gather_last(ValueId x, ValueId idx) { return op(PrimId::gather_last, {}, {x, idx}); }

ValueId Builder::scatter_add_rows(ValueId idx, ValueId src, int64_t rows) {
  return op(PrimId::scatter_add_rows, ScatterAddRowsParams{rows, false}.to_params(), {idx, src});
}

ValueId Builder::one_hot(ValueId idx, int64_t depth, DType dtype) {
  return op(PrimId::one_hot, OneHotParams{depth, dtype}.to_params(), {idx});
}

ValueId Builder::reshape(ValueId x, const Shape& shape) {
  Params p;
  p.ints = shape.dims();
  return op(PrimId::reshape, std::move(p), {x});
}

ValueId Builder::permute(ValueId x, const std::vector<int64_t>& perm) {
  return op(PrimId::permute, PermuteParams{perm}.to_params(), {x});
}

ValueId Builder::transpose(ValueId x, int a, int b) {
  int r = info(x).shape.rank();
  a = info(x).shape.normalize_axis(a, "transpose");
  b = info(x).shape.normalize_axis(b, "transpose");
  std::vector<int64_t> perm(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) perm[static_cast<size_t>(i)] = i;
  std::swap(perm[static_cast<size_t>(a)], perm[static_cast<size_t>(b)]);
  return permute(x, perm);
}

ValueId Builder::broadcast(ValueId x, const Shape& shape) {
  Params p;
  p.ints = shape.dims();
  return op(PrimId::broadcast, std::move(p), {x});
}

ValueId Builder::slice(ValueId x, int axis, int64_t start, int64_t end) {
  axis = normalize(axis, info(x).shape.rank());
  return op(PrimId::slice, SliceParams{axis, start, end}.to_params(), {x});
}

ValueId Builder::concat(const std::vector<ValueId>& xs, int axis) {
  if (!xs.empty()) axis = normalize(axis, info(xs[0]).shape.rank());
  return op(PrimId::concat, ConcatParams{axis}.to_params(), xs);
}

std::vector<ValueId> Builder::split(ValueId x, int axis, const std::vector<int64_t>& sizes) {
  axis = normalize(axis, info(x).shape.rank());
  return c_.add_op(PrimId::split, SplitParams{axis, sizes}.to_params(), {x}, scope_);
}

ValueId Builder::where(ValueId cond, ValueId a, ValueId b) { return op(PrimId::where, {}, {cond, a, b}); }

ValueId Builder::cast(ValueId x, DType dtype) {
  Params p;
  p.dtype = dtype;
  return op(PrimId::cast, std::move(p), {x});
}

ValueId Builder::stop_gradient(ValueId x) { return op(PrimId::stop_gradient, {}, {x}); }

ValueId Builder::fill(const Shape& shape, DType dtype, double value) {
  return op(PrimId::fill, FillParams{shape, value, dtype}.to_params(), {});
}

ValueId Builder::iota(const Shape& shape, DType dtype, const IndexExp& index) {
  Params p;
  p.ints = shape.dims();
  p.dtype = dtype;
  p.index = index;
  return op(PrimId::iota, std::move(p), {});
}

ValueId Builder::random(RandomKind kind, const Shape& shape, DType dtype, ValueId key, ValueId offset, double prob) {
  return op(PrimId::random, RandomParams{kind, shape, prob, dtype}.to_params(), {key, offset});
}

ValueId Builder::assign(ValueId target, ValueId value) { return op(PrimId::assign, {}, {target, value}); }

}  // namespace kiln
