// Block evaluation of ScalarExp bodies on the host, shared by the pointwise and fused_rows
// references. Internal to circuit/prims/ (it pulls in Eigen).
#pragma once

#include <cmath>
#include <utility>
#include <vector>

#include <kiln/circuit/ir/scalar_exp.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>

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

// A thread's working storage for running a body block by block: a block per instruction, and
// where each instruction's value for the current block lies (its block; for an input read in
// place, the input itself; for a constant, its block, filled once per body).
template <class T>
struct Registers {
  std::vector<Blk<T>> blocks;
  std::vector<const T*> value;
  bool constants_filled = false;
  // Ready for a body of n instructions (reusing the storage of an earlier body).
  void reset(size_t n) {
    if (blocks.size() < n) blocks.resize(n, Blk<T>(kBlock));
    value.assign(n, nullptr);
    constants_filled = false;
  }
};

// dst[0, len) = instruction I (an operation, not a Const or an Input) of its arguments' values
// a, b, c (those it has). dst must be none of them (GELU's gradient keeps a value in dst).
template <class T>
inline void apply_instr(const Instr& I, const T* a, const T* b, const T* c, T* dst, int64_t len) {
  auto b2 = [](bool v) { return v ? T(1) : T(0); };
  Eigen::Map<Arr<T>> r(dst, len);
  auto A = [&] { return Eigen::Map<const Arr<T>>(a, len); };
  auto B = [&] { return Eigen::Map<const Arr<T>>(b, len); };
  switch (I.op) {
    case ExpOp::Const:
    case ExpOp::Input: break;
    case ExpOp::Neg: r = -A(); break;
    case ExpOp::Exp: r = A().exp(); break;
    case ExpOp::Log: r = A().log(); break;
    case ExpOp::Sqrt: r = A().sqrt(); break;
    case ExpOp::Rsqrt: r = A().sqrt().inverse(); break;
    case ExpOp::Tanh: r = A().tanh(); break;
    case ExpOp::Sigmoid: r = (T(1) + (-A()).exp()).inverse(); break;
    case ExpOp::Gelu: {
      const T k = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)
      const auto x = A();
      r = T(0.5) * x * (T(1) + (k * (x + T(0.044715) * x * x * x)).tanh());
      break;
    }
    case ExpOp::GeluGrad: {  // t = tanh(.) first, into the destination, then the rest over t
      const T k = static_cast<T>(0.7978845608028654);
      const auto x = A();
      r = (k * (x + T(0.044715) * x * x * x)).tanh();
      r = T(0.5) * (T(1) + r) + (T(0.5) * k) * x * (T(1) - r * r) * (T(1) + T(3 * 0.044715) * x * x);
      break;
    }
    case ExpOp::Silu: r = A() * (T(1) + (-A()).exp()).inverse(); break;
    case ExpOp::Sin: r = A().sin(); break;
    case ExpOp::Cos: r = A().cos(); break;
    case ExpOp::Abs: r = A().abs(); break;
    case ExpOp::RoundBf16:
      r = A().unaryExpr([](T v) { return static_cast<T>(round_to_bf16(static_cast<float>(v))); });
      break;
    case ExpOp::Add: r = A() + B(); break;
    case ExpOp::Sub: r = A() - B(); break;
    case ExpOp::Mul: r = A() * B(); break;
    case ExpOp::Div: r = A() / B(); break;
    case ExpOp::Pow: r = A().pow(B()); break;
    // NaN propagates; ties return the first argument (as ScalarExp::eval).
    case ExpOp::Max:
      r = A().binaryExpr(B(), [](T x, T y) { return std::isnan(x) ? x : std::isnan(y) ? y : x >= y ? x : y; });
      break;
    case ExpOp::Min:
      r = A().binaryExpr(B(), [](T x, T y) { return std::isnan(x) ? x : std::isnan(y) ? y : x <= y ? x : y; });
      break;
    case ExpOp::Lt: r = A().binaryExpr(B(), [&](T x, T y) { return b2(x < y); }); break;
    case ExpOp::Le: r = A().binaryExpr(B(), [&](T x, T y) { return b2(x <= y); }); break;
    case ExpOp::Gt: r = A().binaryExpr(B(), [&](T x, T y) { return b2(x > y); }); break;
    case ExpOp::Ge: r = A().binaryExpr(B(), [&](T x, T y) { return b2(x >= y); }); break;
    case ExpOp::Eq: r = A().binaryExpr(B(), [&](T x, T y) { return b2(x == y); }); break;
    case ExpOp::Ne: r = A().binaryExpr(B(), [&](T x, T y) { return b2(x != y); }); break;
    case ExpOp::Select: r = (A() != T(0)).select(B(), Eigen::Map<const Arr<T>>(c, len)); break;
  }
}

// One block of `len` elements; returns where the body's value lies: `out` when given (the last
// instruction writes there), else a register. Constants and inputs read in place cost nothing
// per block, so a body of one operation makes one pass over its operands.
template <class T>
inline const T* run_block(const std::vector<Instr>& code, const std::vector<const T*>& direct,
                          const std::vector<std::vector<int64_t>>& bstrides, const std::vector<const HostTensor*>& in,
                          const Shape& shape, int64_t start, int64_t len, Registers<T>& regs, T* out) {
  if (!regs.constants_filled) {  // as far as a block of this domain reaches (a small op's few elements)
    const int64_t reach = std::min(kBlock, shape.numel());
    for (size_t i = 0; i < code.size(); ++i)
      if (code[i].op == ExpOp::Const) {
        regs.blocks[i].head(reach).setConstant(static_cast<T>(code[i].value));
        regs.value[i] = regs.blocks[i].data();
      }
    regs.constants_filled = true;
  }
  auto arg = [&](int k) { return k < 0 ? nullptr : regs.value[static_cast<size_t>(k)]; };
  for (size_t i = 0; i < code.size(); ++i) {
    const Instr& I = code[i];
    if (I.op == ExpOp::Const) continue;
    if (I.op == ExpOp::Input && direct[static_cast<size_t>(I.input)]) {
      regs.value[i] = direct[static_cast<size_t>(I.input)] + start;
      continue;
    }
    T* dst = out && i + 1 == code.size() ? out : regs.blocks[i].data();
    if (I.op == ExpOp::Input) {
      const auto k = static_cast<size_t>(I.input);
      broadcast_range<T>(in[k]->data<T>(), bstrides[k], shape, start, len, dst);
    } else {
      apply_instr<T>(I, arg(I.a), arg(I.b), arg(I.c), dst, len);
    }
    regs.value[i] = dst;
  }
  const T* result = regs.value.back();
  if (out && result != out) std::copy_n(result, len, out);  // the body is a constant or an input
  return out ? out : result;
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
  // Readies registers (one set per thread, see thread_registers) for run().
  void prepare(Registers<T>& regs) const { regs.reset(code_.size()); }
  // Elements [start, start + len) of the domain, len <= kBlock: written to out when given, and
  // returned (valid until the next run with these registers).
  const T* run(int64_t start, int64_t len, Registers<T>& regs, T* out = nullptr) const {
    return run_block<T>(code_, direct_, bstrides_, inputs_, domain_, start, len, regs, out);
  }

 private:
  std::vector<Instr> code_;
  std::vector<const HostTensor*> inputs_;
  Shape domain_;
  std::vector<const T*> direct_;
  std::vector<std::vector<int64_t>> bstrides_;
};

// The calling thread's `count` sets of registers, kept from one call to the next: once they
// have grown to the longest bodies, running a body allocates nothing (a set of a body of 30
// instructions is 240 KiB, which malloc would hand out as fresh, page-faulting memory).
template <class T>
std::vector<Registers<T>>& thread_registers(size_t count) {
  thread_local std::vector<Registers<T>> sets;
  if (sets.size() < count) sets.resize(count);
  return sets;
}

// Writes the body's value at each of the n elements of its domain to dst, block by block
// (OpenMP threads share the blocks of a large domain).
template <class T>
void run_all(const BodyRunner<T>& body, T* dst, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel if (n >= 4 * kBlock)
  {
    Registers<T>& regs = thread_registers<T>(1)[0];
    body.prepare(regs);
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t start = blk * kBlock, len = std::min(kBlock, n - start);
      body.run(start, len, regs, dst + start);
    }
  }
}

}  // namespace kiln::ref
