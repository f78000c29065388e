// Block evaluation of ScalarExp bodies on the host, shared by the pointwise and fused_rows
// references. Internal to circuit/prims/ (it pulls in Eigen).
#pragma once

#include <cmath>
#include <utility>
#include <vector>

#include "circuit/prims/eigen_util.hpp"
#include "circuit/scalar_exp.hpp"

namespace kiln::ref {

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

inline int compile_body(const ScalarExp& e, std::vector<Instr>& code, std::vector<std::pair<ScalarExp, int>>& seen) {
  for (const auto& [expr, at] : seen)
    if (expr.hash() == e.hash() && expr == e) return at;
  Instr ins{e.op()};
  const auto& args = e.args();
  if (e.op() == ExpOp::Const) ins.value = e.const_value();
  if (e.op() == ExpOp::Input) ins.input = e.input_index();
  if (args.size() > 0) ins.a = compile_body(args[0], code, seen);
  if (args.size() > 1) ins.b = compile_body(args[1], code, seen);
  if (args.size() > 2) ins.c = compile_body(args[2], code, seen);
  code.push_back(ins);
  seen.emplace_back(e, static_cast<int>(code.size()) - 1);
  return static_cast<int>(code.size()) - 1;
}

constexpr int64_t kBlock = 2048;

template <class T>
using Blk = Eigen::Array<T, Eigen::Dynamic, 1, Eigen::ColMajor, kBlock, 1>;  // storage inline, no heap

// One block of `len` elements; regs holds one block per instruction.
template <class T>
inline void run_block(const std::vector<Instr>& code, const std::vector<const T*>& direct,
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
          r = Eigen::Map<const Arr<T>>(direct[k] + start, len);
        else
          broadcast_range<T>(in[k]->data<T>(), bstrides[k], shape, start, len, r.data());
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

// A body compiled once and bound to its inputs over an index domain: run() evaluates a range of
// the domain's flat elements. inputs[k] may be null where the body does not read in_k; every
// input it reads must broadcast to `domain` (read in place when it has the domain's size).
template <class T>
class BodyRunner {
 public:
  BodyRunner(const ScalarExp& body, std::vector<const HostTensor*> inputs, Shape domain)
      : inputs_(std::move(inputs)), domain_(std::move(domain)) {
    std::vector<std::pair<ScalarExp, int>> seen;
    compile_body(body, code_, seen);
    for (const HostTensor* x : inputs_) {
      const bool same = x && x->shape().numel() == domain_.numel();
      direct_.push_back(same ? x->data<T>() : nullptr);
      bstrides_.push_back(x && !same ? broadcast_strides(x->shape(), domain_) : std::vector<int64_t>{});
    }
  }
  // Registers for run(), one block per instruction; one set per thread.
  std::vector<Blk<T>> registers() const { return std::vector<Blk<T>>(code_.size()); }
  // Elements [start, start + len) of the domain, len <= kBlock; the result lives in regs.
  const Blk<T>& run(int64_t start, int64_t len, std::vector<Blk<T>>& regs) const {
    run_block<T>(code_, direct_, bstrides_, inputs_, domain_, start, len, regs);
    return regs.back();
  }

 private:
  std::vector<Instr> code_;
  std::vector<const HostTensor*> inputs_;
  Shape domain_;
  std::vector<const T*> direct_;
  std::vector<std::vector<int64_t>> bstrides_;
};

// Writes the body's value at each of the n elements of its domain to dst, block by block
// (OpenMP threads share the blocks of a large domain).
template <class T>
void run_all(const BodyRunner<T>& body, T* dst, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel if (n >= 4 * kBlock)
  {
    auto regs = body.registers();
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t start = blk * kBlock, len = std::min(kBlock, n - start);
      Eigen::Map<Arr<T>>(dst + start, len) = body.run(start, len, regs);
    }
  }
}

}  // namespace kiln::ref
