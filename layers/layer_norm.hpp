// LayerNorm over the last axis: y = (x - mean) / sqrt(var + eps) * weight + bias (biased
// variance, as PyTorch). Shape contract: x: (..., dim) -> (..., dim); weight = 1, bias = 0.
#pragma once

#include "layers/module.hpp"

namespace kiln::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  double eps;
};

// Dropout: in training, zeroes each element with probability p (a Philox mask, reproducible
// from the seed) and scales the rest by 1 / (1 - p); the identity in eval mode or for p = 0.
class Dropout : public Module {
 public:
  explicit Dropout(double p) : p(p) {}
  Tensor forward(const Tensor& x) const;
  double p;
};

}  // namespace kiln::nn
