// Prim family `cast`: dtype conversion and the gradient barrier.
//   cast          x -> same shape, params dtype (float -> int truncates toward zero)
//   stop_gradient x -> x, with no gradient flowing back
// VJPs: a float cast casts g back to x's dtype; an integer input has no gradient;
// stop_gradient needs no rule, since its input is marked non-differentiable.
#include "circuit/ir/prim.hpp"
#include "circuit/prims/builder.hpp"
#include "circuit/prims/eigen_util.hpp"
#include "circuit/prims/families.hpp"

namespace kiln {
namespace {

std::vector<ValueInfo> cast_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 1) ctx.fail("takes one input");
  return {{in[0].shape, p.dtype}};
}

std::vector<HostTensor> cast_eval(const Op&, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  HostTensor out = bufs.output(0);
  ref::dispatch_any(in[0]->dtype(), "cast", [&](auto s) {
    using S = decltype(s);
    ref::dispatch_any(out.dtype(), "cast", [&](auto d) {
      using D = decltype(d);
      ref::array_of<D>(out) = ref::array_of<S>(*in[0]).template cast<D>();
    });
  });
  return {out};
}

std::vector<ValueId> cast_vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  DType src = b.info(op.inputs[0]).dtype;
  if (src == DType::i32 || op.params.dtype == DType::i32) return {kNoValue};
  return {b.cast(g[0], src)};
}

std::vector<ValueInfo> identity_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params&) {
  if (in.size() != 1) ctx.fail("takes one input");
  return {in[0]};
}

}  // namespace

void register_cast(PrimRegistry& r) {
  PrimDef c;
  c.id = PrimId::cast;
  c.shape = cast_shape;
  c.eval = cast_eval;
  c.vjp = cast_vjp;
  c.describe = [](const Params& p) { return std::string("to ") + dtype_name(p.dtype); };
  r.add(c, __FILE__);

  PrimDef s;
  s.id = PrimId::stop_gradient;
  s.shape = identity_shape;
  s.eval = [](const Op&, const std::vector<const HostTensor*>& in, EvalBuffers&) {
    return std::vector<HostTensor>{*in[0]};  // values are immutable: share the storage
  };
  s.output_aliases = 0;
  s.nondiff_inputs = {0};  // the barrier itself: no gradient reaches x
  s.differentiable = false;
  r.add(s, __FILE__);
}

}  // namespace kiln
