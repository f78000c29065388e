// Prim family `cast`: dtype conversion and the gradient barrier.
//   cast          x -> same shape, params dtype (float -> int truncates toward zero)
//   stop_gradient x -> x, with no gradient flowing back
// VJPs: a float cast casts g back to x's gradient dtype; an integer input has no gradient;
// stop_gradient needs no rule, since its input is marked non-differentiable.
#include <type_traits>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>

namespace kiln {
namespace {

std::vector<ValueInfo> cast_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 1) ctx.fail("takes one input");
  return {{in[0].shape, p.dtype}};
}

// Element-wise conversion from S to D; bf16 goes through f32 (exact one way, rounded to nearest
// even the other, as cvt.rn.bf16.f32 rounds), so i32 and f64 -> bf16 round twice: the GPU
// lowering converts i32 through f32 too (it runs no f64).
template <class D, class S>
D convert(S v) {
  if constexpr (std::is_same_v<S, Bf16> && std::is_same_v<D, Bf16>)
    return v;
  else if constexpr (std::is_same_v<S, Bf16>)
    return static_cast<D>(bf16_to_f32(v));
  else if constexpr (std::is_same_v<D, Bf16>)
    return f32_to_bf16(static_cast<float>(v));
  else
    return static_cast<D>(v);
}

std::vector<HostTensor> cast_eval(const Op&, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  HostTensor out = bufs.output(0);
  ref::dispatch_movable(in[0]->dtype(), "cast", [&](auto s) {
    using S = decltype(s);
    ref::dispatch_movable(out.dtype(), "cast", [&](auto d) {
      using D = decltype(d);
      const S* src = in[0]->data<S>();
      D* dst = out.data<D>();
      const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) dst[i] = convert<D>(src[i]);
    });
  });
  return {out};
}

// The gradient goes back in x's gradient dtype (f32 for a bf16 x: nothing to convert).
std::vector<ValueId> cast_vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  DType src = b.info(op.inputs[0]).dtype;
  if (src == DType::i32 || op.params.dtype == DType::i32) return {kNoValue};
  const DType want = gradient_dtype(src);
  return {b.info(g[0]).dtype == want ? g[0] : b.cast(g[0], want)};
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
