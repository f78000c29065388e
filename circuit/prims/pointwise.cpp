// Prim family `pointwise`: out = body(in0, in1, ...) elementwise with numpy broadcasting.
// Shape contract: inputs of one float dtype whose shapes broadcast -> out: broadcast shape.
// Reference: the body is evaluated node by node as Eigen array expressions over the inputs
// broadcast to the output shape. VJP: grad_k = g * d(body)/d(in_k), the derivative taken
// symbolically by ScalarExp and recorded as another pointwise op.
#include <spdlog/fmt/fmt.h>

#include <cmath>

#include "circuit/builder.hpp"
#include "circuit/prim.hpp"
#include "circuit/prims/eigen_util.hpp"
#include "circuit/prims/families.hpp"

namespace kiln {
namespace {

// The body is compiled once per call into a flat list of instructions (structurally equal
// subtrees, which derivatives produce in numbers, become one instruction), then run over the
// output in blocks that stay in cache, in parallel. Inputs of the output's shape are read in
// place; broadcast inputs are gathered block by block.
struct Instr {
  ExpOp op;
  int a = -1, b = -1, c = -1;  // argument instructions
  double value = 0;            // Const
  int input = -1;              // Input
};

int compile(const ScalarExp& e, std::vector<Instr>& code, std::vector<std::pair<ScalarExp, int>>& seen) {
  for (const auto& [expr, at] : seen)
    if (expr.hash() == e.hash() && expr == e) return at;
  Instr ins{e.op()};
  const auto& args = e.args();
  if (e.op() == ExpOp::Const) ins.value = e.const_value();
  if (e.op() == ExpOp::Input) ins.input = e.input_index();
  if (args.size() > 0) ins.a = compile(args[0], code, seen);
  if (args.size() > 1) ins.b = compile(args[1], code, seen);
  if (args.size() > 2) ins.c = compile(args[2], code, seen);
  code.push_back(ins);
  seen.emplace_back(e, static_cast<int>(code.size()) - 1);
  return static_cast<int>(code.size()) - 1;
}

constexpr int64_t kBlock = 2048;

template <class T>
using Blk = Eigen::Array<T, Eigen::Dynamic, 1, Eigen::ColMajor, kBlock, 1>;  // storage inline, no heap

// One block of `len` elements; regs holds one block per instruction.
template <class T>
void run_block(const std::vector<Instr>& code, const std::vector<const T*>& direct,
               const std::vector<std::vector<int64_t>>& bstrides, const std::vector<const HostTensor*>& in,
               const Shape& shape, int64_t start, int64_t len, std::vector<Blk<T>>& regs) {
  auto b2 = [](bool v) { return v ? T(1) : T(0); };
  for (size_t i = 0; i < code.size(); ++i) {
    const Instr& I = code[i];
    Blk<T>& r = regs[i];
    r.resize(len);
    auto A = [&]() -> const Blk<T>& { return regs[static_cast<size_t>(I.a)]; };
    auto B = [&]() -> const Blk<T>& { return regs[static_cast<size_t>(I.b)]; };
    switch (I.op) {
      case ExpOp::Const: r.setConstant(static_cast<T>(I.value)); break;
      case ExpOp::Input: {
        auto k = static_cast<size_t>(I.input);
        if (direct[k])
          r = Eigen::Map<const ref::Arr<T>>(direct[k] + start, len);
        else
          ref::broadcast_range<T>(in[k]->data<T>(), bstrides[k], shape, start, len, r.data());
        break;
      }
      case ExpOp::Neg: r = -A(); break;
      case ExpOp::Exp: r = A().exp(); break;
      case ExpOp::Log: r = A().log(); break;
      case ExpOp::Sqrt: r = A().sqrt(); break;
      case ExpOp::Rsqrt: r = A().sqrt().inverse(); break;
      case ExpOp::Tanh: r = A().tanh(); break;
      case ExpOp::Sigmoid: r = (T(1) + (-A()).exp()).inverse(); break;
      case ExpOp::Gelu: {
        const T k = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)
        const auto& x = A();
        r = T(0.5) * x * (T(1) + (k * (x + T(0.044715) * x * x * x)).tanh());
        break;
      }
      case ExpOp::Silu: r = A() * (T(1) + (-A()).exp()).inverse(); break;
      case ExpOp::Sin: r = A().sin(); break;
      case ExpOp::Cos: r = A().cos(); break;
      case ExpOp::Abs: r = A().abs(); break;
      case ExpOp::Add: r = A() + B(); break;
      case ExpOp::Sub: r = A() - B(); break;
      case ExpOp::Mul: r = A() * B(); break;
      case ExpOp::Div: r = A() / B(); break;
      case ExpOp::Pow: r = A().pow(B()); break;
      // NaN propagates; ties return the first argument (as ScalarExp::eval).
      case ExpOp::Max:
        r = A().binaryExpr(B(), [](T a, T b) { return std::isnan(a) ? a : std::isnan(b) ? b : a >= b ? a : b; });
        break;
      case ExpOp::Min:
        r = A().binaryExpr(B(), [](T a, T b) { return std::isnan(a) ? a : std::isnan(b) ? b : a <= b ? a : b; });
        break;
      case ExpOp::Lt: r = A().binaryExpr(B(), [&](T a, T b) { return b2(a < b); }); break;
      case ExpOp::Le: r = A().binaryExpr(B(), [&](T a, T b) { return b2(a <= b); }); break;
      case ExpOp::Gt: r = A().binaryExpr(B(), [&](T a, T b) { return b2(a > b); }); break;
      case ExpOp::Ge: r = A().binaryExpr(B(), [&](T a, T b) { return b2(a >= b); }); break;
      case ExpOp::Eq: r = A().binaryExpr(B(), [&](T a, T b) { return b2(a == b); }); break;
      case ExpOp::Ne: r = A().binaryExpr(B(), [&](T a, T b) { return b2(a != b); }); break;
      case ExpOp::Select: r = (A() != T(0)).select(B(), regs[static_cast<size_t>(I.c)]); break;
    }
  }
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
  std::vector<Instr> code;
  std::vector<std::pair<ScalarExp, int>> seen;
  compile(op.params.body, code, seen);
  ref::dispatch_float(out.dtype(), "pointwise", [&](auto t) {
    using T = decltype(t);
    std::vector<const T*> direct;
    std::vector<std::vector<int64_t>> bstrides;
    for (const HostTensor* x : in) {
      bool same = x->shape().numel() == shape.numel();
      direct.push_back(same ? x->data<T>() : nullptr);
      bstrides.push_back(same ? std::vector<int64_t>{} : ref::broadcast_strides(x->shape(), shape));
    }
    const int64_t n = shape.numel(), blocks = (n + kBlock - 1) / kBlock;
    T* o = out.data<T>();
#pragma omp parallel if (n >= 4 * kBlock)
    {
      std::vector<Blk<T>> regs(code.size());
#pragma omp for schedule(static)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        int64_t start = blk * kBlock, len = std::min(kBlock, n - start);
        run_block<T>(code, direct, bstrides, in, shape, start, len, regs);
        Eigen::Map<ref::Arr<T>>(o + start, len) = regs.back();
      }
    }
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
