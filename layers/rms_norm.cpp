// RMSNorm.
#include <kiln/circuit/ir/error.hpp>
#include <kiln/layers/rms_norm.hpp>

namespace kiln::nn {

RMSNorm::RMSNorm(int64_t dim, double eps) : dim(dim), eps(eps) {
  if (dim < 1 || !(eps >= 0)) throw Error("RMSNorm: expected dim >= 1 and eps >= 0");
  weight = register_parameter("weight", constant_init({dim}, 1.0));
}

Tensor RMSNorm::forward(const Tensor& x) const {
  auto s = scope();
  if (x.rank() < 1 || x.shape()[x.rank() - 1] != dim)
    throw Error("RMSNorm(" + std::to_string(dim) + ") in layer '" + Engine::current().scope() +
                "': expected input (..., " + std::to_string(dim) + "), received " + x.shape().str());
  const int last = static_cast<int>(x.rank()) - 1;
  return x * rsqrt(mean(square(x), last, /*keepdim=*/true) + eps) * weight;
}

}  // namespace kiln::nn
