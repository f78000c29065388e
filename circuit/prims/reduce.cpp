// Prim family `reduce`: reductions along one axis (sum, max, mean; the axis is kept as a dim
// of 1) and over all axes (`reduce_all`: sum or mean to a scalar of shape []).
// Shape contracts: reduce x: (..., n, ...) -> (..., 1, ...); reduce_all x: any -> [].
// VJPs return gradients of the output's shape or a mask-weighted one; the reverse sweep
// broadcasts them back to the input's shape. Max sends the gradient to every maximal element
// in equal parts (ties split, as torch.amax).
#include <cmath>
#include <limits>

#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

std::vector<ValueInfo> reduce_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 1) ctx.fail("takes one input");
  ctx.require_float(in[0], "input");
  if (in[0].shape.rank() == 0) ctx.fail("cannot reduce along an axis of a scalar; use reduce_all");
  if (p.ints.size() != 2 || p.ints[0] < 0 || p.ints[0] > 2) ctx.fail("params must be {kind, axis}");
  int axis = static_cast<int>(p.ints[1]);
  if (axis < 0 || axis >= in[0].shape.rank())
    ctx.fail("axis " + std::to_string(axis) + " is out of range for an input of shape " + in[0].shape.str() +
             " (axes run from " + std::to_string(-in[0].shape.rank()) + " to " +
             std::to_string(in[0].shape.rank() - 1) + ")");
  Shape out = in[0].shape;
  out[axis] = 1;
  return {{out, in[0].dtype}};
}

// x viewed as [outer, n, inner]; out as [outer, inner].
template <class T>
void reduce_axis(const T* x, T* out, int64_t outer, int64_t n, int64_t inner, ReduceKind kind) {
  for (int64_t o = 0; o < outer; ++o) {
    T* dst = out + o * inner;
    const T* src = x + o * n * inner;
    std::fill(dst, dst + inner, reduce_identity<T>(kind));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) dst[j] = reduce_combine(kind, dst[j], src[i * inner + j]);
    for (int64_t j = 0; j < inner; ++j) dst[j] = reduce_finish(kind, dst[j], n);
  }
}

std::vector<HostTensor> reduce_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const HostTensor& x = *in[0];
  auto kind = static_cast<ReduceKind>(op.params.ints[0]);
  int axis = static_cast<int>(op.params.ints[1]);
  int64_t outer = 1, inner = 1, n = x.shape()[axis];
  for (int a = 0; a < axis; ++a) outer *= x.shape()[a];
  for (int a = axis + 1; a < x.shape().rank(); ++a) inner *= x.shape()[a];
  HostTensor out = bufs.output(0);
  ref::dispatch_float(x.dtype(), "reduce", [&](auto t) {
    using T = decltype(t);
    if (inner == 1 && n > 0) {
      // Rows are contiguous: Eigen reduces each column of the [n, outer] column-major view.
      Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic>> m(x.data<T>(), n, outer);
      Eigen::Map<ref::Arr<T>> o(out.data<T>(), outer);
      if (kind == ReduceKind::Max) {
        for (int64_t r = 0; r < outer; ++r)
          o[r] = Eigen::Map<const ref::Arr<T>>(x.data<T>() + r * n, n).template maxCoeff<Eigen::PropagateNaN>();
      } else {
        o = m.colwise().sum().transpose();
      }
      o = o.unaryExpr([&](T v) { return reduce_finish(kind, v, n); });
    } else {
      reduce_axis<T>(x.data<T>(), out.data<T>(), outer, n, inner, kind);
    }
  });
  return {out};
}

std::vector<ValueId> reduce_vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  auto kind = static_cast<ReduceKind>(op.params.ints[0]);
  int axis = static_cast<int>(op.params.ints[1]);
  ValueId x = op.inputs[0];
  switch (kind) {
    case ReduceKind::Sum: return {g[0]};
    case ReduceKind::Mean: return {b.scale(g[0], 1.0 / static_cast<double>(b.info(x).shape[axis]))};
    case ReduceKind::Max: {
      ValueId mask = b.pointwise(se::eq(se::in(0), se::in(1)), {x, op.outputs[0]});
      ValueId count = b.reduce(ReduceKind::Sum, mask, axis);
      return {b.pointwise(se::in(0) * se::in(1) / se::in(2), {g[0], mask, count})};
    }
  }
  return {kNoValue};
}

std::vector<ValueInfo> reduce_all_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 1) ctx.fail("takes one input");
  ctx.require_float(in[0], "input");
  if (p.ints.size() != 1 || (p.ints[0] != 0 && p.ints[0] != 2)) ctx.fail("params must be {kind} with kind sum or mean");
  return {{Shape{}, in[0].dtype}};
}

std::vector<HostTensor> reduce_all_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  HostTensor out = bufs.output(0);
  ref::dispatch_float(in[0]->dtype(), "reduce_all", [&](auto t) {
    using T = decltype(t);
    T s = ref::array_of<T>(*in[0]).sum();
    s = reduce_finish(static_cast<ReduceKind>(op.params.ints[0]), s, in[0]->numel());
    out.data<T>()[0] = s;
  });
  return {out};
}

std::vector<ValueId> reduce_all_vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  if (static_cast<ReduceKind>(op.params.ints[0]) == ReduceKind::Sum) return {g[0]};
  return {b.scale(g[0], 1.0 / static_cast<double>(b.info(op.inputs[0]).shape.numel()))};
}

}  // namespace

ReduceParams ReduceParams::of(const Op& op) {
  require_view_of(op, {PrimId::reduce, PrimId::reduce_all}, "ReduceParams");
  return {static_cast<ReduceKind>(op.params.ints.at(0)),
          op.is(PrimId::reduce) ? static_cast<int>(op.params.ints.at(1)) : -1};
}

bool ReduceParams::is_sum_along(const Op& op, int axis) {
  if (!op.is(PrimId::reduce)) return false;
  const ReduceParams rp = of(op);
  return rp.kind == ReduceKind::Sum && rp.axis == axis;
}

Params ReduceParams::to_params() const {
  Params p;
  p.ints = {static_cast<int64_t>(kind)};
  if (axis >= 0) p.ints.push_back(axis);
  return p;
}

void register_reduce(PrimRegistry& r) {
  PrimDef d;
  d.id = PrimId::reduce;
  d.shape = reduce_shape;
  d.eval = reduce_eval;
  d.vjp = reduce_vjp;
  d.describe = [](const Params& p) {
    return std::string(reduce_kind_name(static_cast<ReduceKind>(p.ints[0]))) + " axis=" + std::to_string(p.ints[1]);
  };
  r.add(d, __FILE__);

  PrimDef all;
  all.id = PrimId::reduce_all;
  all.shape = reduce_all_shape;
  all.eval = reduce_all_eval;
  all.vjp = reduce_all_vjp;
  all.describe = [](const Params& p) { return std::string(reduce_kind_name(static_cast<ReduceKind>(p.ints[0]))); };
  r.add(all, __FILE__);
}

const char* reduce_kind_name(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::Sum: return "sum";
    case ReduceKind::Max: return "max";
    case ReduceKind::Mean: return "mean";
  }
  return "?";
}

}  // namespace kiln
