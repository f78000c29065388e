// Prim family `pointwise`: out = body(in0, in1, ...) elementwise with numpy broadcasting.
// Shape contract: inputs of one float dtype whose shapes broadcast -> out: broadcast shape.
// Reference: the body is evaluated node by node as Eigen array expressions over the inputs
// broadcast to the output shape. VJP: grad_k = g * d(body)/d(in_k), the derivative taken
// symbolically by ScalarExp and recorded as another pointwise op.
#include <cmath>
#include <unordered_map>

#include <spdlog/fmt/fmt.h>

#include "circuit/builder.hpp"
#include "circuit/prim.hpp"
#include "circuit/prims/eigen_util.hpp"
#include "circuit/prims/families.hpp"

namespace kiln {
namespace {

// Shared subtrees (derivatives share them heavily) are evaluated once: `memo` maps a node to
// its array.
template <class T>
using Memo = std::unordered_map<const ScalarExp::Node*, ref::Arr<T>>;

template <class T>
ref::Arr<T> eval_node(const ScalarExp& e, const std::vector<ref::Arr<T>>& in, int64_t n, Memo<T>& memo);

template <class T>
ref::Arr<T> eval_body(const ScalarExp& e, const std::vector<ref::Arr<T>>& in, int64_t n, Memo<T>& memo) {
  auto it = memo.find(e.node());
  if (it != memo.end()) return it->second;
  ref::Arr<T> value = eval_node<T>(e, in, n, memo);
  if (e.op() != ExpOp::Input && e.op() != ExpOp::Const) memo.emplace(e.node(), value);
  return value;
}

template <class T>
ref::Arr<T> eval_node(const ScalarExp& e, const std::vector<ref::Arr<T>>& in, int64_t n, Memo<T>& memo) {
  using A = ref::Arr<T>;
  const auto& args = e.args();
  auto arg = [&](size_t i) { return eval_body<T>(args[i], in, n, memo); };
  auto b2 = [](bool v) { return v ? T(1) : T(0); };
  switch (e.op()) {
    case ExpOp::Const: return A::Constant(n, static_cast<T>(e.const_value()));
    case ExpOp::Input: return in[static_cast<size_t>(e.input_index())];
    case ExpOp::Neg: return -arg(0);
    case ExpOp::Exp: return arg(0).exp();
    case ExpOp::Log: return arg(0).log();
    case ExpOp::Sqrt: return arg(0).sqrt();
    case ExpOp::Rsqrt: return arg(0).sqrt().inverse();
    case ExpOp::Tanh: return arg(0).tanh();
    case ExpOp::Sigmoid: return (T(1) + (-arg(0)).exp()).inverse();
    case ExpOp::Gelu: {
      A x = arg(0);
      const T k = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)
      return T(0.5) * x * (T(1) + (k * (x + T(0.044715) * x * x * x)).tanh());
    }
    case ExpOp::Silu: {
      A x = arg(0);
      return x * (T(1) + (-x).exp()).inverse();
    }
    case ExpOp::Sin: return arg(0).sin();
    case ExpOp::Cos: return arg(0).cos();
    case ExpOp::Abs: return arg(0).abs();
    case ExpOp::Add: return arg(0) + arg(1);
    case ExpOp::Sub: return arg(0) - arg(1);
    case ExpOp::Mul: return arg(0) * arg(1);
    case ExpOp::Div: return arg(0) / arg(1);
    case ExpOp::Pow: return arg(0).pow(arg(1));
    case ExpOp::Max:
      // NaN propagates; ties return the first argument (as ScalarExp::eval).
      return arg(0).binaryExpr(arg(1), [](T a, T b) { return std::isnan(a) ? a : std::isnan(b) ? b : a >= b ? a : b; });
    case ExpOp::Min:
      return arg(0).binaryExpr(arg(1), [](T a, T b) { return std::isnan(a) ? a : std::isnan(b) ? b : a <= b ? a : b; });
    case ExpOp::Lt: return arg(0).binaryExpr(arg(1), [&](T a, T b) { return b2(a < b); });
    case ExpOp::Le: return arg(0).binaryExpr(arg(1), [&](T a, T b) { return b2(a <= b); });
    case ExpOp::Gt: return arg(0).binaryExpr(arg(1), [&](T a, T b) { return b2(a > b); });
    case ExpOp::Ge: return arg(0).binaryExpr(arg(1), [&](T a, T b) { return b2(a >= b); });
    case ExpOp::Eq: return arg(0).binaryExpr(arg(1), [&](T a, T b) { return b2(a == b); });
    case ExpOp::Ne: return arg(0).binaryExpr(arg(1), [&](T a, T b) { return b2(a != b); });
    case ExpOp::Select: return (arg(0) != T(0)).select(arg(1), arg(2));
  }
  throw Error("pointwise: unknown ScalarExp op");
}

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

std::vector<HostTensor> eval(const Op& op, const std::vector<const HostTensor*>& in,
                             const std::vector<ValueInfo>& out_info) {
  const Shape& shape = out_info[0].shape;
  HostTensor out = HostTensor::zeros(out_info[0].dtype, shape);
  ref::dispatch_float(out.dtype(), "pointwise", [&](auto t) {
    using T = decltype(t);
    std::vector<ref::Arr<T>> arrays;
    for (const HostTensor* x : in) {
      ref::Arr<T> a(shape.numel());
      ref::broadcast_copy<T>(x->data<T>(), x->shape(), a.data(), shape);
      arrays.push_back(std::move(a));
    }
    Memo<T> memo;
    ref::array_of<T>(out) = eval_body<T>(op.params.body, arrays, shape.numel(), memo);
  });
  return {out};
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
  d.name = "pointwise";
  d.family = "pointwise.cpp";
  d.shape = shape_rule;
  d.eval = eval;
  d.vjp = vjp;
  d.describe = [](const Params& p) { return fmt::format("{{{}}}", p.body.str()); };
  r.add(std::move(d));
}

}  // namespace kiln
