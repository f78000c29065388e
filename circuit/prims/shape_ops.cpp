// Prim family `shape_ops`: ops that only move elements.
//   reshape   x -> same elements, new shape (params ints = new dims, one may be -1)
//   permute   x: (d0, d1, ...) -> (d_perm[0], d_perm[1], ...) (params ints = perm)
//   broadcast x -> params shape, numpy rules (x must broadcast to exactly that shape)
// VJPs: reshape back; inverse permutation; broadcast passes g through and the reverse sweep
// sums it back to x's shape.
#include <numeric>

#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

std::vector<ValueInfo> reshape_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 1) ctx.fail("takes one input");
  std::vector<int64_t> dims = p.ints;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      if (infer >= 0) ctx.fail("at most one dim may be -1, received " + Shape(p.ints).str());
      infer = static_cast<int>(i);
    } else if (dims[i] < 0) {
      ctx.fail("negative dim in target shape " + Shape(p.ints).str());
    } else {
      known *= dims[i];
    }
  }
  int64_t n = in[0].shape.numel();
  if (infer >= 0) {
    if (known == 0 || n % known != 0)
      ctx.fail("cannot infer -1 in " + Shape(p.ints).str() + " for input " + in[0].shape.str());
    dims[static_cast<size_t>(infer)] = n / known;
    known = n;
  }
  if (known != n)
    ctx.fail("cannot reshape " + in[0].shape.str() + " (" + std::to_string(n) + " elements) to " + Shape(p.ints).str() +
             " (" + std::to_string(known) + " elements)");
  return {{Shape(dims), in[0].dtype}};
}

std::vector<HostTensor> reshape_eval(const Op&, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  return {in[0]->reshaped(bufs.info(0).shape)};  // values are immutable: share the storage
}

std::vector<ValueInfo> permute_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 1) ctx.fail("takes one input");
  const Shape& s = in[0].shape;
  std::vector<char> seen(static_cast<size_t>(s.rank()), 0);
  bool ok = static_cast<int>(p.ints.size()) == s.rank();
  for (int64_t a : p.ints) {
    if (!ok || a < 0 || a >= s.rank() || seen[static_cast<size_t>(a)]) {
      ok = false;
      break;
    }
    seen[static_cast<size_t>(a)] = 1;
  }
  if (!ok) ctx.fail("perm " + Shape(p.ints).str() + " is not a permutation of the axes of " + s.str());
  std::vector<int64_t> dims;
  for (int64_t a : p.ints) dims.push_back(s[static_cast<int>(a)]);
  return {{Shape(dims), in[0].dtype}};
}

std::vector<HostTensor> permute_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const HostTensor& x = *in[0];
  HostTensor out = bufs.output(0);
  const Shape& os = out.shape();
  std::vector<int64_t> xs = x.shape().strides(), st(op.params.ints.size());
  for (size_t i = 0; i < st.size(); ++i) st[i] = xs[static_cast<size_t>(op.params.ints[i])];
  ref::dispatch_movable(x.dtype(), "permute", [&](auto t) {
    using T = decltype(t);
    const T* src = x.data<T>();
    T* dst = out.data<T>();
    if (os.numel() == 0) return;
    // Rows along the output's last axis: contiguous copies when that axis stays last (the
    // head split and merge of attention), strided otherwise.
    const int r = os.rank();
    const int64_t inner = r ? os[r - 1] : 1, inner_stride = r ? st[static_cast<size_t>(r - 1)] : 1;
    std::vector<int64_t> idx(static_cast<size_t>(std::max(r - 1, 0)), 0);
    for (int64_t base = 0; base < os.numel(); base += inner) {
      int64_t off = 0;
      for (int a = 0; a < r - 1; ++a) off += idx[static_cast<size_t>(a)] * st[static_cast<size_t>(a)];
      if (inner_stride == 1)
        std::copy_n(src + off, inner, dst + base);
      else
        for (int64_t j = 0; j < inner; ++j) dst[base + j] = src[off + j * inner_stride];
      for (int a = r - 2; a >= 0; --a) {
        if (++idx[static_cast<size_t>(a)] < os[a]) break;
        idx[static_cast<size_t>(a)] = 0;
      }
    }
  });
  return {out};
}

std::vector<ValueId> permute_vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  std::vector<int64_t> inv(op.params.ints.size());
  for (size_t i = 0; i < inv.size(); ++i) inv[static_cast<size_t>(op.params.ints[i])] = static_cast<int64_t>(i);
  return {b.permute(g[0], inv)};
}

std::vector<ValueInfo> broadcast_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 1) ctx.fail("takes one input");
  ctx.require_dims(p.ints, "target shape");
  Shape target(p.ints);
  bool ok = in[0].shape.rank() <= target.rank();
  for (int i = 0; ok && i < in[0].shape.rank(); ++i) {
    int64_t d = in[0].shape[i], t = target[target.rank() - in[0].shape.rank() + i];
    ok = d == t || d == 1;
  }
  if (!ok) ctx.fail("cannot broadcast " + in[0].shape.str() + " to " + target.str());
  return {{target, in[0].dtype}};
}

std::vector<HostTensor> broadcast_eval(const Op&, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  HostTensor out = bufs.output(0);
  ref::broadcast_into(*in[0], out);
  return {out};
}

}  // namespace

PermuteParams PermuteParams::of(const Op& op) {
  require_view_of(op, {PrimId::permute}, "PermuteParams");
  return {op.params.ints};
}

Params PermuteParams::to_params() const {
  Params p;
  p.ints = perm;
  return p;
}

void register_shape_ops(PrimRegistry& r) {
  auto dims = [](const Params& p) { return Shape(p.ints).str(); };
  PrimDef rs;
  rs.id = PrimId::reshape;
  rs.shape = reshape_shape;
  rs.eval = reshape_eval;
  rs.output_aliases = 0;
  rs.vjp = [](Builder& b, const Op& op, const std::vector<ValueId>& g) {
    return std::vector<ValueId>{b.reshape(g[0], b.info(op.inputs[0]).shape)};
  };
  rs.describe = dims;
  r.add(rs, __FILE__);

  PrimDef pm;
  pm.id = PrimId::permute;
  pm.shape = permute_shape;
  pm.eval = permute_eval;
  pm.vjp = permute_vjp;
  pm.describe = dims;
  r.add(pm, __FILE__);

  PrimDef bc;
  bc.id = PrimId::broadcast;
  bc.shape = broadcast_shape;
  bc.eval = broadcast_eval;
  bc.vjp = [](Builder&, const Op&, const std::vector<ValueId>& g) { return std::vector<ValueId>{g[0]}; };
  bc.describe = dims;
  r.add(bc, __FILE__);
}

}  // namespace kiln
