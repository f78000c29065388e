// Prim family `slice_concat`: contiguous slices along an axis and their inverse.
//   slice  x: (..., n, ...) -> (..., end - start, ...)  params ints {axis, start, end}, 0 <= start <= end <= n
//   concat xs: (..., n_i, ...) -> (..., sum n_i, ...)    params ints {axis}; other dims and dtype equal
//   split  x: (..., sum n_i, ...) -> pieces (..., n_i, ...)  params ints {axis, n_0, n_1, ...}
// VJPs: slice -> concat of zeros around g; concat -> the matching slice of g for each input;
// split -> one concat of the pieces' gradients (zeros for pieces that get none), where
// separate slices would each pad with zeros and the sweep would add the padded copies.
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

// A tensor viewed as [outer, n * inner] rows around `axis`.
struct AxisView {
  int64_t outer = 1, inner = 1;
  AxisView(const Shape& s, int axis) {
    for (int a = 0; a < axis; ++a) outer *= s[a];
    for (int a = axis + 1; a < s.rank(); ++a) inner *= s[a];
  }
};

std::vector<ValueInfo> slice_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 1) ctx.fail("takes one input");
  if (p.ints.size() != 3) ctx.fail("params must be {axis, start, end}");
  const Shape& s = in[0].shape;
  int64_t axis = p.ints[0], start = p.ints[1], end = p.ints[2];
  if (axis < 0 || axis >= s.rank()) ctx.fail("axis " + std::to_string(axis) + " out of range for " + s.str());
  int64_t n = s[static_cast<int>(axis)];
  if (start < 0 || start > end || end > n)
    ctx.fail("range [" + std::to_string(start) + ", " + std::to_string(end) + ") is not inside [0, " +
             std::to_string(n) + "] of axis " + std::to_string(axis) + " of " + s.str());
  Shape out = s;
  out[static_cast<int>(axis)] = end - start;
  return {{out, in[0].dtype}};
}

std::vector<HostTensor> slice_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const HostTensor& x = *in[0];
  int axis = static_cast<int>(op.params.ints[0]);
  int64_t start = op.params.ints[1], n = x.shape()[axis], m = bufs.info(0).shape[axis];
  AxisView v(x.shape(), axis);
  HostTensor out = bufs.output(0);
  ref::dispatch_movable(x.dtype(), "slice", [&](auto t) {
    using T = decltype(t);
    for (int64_t o = 0; o < v.outer; ++o)
      std::copy_n(x.data<T>() + (o * n + start) * v.inner, m * v.inner, out.data<T>() + o * m * v.inner);
  });
  return {out};
}

std::vector<ValueId> slice_vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  const ValueInfo& x = b.info(op.inputs[0]);
  int axis = static_cast<int>(op.params.ints[0]);
  int64_t start = op.params.ints[1], end = op.params.ints[2], n = x.shape[axis];
  std::vector<ValueId> parts;
  auto zeros = [&](int64_t len) {
    Shape s = x.shape;
    s[axis] = len;
    return b.fill(s, gradient_dtype(x.dtype), 0.0);
  };
  if (start > 0) parts.push_back(zeros(start));
  parts.push_back(g[0]);
  if (end < n) parts.push_back(zeros(n - end));
  return {parts.size() == 1 ? g[0] : b.concat(parts, axis)};
}

std::vector<ValueInfo> concat_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.empty()) ctx.fail("needs at least one input");
  if (p.ints.size() != 1) ctx.fail("params must be {axis}");
  const Shape& s0 = in[0].shape;
  int64_t axis = p.ints[0];
  if (axis < 0 || axis >= s0.rank()) ctx.fail("axis " + std::to_string(axis) + " out of range for " + s0.str());
  Shape out = s0;
  out[static_cast<int>(axis)] = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const Shape& s = in[i].shape;
    bool ok = s.rank() == s0.rank() && in[i].dtype == in[0].dtype;
    for (int a = 0; ok && a < s.rank(); ++a) ok = a == axis || s[a] == s0[a];
    if (!ok)
      ctx.fail("input " + std::to_string(i) + " " + dtype_name(in[i].dtype) + s.str() + " does not match input 0 " +
               dtype_name(in[0].dtype) + s0.str() + " outside axis " + std::to_string(axis));
    out[static_cast<int>(axis)] += s[static_cast<int>(axis)];
  }
  return {{out, in[0].dtype}};
}

std::vector<HostTensor> concat_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  int axis = static_cast<int>(op.params.ints[0]);
  HostTensor out = bufs.output(0);
  AxisView v(out.shape(), axis);
  int64_t total = out.shape()[axis];
  ref::dispatch_movable(out.dtype(), "concat", [&](auto t) {
    using T = decltype(t);
    int64_t at = 0;
    for (const HostTensor* x : in) {
      int64_t m = x->shape()[axis];
      for (int64_t o = 0; o < v.outer; ++o)
        std::copy_n(x->data<T>() + o * m * v.inner, m * v.inner, out.data<T>() + (o * total + at) * v.inner);
      at += m;
    }
  });
  return {out};
}

std::vector<ValueId> concat_vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  int axis = static_cast<int>(op.params.ints[0]);
  std::vector<ValueId> grads;
  int64_t at = 0;
  for (ValueId x : op.inputs) {
    int64_t m = b.info(x).shape[axis];
    grads.push_back(b.slice(g[0], axis, at, at + m));
    at += m;
  }
  return grads;
}

std::vector<ValueInfo> split_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 1) ctx.fail("takes one input");
  if (p.ints.size() < 2) ctx.fail("params must be {axis, n_0, n_1, ...}");
  const Shape& s = in[0].shape;
  int64_t axis = p.ints[0], total = 0;
  if (axis < 0 || axis >= s.rank()) ctx.fail("axis " + std::to_string(axis) + " out of range for " + s.str());
  std::vector<ValueInfo> out;
  for (size_t i = 1; i < p.ints.size(); ++i) {
    if (p.ints[i] < 0) ctx.fail("negative piece size in " + Shape(p.ints).str());
    Shape piece = s;
    piece[static_cast<int>(axis)] = p.ints[i];
    out.push_back({piece, in[0].dtype});
    total += p.ints[i];
  }
  if (total != s[static_cast<int>(axis)])
    ctx.fail("pieces sum to " + std::to_string(total) + " but axis " + std::to_string(axis) + " of " + s.str() +
             " has " + std::to_string(s[static_cast<int>(axis)]));
  return out;
}

std::vector<HostTensor> split_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const HostTensor& x = *in[0];
  int axis = static_cast<int>(op.params.ints[0]);
  int64_t n = x.shape()[axis], at = 0;
  AxisView v(x.shape(), axis);
  std::vector<HostTensor> outs;
  for (size_t k = 0; k < bufs.size(); ++k) {
    const ValueInfo& info = bufs.info(k);
    HostTensor o = bufs.output(k);
    int64_t m = info.shape[axis];
    ref::dispatch_movable(x.dtype(), "split", [&](auto t) {
      using T = decltype(t);
      for (int64_t r = 0; r < v.outer; ++r)
        std::copy_n(x.data<T>() + (r * n + at) * v.inner, m * v.inner, o.data<T>() + r * m * v.inner);
    });
    at += m;
    outs.push_back(std::move(o));
  }
  return outs;
}

std::vector<ValueId> split_vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  std::vector<ValueId> parts;
  for (size_t i = 0; i < op.outputs.size(); ++i) {
    const ValueInfo& piece = b.info(op.outputs[i]);
    parts.push_back(g[i] != kNoValue ? g[i] : b.fill(piece.shape, gradient_dtype(piece.dtype), 0.0));
  }
  return {parts.size() == 1 ? parts[0] : b.concat(parts, static_cast<int>(op.params.ints[0]))};
}

}  // namespace

SliceParams SliceParams::of(const Op& op) {
  require_view_of(op, {PrimId::slice}, "SliceParams");
  return {static_cast<int>(op.params.ints.at(0)), op.params.ints.at(1), op.params.ints.at(2)};
}

Params SliceParams::to_params() const {
  Params p;
  p.ints = {axis, start, end};
  return p;
}

ConcatParams ConcatParams::of(const Op& op) {
  require_view_of(op, {PrimId::concat}, "ConcatParams");
  return {static_cast<int>(op.params.ints.at(0))};
}

Params ConcatParams::to_params() const {
  Params p;
  p.ints = {axis};
  return p;
}

SplitParams SplitParams::of(const Op& op) {
  require_view_of(op, {PrimId::split}, "SplitParams");
  return {static_cast<int>(op.params.ints.at(0)),
          std::vector<int64_t>(op.params.ints.begin() + 1, op.params.ints.end())};
}

Params SplitParams::to_params() const {
  Params p;
  p.ints = {axis};
  p.ints.insert(p.ints.end(), sizes.begin(), sizes.end());
  return p;
}

void register_slice_concat(PrimRegistry& r) {
  PrimDef s;
  s.id = PrimId::slice;
  s.shape = slice_shape;
  s.eval = slice_eval;
  s.vjp = slice_vjp;
  s.describe = [](const Params& p) {
    return "axis=" + std::to_string(p.ints[0]) + " [" + std::to_string(p.ints[1]) + ":" + std::to_string(p.ints[2]) +
           "]";
  };
  r.add(s, __FILE__);

  PrimDef c;
  c.id = PrimId::concat;
  c.shape = concat_shape;
  c.eval = concat_eval;
  c.vjp = concat_vjp;
  c.describe = [](const Params& p) { return "axis=" + std::to_string(p.ints[0]); };
  r.add(c, __FILE__);

  PrimDef sp;
  sp.id = PrimId::split;
  sp.shape = split_shape;
  sp.eval = split_eval;
  sp.vjp = split_vjp;
  sp.describe = [](const Params& p) {
    return "axis=" + std::to_string(p.ints[0]) + " " +
           Shape(std::vector<int64_t>(p.ints.begin() + 1, p.ints.end())).str();
  };
  r.add(sp, __FILE__);
}

}  // namespace kiln
