// RMSNorm over the last axis: y = x / sqrt(mean(x^2) + eps) * weight (Llama's LlamaRMSNorm; no
// mean subtraction, no bias). Shape contract: x: (..., dim) -> (..., dim); weight (dim) = 1.
#pragma once

#include <kiln/layers/module.hpp>

namespace kiln::nn {

class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) const;
  Tensor weight;
  int64_t dim;
  double eps;
};

}  // namespace kiln::nn
