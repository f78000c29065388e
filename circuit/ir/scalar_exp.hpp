// ScalarExp: the per-element expression language of pointwise bodies (value expressions, float),
// and IndexExp: integer expressions over output coordinates (positions, masks, and later
// addressing). The two are separate types on purpose: addresses are never computed in floating
// point. Both are immutable trees with structural hashing and equality.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kiln {

enum class ExpOp : uint8_t {
  // leaves
  Const,
  Input,
  // unary
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Tanh,
  Sigmoid,
  Gelu,
  GeluGrad,  // d gelu(x) / dx, one op so that backward evaluates its tanh once per element
  Silu,
  Sin,
  Cos,
  Abs,
  RoundBf16,  // the value rounded to bf16 (nearest even) and back: a bf16 operand read from f32
  // binary
  Add,
  Sub,
  Mul,
  Div,
  Pow,
  Max,
  Min,
  // comparisons: 1.0 when true, 0.0 when false
  Lt,
  Le,
  Gt,
  Ge,
  Eq,
  Ne,
  // select(c, a, b) = c != 0 ? a : b
  Select,
};

const char* exp_op_name(ExpOp op);
int exp_op_arity(ExpOp op);  // 0 for leaves, 1, 2, or 3 (Select)

// A value expression over the inputs in0, in1, ... of a pointwise op. A default-constructed
// ScalarExp is "null"; derivative() returns null for a derivative that is structurally zero
// (the expression does not depend on that input), so that no `0 * x` terms (which are NaN for
// x = inf and may not be folded) are ever built.
class ScalarExp {
 public:
  struct Node;
  ScalarExp() = default;

  static ScalarExp constant(double v);
  static ScalarExp input(int k);
  static ScalarExp unary(ExpOp op, const ScalarExp& a);
  static ScalarExp binary(ExpOp op, const ScalarExp& a, const ScalarExp& b);
  static ScalarExp select(const ScalarExp& c, const ScalarExp& a, const ScalarExp& b);

  bool is_null() const { return node_ == nullptr; }
  explicit operator bool() const { return node_ != nullptr; }

  ExpOp op() const;
  double const_value() const;  // Const only
  int input_index() const;     // Input only
  const std::vector<ScalarExp>& args() const;

  uint64_t hash() const;                      // structural; constants hashed by bit pattern; cached in the node
  bool operator==(const ScalarExp& o) const;  // structural equality (constants by bit pattern)
  bool operator!=(const ScalarExp& o) const { return !(*this == o); }
  std::string str() const;  // infix, e.g. "(in0 * 2)", "exp(in1)", "select(c, a, b)"

  int num_inputs() const;        // 1 + largest input index used, 0 if none
  bool depends_on(int k) const;  // does input k occur?
  // d(this)/d(in_k) as a ScalarExp over the same inputs; null when structurally zero.
  // Gelu is the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  // Max/Min send the whole gradient to the first argument on ties; Abs has derivative 0 at 0;
  // comparisons have derivative null.
  ScalarExp derivative(int k) const;
  // Folds constant subtrees and applies only identities exact for every IEEE input
  // (x*1, 1*x, x/1, x-0, --x); never x*0 -> 0 or x+0 -> x (wrong for NaN/inf or -0).
  ScalarExp simplify() const;
  // Replaces in_k by subs[k] for every k (subs.size() >= num_inputs()).
  ScalarExp substitute(const std::vector<ScalarExp>& subs) const;

  // Reference evaluation of one element (tests, and the pointwise Eigen reference's oracle).
  double eval(std::span<const double> inputs) const;
  float eval(std::span<const float> inputs) const;  // every step rounded to float

  const Node* node() const { return node_.get(); }

 private:
  explicit ScalarExp(std::shared_ptr<const Node> n) : node_(std::move(n)) {}
  std::shared_ptr<const Node> node_;
};

ScalarExp operator+(const ScalarExp& a, const ScalarExp& b);
ScalarExp operator-(const ScalarExp& a, const ScalarExp& b);
ScalarExp operator*(const ScalarExp& a, const ScalarExp& b);
ScalarExp operator/(const ScalarExp& a, const ScalarExp& b);
ScalarExp operator-(const ScalarExp& a);

// Short builders: se::in(0) * se::c(2.0) + se::exp(se::in(1)).
namespace se {
inline ScalarExp in(int k) { return ScalarExp::input(k); }
inline ScalarExp c(double v) { return ScalarExp::constant(v); }
ScalarExp exp(const ScalarExp& a);
ScalarExp log(const ScalarExp& a);
ScalarExp sqrt(const ScalarExp& a);
ScalarExp rsqrt(const ScalarExp& a);
ScalarExp tanh(const ScalarExp& a);
ScalarExp sigmoid(const ScalarExp& a);
ScalarExp gelu(const ScalarExp& a);
ScalarExp gelu_grad(const ScalarExp& a);
ScalarExp silu(const ScalarExp& a);
ScalarExp sin(const ScalarExp& a);
ScalarExp cos(const ScalarExp& a);
ScalarExp abs(const ScalarExp& a);
// Rounds an f32 value to bf16 and back (exact on the way back). Its derivative passes the
// gradient straight through, as cast's VJP does; the matmul fusion pass writes it where a matmul
// reads an f32 value through a cast to bf16.
ScalarExp round_bf16(const ScalarExp& a);
ScalarExp pow(const ScalarExp& a, const ScalarExp& b);
ScalarExp max(const ScalarExp& a, const ScalarExp& b);
ScalarExp min(const ScalarExp& a, const ScalarExp& b);
ScalarExp lt(const ScalarExp& a, const ScalarExp& b);
ScalarExp le(const ScalarExp& a, const ScalarExp& b);
ScalarExp gt(const ScalarExp& a, const ScalarExp& b);
ScalarExp ge(const ScalarExp& a, const ScalarExp& b);
ScalarExp eq(const ScalarExp& a, const ScalarExp& b);
ScalarExp ne(const ScalarExp& a, const ScalarExp& b);
ScalarExp select(const ScalarExp& c, const ScalarExp& a, const ScalarExp& b);
}  // namespace se

enum class IndexOp : uint8_t {
  Const,
  Coord,  // leaves: a constant; the output coordinate along an axis
  Add,
  Sub,
  Mul,
  FloorDiv,
  Mod,  // floor semantics for negative operands, as Python
  Min,
  Max,
  Lt,
  Le,
  Gt,
  Ge,
  Eq,
  Ne,      // 1 when true, 0 when false
  Select,  // select(c, a, b) = c != 0 ? a : b
};

// An integer expression over the coordinates of an output element (64-bit arithmetic).
class IndexExp {
 public:
  struct Node;
  IndexExp() = default;
  static IndexExp constant(int64_t v);
  static IndexExp coord(int axis);
  static IndexExp binary(IndexOp op, const IndexExp& a, const IndexExp& b);
  static IndexExp select(const IndexExp& c, const IndexExp& a, const IndexExp& b);

  bool is_null() const { return node_ == nullptr; }
  explicit operator bool() const { return node_ != nullptr; }
  IndexOp op() const;
  int64_t const_value() const;  // Const only
  int axis() const;             // Coord only
  const std::vector<IndexExp>& args() const;
  int max_axis() const;  // largest Coord axis used, -1 if none

  uint64_t hash() const;
  bool operator==(const IndexExp& o) const;
  bool operator!=(const IndexExp& o) const { return !(*this == o); }
  std::string str() const;  // "(i0 - i1)", "ge(i0, i1)"
  // Throws kiln::Error on division or modulo by zero.
  int64_t eval(std::span<const int64_t> coords) const;

 private:
  explicit IndexExp(std::shared_ptr<const Node> n) : node_(std::move(n)) {}
  std::shared_ptr<const Node> node_;
};

namespace ix {
inline IndexExp c(int64_t v) { return IndexExp::constant(v); }
inline IndexExp coord(int axis) { return IndexExp::coord(axis); }
IndexExp add(const IndexExp& a, const IndexExp& b);
IndexExp sub(const IndexExp& a, const IndexExp& b);
IndexExp mul(const IndexExp& a, const IndexExp& b);
IndexExp floordiv(const IndexExp& a, const IndexExp& b);
IndexExp mod(const IndexExp& a, const IndexExp& b);
IndexExp ge(const IndexExp& a, const IndexExp& b);
IndexExp lt(const IndexExp& a, const IndexExp& b);
IndexExp eq(const IndexExp& a, const IndexExp& b);
}  // namespace ix

}  // namespace kiln
