// Tests of ScalarExp and IndexExp: evaluation of every op, symbolic derivatives against central
// finite differences, exact-only simplification, structural hashing/equality, printing,
// substitution, and IndexExp's Python floor semantics.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/scalar_exp.hpp>

namespace kiln {
namespace {

using se::c;
using se::in;

double ev(const ScalarExp& e, const std::vector<double>& x) { return e.eval(x); }

double gelu_ref(double x) {
  const double k0 = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k0 * (x + 0.044715 * x * x * x)));
}

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Checks every partial derivative of f at x against a central finite difference.
void expect_grad_matches_fd(const ScalarExp& f, const std::vector<double>& x) {
  const double h = 1e-6;
  for (int k = 0; k < static_cast<int>(x.size()); ++k) {
    std::vector<double> xp = x, xm = x;
    xp[static_cast<size_t>(k)] += h;
    xm[static_cast<size_t>(k)] -= h;
    const double fd = (ev(f, xp) - ev(f, xm)) / (2 * h);
    const ScalarExp d = f.derivative(k);
    const double an = d ? ev(d, x) : 0.0;
    EXPECT_NEAR(an, fd, 1e-6 * std::max(1.0, std::abs(fd)))
        << f.str() << " d/in" << k << " = " << d.str() << " at x[0] = " << x[0];
  }
}

TEST(ScalarExp, EvalUnaryOps) {
  const double x = 0.7;
  const ScalarExp a = in(0);
  EXPECT_DOUBLE_EQ(ev(-a, {x}), -x);
  EXPECT_DOUBLE_EQ(ev(se::exp(a), {x}), std::exp(x));
  EXPECT_DOUBLE_EQ(ev(se::log(a), {x}), std::log(x));
  EXPECT_DOUBLE_EQ(ev(se::sqrt(a), {x}), std::sqrt(x));
  EXPECT_DOUBLE_EQ(ev(se::rsqrt(a), {x}), 1.0 / std::sqrt(x));
  EXPECT_DOUBLE_EQ(ev(se::tanh(a), {x}), std::tanh(x));
  EXPECT_DOUBLE_EQ(ev(se::sigmoid(a), {x}), sigmoid_ref(x));
  EXPECT_DOUBLE_EQ(ev(se::gelu(a), {x}), gelu_ref(x));
  EXPECT_DOUBLE_EQ(ev(se::silu(a), {x}), x * sigmoid_ref(x));
  EXPECT_DOUBLE_EQ(ev(se::sin(a), {x}), std::sin(x));
  EXPECT_DOUBLE_EQ(ev(se::cos(a), {x}), std::cos(x));
  EXPECT_DOUBLE_EQ(ev(se::abs(a), {-x}), x);
  EXPECT_NEAR(ev(se::gelu(a), {-3.0}), -0.00363739, 1e-8);  // torch gelu(tanh) value
}

TEST(ScalarExp, EvalBinaryOps) {
  const ScalarExp a = in(0), b = in(1);
  const std::vector<double> x = {1.5, -2.0};
  EXPECT_DOUBLE_EQ(ev(a + b, x), -0.5);
  EXPECT_DOUBLE_EQ(ev(a - b, x), 3.5);
  EXPECT_DOUBLE_EQ(ev(a * b, x), -3.0);
  EXPECT_DOUBLE_EQ(ev(a / b, x), -0.75);
  EXPECT_DOUBLE_EQ(ev(se::pow(a, b), x), std::pow(1.5, -2.0));
  EXPECT_DOUBLE_EQ(ev(se::max(a, b), x), 1.5);
  EXPECT_DOUBLE_EQ(ev(se::min(a, b), x), -2.0);
  EXPECT_EQ(ev(se::lt(a, b), x), 0.0);
  EXPECT_EQ(ev(se::le(a, b), x), 0.0);
  EXPECT_EQ(ev(se::gt(a, b), x), 1.0);
  EXPECT_EQ(ev(se::ge(a, b), x), 1.0);
  EXPECT_EQ(ev(se::eq(a, b), x), 0.0);
  EXPECT_EQ(ev(se::ne(a, b), x), 1.0);
  EXPECT_EQ(ev(se::le(a, a), x), 1.0);
  EXPECT_EQ(ev(se::eq(a, a), x), 1.0);
  EXPECT_EQ(ev(se::select(in(2), a, b), {1.5, -2.0, 3.0}), 1.5);
  EXPECT_EQ(ev(se::select(in(2), a, b), {1.5, -2.0, 0.0}), -2.0);
}

TEST(ScalarExp, MaxMinTiesAndNan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const ScalarExp mx = se::max(in(0), in(1)), mn = se::min(in(0), in(1));
  EXPECT_FALSE(std::signbit(ev(mx, {0.0, -0.0})));  // tie: the first argument
  EXPECT_TRUE(std::signbit(ev(mx, {-0.0, 0.0})));
  EXPECT_TRUE(std::signbit(ev(mn, {-0.0, 0.0})));
  EXPECT_FALSE(std::signbit(ev(mn, {0.0, -0.0})));
  EXPECT_TRUE(std::isnan(ev(mx, {nan, 1.0})));
  EXPECT_TRUE(std::isnan(ev(mx, {1.0, nan})));
  EXPECT_TRUE(std::isnan(ev(mn, {nan, 1.0})));
  EXPECT_TRUE(std::isnan(ev(mn, {1.0, nan})));
}

TEST(ScalarExp, EvalFloatRoundsEachStep) {
  // 1e8 + 1 rounds back to 1e8 in float (the spacing there is 8) but not in double.
  const ScalarExp e = (in(0) + c(1e8)) - c(1e8);
  const std::vector<float> xf = {1.0f};
  EXPECT_EQ(e.eval(std::span<const float>(xf)), 0.0f);
  EXPECT_EQ(ev(e, {1.0}), 1.0);
  const ScalarExp g = se::gelu(in(0)) * in(1) + se::exp(in(0));
  const std::vector<float> x = {0.3f, 1.7f};
  const float k0 = static_cast<float>(std::sqrt(2.0 / std::numbers::pi));
  const float gf = 0.5f * x[0] * (1.0f + std::tanh(k0 * (x[0] + 0.044715f * x[0] * x[0] * x[0])));
  EXPECT_FLOAT_EQ(g.eval(std::span<const float>(x)), gf * x[1] + std::exp(x[0]));
}

TEST(ScalarExp, EvalMissingInputThrows) {
  EXPECT_THROW(ev(in(0) + in(2), {1.0, 2.0}), Error);
  EXPECT_THROW(ScalarExp().eval(std::span<const double>()), Error);
}

TEST(ScalarExp, DerivativeUnaryMatchesFiniteDifferences) {
  const ScalarExp x = in(0);
  for (double p : {0.7, -1.3}) {
    for (const ScalarExp& f : {-x, se::exp(x), se::tanh(x), se::sigmoid(x), se::gelu(x), se::gelu_grad(x), se::silu(x),
                               se::sin(x), se::cos(x), se::abs(x)})
      expect_grad_matches_fd(f, {p});
  }
  for (double p : {0.7, 2.3}) {
    for (const ScalarExp& f : {se::log(x), se::sqrt(x), se::rsqrt(x)}) expect_grad_matches_fd(f, {p});
  }
}

TEST(ScalarExp, DerivativeBinaryMatchesFiniteDifferences) {
  const ScalarExp a = in(0), b = in(1);
  for (const std::vector<double>& p : {std::vector<double>{0.7, -1.3}, {-2.1, 0.4}}) {
    for (const ScalarExp& f : {a + b, a - b, a * b, a / b, se::max(a, b), se::min(a, b), se::max(b, a), se::min(b, a)})
      expect_grad_matches_fd(f, p);
  }
  for (const std::vector<double>& p : {std::vector<double>{0.7, 1.3}, {2.1, -0.4}})
    expect_grad_matches_fd(se::pow(a, b), p);
}

TEST(ScalarExp, DerivativeSelectAndCompositesMatchFiniteDifferences) {
  const ScalarExp a = in(0), b = in(1);
  const ScalarExp sel = se::select(se::gt(a, b), a * b, se::exp(b));
  expect_grad_matches_fd(sel, {0.7, -1.3});
  expect_grad_matches_fd(sel, {-0.7, 1.3});
  const ScalarExp comp = se::gelu(a * b + se::sin(a)) / (c(1.0) + se::sigmoid(b) * a * a);
  expect_grad_matches_fd(comp, {0.7, -1.3});
  expect_grad_matches_fd(comp, {-1.1, 0.4});
  // Only the base depends on the input, then only the exponent.
  expect_grad_matches_fd(se::pow(a, c(3.0)), {1.3});
  expect_grad_matches_fd(se::pow(c(2.0), a), {1.3});
  // A second derivative through the first.
  const ScalarExp g = se::tanh(a * a).derivative(0);
  expect_grad_matches_fd(g, {0.6});
}

TEST(ScalarExp, DerivativeNullWhenStructurallyZero) {
  const ScalarExp a = in(0), b = in(1);
  EXPECT_TRUE(se::exp(a).derivative(1).is_null());
  EXPECT_TRUE((a * in(2)).derivative(1).is_null());
  EXPECT_TRUE(c(3.0).derivative(0).is_null());
  for (const ScalarExp& f : {se::lt(a, b), se::le(a, b), se::gt(a, b), se::ge(a, b), se::eq(a, b), se::ne(a, b)}) {
    EXPECT_TRUE(f.derivative(0).is_null()) << f.str();
    EXPECT_TRUE(f.derivative(1).is_null()) << f.str();
  }
  EXPECT_TRUE(se::select(se::lt(a, b), c(1.0), c(2.0)).derivative(0).is_null());
  EXPECT_TRUE(se::exp(se::lt(a, b)).derivative(0).is_null());
}

TEST(ScalarExp, DerivativeBuildsNoZeroProducts) {
  const ScalarExp a = in(0), b = in(1);
  EXPECT_EQ((a * b).derivative(0), b);
  EXPECT_EQ((a * b).derivative(1), a);
  EXPECT_EQ((a + b).derivative(1), c(1.0));
  EXPECT_EQ((a - b).derivative(1), c(-1.0));
  EXPECT_EQ(se::max(a, b).derivative(0).str(), "select(ge(in0, in1), 1, 0)");
  // At x = inf the derivative of in0 + in1 * exp(in1) in in0 is exactly 1, not NaN.
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(ev((a + b * se::exp(b)).derivative(0), {1.0, inf}), 1.0);
}

TEST(ScalarExp, SimplifyFoldsConstantsAndExactIdentitiesOnly) {
  const ScalarExp x = in(0);
  EXPECT_EQ((c(2.0) * c(3.0) + x).simplify().str(), "(6 + in0)");
  EXPECT_EQ(se::exp(c(0.0)).simplify(), c(1.0));
  EXPECT_EQ((x * c(1.0)).simplify(), x);
  EXPECT_EQ((c(1.0) * x).simplify(), x);
  EXPECT_EQ((x / c(1.0)).simplify(), x);
  EXPECT_EQ((x - c(0.0)).simplify(), x);
  EXPECT_EQ((x - (c(0.5) - c(0.5))).simplify(), x);
  EXPECT_EQ((-(-x)).simplify(), x);
  EXPECT_EQ((-c(2.0)).simplify(), c(-2.0));
  EXPECT_EQ(((x * c(1.0)) * c(1.0)).simplify(), x);
  // Not exact for every input, so kept.
  EXPECT_EQ((x - c(-0.0)).simplify().op(), ExpOp::Sub);
  EXPECT_EQ((x + c(0.0)).simplify().op(), ExpOp::Add);
  const ScalarExp times_zero = (x * c(0.0)).simplify();
  EXPECT_EQ(times_zero.op(), ExpOp::Mul);
  EXPECT_TRUE(std::isnan(ev(times_zero, {std::numeric_limits<double>::infinity()})));
  // An unchanged tree is returned as is.
  const ScalarExp e = se::exp(x) * in(1);
  EXPECT_EQ(e.simplify().node(), e.node());
}

TEST(ScalarExp, HashAndStructuralEquality) {
  const ScalarExp e1 = in(0) * c(2.0) + se::exp(in(1));
  const ScalarExp e2 = in(0) * c(2.0) + se::exp(in(1));
  EXPECT_NE(e1.node(), e2.node());
  EXPECT_EQ(e1, e2);
  EXPECT_EQ(e1.hash(), e2.hash());
  EXPECT_NE(e1, in(0) * c(3.0) + se::exp(in(1)));
  EXPECT_NE(e1, in(0) * c(2.0) + se::exp(in(2)));
  EXPECT_NE(e1, in(0) * c(2.0) - se::exp(in(1)));
  EXPECT_NE(c(2.0), c(3.0));
  EXPECT_NE(c(2.0).hash(), c(3.0).hash());
  EXPECT_NE(c(0.0), c(-0.0));
  EXPECT_NE(c(0.0).hash(), c(-0.0).hash());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(c(nan), c(nan));
  EXPECT_NE(in(0) - in(1), in(1) - in(0));
  EXPECT_EQ(ScalarExp(), ScalarExp());
  EXPECT_NE(ScalarExp(), in(0));
}

TEST(ScalarExp, StrGolden) {
  EXPECT_EQ((in(0) * c(2.0) + se::exp(in(1))).str(), "((in0 * 2) + exp(in1))");
  EXPECT_EQ(se::select(se::lt(in(0), c(0.5)), se::max(in(0), in(1)), -in(2)).str(),
            "select(lt(in0, 0.5), max(in0, in1), neg(in2))");
  EXPECT_EQ((in(0) / c(-0.25) - se::pow(in(1), c(3.0))).str(), "((in0 / -0.25) - pow(in1, 3))");
}

TEST(ScalarExp, SubstituteAndInputs) {
  const ScalarExp e = in(0) * se::exp(in(1));
  EXPECT_EQ(e.substitute({in(1), c(2.0)}), in(1) * se::exp(c(2.0)));
  EXPECT_EQ(e.substitute({in(0) + in(3), in(2)}), (in(0) + in(3)) * se::exp(in(2)));
  EXPECT_THROW(e.substitute({in(1)}), Error);
  const ScalarExp f = in(0) * in(3) + in(70);
  EXPECT_EQ(f.num_inputs(), 71);
  EXPECT_EQ(c(1.0).num_inputs(), 0);
  EXPECT_TRUE(f.depends_on(3));
  EXPECT_TRUE(f.depends_on(70));
  EXPECT_FALSE(f.depends_on(1));
  EXPECT_FALSE(f.depends_on(69));
  EXPECT_FALSE(f.depends_on(71));
}

TEST(ScalarExp, AccessorsAndNames) {
  const ScalarExp e = se::pow(in(2), c(0.5));
  EXPECT_EQ(e.op(), ExpOp::Pow);
  EXPECT_EQ(e.args()[0].input_index(), 2);
  EXPECT_EQ(e.args()[1].const_value(), 0.5);
  EXPECT_THROW(e.const_value(), Error);
  EXPECT_STREQ(exp_op_name(ExpOp::Select), "select");
  EXPECT_STREQ(exp_op_name(ExpOp::Add), "add");
  EXPECT_EQ(exp_op_arity(ExpOp::Input), 0);
  EXPECT_EQ(exp_op_arity(ExpOp::Abs), 1);
  EXPECT_EQ(exp_op_arity(ExpOp::RoundBf16), 1);
  EXPECT_STREQ(exp_op_name(ExpOp::RoundBf16), "round_bf16");
  // Rounds like cast to bf16 (ties to even: 1 + 2^-8 -> 1), and its derivative passes straight through.
  EXPECT_EQ(se::round_bf16(in(0)).eval(std::vector<double>{1.0 + 0x1p-8}), 1.0);
  EXPECT_EQ(se::round_bf16(in(0)).eval(std::vector<double>{1.0 + 3 * 0x1p-8}), 1.0 + 0x1p-6);
  EXPECT_EQ(se::round_bf16(in(0) * in(0)).derivative(0), in(0) + in(0));
  EXPECT_EQ(exp_op_arity(ExpOp::Ne), 2);
  EXPECT_EQ(exp_op_arity(ExpOp::Select), 3);
}

TEST(ScalarExp, MisuseThrows) {
  EXPECT_THROW(ScalarExp::input(-1), Error);
  EXPECT_THROW(ScalarExp::unary(ExpOp::Add, in(0)), Error);
  EXPECT_THROW(ScalarExp::binary(ExpOp::Exp, in(0), in(1)), Error);
  EXPECT_THROW(ScalarExp::unary(ExpOp::Exp, ScalarExp()), Error);
  EXPECT_THROW(in(0) + ScalarExp(), Error);
  EXPECT_THROW(se::select(in(0), ScalarExp(), in(1)), Error);
}

TEST(IndexExp, EvalWithFloorSemantics) {
  const IndexExp i0 = ix::coord(0), i1 = ix::coord(1);
  auto at = [](const IndexExp& e, std::vector<int64_t> x) { return e.eval(x); };
  EXPECT_EQ(at(ix::add(i0, i1), {3, 4}), 7);
  EXPECT_EQ(at(ix::sub(i0, i1), {3, 4}), -1);
  EXPECT_EQ(at(ix::mul(i0, i1), {3, 4}), 12);
  EXPECT_EQ(at(ix::floordiv(i0, i1), {-7, 2}), -4);
  EXPECT_EQ(at(ix::mod(i0, i1), {-7, 2}), 1);
  EXPECT_EQ(at(ix::floordiv(i0, i1), {7, -2}), -4);
  EXPECT_EQ(at(ix::mod(i0, i1), {7, -2}), -1);
  EXPECT_EQ(at(ix::floordiv(i0, i1), {-7, -2}), 3);
  EXPECT_EQ(at(ix::mod(i0, i1), {-7, -2}), -1);
  EXPECT_EQ(at(ix::floordiv(i0, i1), {6, -2}), -3);
  EXPECT_EQ(at(ix::mod(i0, i1), {6, -2}), 0);
  EXPECT_EQ(at(ix::ge(i0, i1), {4, 4}), 1);
  EXPECT_EQ(at(ix::lt(i0, i1), {4, 4}), 0);
  EXPECT_EQ(at(ix::eq(i0, i1), {4, 4}), 1);
  EXPECT_EQ(at(IndexExp::binary(IndexOp::Min, i0, i1), {4, -2}), -2);
  EXPECT_EQ(at(IndexExp::binary(IndexOp::Max, i0, i1), {4, -2}), 4);
  EXPECT_EQ(at(IndexExp::binary(IndexOp::Ne, i0, i1), {4, -2}), 1);
  // select evaluates only the chosen side, so a guarded division never divides by zero.
  const IndexExp guarded = IndexExp::select(ix::eq(i1, ix::c(0)), ix::c(-1), ix::floordiv(i0, i1));
  EXPECT_EQ(at(guarded, {9, 0}), -1);
  EXPECT_EQ(at(guarded, {9, 2}), 4);
}

TEST(IndexExp, EvalErrors) {
  const IndexExp i0 = ix::coord(0), i1 = ix::coord(1);
  const std::vector<int64_t> x = {5, 0};
  EXPECT_THROW(ix::floordiv(i0, i1).eval(x), Error);
  EXPECT_THROW(ix::mod(i0, i1).eval(x), Error);
  EXPECT_THROW(ix::coord(2).eval(x), Error);
  EXPECT_THROW(ix::mul(ix::c(int64_t{1} << 40), ix::c(int64_t{1} << 40)).eval(x), Error);
  EXPECT_THROW(ix::coord(-1), Error);
  EXPECT_THROW(IndexExp::binary(IndexOp::Select, i0, i1), Error);
}

TEST(IndexExp, StrHashEqualityAndMaxAxis) {
  const IndexExp e = ix::floordiv(ix::sub(ix::coord(0), ix::coord(2)), ix::c(-3));
  EXPECT_EQ(e.str(), "floordiv((i0 - i2), -3)");
  EXPECT_EQ(ix::ge(ix::coord(0), ix::coord(1)).str(), "ge(i0, i1)");
  EXPECT_EQ(e.max_axis(), 2);
  EXPECT_EQ(ix::c(4).max_axis(), -1);
  const IndexExp same = ix::floordiv(ix::sub(ix::coord(0), ix::coord(2)), ix::c(-3));
  EXPECT_EQ(e, same);
  EXPECT_EQ(e.hash(), same.hash());
  EXPECT_NE(e, ix::floordiv(ix::sub(ix::coord(0), ix::coord(2)), ix::c(3)));
  EXPECT_NE(e, ix::mod(ix::sub(ix::coord(0), ix::coord(2)), ix::c(-3)));
  EXPECT_EQ(e.op(), IndexOp::FloorDiv);
  EXPECT_EQ(e.args()[1].const_value(), -3);
  EXPECT_EQ(e.args()[0].args()[1].axis(), 2);
}

}  // namespace
}  // namespace kiln
