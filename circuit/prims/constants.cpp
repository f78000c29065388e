// Prim family `constants`: ops without inputs.
//   fill  -> params shape (ints), every element params reals[0], params dtype
//   iota  -> params shape (ints), element at coords = params index(coords) as params dtype
//            (positions: index = i_axis; causal masks: index = ge(i0, i1))
// Neither has inputs, so neither needs a VJP rule.
#include <spdlog/fmt/fmt.h>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

std::vector<ValueInfo> fill_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (!in.empty()) ctx.fail("takes no inputs");
  if (p.reals.size() != 1) ctx.fail("params must hold the fill value");
  ctx.require_dims(p.ints, "shape");
  return {{Shape(p.ints), p.dtype}};
}

std::vector<HostTensor> fill_eval(const Op& op, const std::vector<const HostTensor*>&, EvalBuffers& bufs) {
  HostTensor out = bufs.output(0);
  ref::dispatch_any(out.dtype(), "fill", [&](auto t) {
    using T = decltype(t);
    ref::array_of<T>(out).setConstant(static_cast<T>(op.params.reals[0]));
  });
  return {out};
}

std::vector<ValueInfo> iota_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (!in.empty()) ctx.fail("takes no inputs");
  if (!p.index) ctx.fail("has no index expression");
  ctx.require_dims(p.ints, "shape");
  Shape s(p.ints);
  if (p.index.max_axis() >= s.rank())
    ctx.fail("index " + p.index.str() + " reads axis " + std::to_string(p.index.max_axis()) + " of shape " + s.str());
  return {{s, p.dtype}};
}

std::vector<HostTensor> iota_eval(const Op& op, const std::vector<const HostTensor*>&, EvalBuffers& bufs) {
  const Shape& s = bufs.info(0).shape;
  HostTensor out = bufs.output(0);
  ref::dispatch_any(out.dtype(), "iota", [&](auto t) {
    using T = decltype(t);
    std::vector<int64_t> idx(static_cast<size_t>(s.rank()), 0);
    for (int64_t e = 0; e < s.numel(); ++e) {
      out.data<T>()[e] = static_cast<T>(op.params.index.eval(idx));
      for (int a = s.rank() - 1; a >= 0; --a) {
        if (++idx[static_cast<size_t>(a)] < s[a]) break;
        idx[static_cast<size_t>(a)] = 0;
      }
    }
  });
  return {out};
}

}  // namespace

FillParams FillParams::of(const Op& op) {
  require_view_of(op, {PrimId::fill}, "FillParams");
  return {Shape(op.params.ints), op.params.reals.at(0), op.params.dtype};
}

std::optional<FillParams> FillParams::producing(const Circuit& c, ValueId v) {
  const int32_t p = c.value(v).producer;
  if (p < 0 || !c.ops()[static_cast<size_t>(p)].is(PrimId::fill)) return std::nullopt;
  return of(c.ops()[static_cast<size_t>(p)]);
}

std::optional<double> FillParams::float_value(const Circuit& c, ValueId v) {
  const std::optional<FillParams> fill = producing(c, v);
  if (!fill || (fill->dtype != DType::f32 && fill->dtype != DType::f64)) return std::nullopt;
  return fill->value;
}

Params FillParams::to_params() const {
  Params p;
  p.ints = shape.dims();
  p.reals = {value};
  p.dtype = dtype;
  return p;
}

void register_constants(PrimRegistry& r) {
  PrimDef f;
  f.id = PrimId::fill;
  f.shape = fill_shape;
  f.eval = fill_eval;
  f.differentiable = false;
  f.describe = [](const Params& p) { return fmt::format("value={}", p.reals[0]); };
  r.add(f, __FILE__);

  PrimDef i;
  i.id = PrimId::iota;
  i.shape = iota_shape;
  i.eval = iota_eval;
  i.differentiable = false;
  i.describe = [](const Params& p) { return fmt::format("{{{}}}", p.index.str()); };
  r.add(i, __FILE__);
}

}  // namespace kiln
