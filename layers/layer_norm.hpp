// LayerNorm over the last axis: y = (x - mean) / sqrt(var + eps) * weight + bias (biased
// variance, as PyTorch). Shape contract: x: (..., dim) -> (..., dim); weight = 1, bias = 0.
#pragma once

#include <kiln/layers/module.hpp>

namespace kiln::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  double eps;
};

}  // namespace kiln::nn
