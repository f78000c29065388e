// Prim family `pointwise`: out = body(in0, in1, ...) elementwise with numpy broadcasting.
// Shape contract: inputs of one float dtype whose shapes broadcast -> out: broadcast shape.
// Reference: the body is evaluated node by node as Eigen array expressions over the inputs
// broadcast to the output shape. VJP: grad_k = g * d(body)/d(in_k), the derivative taken
// symbolically by ScalarExp and recorded as another pointwise op.
#include <spdlog/fmt/fmt.h>

#include <cmath>

#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/body_eval.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/families.hpp>

namespace kiln {
namespace {

std::vector<ValueInfo> shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (!p.body) ctx.fail("has no body expression");
  if (in.empty()) ctx.fail("needs at least one input");
  if (p.body.num_inputs() > static_cast<int>(in.size()))
    ctx.fail("body " + p.body.str() + " reads in" + std::to_string(p.body.num_inputs() - 1) + " but only " +
             std::to_string(in.size()) + " inputs were given");
  Shape out = in[0].shape;
  for (size_t i = 0; i < in.size(); ++i) {
    ctx.require_float(in[i], ("input " + std::to_string(i)).c_str());
    if (in[i].dtype != in[0].dtype)
      ctx.fail("inputs must share one dtype (no implicit promotion; use cast): input 0 is " +
               std::string(dtype_name(in[0].dtype)) + in[0].shape.str() + ", input " + std::to_string(i) + " is " +
               dtype_name(in[i].dtype) + in[i].shape.str());
    try {
      out = broadcast_shapes(out, in[i].shape, "pointwise");
    } catch (const Error&) {
      ctx.fail("input shapes do not broadcast: " + out.str() + " vs input " + std::to_string(i) + " " +
               in[i].shape.str());
    }
  }
  return {{out, in[0].dtype}};
}

std::vector<HostTensor> eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const Shape& shape = bufs.info(0).shape;
  HostTensor out = bufs.output(0);
  ref::dispatch_float(out.dtype(), "pointwise", [&](auto t) {
    using T = decltype(t);
    ref::run_all(ref::BodyRunner<T>(op.params.body, in, shape), out.data<T>(), shape.numel());
  });
  return {out};
}

// The body runs block by block (BodyRunner), its last instruction writing the block: input k
// may be overwritten where that instruction is coefficient-wise, as all are but GELU's gradient.
bool may_overwrite(const Op& op, const std::vector<ValueInfo>&, size_t, size_t) {
  return op.params.body.op() != ExpOp::GeluGrad;
}

std::vector<ValueId> vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  std::vector<ValueId> grads(op.inputs.size(), kNoValue);
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    ScalarExp d = op.params.body.derivative(static_cast<int>(k));
    if (!d) continue;
    // Body over (g, the inputs d reads): compact the inputs so unused ones are not wired in.
    std::vector<ValueId> inputs{g[0]};
    std::vector<ScalarExp> subs;
    for (size_t j = 0; j < op.inputs.size(); ++j) {
      if (d.depends_on(static_cast<int>(j))) {
        subs.push_back(se::in(static_cast<int>(inputs.size())));
        inputs.push_back(op.inputs[j]);
      } else {
        subs.push_back(se::c(0.0));  // never read: d does not depend on it
      }
    }
    ScalarExp body = (se::in(0) * d.substitute(subs)).simplify();
    // A derivative of 1 (sums, differences) passes g on as it is: no copy op.
    grads[k] = body == se::in(0) ? g[0] : b.pointwise(body, inputs);
  }
  return grads;
}

}  // namespace

void register_pointwise(PrimRegistry& r) {
  PrimDef d;
  d.id = PrimId::pointwise;
  d.shape = shape_rule;
  d.eval = eval;
  d.may_overwrite = may_overwrite;
  d.vjp = vjp;
  d.describe = [](const Params& p) { return fmt::format("{{{}}}", p.body.str()); };
  r.add(std::move(d), __FILE__);
}

}  // namespace kiln
