// The cases of pointwise (circuit/prims/pointwise.cpp, cuda/lower/pointwise.cpp): every value op, broadcasting.
#include "prim_cases.hpp"

namespace kiln::testing {

void pointwise_cases(FamilyCases& c) {
  using se::in;
  // Gradients (f64 central differences).
  add_gradient(c, "add_broadcast", {"pointwise"}, {F({3, 5}), F({5})}, body(in(0) + in(1)));
  add_gradient(c, "sub_broadcast_both", {"pointwise"}, {F({4, 1, 3}), F({2, 3})}, body(in(0) - in(1)));
  add_gradient(c, "mul_scalar_input", {"pointwise"}, {F({33}), F({})}, body(in(0) * in(1)));
  add_gradient(c, "div", {"pointwise"}, {F({3, 7}), F({3, 7}, 0.5, 2.0)}, body(in(0) / in(1)));
  add_gradient(c, "neg", {"pointwise"}, {F({5, 3})}, body(-in(0)));
  add_gradient(c, "exp", {"pointwise"}, {F({37})}, unary(se::exp));
  add_gradient(c, "log", {"pointwise"}, {F({37}, 0.2, 3.0)}, unary(se::log));
  add_gradient(c, "sqrt", {"pointwise"}, {F({37}, 0.2, 3.0)}, unary(se::sqrt));
  add_gradient(c, "rsqrt", {"pointwise"}, {F({37}, 0.2, 3.0)}, unary(se::rsqrt));
  add_gradient(c, "tanh", {"pointwise"}, {F({37}, -2, 2)}, unary(se::tanh));
  add_gradient(c, "sigmoid", {"pointwise"}, {F({37}, -3, 3)}, unary(se::sigmoid));
  add_gradient(c, "gelu", {"pointwise"}, {F({37}, -3, 3)}, unary(se::gelu));
  add_gradient(c, "gelu_grad", {"pointwise"}, {F({37}, -3, 3)}, unary(se::gelu_grad));  // gelu's second derivative
  add_gradient(c, "silu", {"pointwise"}, {F({37}, -3, 3)}, unary(se::silu));
  add_gradient(c, "sin", {"pointwise"}, {F({37}, -3, 3)}, unary(se::sin));
  add_gradient(c, "cos", {"pointwise"}, {F({37}, -3, 3)}, unary(se::cos));
  add_gradient(c, "abs", {"pointwise"}, {F({37}, 0.1, 1.0)}, body(se::abs(in(0) * se::c(-1.0))));
  add_gradient(c, "pow", {"pointwise"}, {F({6, 5}, 0.5, 2.0), F({5}, -1.5, 2.0)}, body(se::pow(in(0), in(1))));
  add_gradient(c, "max_min", {"pointwise"}, {F({4, 9}), F({9})},
               body(se::max(in(0), in(1)) + se::min(in(0), in(1)) * se::c(0.5)));
  add_gradient(c, "select_compare", {"pointwise"}, {F({3, 11}), F({3, 11})},
               body(se::select(se::gt(in(0), in(1)), in(0) * in(1), in(0) - in(1)) + se::lt(in(0), in(1)) +
                    se::ge(in(0), in(1)) + se::le(in(0), in(1)) + se::eq(in(0), in(1)) + se::ne(in(0), in(1))));
  add_gradient(c, "three_inputs_fanout", {"pointwise"}, {F({2, 3, 5}), F({3, 1}), F({5})},
               body(in(0) * se::exp(in(1)) + se::tanh(in(0) * in(2)) / (se::c(2.0) + in(1) * in(1))));
  // Lowerings (f32 kernels against the Eigen reference).
  add_unary_pointwise_lowering(c, "exp", se::exp(in(0)));
  add_unary_pointwise_lowering(c, "exp_wide", se::exp(in(0)), -80,
                               85);  // large |x log2 e|: the product's rounding matters
  add_unary_pointwise_lowering(c, "log", se::log(in(0)), 0.01, 50);
  add_unary_pointwise_lowering(c, "log_near_one", se::log(in(0)), 0.995,
                               1.005);  // lg2.approx's absolute error is large here
  add_unary_pointwise_lowering(c, "sqrt", se::sqrt(in(0)), 0, 50);
  add_unary_pointwise_lowering(c, "rsqrt", se::rsqrt(in(0)), 0.01, 50);
  add_unary_pointwise_lowering(c, "tanh", se::tanh(in(0)));
  add_unary_pointwise_lowering(c, "tanh_small", se::tanh(in(0)), -0.2, 0.2);  // mostly the polynomial branch
  add_unary_pointwise_lowering(c, "sigmoid", se::sigmoid(in(0)), -20, 20);
  add_unary_pointwise_lowering(c, "gelu", se::gelu(in(0)));
  add_unary_pointwise_lowering(c, "gelu_grad", se::gelu_grad(in(0)));
  add_unary_pointwise_lowering(c, "silu", se::silu(in(0)));
  add_unary_pointwise_lowering(c, "sin", se::sin(in(0)), -20, 20);
  add_unary_pointwise_lowering(c, "cos", se::cos(in(0)), -20, 20);
  add_unary_pointwise_lowering(c, "abs_neg", -se::abs(in(0)));
  add_unary_pointwise_lowering(c, "pow_positive_base", se::pow(in(0), se::c(1.7)), 0.01, 4);
  add_unary_pointwise_lowering(c, "pow_negative_base_integer", se::pow(in(0), se::c(3.0)));
  add_unary_pointwise_lowering(
      c, "compare_select",
      se::select(se::gt(in(0), se::c(0.5)), se::max(in(0), se::c(1.0)), se::min(in(0), se::c(-1.0))));
  // Rounding to bf16 (cvt.rn.bf16.f32, then back): bit-exact against the host's conversion.
  c.lowering.push_back({"pointwise_round_bf16",
                        {f32({37, 45}, -1000, 1000)},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          return b.pointwise(se::round_bf16(se::in(0) * se::c(1.0 / 3.0)), {x[0]});
                        },
                        0});
  c.lowering.push_back({"pointwise_binary_broadcast",
                        {f32({37, 1}), f32({1, 45}, 0.5, 2)},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          return b.pointwise(se::in(0) / se::in(1) - se::in(0) * se::in(1), {x[0], x[1]});
                        },
                        1e-5});
  c.lowering.push_back({"pointwise_scalar_and_3d",
                        {f32({3, 5, 7}), f32({})},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.add(x[0], x[1]); },
                        1e-6});
}

}  // namespace kiln::testing
