// The cases of random (circuit/prims/random.cpp, cuda/lower/random.cpp).
#include "prim_cases.hpp"

namespace kiln::testing {

void random_cases(FamilyCases& c) {
  using se::in;
  // Gradients (f64 central differences).
  add_gradient(c, "random_uniform", {"pointwise"}, {F({5, 7}), I({2}, 1000), I({}, 10)}, [](Builder& b, const auto& x) {
    return b.mul(x[0], b.random(RandomKind::Uniform, Shape{5, 7}, DType::f64, x[1], x[2]));
  });
  // Lowerings (f32 kernels against the Eigen reference).
  for (auto kind : {RandomKind::Uniform, RandomKind::Bernoulli, RandomKind::Normal}) {
    const std::string k = kind == RandomKind::Uniform     ? "uniform"
                          : kind == RandomKind::Bernoulli ? "bernoulli"
                                                          : "normal";
    c.lowering.push_back({"random_" + k,
                          {i32({2}, -2000000000.0, 2000000000.0), i32({}, 0, 1000)},
                          [kind](Builder& b, const std::vector<ValueId>& x) {
                            return b.random(kind, Shape{1001}, DType::f32, x[0], x[1], 0.3);
                          },
                          // Uniform and Bernoulli are the reference's bits exactly; normal goes through
                          // lg2.approx and cos.approx (absolute error ~1e-6 per element).
                          kind == RandomKind::Normal ? 1e-5 : 0});
  }
}

}  // namespace kiln::testing
