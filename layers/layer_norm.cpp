// LayerNorm.
#include <kiln/layers/layer_norm.hpp>

namespace kiln::nn {

LayerNorm::LayerNorm(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", constant_init({dim}, 1.0));
  bias = register_parameter("bias", constant_init({dim}, 0.0));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  auto s = scope();
  return layer_norm(x, weight, bias, eps);
}

}  // namespace kiln::nn
