// Linear layer.
#include <kiln/circuit/ir/error.hpp>
#include <kiln/layers/linear.hpp>

namespace kiln::nn {

Linear::Linear(int64_t in, int64_t out, bool has_bias, double init_std) : in_features(in), out_features(out) {
  weight = register_parameter("weight", normal_init({out, in}, init_std));
  if (has_bias) bias = register_parameter("bias", constant_init({out}, 0.0));
}

Tensor Linear::forward(const Tensor& x) const {
  auto s = scope();
  if (x.rank() < 1 || x.shape()[x.rank() - 1] != in_features)
    throw Error("Linear(" + std::to_string(in_features) + " -> " + std::to_string(out_features) + ")" +
                (Engine::current().scope().empty() ? "" : " in layer '" + Engine::current().scope() + "'") +
                ": expected input (..., " + std::to_string(in_features) + "), received " + x.shape().str());
  Tensor y = matmul(x, weight, false, true);
  return bias.defined() ? y + bias : y;
}

}  // namespace kiln::nn
